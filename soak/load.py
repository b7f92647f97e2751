"""The actors of the mixed load: publishers, dashboards, a history prober, sync runs and the
real serial driver on simulated sensors. Each runs until ``stop`` is set and notes anything
wrong in a shared ``problems`` list, so a long run reports every kind of failure at once."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from cairn.base.clock_readings import parse_rfc3339
from harness.process import RouterProcess
from harness.wamp_client import Client, connect
from soak.knobs import ROOT

HZ = 10
PROBLEMS_CAP = 200  # a broken router would otherwise fill memory with the same complaint


class Problems(list):
    """What went wrong, each with the second of the run it was noted in: set beside the
    router's CPU samples, it tells which neighbour was busy then."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.monotonic()

    def note(self, text: str) -> None:
        if len(self) < PROBLEMS_CAP:
            self.append(f"t={time.monotonic() - self.started:.0f} s: {text}")


def log_errors(log: Path) -> list[str]:
    """ERROR and CRITICAL lines and tracebacks in a router log (level first on each line)."""
    return [line for line in log.read_text().splitlines()
            if re.match(r"(ERROR|CRITICAL) ", line) or line.startswith("Traceback")]


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep; True if ``stop`` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def leave(session: Client) -> None:
    with contextlib.suppress(Exception):
        if session.is_attached():
            await asyncio.wait_for(session.leave(), 5)


# -- WAMP publishers -----------------------------------------------------------------------


@dataclass
class Publisher:
    """Publishes retained readings at 10 Hz with a counter ``n``, so every subscriber and
    every history page can tell whether one went missing."""

    router: RouterProcess
    topic: str
    transport: str
    serializer: str
    acknowledge: bool
    problems: Problems
    sent: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        session = await connect(self.router, self.transport, self.serializer)
        options = PublishOptions(retain=True, acknowledge=self.acknowledge)
        next_tick = time.monotonic()
        try:
            while not stop.is_set():
                temperature = round(20 + 5 * random.random(), 1)
                try:
                    result = session.publish(self.topic, n=self.sent, temperature=temperature,
                                             humidity=50.0, options=options)
                    if self.acknowledge:
                        await asyncio.wait_for(result, 5)
                except Exception as e:
                    self.problems.note(f"{self.topic}: publish {self.sent} failed: {e!r}")
                    return
                self.sent += 1
                next_tick += 1 / HZ
                if await sleep_or_stop(stop, max(0.0, next_tick - time.monotonic())):
                    break
        finally:
            await leave(session)


# -- dashboards ----------------------------------------------------------------------------


@dataclass
class Dashboard:
    """Subscribes to prefix ``sensor.`` with ``get_retained`` like the real dashboard. A
    churning one drops its connection every ``churn_every`` seconds (on alternate rounds by
    GOODBYE and by cutting the socket) and comes back. Per connection it checks that a
    publisher's counter never goes backwards and, after the first live event of a topic,
    never skips."""

    router: RouterProcess
    name: str
    transport: str
    serializer: str
    churn_every: float | None
    problems: Problems
    connections: int = 0
    live: int = 0
    retained: int = 0
    retained_per_connection: list[int] = field(default_factory=list)
    topics: set[str] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            session = await self._open()
            stopped = await sleep_or_stop(stop, self._hold_time())
            if not session.is_attached():
                self.problems.note(f"{self.name}: the router dropped connection "
                                   f"{self.connections}")
            if stopped or self.connections % 2:
                await leave(session)
            elif session.transport is not None:  # the tab closes, the Wi-Fi drops
                session.transport.transport.abort()
            if not stopped:
                await sleep_or_stop(stop, random.uniform(0.1, 1.0))

    def _hold_time(self) -> float:
        if self.churn_every is None:
            return 10**9
        return random.uniform(0.5, 1.5) * self.churn_every

    async def _open(self) -> Client:
        session = await connect(self.router, self.transport, self.serializer)
        self.connections += 1
        self.retained_per_connection.append(0)
        last: dict[str, int] = {}
        await session.subscribe(
            lambda *args, details, **kwargs: self._on_event(last, details, kwargs), "sensor.",
            options=SubscribeOptions(match="prefix", get_retained=True, details_arg="details"))
        return session

    def _on_event(self, last: dict[str, int], details: Any, kwargs: dict[str, Any]) -> None:
        topic = details.topic
        self.topics.add(topic)
        if details.retained:
            self.retained += 1
            self.retained_per_connection[-1] += 1
        else:
            self.live += 1
        n = kwargs.get("n")
        if n is None:  # a serial sensor's reading: no counter
            return
        before = last.get(topic)
        if before is not None and n != before + 1 and not (details.retained and n <= before):
            self.problems.note(f"{self.name} connection {self.connections}: {topic} "
                               f"n={n} after n={before} (retained={details.retained})")
        last[topic] = n


async def leaky_client(router: RouterProcess, stop: asyncio.Event, kept: list[Client]) -> None:
    """The self-check of the growth assertions (CAIRN_SOAK_INJECT_LEAK): every second a new
    session that is never closed (fds), retaining 100 kB on topics of its own (memory; two
    payloads of 50 kB, within router.limits.max_retained_payload)."""
    blob = "x" * 50_000
    while not await sleep_or_stop(stop, 1.0):
        session = await connect(router, "rawsocket-tcp", "msgpack")
        kept.append(session)
        for half in "ab":
            session.publish(f"leak.t{len(kept)}{half}", blob, options=PublishOptions(retain=True))


# -- history queries -----------------------------------------------------------------------


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class HistoryProber:
    """Every ``every`` seconds one of a rotation of ``get_events`` queries, each checked
    against what the publishers' counters say the answer must be."""

    router: RouterProcess
    topics: list[str]  # the WAMP publishers' topics: counters without gaps
    problems: Problems
    every: float = 2.0
    queries: int = 0
    events: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        session = await connect(self.router, "rawsocket-tcp", "msgpack")
        self.sub = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        checks = [self._latest_page, self._topic_pages, self._time_window,
                  self._after_publication, self._bad_argument]
        try:
            while not await sleep_or_stop(stop, self.every):
                check = checks[self.queries % len(checks)]
                try:
                    await check(session)
                except Exception as e:
                    self.problems.note(f"history {check.__name__}: {e!r}")
                self.queries += 1
        finally:
            await leave(session)

    async def _get(self, session: Client, **kwargs: Any) -> tuple[list[dict], bool]:
        result = await asyncio.wait_for(
            session.call("wamp.subscription.get_events", self.sub, **kwargs), 10)
        page = result.results[0]
        self.events += len(page)
        return page, result.kwresults["is_limit_reached"]

    def _expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.problems.note(f"history: {what}")

    async def _latest_page(self, session: Client) -> None:
        page, more = await self._get(session, reverse=True, limit=100)
        self._expect(len(page) == 100 and more, f"latest page: {len(page)} events, more={more}")
        self._expect(all(e["details"]["topic"].startswith("sensor.") for e in page),
                     "latest page: a topic outside sensor.")

    def _counters(self, page: list[dict], topic: str, step: int, what: str) -> None:
        ns = [e["kwargs"]["n"] for e in page]
        self._expect(all(e["details"]["topic"] == topic for e in page), f"{what}: other topics")
        self._expect(ns == list(range(ns[0], ns[0] + step * len(ns), step)) if ns else False,
                     f"{what}: counters {ns[:5]}...{ns[-5:]} are not consecutive")

    async def _topic_pages(self, session: Client) -> None:
        """Two pages back in time on one topic: consecutive counters, the second page
        continuing where the first ended."""
        topic = random.choice(self.topics)
        first, _ = await self._get(session, topic=topic, reverse=True, limit=50)
        self._counters(first, topic, -1, f"{topic} newest page")
        second, _ = await self._get(session, topic=topic, reverse=True, limit=50,
                                    before_publication=first[-1]["publication"])
        if second:
            self._counters(first + second, topic, -1, f"{topic} two pages")

    async def _time_window(self, session: Client) -> None:
        """Five seconds of all topics, ending five seconds ago: every event inside the window,
        each publisher's counters consecutive, about 10 Hz per publisher."""
        now = datetime.now(UTC)
        start, end = now - timedelta(seconds=10), now - timedelta(seconds=5)
        page, more = await self._get(session, from_time=_rfc3339(start),
                                     until_time=_rfc3339(end), limit=1000)
        stamps = [parse_rfc3339(e["timestamp"]) for e in page]
        low, high = parse_rfc3339(_rfc3339(start)), parse_rfc3339(_rfc3339(end))
        self._expect(not more and all(low <= s <= high for s in stamps),
                     f"time window: stamps outside [{low}, {high}] or more={more}")
        for topic in self.topics:
            mine = [e for e in page if e["details"]["topic"] == topic]
            self._expect(5 * HZ - 10 <= len(mine) <= 5 * HZ + 10,  # publishers catch up
                         f"time window: {len(mine)} events of {topic} in 5 s")
            if mine:
                self._counters(mine, topic, 1, f"time window {topic}")

    async def _after_publication(self, session: Client) -> None:
        topic = random.choice(self.topics)
        back, _ = await self._get(session, topic=topic, reverse=True, limit=200)
        anchor = back[-1]
        page, _ = await self._get(session, topic=topic, after_publication=anchor["publication"],
                                  limit=20)
        n = anchor["kwargs"]["n"]
        got = [e["kwargs"]["n"] for e in page]
        self._expect(got == list(range(n + 1, n + 21)), f"after n={n}: {got}")

    async def _bad_argument(self, session: Client) -> None:
        try:
            await self._get(session, limit=0)
        except ApplicationError as e:
            self._expect(e.error == "wamp.error.invalid_argument", f"limit=0: {e.error}")
        else:
            self._expect(False, "limit=0 was accepted")


# -- sync ----------------------------------------------------------------------------------


@dataclass
class SyncRunner:
    """``cairn sync --once`` every ``every`` seconds into a directory sink, as cron would."""

    data_dir: Path
    workdir: Path
    problems: Problems
    every: float = 30.0
    runs: int = 0

    @property
    def landing(self) -> Path:
        return self.workdir / "landing"

    def write_config(self) -> Path:
        config = self.workdir / "sync.toml"
        config.write_text(f'[router]\ndata_dir = "{self.data_dir}"\n\n[sync]\n'
                          f'sink = "dir:{self.landing}"\ngateway_id = "soak"\n'
                          f'batch_events = 2000\n')
        return config

    async def once(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cairn.app.cli", "sync", "--config", str(self.write_config()),
            "--once", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        self.runs += 1
        if proc.returncode != 0:
            self.problems.note(f"cairn sync --once exited {proc.returncode}: {out.decode()}")

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.every):
            await self.once()


# -- serial sensors ------------------------------------------------------------------------


@dataclass
class SerialSensors:
    """``cairn sensor sim`` (Modbus devices on one bus, $THS line sensors) and ``cairn sensor
    run`` polling them every 0.1 s; every reading is published (heartbeat below the
    interval), retained and acknowledged, on sensor.<id>."""

    router: RouterProcess
    workdir: Path
    modbus: int = 4
    line: int = 2
    baudrate: int = 115200
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    @property
    def topics(self) -> list[str]:
        return ([f"sensor.sim-modbus-{a}" for a in range(1, self.modbus + 1)]
                + [f"sensor.sim-ths{i}" for i in range(self.line)])

    async def start(self) -> None:
        ports = self.workdir / "ports"
        sim = await self._spawn("sim", "--modbus", str(self.modbus), "--line", str(self.line),
                                "--dir", str(ports), "--baudrate", str(self.baudrate),
                                "--line-interval", str(1 / HZ), "--seed", "9")
        await asyncio.wait_for(sim.stdout.readline(), 15)  # the first line: ports exist
        config = self.workdir / "sensors.toml"
        config.write_text(self._config(ports))
        await self._spawn("run", "--config", str(config))

    def _config(self, ports: Path) -> str:
        url = f"rawsocket+tcp://127.0.0.1:{self.router.rawsocket_port}"
        common = f"interval = {1 / HZ}\nheartbeat = 0.01\ndeadband = 0\n"
        out = [f'[driver]\nrouter = "{url}"\nrealm = "realm1"\n']
        for a in range(1, self.modbus + 1):
            out.append(f'[[sensors]]\nid = "sim-modbus-{a}"\nkind = "modbus"\n'
                       f'port = "{ports / "modbus0"}"\nbaudrate = {self.baudrate}\n'
                       f'address = {a}\n{common}')
        for i in range(self.line):
            out.append(f'[[sensors]]\nid = "sim-ths{i}"\nkind = "line"\n'
                       f'port = "{ports / f"line{i}"}"\nmatch_id = "ths{i}"\n{common}')
        return "\n".join(out)

    async def _spawn(self, *args: str) -> asyncio.subprocess.Process:
        log = (self.workdir / f"sensor-{args[0]}.log").open("ab")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cairn.drivers.cli", "sensor", *args, cwd=ROOT,
            stdout=asyncio.subprocess.PIPE if args[0] == "sim" else log, stderr=log)
        self.procs.append(proc)
        return proc

    async def stop(self) -> list[int | None]:
        """SIGTERM the driver, then the simulator; their exit codes."""
        codes = []
        for proc in reversed(self.procs):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            try:
                codes.append(await asyncio.wait_for(proc.wait(), 15))
            except TimeoutError:
                proc.kill()
                codes.append(None)
        return codes
