"""Ten minutes (CAIRN_SOAK_SECONDS) of what a gateway lives through, against a real router
process: serial sensors and WAMP publishers at 10 Hz, 50 dashboards (some coming and going),
history queries and sync runs. The router's RSS and open fds must show no growth trend, and
nobody may miss anything."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import EVERYTHING, history_rule, open_realm, permission, role, user
from harness.landing import landed
from harness.process import RouterProcess
from harness.wamp_client import Client
from soak import procstat
from soak.hostile import (
    HANDSHAKE_TIMEOUT,
    MAX_RETAINED,
    MAX_RETAINED_PER_SESSION,
    SEND_BUFFER_LIMIT,
    STORM_KEPT,
    STORM_TOPIC,
    BigRetained,
    Lockout,
    RetainedSlotAttacker,
    Slowloris,
    Storm,
    SubscriptionFlood,
)
from soak.knobs import ARTIFACTS, HOSTILE, HOSTILE_ONLY, INJECT_LEAK, SECONDS
from soak.load import (
    Dashboard,
    HistoryProber,
    Problems,
    Publisher,
    SerialSensors,
    SyncRunner,
    leaky_client,
    log_errors,
    sleep_or_stop,
)

# the real users whose logins the lockout attacker guesses: (authid, secret, authmethod)
USERS = (("operator", "operator-s3cret", "ticket"), ("logger", "logger-s3cret", "wampcra"))
REALM = open_realm(history=[history_rule("sensor", max_events=1_000_000, max_age="90d"),
                            history_rule("storm", max_events=STORM_KEPT)],
                   extra=role("operator", permission("", EVERYTHING))
                   + "".join(user(authid, "operator", secret=secret)
                             for authid, secret, _ in USERS))
LIMITS = (f"send_buffer_limit = {SEND_BUFFER_LIMIT}\n"
          f'[router.limits]\nhandshake_timeout = "{HANDSHAKE_TIMEOUT:g}s"\n'
          f"max_retained = {MAX_RETAINED}\nmax_retained_per_session = "
          f"{MAX_RETAINED_PER_SESSION}\n")

WAMP_PUBLISHERS = 8        # + 6 serial sensors = 14 topics at 10 Hz
DASHBOARDS = 50
CHURN_EVERY = 10.0         # seconds a churning dashboard stays, on average
CHURNING = 20              # of the 50: ~120 reconnects a minute
SAMPLE_EVERY = max(1.0, min(3.0, SECONDS / 50))
TRANSPORTS = [("websocket", "json"), ("rawsocket-tcp", "msgpack"), ("websocket", "cbor")]


def chosen(neighbour: type) -> bool:
    """Whether this run has the hostile ``neighbour`` (CAIRN_SOAK_HOSTILE, _HOSTILE_ONLY)."""
    return HOSTILE and (not HOSTILE_ONLY or neighbour.__name__ in HOSTILE_ONLY)


def _publishers(router: RouterProcess, problems: Problems) -> list[Publisher]:
    return [Publisher(router, f"sensor.wamp-{k}", *TRANSPORTS[k % 3], acknowledge=k % 2 == 0,
                      problems=problems) for k in range(WAMP_PUBLISHERS)]


def _dashboards(router: RouterProcess, problems: Problems) -> list[Dashboard]:
    # mostly what the real dashboard speaks: JSON over WebSocket
    kinds = [("websocket", "json")] * 3 + [("rawsocket-tcp", "msgpack"), ("websocket", "cbor")]
    return [Dashboard(router, f"dashboard-{i}", *kinds[i % len(kinds)],
                      churn_every=CHURN_EVERY if i < CHURNING else None, problems=problems)
            for i in range(DASHBOARDS)]


async def _sample(pid: int, stop: asyncio.Event, into: list[procstat.Sample]) -> None:
    t0 = time.monotonic()
    while True:
        into.append(procstat.sample(pid, t0))
        if await sleep_or_stop(stop, SAMPLE_EVERY):
            return


@dataclass
class MixedLoad:
    router: RouterProcess
    workdir: Path
    problems: Problems = field(default_factory=Problems)
    samples: list[procstat.Sample] = field(default_factory=list)
    leaked: list[Client] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sensors = SerialSensors(self.router, self.workdir)
        self.publishers = _publishers(self.router, self.problems)
        self.dashboards = _dashboards(self.router, self.problems)
        self.prober = HistoryProber(self.router, [p.topic for p in self.publishers],
                                    self.problems)
        self.sync = SyncRunner(self.router.data_dir, self.workdir, self.problems)
        self.big = BigRetained(self.router, self.problems) if chosen(BigRetained) else None
        sensors = frozenset(p.topic for p in self.publishers) | set(self.sensors.topics)
        self.hostile = [neighbour for neighbour in (
            Slowloris(self.router, self.problems), Storm(self.router, self.problems),
            SubscriptionFlood(self.router, self.problems),
            RetainedSlotAttacker(self.router, self.problems, sensors), self.big,
            Lockout(self.router, self.problems, USERS)) if chosen(type(neighbour))]

    @property
    def topics(self) -> set[str]:
        """What every dashboard must see: the sensors', and the big retained values'."""
        big = self.big.topics if self.big is not None else set()
        return {p.topic for p in self.publishers} | set(self.sensors.topics) | big

    async def run(self, seconds: float) -> None:
        stop = asyncio.Event()
        await self.sensors.start()
        tasks = [asyncio.create_task(p.run(stop)) for p in self.publishers]
        await asyncio.sleep(1)  # retained values exist before the dashboards arrive
        tasks += [asyncio.create_task(d.run(stop)) for d in self.dashboards]
        await asyncio.sleep(5)  # history exists before the first query
        tasks += [asyncio.create_task(self.prober.run(stop)),
                  asyncio.create_task(self.sync.run(stop))]
        tasks += [asyncio.create_task(actor.run(stop)) for actor in self.hostile]
        if INJECT_LEAK:
            tasks.append(asyncio.create_task(leaky_client(self.router, stop, self.leaked)))
        tasks.append(asyncio.create_task(_sample(self.router.proc.pid, stop, self.samples)))
        await asyncio.sleep(seconds)
        stop.set()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException):
                self.problems.note(f"an actor failed: {result!r}")

    def report(self, trends: list[procstat.Trend]) -> None:
        path = ARTIFACTS / f"mixed-load-{time.strftime('%Y%m%d-%H%M%S')}.json"
        procstat.write_json(path, {
            "seconds": SECONDS, "sample_every": SAMPLE_EVERY,
            "published": {p.topic: p.sent for p in self.publishers},
            "dashboards": {d.name: {"connections": d.connections, "live": d.live,
                                    "retained": d.retained} for d in self.dashboards},
            "history_queries": self.prober.queries, "sync_runs": self.sync.runs,
            "hostile": {type(a).__name__: {k: v for k, v in vars(a).items()
                                           if isinstance(v, int | float)}
                        for a in self.hostile},
            "trends": [{**vars(t), "growth": t.growth, "fitted_growth": t.fitted_growth}
                       for t in trends], "problems": self.problems}, self.samples)
        print(f"\nrouter resources every {SAMPLE_EVERY:g} s ({path}):")
        print(procstat.table(self.samples))
        print(procstat.summary(self.samples))
        for t in trends:
            print(f"{t.name}: 2nd fifth {t.early:.1f}, last fifth {t.late:.1f}, "
                  f"slope {t.slope_per_min:+.3f}/min, tolerance {t.tolerance:.1f}")
        dashboards = self.dashboards
        print(f"published {sum(p.sent for p in self.publishers)} by {len(self.publishers)} WAMP "
              f"publishers; {len(dashboards)} dashboards: "
              f"{sum(d.connections for d in dashboards)} connections, "
              f"{sum(d.live for d in dashboards)} live and "
              f"{sum(d.retained for d in dashboards)} retained events; "
              f"{self.prober.queries} history queries ({self.prober.events} events); "
              f"{self.sync.runs} sync runs")
        for actor in self.hostile:
            print(f"hostile {type(actor).__name__}: " + ", ".join(
                f"{k} {v}" for k, v in vars(actor).items() if isinstance(v, int | float)))


async def test_ten_minutes_of_mixed_load_shows_no_memory_or_fd_growth(tmp_path):
    router = RouterProcess(tmp_path, REALM, router_toml=LIMITS).start()
    load = MixedLoad(router, tmp_path)
    try:
        await load.run(SECONDS)
    finally:
        exit_code = router.stop()  # SIGTERM, with the serial driver still connected
        sensor_codes = await load.sensors.stop()
    await load.sync.once()  # the rest, with the router stopped
    trends = procstat.verdict(load.samples)
    load.report(trends)

    assert not load.problems, "\n".join(load.problems)
    bad = log_errors(router.log_path)
    assert not bad, "router log:\n" + "\n".join(bad[:20])
    assert exit_code == 0, f"the router exited {exit_code} on SIGTERM"
    assert sensor_codes == [0, 0], f"driver, simulator exit codes {sensor_codes}"
    _check_every_dashboard_saw_every_topic(load)
    print(f"{_check_everything_landed(load.sync, router.db_path)} events landed by sync")
    growth = [p for t in trends for p in t.problems()]
    assert not growth, "\n".join(growth)


def _check_every_dashboard_saw_every_topic(load: MixedLoad) -> None:
    for d in load.dashboards:
        assert d.live > 0, f"{d.name} received no live event"
        assert d.topics == load.topics, f"{d.name} missed topics {load.topics - d.topics}"
        # the WAMP publishers' values are retained before the first dashboard arrives
        few = [i for i, n in enumerate(d.retained_per_connection) if n < len(load.publishers)]
        assert not few, f"{d.name}: connections {few} got fewer retained events than topics"


def _check_everything_landed(runner: SyncRunner, db_path: Path) -> int:
    """Everything the router stored landed once, in seq order, in a chain of manifests."""
    manifests, rows = landed(runner.landing)
    everything = [r["seq"] for r in rows]
    assert everything == sorted(set(everything)), "landed rows are not in increasing seq order"
    # the storm's history is pruned to its last STORM_KEPT events, some before they shipped
    seqs = [r["seq"] for r in rows if r["topic"] != STORM_TOPIC]
    assert seqs == sorted(set(seqs)), "landed rows are not in strictly increasing seq order"
    chain = [m["after_seq"] for m in manifests[1:]] == [m["last_seq"] for m in manifests[:-1]]
    assert chain, "the manifests' after_seq/last_seq do not chain"
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        stored = [s for (s,) in db.execute(
            "SELECT seq FROM publications WHERE topic != ? ORDER BY seq", (STORM_TOPIC,))]
    assert seqs == stored, f"{len(stored)} events stored, {len(seqs)} landed"
    return len(seqs)


def test_growth_check_flags_a_steady_climb_but_not_a_plateau():
    """The verdict itself can fail: a warm-up then a plateau with noise passes, the same
    plus 1 MiB/min or one fd a minute does not."""
    def samples(mib_per_min: float, fds_per_min: float) -> list[procstat.Sample]:
        out = []
        for i in range(200):  # ten minutes every 3 s
            t = 3.0 * i
            warm = 8 * min(1, t / 90)
            rss = 45 + warm + 0.3 * ((i * 7) % 5 - 2) + mib_per_min * t / 60
            out.append(procstat.Sample(t, int(rss * procstat.MIB),
                                       74 + (i % 3 == 0) + int(fds_per_min * t / 60), t / 10))
        return out

    assert not [p for t in procstat.verdict(samples(0, 0)) for p in t.problems()]
    rss, fds = procstat.verdict(samples(1.0, 0))
    assert rss.problems() and not fds.problems()
    rss, fds = procstat.verdict(samples(0, 1.0))
    assert fds.problems() and not rss.problems()
