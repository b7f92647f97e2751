"""Store benchmark for the Cairn router: durable publishes, history queries, retained
events and bytes written per stored event, all measured through the real router process.

Run from the repository root::

    .venv/bin/python -m bench.store [--quick] [--events 1000000] [--profile]
    .venv/bin/python -m bench.store --only publish,bytes   # the durable part only

What it does, in order:

1. **populate** (not through the router, timed separately): a fresh database in a temporary
   directory is filled with ``gateway.store.Store`` itself (``Store.open``, ``assign``,
   ``append``, ``flush``, ``close``): ``--events`` history rows on ``sensor.dev0000`` ..
   ``sensor.dev0099`` (each topic ~1 %) and, every 5,000th, ``sensor.door.front``; 10
   events/s of wall time (so 1,000,000 events span ~28 hours), kwargs
   ``{temperature, humidity}``, rule 0; and ``--retained`` retained-only rows on
   ``state.dev00000`` .. (no history rule covers ``state``).
2. the router (``python -m gateway.cli router``, via ``harness.process.RouterProcess``)
   starts on that data dir with one realm whose history rule is prefix ``sensor`` (its
   ``max_events`` is raised so that pruning never deletes rows during the run). Every
   measurement below goes through it, with lean RawSocket/msgpack WAMP clients in this
   process (:class:`WampClient`), over 127.0.0.1 only.
3. **get_events**: ``wamp.subscription.get_events`` with ``limit=100`` on the ``sensor``
   prefix subscription: the newest page (``reverse=true``); a page in the middle
   (``after_publication`` of a random event near the middle); a one-minute time window in the
   middle (``from_time``/``until_time``); the newest page of one device (``topic`` filter,
   ~1 % of the events, ``reverse=true``); and, as an extra, the newest page of a prefix
   subscription whose events are sparse (``sensor.door``). CALL->RESULT p50/p99 over
   ``--calls`` calls each (after 5 warm-up calls; a case stops early at ``--call-budget``
   seconds), every page checked (count, order, window, topic).
4. **get_retained**: SUBSCRIBE ``state`` (prefix, ``get_retained=true``) -> time until the
   last of the ``--retained`` retained EVENTs has arrived; UNSUBSCRIBE; ``--repeats`` times.
5. **durable publishes**: PUBLISH ``acknowledge=true, retain=true`` on ``sensor.devNNNN``
   (PUBLISHED only after the fsynced group commit) with 1 and with 16 concurrent publisher
   sessions (``--publishers``), each keeping ``--window`` publishes in flight (one case per
   window: 1, 8, 32), ``--duration`` s per case after a warm-up: PUBLISHED/s,
   publish->PUBLISHED p50/p99, and the router's CPU split into its event-loop thread and
   the rest (the SQLite worker threads). The publishers are lean sessions
   (:class:`AckPublisher`: pre-serialized msgpack frames, only the request id changes)
   spread over ``--client-procs`` processes; the generator check runs the largest case
   against a trivial server that answers PUBLISHED at once, to show the clients' ceiling.
6. **bytes per event**: ``--bytes-events`` history publications paced at ``--bytes-rate``/s,
   first without acknowledgement (group commit every ``Store.flush_interval``), then the same
   stream with ``acknowledge=true``, then (``--bytes-low-rate``) a slower unacknowledged
   stream, since the bytes per event depend on how many events share a commit. Each run
   starts on an empty WAL and ends with a checkpoint made by this process, so it pays for
   its own WAL frames and for copying its own pages into the database. Measured: bytes
   written to files (``wchar`` of ``/proc/<router>/io`` less the bytes the router sent on
   sockets, which the clients count, plus what the final checkpoint wrote),
   ``write_bytes`` of ``/proc/<router>/io`` (page-cache memory dirtied; on kernels with large
   folios a 4 KiB page write into a cached large folio counts the whole folio), growth of
   ``cairn.db`` + ``cairn.db-wal``, and sectors written on the whole block device (includes
   the file system journal and anything else on the machine), each divided by the count.
7. after the router has stopped, every get_events case is replayed in this process through
   ``gateway.history.history_query`` on a ``Store`` opened on the same file, recording the
   SQL it runs, so the report can show ``EXPLAIN QUERY PLAN`` and the bare SQL time next to the
   router's round trip.

The table goes to stdout, the details (machine, settings, plans, router log problems) to
``bench/results/store.json``. ``--profile`` samples the router with py-spy while it answers
retained subscriptions (and the slowest get_events case) and during the largest durable
publish case (samples per thread: event loop, store writer), and lists its hot spots.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import struct
import sys
import tempfile
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack

from bench.pubsub import (
    CTX,
    FakeBrokerProcess,
    Profiler,
    machine,
    machine_busy_seconds,
    source_version,
)
from bench.wire import check_rs_reply, rs_frame, rs_handshake, split_rs
from gateway.clock import rfc3339
from gateway.config import Limits
from gateway.history import EventsQuery, history_query
from gateway.metrics import quantile
from gateway.patterns import wildcard_matches
from gateway.store import Store, StoredPublication, eligible
from harness.config import history_rule, open_realm
from harness.process import CLK_TCK, RouterProcess, process_cpu_seconds
from harness.wamp import ABORT, CALL, ERROR, GOODBYE, HELLO, RESULT, WELCOME

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# max_events above the default (1,000,000): the minute's pruning never deletes rows mid-run
REALM = open_realm(history=[history_rule("sensor", max_events=100_000_000)])

HISTORY_PREFIX = "sensor"
DEVICES = 100
# a rarely published topic, evenly spread through history (0.02 %): a pattern subscription
# whose events are sparse, the hard case for walking seq
SPARSE_PREFIX, SPARSE_TOPIC, SPARSE_EVERY = "sensor.door", "sensor.door.front", 5000
RETAINED_PREFIX = "state"
SPACING_MS = 100  # wall time between consecutive history events: 10 events/s
PAGE = 100
TARGET_GET_EVENTS_P99_MS = 20.0
TARGET_RETAINED_MS = 100.0
TARGET_DURABLE_PER_S = 20_000  # with 16 publishers (issue 9)
PHASES = ("get_events", "retained", "publish", "bytes")

PUBLISH, PUBLISHED, SUBSCRIBE, SUBSCRIBED, UNSUBSCRIBE, UNSUBSCRIBED, EVENT = \
    16, 17, 32, 33, 34, 35, 36


def device_topic(k: int) -> str:
    return f"{HISTORY_PREFIX}.dev{k:04d}"


def reading(rng: random.Random) -> dict[str, float]:
    return {"temperature": round(rng.gauss(21.0, 3.0), 2),
            "humidity": round(rng.uniform(30.0, 70.0), 1)}


# -- a lean WAMP client (RawSocket over TCP, msgpack) ------------------------------------------


class WampError(Exception):
    pass


class WampClient(asyncio.Protocol):
    """Just enough of a WAMP client: PUBLISH (with or without acknowledgement), CALL,
    SUBSCRIBE/UNSUBSCRIBE. Replies resolve futures with the receive time
    (``perf_counter_ns`` taken when the socket read was handed to us), so latencies do not
    include waking the awaiting coroutine. ``raw_event`` (if set) gets every EVENT frame
    undecoded, for counting thousands of them cheaply."""

    def __init__(self, realm: str) -> None:
        self.realm = realm
        loop = asyncio.get_running_loop()
        self.welcome: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.handshaken = False
        self.pending: dict[int, asyncio.Future] = {}
        self.next_request = 0
        self.raw_event: Callable[[bytes, int], None] | None = None
        self.rx_bytes = 0  # what the router sent us: its socket share of wchar

    @classmethod
    async def connect(cls, port: int, realm: str = "realm1") -> WampClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(realm), "127.0.0.1", port)
        await asyncio.wait_for(client.welcome, 10)
        return client

    # asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(rs_handshake("msgpack"))

    def connection_lost(self, exc: Exception | None) -> None:
        error = ConnectionError(f"router closed the connection ({exc})")
        if not self.welcome.done():
            self.welcome.set_exception(error)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(error)
        self.pending.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.rx_bytes += len(data)
        buf = self.buf + data if self.buf else data
        if not self.handshaken:
            if len(buf) < 4:
                self.buf = buf
                return
            check_rs_reply(buf[:4], "msgpack")
            self.handshaken = True
            buf = buf[4:]
            self._send([HELLO, self.realm, {"roles": {"publisher": {}, "subscriber": {},
                                                      "caller": {}}}])
        frames, self.buf = split_rs(buf)
        raw_event = self.raw_event
        for kind, payload in frames:
            if kind == 1:  # ping
                self.transport.write(rs_frame(payload, 2))
            elif kind == 0:
                if raw_event is not None and payload[1] == EVENT and payload[0] & 0xF0 == 0x90:
                    raw_event(payload, now)
                else:
                    self._dispatch(msgpack.unpackb(payload, raw=False), now)

    def _dispatch(self, msg: list[Any], now: int) -> None:
        kind = msg[0]
        if kind in (PUBLISHED, SUBSCRIBED, UNSUBSCRIBED, RESULT):
            fut = self.pending.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result((msg, now))
        elif kind == ERROR:
            fut = self.pending.pop(msg[2], None)
            if fut is not None and not fut.done():
                fut.set_exception(WampError(f"{msg[4]}: {msg[5:] if len(msg) > 5 else ''}"))
        elif kind == WELCOME:
            self.welcome.set_result(msg[1])
        elif kind in (ABORT, GOODBYE):
            if not self.welcome.done():
                self.welcome.set_exception(WampError(f"router said {msg!r:.300}"))
            if kind == GOODBYE:
                self._send([GOODBYE, {}, "wamp.close.goodbye_and_out"])
            self.transport.close()

    def _send(self, msg: list[Any]) -> None:
        self.transport.write(rs_frame(msgpack.packb(msg)))

    def _request(self, msg_without_id: list[Any], expect: bool = True) -> asyncio.Future | None:
        self.next_request += 1
        request = self.next_request
        fut = None
        if expect:
            fut = asyncio.get_running_loop().create_future()
            self.pending[request] = fut
        self._send([msg_without_id[0], request, *msg_without_id[1:]])
        return fut

    # WAMP

    def publish(self, topic: str, kwargs: dict[str, Any], acknowledge: bool = False,
                retain: bool = False) -> asyncio.Future | None:
        options: dict[str, Any] = {}
        if acknowledge:
            options["acknowledge"] = True
        if retain:
            options["retain"] = True
        return self._request([PUBLISH, options, topic, [], kwargs], expect=acknowledge)

    async def call(self, procedure: str, args: list[Any], kwargs: dict[str, Any] | None = None,
                   timeout: float = 60) -> tuple[list[Any], dict[str, Any], int]:
        """(args, kwargs, receive time ns) of the RESULT."""
        fut = self._request([CALL, {}, procedure, args, kwargs or {}])
        msg, now = await asyncio.wait_for(fut, timeout)
        return (msg[3] if len(msg) > 3 else []), (msg[4] if len(msg) > 4 else {}), now

    def subscribe(self, topic: str, options: dict[str, Any]) -> asyncio.Future:
        return self._request([SUBSCRIBE, options, topic])

    async def unsubscribe(self, subscription: int) -> None:
        await asyncio.wait_for(self._request([UNSUBSCRIBE, subscription]), 30)

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(Exception):
                self._send([GOODBYE, {}, "wamp.close.normal"])
                await asyncio.wait_for(asyncio.shield(self.closed), 2)
            self.transport.close()


# -- measuring helpers ------------------------------------------------------------------------


def latency_summary(ns: list[int]) -> dict[str, Any]:
    ms = [v / 1e6 for v in ns]
    return {"n": len(ms), "p50_ms": _r(quantile(ms, 0.50)), "p99_ms": _r(quantile(ms, 0.99)),
            "max_ms": _r(max(ms) if ms else None),
            "mean_ms": _r(sum(ms) / len(ms) if ms else None)}


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


_PF_KTHREAD = 0x00200000


def kernel_threads_cpu_seconds() -> float:
    """utime + stime of all kernel threads (writeback, the ext4 journal, ...): work our own
    fsyncs cause, kept apart from "other programs"."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[6]) & _PF_KTHREAD:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def thread_cpu_seconds(pid: int, tid: int) -> float:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class CpuMeter:
    """CPU used during a phase by the router (and by its event-loop thread apart from its
    other threads, i.e. the SQLite workers), by the clients, by kernel threads and by
    anything else on the machine (100 = one core). A large "other" means other programs ran
    meanwhile and the numbers are disturbed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.router0 = process_cpu_seconds(pid)
        self.loop0 = thread_cpu_seconds(pid, pid)
        self.self0 = time.process_time()
        self.kernel0 = kernel_threads_cpu_seconds()
        self.busy0 = machine_busy_seconds()[0]
        self.wall0 = time.perf_counter()

    def stop(self, client_processes_s: float = 0.0) -> dict[str, int]:
        """``client_processes_s``: CPU seconds of client processes other than this one."""
        wall = time.perf_counter() - self.wall0
        busy = machine_busy_seconds()[0] - self.busy0
        router = process_cpu_seconds(self.pid) - self.router0
        loop = thread_cpu_seconds(self.pid, self.pid) - self.loop0
        me = time.process_time() - self.self0 + client_processes_s
        kernel = kernel_threads_cpu_seconds() - self.kernel0
        return {"router_cpu_pct": round(100 * router / wall),
                "router_loop_cpu_pct": round(100 * loop / wall),
                "client_cpu_pct": round(100 * me / wall),
                "kernel_threads_cpu_pct": round(100 * kernel / wall),
                "other_cpu_pct": round(100 * max(0.0, busy - router - me - kernel) / wall)}


def proc_io(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def file_bytes(io0: dict[str, int], io1: dict[str, int], socket_bytes: int) -> int:
    """Bytes the router handed to write system calls for files (the WAL, the database, its
    log): wchar less what it sent on sockets (= what the clients received). Unlike
    write_bytes it does not depend on how the kernel accounts dirtied page-cache memory (on
    kernels with large folios a 4 KiB write into a cached 64 KiB folio counts 64 KiB)."""
    return io1["wchar"] - io0["wchar"] - socket_bytes


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def db_files_size(db: Path) -> tuple[int, int]:
    return file_size(db), file_size(db.with_name(db.name + "-wal"))


def block_device_stat(path: Path) -> Path | None:
    """/sys/dev/block/MAJ:MIN/stat of the device holding ``path`` (or its parent disk)."""
    dev = path.stat().st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return stat if stat.exists() else None


def device_sectors_written(stat: Path | None) -> int | None:
    if stat is None:
        return None
    try:
        return int(stat.read_text().split()[6])  # sectors of 512 bytes, whatever the device
    except (OSError, IndexError, ValueError):
        return None


def filesystem_of(path: Path) -> dict[str, Any]:
    """The mount holding ``path`` (longest matching mount point in /proc/mounts)."""
    best: tuple[str, str, str] = ("", "?", "?")
    resolved = str(path.resolve())
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            device, mount, fstype = parts[0], parts[1], parts[2]
            if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) >= len(best[0]):
                best = (mount, device, fstype)
    return {"mount": best[0], "device": best[1], "fstype": best[2]}


def fsync_baseline(directory: Path, rounds: int = 100) -> dict[str, Any]:
    """4 KiB pwrite + fdatasync on the data directory's file system: the floor under every
    durable commit."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    times = []
    try:
        block = os.urandom(4096)
        for i in range(rounds):
            os.pwrite(fd, block, (i % 16) * 4096)
            t0 = time.perf_counter_ns()
            os.fdatasync(fd)
            times.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return latency_summary(times)


# -- 1. populate -------------------------------------------------------------------------------


async def populate(db_path: Path, events: int, retained: int, seed: int) -> dict[str, Any]:
    """Fill a new database through gateway.store.Store. Returns what the queries need: the
    publication ids of the events around the middle, and the wall-clock span."""
    rng = random.Random(seed)
    boot_id = str(uuid.UUID(int=rng.getrandbits(128)))
    now_ms = int(time.time() * 1000)
    first_ms = now_ms - 3_600_000 - events * SPACING_MS  # the newest event: an hour ago
    boottime0 = 3_600_000_000_000
    mid_lo, mid_hi = events // 2 - min(5000, events // 10), events // 2 + min(5000, events // 10)
    mid_pubs: list[int] = []  # publication ids of seq mid_lo+1 .. mid_hi+1
    sparse = 0
    t0 = time.perf_counter()
    store = await Store.open(db_path)
    chunk = 20_000
    try:
        for i in range(events):
            seq, publication = store.assign()
            wall_ms = first_ms + i * SPACING_MS + rng.randrange(SPACING_MS)
            if mid_lo <= i <= mid_hi:
                mid_pubs.append(publication)
            topic = device_topic(rng.randrange(DEVICES))
            if i % SPARSE_EVERY == SPARSE_EVERY // 2:
                topic = SPARSE_TOPIC
                sparse += 1
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=topic, args=[],
                kwargs=reading(rng), wall_ms=wall_ms, boot_id=boot_id,
                boottime_ns=boottime0 + (wall_ms - first_ms) * 1_000_000, clock_synced=True,
                authid="sensor-gw", authrole="anonymous", details={"topic": topic},
                history_rule=0))
            if (i + 1) % chunk == 0:
                await store.flush()
        await store.flush()
        history_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        for j in range(retained):
            seq, publication = store.assign()
            topic = f"{RETAINED_PREFIX}.dev{j:05d}"
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=topic,
                args=[], kwargs={"online": rng.random() < 0.95,
                                 "battery_v": round(rng.uniform(3.3, 4.2), 2),
                                 "rssi": rng.randrange(-90, -40), "fw": "1.4.2"},
                wall_ms=now_ms - rng.randrange(3_600_000), boot_id=boot_id,
                boottime_ns=boottime0, clock_synced=True, authid="sensor-gw",
                authrole="anonymous", details={"topic": topic}, retain=True))
            if (j + 1) % chunk == 0:
                await store.flush()
        await store.flush()
        retained_s = time.perf_counter() - t1
    finally:
        await store.close()
    total_s = time.perf_counter() - t0
    return {
        "events": events, "retained": retained, "history_s": round(history_s, 2),
        "retained_s": round(retained_s, 2), "total_s": round(total_s, 2),
        "events_per_s": round(events / history_s) if history_s else None,
        "db_bytes": file_size(db_path),
        "first_ms": first_ms, "last_ms": first_ms + (events - 1) * SPACING_MS,
        "mid_first_seq": mid_lo + 1, "mid_pubs": mid_pubs, "sparse_events": sparse,
    }


# -- 3. get_events ----------------------------------------------------------------------------


GET_EVENTS_CASES = [  # "sub": the prefix subscription queried
    {"id": "newest", "sub": HISTORY_PREFIX, "label": "get_events newest page (reverse)"},
    {"id": "middle", "sub": HISTORY_PREFIX,
     "label": "get_events middle page (after_publication)"},
    {"id": "window", "sub": HISTORY_PREFIX,
     "label": "get_events 1-minute time window (middle)"},
    {"id": "topic", "sub": HISTORY_PREFIX,
     "label": "get_events topic filter (1% of events, reverse)"},
    {"id": "sparse", "sub": SPARSE_PREFIX,
     "label": f"extra: get_events sparse prefix '{SPARSE_PREFIX}' (0.02%, reverse)"},
]


def make_query(case: str, pop: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], Any]:
    """(get_events kwargs, what to check the page against)."""
    if case == "newest":
        return {"limit": PAGE, "reverse": True}, None
    if case == "middle":
        pubs = pop["mid_pubs"]
        k = rng.randrange(len(pubs) - PAGE - 1)
        return {"limit": PAGE, "after_publication": pubs[k]}, pubs[k + 1:k + 1 + PAGE]
    if case == "window":
        span = pop["last_ms"] - pop["first_ms"]
        start = pop["first_ms"] + span // 2 + rng.randrange(-span // 20, span // 20 + 1)
        start -= start % 1000
        return ({"limit": PAGE, "from_time": rfc3339(start),
                 "until_time": rfc3339(start + 60_000)}, (start, start + 60_000))
    if case == "topic":
        topic = device_topic(rng.randrange(DEVICES))
        return {"limit": PAGE, "reverse": True, "topic": topic}, topic
    if case == "sparse":
        return {"limit": PAGE, "reverse": True}, pop["sparse_events"]
    raise ValueError(case)


def check_page(case: str, events: list[dict[str, Any]], more: bool, expect: Any) -> str | None:
    if case == "sparse":
        if len(events) != min(PAGE, expect) or more != (expect > PAGE):
            return f"{len(events)} events (is_limit_reached={more}) of {expect} stored"
        if any(e["details"].get("topic") != SPARSE_TOPIC for e in events):
            return f"events of other topics in the page of {SPARSE_PREFIX!r}"
        return None
    if len(events) != PAGE or not more:
        return f"{len(events)} events (is_limit_reached={more}), expected a full page of {PAGE}"
    stamps = [e["timestamp"] for e in events]
    if case in ("newest", "topic", "sparse") and stamps != sorted(stamps, reverse=True):
        return "page not newest-first"
    if case == "middle" and [e["publication"] for e in events] != expect:
        return "page is not the 100 events after the given publication"
    if case == "window":
        lo, hi = rfc3339(expect[0]), rfc3339(expect[1])
        if not all(lo <= s <= hi for s in stamps) or stamps != sorted(stamps):
            return "events outside the time window or out of order"
    if case == "topic" and any(e["details"].get("topic") != expect for e in events):
        return "events of other topics in a topic-filtered page"
    return None


async def bench_get_events(client: WampClient, pid: int, sub_ids: dict[str, int],
                           pop: dict[str, Any], calls: int, budget_s: float,
                           seed: int) -> list[dict[str, Any]]:
    results = []
    for case in GET_EVENTS_CASES:
        rng = random.Random(seed)
        meter = CpuMeter(pid)
        problems: list[str] = []
        notes: list[str] = []
        lat: list[int] = []
        t_end = None
        for i in range(5 + calls):
            kwargs, expect = make_query(case["id"], pop, rng)
            t0 = time.perf_counter_ns()
            try:
                args, kw, now = await client.call("wamp.subscription.get_events",
                                                  [sub_ids[case["sub"]]], kwargs)
            except (WampError, TimeoutError) as e:
                problems.append(f"{type(e).__name__}: {e}")
                break
            if i >= 5:
                lat.append(now - t0)
                t_end = t_end or time.monotonic() + budget_s
            problem = check_page(case["id"], args[0] if args else [],
                                 bool(kw.get("is_limit_reached")), expect)
            if problem and len(problems) < 3:
                problems.append(problem)
            if t_end is not None and time.monotonic() > t_end and len(lat) >= 10:
                notes.append(f"stopped at the time budget of {budget_s:.0f} s after "
                             f"{len(lat)} of {calls} calls")
                break
        summary = latency_summary(lat)
        results.append({**case, **summary, "cpu": meter.stop(), "example_kwargs": make_query(
            case["id"], pop, random.Random(seed))[0], "problems": problems, "notes": notes,
            "ok": not problems})
        print(f"  {case['label']}: p50 {fmt_ms(summary['p50_ms'])}, p99 "
              f"{fmt_ms(summary['p99_ms'])} ({summary['n']} calls)"
              + (f"; {notes[0]}" if notes else "")
              + (f"  PROBLEMS: {problems}" if problems else ""), flush=True)
    return results


# -- 4. get_retained --------------------------------------------------------------------------


async def bench_retained(client: WampClient, expected: int, repeats: int,
                         warmup: int = 2) -> dict[str, Any]:
    lat: list[int] = []
    first_event_lat: list[int] = []
    problems: list[str] = []
    for i in range(warmup + repeats):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        state = {"count": 0, "first": None, "last": None, "first_at": 0}

        def on_event(payload: bytes, now: int, state: dict = state,
                     done: asyncio.Future = done) -> None:
            state["count"] += 1
            if state["first"] is None:
                state["first"], state["first_at"] = payload, now
            if state["count"] == expected:
                state["last"] = payload
                if not done.done():
                    done.set_result(now)

        client.raw_event = on_event
        t0 = time.perf_counter_ns()
        fut = client.subscribe(RETAINED_PREFIX, {"match": "prefix", "get_retained": True})
        try:
            (msg, _), end = await asyncio.wait_for(asyncio.gather(fut, done), 60)
        except TimeoutError:
            problems.append(f"timed out with {state['count']} of {expected} retained events")
            client.raw_event = None
            break
        await asyncio.sleep(0.05)  # anything beyond the expected count would arrive by now
        if state["count"] != expected:
            problems.append(f"{state['count']} retained events, expected {expected}")
        for payload in (state["first"], state["last"]):
            event = msgpack.unpackb(payload, raw=False)
            details = event[3]
            if not details.get("retained") or \
                    not str(details.get("topic", "")).startswith(RETAINED_PREFIX + "."):
                problems.append(f"not a retained event of {RETAINED_PREFIX}.*: {event!r:.200}")
        client.raw_event = None
        await client.unsubscribe(msg[2])
        if i >= warmup:
            lat.append(end - t0)
            first_event_lat.append(state["first_at"] - t0)
    summary = latency_summary(lat)
    return {"retained": expected, **summary,
            "first_event_p50_ms": _r(quantile([v / 1e6 for v in first_event_lat], 0.5)),
            "problems": problems[:5], "ok": not problems}


# -- 5. durable publishes ---------------------------------------------------------------------


class AckPublisher(asyncio.Protocol):
    """A lean publisher session for the durable case: pre-serialized acknowledged retained
    PUBLISH frames on one topic (only the 8-byte request id changes), ``window`` in flight.
    Counts the PUBLISHED received in [measure_ns, end_ns] and their latencies; stops sending
    at ``end_ns`` and is done when nothing is left in flight."""

    options: dict[str, Any] = {"acknowledge": True, "retain": True}

    def __init__(self, topic: str, window: int, payloads: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        self.welcome: asyncio.Future = loop.create_future()
        self.done: asyncio.Future = loop.create_future()
        self.window = window
        options = msgpack.packb(self.options)
        # fixarray(6), PUBLISH, uint64 request | options, topic, args [], kwargs
        tails = [options + msgpack.packb(topic) + b"\x90" + p for p in payloads]
        self.frames = [(struct.pack("!L", 3 + 8 + len(t)) + b"\x96\x10\xcf", t) for t in tails]
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.handshaken = False
        self.sent: dict[int, int] = {}
        self.next_request = 0
        self.measure_ns = self.end_ns = 2**63
        self.started = False
        self.count = 0
        self.rx_bytes = 0  # received from measure_ns on
        self.latencies = array("q")
        self.errors: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.write(rs_handshake("msgpack"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionError(f"router closed the connection ({exc})"))
        if self.sent:
            self.errors.append(f"connection lost with {len(self.sent)} in flight ({exc})")
        self._finish()

    def start(self, measure_ns: int, end_ns: int) -> None:
        self.measure_ns, self.end_ns, self.started = measure_ns, end_ns, True
        self._send_publishes(time.perf_counter_ns())

    def _send_publishes(self, now: int) -> None:
        if now >= self.end_ns:
            if not self.sent:
                self._finish()
            return
        out = []
        while len(self.sent) < self.window:
            self.next_request += 1
            request = self.next_request
            head, tail = self.frames[request % len(self.frames)]
            out += (head, request.to_bytes(8, "big"), tail)
            self.sent[request] = time.perf_counter_ns()
        self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if now >= self.measure_ns:
            self.rx_bytes += len(data)
        buf = self.buf + data if self.buf else data
        if not self.handshaken:
            if len(buf) < 4:
                self.buf = buf
                return
            check_rs_reply(buf[:4], "msgpack")
            self.handshaken, buf = True, buf[4:]
            self.transport.write(rs_frame(msgpack.packb(
                [HELLO, "realm1", {"roles": {"publisher": {}}}])))
        frames, self.buf = split_rs(buf)
        for kind, payload in frames:
            if kind == 1:  # ping
                self.transport.write(rs_frame(payload, 2))
            elif kind == 0:
                self._message(msgpack.unpackb(payload, raw=False), now)
        if self.started:
            self._send_publishes(now)

    def _message(self, msg: list[Any], now: int) -> None:
        if msg[0] == PUBLISHED:
            t0 = self.sent.pop(msg[1])
            if self.measure_ns <= now <= self.end_ns:
                self.count += 1
                self.latencies.append(now - t0)
        elif msg[0] == WELCOME:
            self.welcome.set_result(msg[1])
        elif msg[0] == ERROR:
            self.sent.pop(msg[2], None)
            if len(self.errors) < 5:
                self.errors.append(f"{msg[4]}: {msg[5:]!r:.200}")
        else:
            self.errors.append(f"unexpected {msg!r:.200}")
            if not self.welcome.done():
                self.welcome.set_exception(ConnectionError(f"router said {msg!r:.200}"))
            self.transport.close()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def _payloads(seed: int, n: int = 64) -> list[bytes]:
    rng = random.Random(seed)
    return [msgpack.packb(reading(rng)) for _ in range(n)]


async def _publisher_async(port: int, topics: list[str], window: int, seed: int,
                           conn: Any) -> None:
    loop = asyncio.get_running_loop()
    sessions = []
    for topic in topics:
        _, session = await loop.create_connection(
            lambda t=topic: AckPublisher(t, window, _payloads(seed)), "127.0.0.1", port)
        await asyncio.wait_for(session.welcome, 10)
        sessions.append(session)
    conn.send("ready")
    measure_ns, end_ns = await loop.run_in_executor(None, conn.recv)
    for session in sessions:
        session.start(measure_ns, end_ns)
    wait_s = (end_ns - time.perf_counter_ns()) / 1e9 + 30
    cpu0 = None
    while time.perf_counter_ns() < measure_ns:
        await asyncio.sleep(0.01)
    cpu0 = time.process_time()
    await asyncio.wait_for(asyncio.gather(*(s.done for s in sessions)), wait_s)
    cpu = time.process_time() - cpu0
    latencies = array("q")
    for s in sessions:
        latencies.extend(s.latencies)
        s.transport.close()
    conn.send({"count": sum(s.count for s in sessions), "latencies": latencies.tobytes(),
               "rx_bytes": sum(s.rx_bytes for s in sessions),
               "errors": [e for s in sessions for e in s.errors][:5], "cpu_s": cpu})


def _publisher_main(port: int, topics: list[str], window: int, seed: int, conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    try:
        asyncio.run(_publisher_async(port, topics, window, seed, conn))
    except BaseException as e:  # report, never hang the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})


def _recv(conn: Any, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError("a publisher process did not answer")
    reply = conn.recv()
    if isinstance(reply, dict) and "error" in reply:
        raise RuntimeError(f"publisher process failed: {reply['error']}")
    return reply


def run_publishers(port: int, publishers: int, window: int, warmup: float, duration: float,
                   procs: int, seed: int,
                   on_start: Callable[[], Any] | None = None) -> tuple[dict[str, Any], Any]:
    """``publishers`` lean sessions spread over ``procs`` processes (blocking: run it in a
    thread). ``on_start`` is called when the measured interval begins; its result is returned
    with the merged results."""
    procs = max(1, min(procs, publishers))
    workers = []
    for p in range(procs):
        topics = [device_topic(k) for k in range(p, publishers, procs)]
        parent, child = CTX.Pipe()
        proc = CTX.Process(target=_publisher_main, daemon=True,
                           args=(port, topics, window, seed + p, child))
        proc.start()
        workers.append((proc, parent))
    try:
        for _, conn in workers:
            _recv(conn, 30)
        measure_ns = time.perf_counter_ns() + int((0.05 + warmup) * 1e9)
        end_ns = measure_ns + int(duration * 1e9)
        for _, conn in workers:
            conn.send((measure_ns, end_ns))
        time.sleep(max(0.0, (measure_ns - time.perf_counter_ns()) / 1e9))
        started = on_start() if on_start is not None else None
        replies = [_recv(conn, duration + warmup + 60) for _, conn in workers]
    finally:
        for proc, _ in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    latencies = array("q")
    for r in replies:
        latencies.frombytes(r["latencies"])
    published = sum(r["count"] for r in replies)
    result = {"published": published, "per_s": round(published / duration),
              "latency": latency_summary(list(latencies)),
              "errors": [e for r in replies for e in r["errors"]][:5],
              "client_cpu_s": sum(r["cpu_s"] for r in replies), "client_procs": procs,
              "rx_bytes": sum(r["rx_bytes"] for r in replies)}
    return result, started


async def bench_publish(port: int, pid: int, publishers: int, duration: float, window: int,
                        warmup: float, procs: int, seed: int,
                        profile: Path | None = None) -> dict[str, Any]:
    """Durable publishes through the router: PUBLISHED/s, latency, router CPU per thread
    and bytes written, over the measured interval (py-spy'd into ``profile`` if given)."""
    state: dict[str, Any] = {}

    def started() -> None:
        state["io0"], state["meter"] = proc_io(pid), CpuMeter(pid)
        if profile is not None:
            state["profiler"] = Profiler(pid, duration - 0.5, profile)

    r, _ = await asyncio.to_thread(run_publishers, port, publishers, window, warmup,
                                   duration, procs, seed, started)
    io1, cpu = proc_io(pid), state["meter"].stop(r.pop("client_cpu_s"))
    io0, n = state["io0"], r["published"]
    if profile is not None:
        r["profile"] = {**await asyncio.to_thread(state["profiler"].finish),
                        "threads": thread_shares(profile)}
    return {"publishers": publishers, "window": window, "duration_s": duration, **r,
            "cpu": cpu,
            "write_bytes_per_event": round((io1["write_bytes"] - io0["write_bytes"]) / n)
            if n else None,
            "file_bytes_per_event": round(file_bytes(io0, io1, r.pop("rx_bytes")) / n)
            if n else None,
            "ok": not r["errors"] and n > 0}


def thread_shares(path: Path, top: int = 8) -> dict[str, Any]:
    """py-spy samples per router thread (event loop, the store's writer, others), and the
    writer's hottest frames: where a durable publish spends its time."""
    samples: Counter[str] = Counter()
    writer: Counter[str] = Counter()
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            kind = ("event loop" if "run_forever" in stack else
                    "store writer" if "_commit_batch" in stack or "futures/thread.py" in stack
                    else "other")
            samples[kind] += int(count)
            if kind == "store writer":
                writer[stack.rsplit(";", 1)[-1]] += int(count)
    total = sum(samples.values()) or 1
    return {"share_pct": {k: round(100 * v / total, 1) for k, v in samples.items()},
            "writer_self_top": [(f, round(100 * c / (sum(writer.values()) or 1), 1))
                                for f, c in writer.most_common(top)]}


async def generator_check(publishers: int, window: int, duration: float, procs: int,
                          seed: int) -> dict[str, Any]:
    """The same publisher processes against a trivial server that answers every PUBLISH
    with PUBLISHED at once (bench.wire.FakeBroker in its own process): the clients' ceiling."""
    fake = FakeBrokerProcess(batched=True)
    try:
        r, _ = await asyncio.to_thread(run_publishers, fake.rs_port, publishers, window,
                                       min(1.0, duration / 2), duration, procs, seed)
    finally:
        fake.stop()
    cpu_s = r.pop("client_cpu_s")
    return {"publishers": publishers, "window": window, **r,
            "client_cpu_pct": round(100 * cpu_s / duration)}


# -- 6. bytes per stored event ----------------------------------------------------------------


async def paced_stream(client: WampClient, n: int, rate: float, acknowledge: bool,
                       seed: int) -> dict[str, Any]:
    """``n`` history publications at ``rate``/s over the 100 device topics. Without
    acknowledgement the last one is acknowledged anyway: its PUBLISHED comes after the commit
    that holds everything before it, so the measurement ends when all of it is on disk."""
    rng = random.Random(seed)
    futures: list[tuple[asyncio.Future, int]] = []
    start = time.perf_counter()
    sent = 0
    while sent < n:
        due = min(n, int((time.perf_counter() - start) * rate) + 1)
        while sent < due:
            last = sent == n - 1
            t0 = time.perf_counter_ns()
            fut = client.publish(device_topic(rng.randrange(DEVICES)), reading(rng),
                                 acknowledge=acknowledge or last)
            if fut is not None:
                futures.append((fut, t0))
            sent += 1
        await asyncio.sleep(0.002)
    send_s = time.perf_counter() - start
    lat = []
    for fut, t0 in futures:
        _, now = await asyncio.wait_for(fut, 60)
        lat.append(now - t0)
    return {"sent": sent, "rate": round(sent / send_s), "latency": latency_summary(lat)}


def checkpoint_now(db: Path) -> int:
    """Copy the whole WAL into the database from this process (in WAL mode any connection
    may) and truncate it; returns the bytes this process wrote for it."""
    before = proc_io(os.getpid())["wchar"]
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        (busy, _, _), = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    if busy:
        raise RuntimeError("the checkpoint could not complete (the router kept writing)")
    return proc_io(os.getpid())["wchar"] - before


async def bench_bytes(port: int, pid: int, db: Path, runs: list[tuple[int, float, bool]],
                      seed: int) -> list[dict[str, Any]]:
    """One measurement per (count, rate, acknowledge) in ``runs``. Each starts on an empty
    WAL and ends with a checkpoint, so it pays for its own WAL frames and for copying its
    own pages into the database, whatever the router's checkpoint interval."""
    client = await WampClient.connect(port)
    results = []
    try:
        # settle: an acknowledged history publish commits whatever is pending
        await asyncio.wait_for(client.publish(device_topic(0), {}, acknowledge=True), 30)
        for n, rate, acknowledge in runs:
            checkpoint_now(db)
            r = await bytes_run(client, pid, db, n, rate, acknowledge, seed)
            results.append(r)
            print(f"  {n:,} {'acknowledged' if acknowledge else 'not acknowledged'} at "
                  f"{r['rate']:,}/s: {r['file_bytes_per_event']:,} B/event written to files "
                  f"({r['checkpoint_bytes_per_event']:,} of them copying the WAL into the "
                  f"database), {r['write_bytes_per_event']:,} B write_bytes", flush=True)
    finally:
        await client.close()
    return results


async def bytes_run(client: WampClient, pid: int, db: Path, n: int, rate: float,
                    acknowledge: bool, seed: int) -> dict[str, Any]:
    device = block_device_stat(db.parent)
    io0, size0, rx0 = proc_io(pid), db_files_size(db), client.rx_bytes
    sectors0, meter = device_sectors_written(device), CpuMeter(pid)
    r = await paced_stream(client, n, rate, acknowledge, seed + int(acknowledge))
    io1, size1 = proc_io(pid), db_files_size(db)
    checkpoint = checkpoint_now(db)
    files = file_bytes(io0, io1, client.rx_bytes - rx0) + checkpoint
    sectors1, cpu = device_sectors_written(device), meter.stop()
    write_bytes = io1["write_bytes"] - io0["write_bytes"]
    return {
        "acknowledge": acknowledge, "events": n, "rate": r["rate"],
        "write_bytes": write_bytes,
        "write_bytes_per_event": round(write_bytes / n),
        "file_bytes_per_event": round(files / n),
        "checkpoint_bytes_per_event": round(checkpoint / n),
        "wchar_per_event": round((io1["wchar"] - io0["wchar"]) / n),
        "syscw_per_event": round((io1["syscw"] - io0["syscw"]) / n, 2),
        "db_growth_bytes": size1[0] - size0[0],
        "wal_growth_bytes": size1[1] - size0[1],
        "files_growth_per_event": round((size1[0] + size1[1] - size0[0] - size0[1]) / n),
        "wal_size_after": size1[1],
        "device_bytes_per_event": round((sectors1 - sectors0) * 512 / n)
        if sectors0 is not None and sectors1 is not None else None,
        "cpu": cpu, "latency": r["latency"], "ok": True,
    }


# -- 7. diagnosis: the SQL get_events runs ------------------------------------------------------


async def diagnose_get_events(db_path: Path, sub_ids: dict[str, int], pop: dict[str, Any],
                              seed: int) -> dict[str, Any]:
    """Replay each get_events case through gateway.history.history_query on a Store opened on
    the benchmark database (router stopped), record the SQL it runs, and show its query plan
    and its bare execution time."""
    store = await Store.open(db_path)
    recorded: list[tuple[str, tuple[Any, ...]]] = []
    query_fn = store.query

    async def recording_query(sql: str, params: Any, *limits: Any) -> list[tuple[Any, ...]]:
        recorded.append((sql, tuple(params)))
        return await query_fn(sql, params, *limits)

    store.query = recording_query  # type: ignore[method-assign]
    realm = SimpleNamespace(name="realm1", limits=Limits(),
                            broker=SimpleNamespace(may_receive=lambda session, topic: True))
    caller = SimpleNamespace(id=1, authid="bench", authrole="anonymous", closed=False)
    out: dict[str, Any] = {}
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    db.create_function("eligible", 3, eligible, deterministic=True)
    db.create_function("wildcard_match", 2, wildcard_matches, deterministic=True)
    try:
        for case in GET_EVENTS_CASES:
            kwargs, _ = make_query(case["id"], pop, random.Random(seed))
            runs = []
            for _ in range(3):
                recorded.clear()
                t0 = time.perf_counter()
                sub = SimpleNamespace(id=sub_ids[case["sub"]], uri=case["sub"], match="prefix")
                query = history_query(realm, caller, sub, EventsQuery.parse(kwargs), 1000)
                query.result(await store.read_history(query.request))
                runs.append((time.perf_counter() - t0) * 1000)
                if runs[-1] > 500:
                    break
            in_process_ms = sorted(runs)[len(runs) // 2]
            statements = []
            for sql, params in recorded:
                plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
                times = []
                for _ in range(5):
                    t1 = time.perf_counter()
                    db.execute(sql, params).fetchall()
                    times.append((time.perf_counter() - t1) * 1000)
                    if times[-1] > 500:
                        break
                statements.append({"sql": sql, "params": list(params), "plan": plan,
                                   "sql_ms_median": _r(sorted(times)[len(times) // 2])})
            out[case["id"]] = {"kwargs": kwargs, "in_process_ms": _r(in_process_ms),
                               "statements": statements}
    finally:
        db.close()
        await store.close()
    return out


async def profile_router(pid: int, seconds: float, out: Path,
                         workload: Callable[[], Any]) -> dict[str, Any]:
    """py-spy the router while ``workload`` runs over and over."""
    if not (Path(sys.executable).parent / "py-spy").exists():
        return {"error": "py-spy is not installed (.venv/bin/pip install py-spy)"}
    profiler = await asyncio.to_thread(Profiler, pid, seconds, out)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await workload()
    return await asyncio.to_thread(profiler.finish)


# -- reporting ---------------------------------------------------------------------------------


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} ms" if value < 100 else f"{value:,.0f} ms"


def table(rows: list[tuple[str, str, str, str]]) -> str:
    head = ("metric", "value", "target", "result")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def verdict(ok: bool, value: float | None, limit: float) -> str:
    if not ok or value is None:
        return "ERROR"
    return "pass" if value < limit else "FAIL"


def build_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    pop = report["populate"]
    rows.append((f"populate {pop['events']:,} events + {pop['retained']:,} retained (Store)",
                 f"{pop['total_s']:.1f} s ({pop['events_per_s'] or 0:,} events/s, "
                 f"db {pop['db_bytes'] / 2**20:,.0f} MiB)", "-", "info"))
    for r in report.get("publish", []):
        lat = r["latency"]
        if r.get("generator_check"):
            rows.append((f"generator check: {r['publishers']} x window {r['window']} against "
                         f"a trivial server", f"{r['per_s']:,}/s (client CPU "
                         f"{r['client_cpu_pct']}%)", "-", "info"))
            continue
        target, result = "-", "info" if r["ok"] else "ERROR"
        if r["publishers"] == 16 and r["ok"]:
            target = f">= {TARGET_DURABLE_PER_S:,}/s"
            result = "pass" if r["per_s"] >= TARGET_DURABLE_PER_S else "FAIL"
        rows.append((f"durable publish, {r['publishers']} publisher(s) x window {r['window']}",
                     f"{r['per_s']:,}/s; p50 {fmt_ms(lat['p50_ms'])}, p99 {fmt_ms(lat['p99_ms'])}",
                     target, result))
    for r in report.get("get_events", []):
        rows.append((r["label"], f"p50 {fmt_ms(r['p50_ms'])}, p99 {fmt_ms(r['p99_ms'])} "
                                 f"(n={r['n']})",
                     f"p99 < {TARGET_GET_EVENTS_P99_MS:.0f} ms",
                     verdict(r["ok"], r["p99_ms"], TARGET_GET_EVENTS_P99_MS)))
    r = report.get("retained")
    if r:
        rows.append((f"SUBSCRIBE get_retained, {r['retained']:,} topics -> last EVENT",
                     f"p50 {fmt_ms(r['p50_ms'])}, p99 {fmt_ms(r['p99_ms'])} (n={r['n']}; "
                     f"first EVENT p50 {fmt_ms(r['first_event_p50_ms'])})",
                     f"p99 < {TARGET_RETAINED_MS:.0f} ms",
                     verdict(r["ok"], r["p99_ms"], TARGET_RETAINED_MS)))
    for r in report.get("bytes", []):
        kind = "acknowledged" if r["acknowledge"] else "not acknowledged"
        dev = r["device_bytes_per_event"]
        rows.append((f"bytes written/event, {r['events']:,} {kind} @ {r['rate']:,}/s",
                     f"{r['file_bytes_per_event']:,} B to files; {r['write_bytes_per_event']:,}"
                     f" B write_bytes; db+wal growth {r['files_growth_per_event']:,} B; "
                     "device " + (f"{dev:,} B" if dev is not None else "-"), "-", "info"))
    for r in report.get("publish", []):
        if r.get("write_bytes_per_event") is not None:
            rows.append((f"bytes written/event, durable publish {r['publishers']} x window "
                         f"{r['window']} (closed loop, retain)",
                         f"{r['file_bytes_per_event']:,} B to files; "
                         f"{r['write_bytes_per_event']:,} B write_bytes", "-", "info"))
    return rows


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.store",
                                description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small smoke run (50,000 events, short phases): well under a minute")
    p.add_argument("--events", type=int, help="history size (default 1,000,000; 50,000 with "
                                              "--quick)")
    p.add_argument("--retained", type=int, default=10_000,
                   help="retained topics under the get_retained prefix (default 10,000)")
    p.add_argument("--calls", type=int, help="get_events calls per case (default 250; 30 with "
                                             "--quick)")
    p.add_argument("--call-budget", type=float, default=20.0,
                   help="max seconds per get_events case; slower cases stop early (default 20)")
    p.add_argument("--repeats", type=int,
                   help="get_retained subscriptions (default 20; 5 with --quick)")
    p.add_argument("--duration", type=float,
                   help="seconds per durable-publish case (default 5; 1 with --quick)")
    p.add_argument("--window", default="1,8,32",
                   help="acknowledged publishes each publisher keeps in flight: one case per "
                        "value (default 1,8,32)")
    p.add_argument("--publishers", default="1,16",
                   help="publisher counts of the durable-publish cases (default 1,16)")
    p.add_argument("--client-procs", type=int, default=2,
                   help="processes the durable-publish sessions are spread over (default 2)")
    p.add_argument("--no-generator-check", action="store_true",
                   help="skip the durable-publish clients against a trivial server")
    p.add_argument("--only", default=",".join(PHASES),
                   help=f"comma-separated phases to run (default all: {','.join(PHASES)}); "
                        "e.g. --only publish,bytes --events 100000 for the durable part")
    p.add_argument("--bytes-events", type=int,
                   help="publications per bytes-per-event run (default 20,000; 2,000 with "
                        "--quick)")
    p.add_argument("--bytes-rate", type=float,
                   help="publications/s of the bytes-per-event runs (default 2,000; 1,000 with "
                        "--quick)")
    p.add_argument("--bytes-low-rate", type=float, default=100.0,
                   help="also measure non-acknowledged publications at this lower rate, where "
                        "fewer events share a commit (default 100/s; 0 to skip)")
    p.add_argument("--bytes-low-seconds", type=float,
                   help="seconds of the low-rate run (default 10; 2 with --quick)")
    p.add_argument("--dir", type=Path,
                   help="where the temporary data directory goes (default: the system temp "
                        "dir); its file system is what is measured")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (database, config, router log)")
    p.add_argument("--no-diagnose", action="store_true",
                   help="skip the query plans / bare SQL timing after the run")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the router while it sends retained events and answers the "
                        "slowest get_events case, and list its hot spots")
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "store.json")
    opts = p.parse_args(argv)
    quick = opts.quick
    defaults = {"events": (1_000_000, 50_000), "calls": (250, 30), "repeats": (20, 5),
                "duration": (5.0, 1.0), "bytes_events": (20_000, 2_000),
                "bytes_rate": (2_000.0, 1_000.0), "bytes_low_seconds": (10.0, 2.0)}
    for name, (full, small) in defaults.items():
        if getattr(opts, name) is None:
            setattr(opts, name, small if quick else full)
    opts.publisher_counts = [int(x) for x in opts.publishers.split(",") if x]
    opts.windows = [int(x) for x in opts.window.split(",") if x]
    opts.phases = {x for x in opts.only.split(",") if x}
    if opts.phases - set(PHASES):
        p.error(f"--only: unknown phase(s) {', '.join(sorted(opts.phases - set(PHASES)))}")
    return opts


async def run(opts: argparse.Namespace, workdir: Path, report: dict[str, Any]) -> None:
    # the populated store holds --retained slots besides the publishers' own
    router = RouterProcess(workdir, REALM, router_toml=(
        f"[router.limits]\nmax_retained = {opts.retained + 100_000}"))
    data_dir = router.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    report["filesystem"] = filesystem_of(data_dir)
    report["fsync_4k"] = fsync_baseline(data_dir)
    print(f"data dir {data_dir} on {report['filesystem']['fstype']} "
          f"({report['filesystem']['device']}); fdatasync p50 "
          f"{fmt_ms(report['fsync_4k']['p50_ms'])}", flush=True)

    print(f"populating {opts.events:,} history events + {opts.retained:,} retained ...",
          end=" ", flush=True)
    pop = await populate(router.db_path, opts.events, opts.retained, opts.seed)
    report["populate"] = {k: v for k, v in pop.items() if k != "mid_pubs"}
    print(f"{pop['total_s']:.1f} s ({pop['events_per_s']:,} events/s)", flush=True)

    sub_ids: dict[str, int] = {}
    phases: dict[str, float] = {}
    t_start = time.monotonic()
    try:
        await asyncio.to_thread(router.start, 120)
        report["router_start_s"] = round(time.monotonic() - t_start, 2)
        pid = router.proc.pid
        port = router.rawsocket_port
        client = await WampClient.connect(port)
        args, _, _ = await client.call("wamp.subscription.lookup",
                                       [HISTORY_PREFIX, {"match": "prefix"}])
        if not isinstance(args[0], int):
            raise RuntimeError(f"no subscription with history for {HISTORY_PREFIX!r}: {args}")
        sub_ids[HISTORY_PREFIX] = args[0]
        # a pattern subscription inside the rule's prefix has history too
        (msg, _) = await asyncio.wait_for(client.subscribe(SPARSE_PREFIX, {"match": "prefix"}),
                                          10)
        sub_ids[SPARSE_PREFIX] = msg[2]

        if "get_events" in opts.phases:
            print("get_events (limit 100):", flush=True)
            phases["get_events"] = round(time.monotonic() - t_start, 1)
            report["get_events"] = await bench_get_events(client, pid, sub_ids, pop, opts.calls,
                                                          opts.call_budget, opts.seed)
        if "retained" in opts.phases:
            print("get_retained:", end=" ", flush=True)
            phases["retained"] = round(time.monotonic() - t_start, 1)
            meter = CpuMeter(pid)
            r = await bench_retained(client, opts.retained, opts.repeats)
            r["cpu"] = meter.stop()
            report["retained"] = r
            print(f"p50 {fmt_ms(r['p50_ms'])}, p99 {fmt_ms(r['p99_ms'])}"
                  + (f"  PROBLEMS: {r['problems']}" if r["problems"] else ""), flush=True)
        if opts.profile and {"get_events", "retained"} <= opts.phases:
            report["profiles"] = await profile_queries(client, pid, sub_ids, pop, report, opts)
        await client.close()

        if "publish" in opts.phases:
            phases["publish"] = round(time.monotonic() - t_start, 1)
            opts.output.parent.mkdir(parents=True, exist_ok=True)
            report["publish"] = await run_publish_cases(port, pid, opts)
        if "bytes" in opts.phases:
            print("bytes per stored event:", flush=True)
            phases["bytes"] = round(time.monotonic() - t_start, 1)
            runs = [(opts.bytes_events, opts.bytes_rate, False),
                    (opts.bytes_events, opts.bytes_rate, True)]
            if opts.bytes_low_rate:
                low_n = max(1, int(opts.bytes_low_rate * opts.bytes_low_seconds))
                runs.append((low_n, opts.bytes_low_rate, False))
            report["bytes"] = await bench_bytes(port, pid, router.db_path, runs, opts.seed)
        phases["end"] = round(time.monotonic() - t_start, 1)
        if router.proc.poll() is not None:
            raise RuntimeError(f"the router exited with {router.proc.returncode}")
    finally:
        code = await asyncio.to_thread(router.stop)
        report["phases_s_after_router_start"] = phases
        report["router_exit_code"] = code
        log = router.log.read_text(errors="replace").splitlines() if router.log.exists() else []
        report["router_log_problems"] = [
            line for line in log if line.startswith(("WARNING", "ERROR", "CRITICAL"))
            or "Traceback" in line][:30]
        print(f"router stopped (exit code {code})", flush=True)

    if not opts.no_diagnose and sub_ids and "get_events" in opts.phases:
        report["diagnosis"] = await diagnose_get_events(router.db_path, sub_ids, pop, opts.seed)


async def profile_queries(client: WampClient, pid: int, sub_ids: dict[str, int],
                          pop: dict[str, Any], report: dict[str, Any],
                          opts: argparse.Namespace) -> dict[str, Any]:
    print("profiling the router (py-spy) ...", flush=True)
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    profiles = {}

    async def retained_once() -> None:
        await bench_retained(client, opts.retained, 1, warmup=0)

    profiles["retained"] = await profile_router(
        pid, 5, opts.output.parent / "profile-store-retained.txt", retained_once)
    slowest = max(report["get_events"], key=lambda c: c["p99_ms"] or 0)
    rng = random.Random(opts.seed)

    async def get_events_once() -> None:
        kwargs, _ = make_query(slowest["id"], pop, rng)
        await client.call("wamp.subscription.get_events", [sub_ids[slowest["sub"]]], kwargs)

    profiles[f"get_events-{slowest['id']}"] = await profile_router(
        pid, 5, opts.output.parent / f"profile-store-{slowest['id']}.txt", get_events_once)
    return profiles


async def run_publish_cases(port: int, pid: int, opts: argparse.Namespace) -> list[dict]:
    """Every (publishers, window) case, then the generator check on the largest one."""
    results = []
    for n in opts.publisher_counts:
        for window in opts.windows:
            print(f"durable publishes, {n} publisher(s) x window {window}:", end=" ",
                  flush=True)
            largest = (n, window) == (max(opts.publisher_counts), max(opts.windows))
            profile = (opts.output.parent / f"profile-store-publish-{n}x{window}.txt"
                       if opts.profile and largest else None)
            r = await bench_publish(port, pid, n, opts.duration, window,
                                    min(1.0, opts.duration / 2), opts.client_procs,
                                    opts.seed, profile)
            results.append(r)
            print(f"{r['per_s']:,}/s, p50 {fmt_ms(r['latency']['p50_ms'])}, p99 "
                  f"{fmt_ms(r['latency']['p99_ms'])}; CPU router {r['cpu']['router_cpu_pct']}% "
                  f"(loop {r['cpu']['router_loop_cpu_pct']}%), clients "
                  f"{r['cpu']['client_cpu_pct']}%"
                  + (f"  ERRORS: {r['errors']}" if r["errors"] else ""), flush=True)
    if not opts.no_generator_check and results:
        n, window = max(opts.publisher_counts), max(opts.windows)
        print(f"generator check ({n} x {window} against a trivial server):", end=" ",
              flush=True)
        g = await generator_check(n, window, opts.duration, opts.client_procs, opts.seed)
        print(f"{g['per_s']:,}/s, client CPU {g['client_cpu_pct']}%", flush=True)
        results.append({**g, "generator_check": True})
    return results


def phase_cpu(report: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    out = [(f"get_events {r['id']}", r["cpu"]) for r in report.get("get_events", [])]
    if "cpu" in report.get("retained", {}):
        out.append(("get_retained", report["retained"]["cpu"]))
    out += [(f"publish {r['publishers']}x{r['window']}", r["cpu"])
            for r in report.get("publish", []) if "cpu" in r]
    out += [(f"bytes {'ack' if r['acknowledge'] else 'no-ack'} @ {r['rate']}/s", r["cpu"])
            for r in report.get("bytes", [])]
    return out


def print_report(report: dict[str, Any]) -> None:
    print()
    print(table(build_rows(report)))
    print()
    print("Latencies are measured at the client: CALL->RESULT, SUBSCRIBE->last retained EVENT,")
    print("PUBLISH->PUBLISHED. to files: the router's write system calls to files (wchar less")
    print("socket bytes); write_bytes: /proc/<router>/io (page-cache memory the router dirtied,")
    print("inflated by large folios on recent kernels); device: sectors written on the whole")
    print("block device meanwhile (includes other programs).")
    print("CPU % (router/clients/kernel threads/other programs) per phase: " + "; ".join(
        f"{name} {c['router_cpu_pct']}/{c['client_cpu_pct']}/{c['kernel_threads_cpu_pct']}/"
        f"{c['other_cpu_pct']}"
        for name, c in phase_cpu(report)))
    diagnosis = report.get("diagnosis", {})
    for r in report.get("get_events", []):
        d = diagnosis.get(r["id"])
        if d is None:
            continue
        slow = (r["p99_ms"] or 0) >= TARGET_GET_EVENTS_P99_MS
        print(f"{r['label']}: router p50 {fmt_ms(r['p50_ms'])}; in-process get_events "
              f"{fmt_ms(d['in_process_ms'])}; bare SQL "
              + " + ".join(fmt_ms(s["sql_ms_median"]) for s in d["statements"]))
        for s in d["statements"]:
            if slow:  # the full statement only where the target is missed
                print(f"    SQL: {s['sql']}")
                print(f"    params: {s['params']}")
            for line in s["plan"]:
                print(f"    PLAN {line}  [{fmt_ms(s['sql_ms_median'])}]")
    for r in report.get("publish", []):
        prof = r.get("profile")
        if prof:
            print(f"router while {r['publishers']} x {r['window']} publish durably (py-spy "
                  f"samples per thread: {prof['threads']['share_pct']}); event loop, self %:")
            for fn, share in prof.get("self_top", [])[:12]:
                print(f"  {share:5.1f}%  {fn}")
            print("  store writer thread, self %:")
            for fn, share in prof["threads"]["writer_self_top"]:
                print(f"  {share:5.1f}%  {fn}")
    for name, prof in report.get("profiles", {}).items():
        print(f"router hot spots while answering {name} (py-spy, event-loop thread, self %):")
        if "error" in prof:
            print(f"  {prof['error']}")
        for fn, share in prof.get("self_top", [])[:12]:
            print(f"  {share:5.1f}%  {fn}")
        print("  inclusive:")
        for fn, share in prof.get("inclusive_top", [])[:20]:
            print(f"  {share:5.1f}%  {fn}")
    busy = [name for name, cpu in phase_cpu(report) if cpu["other_cpu_pct"] > 15]
    if busy:
        print(f"WARNING: other programs used >15% of a CPU during: {', '.join(busy)}; "
              "those numbers are disturbed, rerun on a quiet machine")
    if report.get("router_log_problems"):
        print("router log warnings/errors:")
        for line in report["router_log_problems"][:10]:
            print(f"  {line}")
    print(f"total {report['total_s']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    import aiosqlite

    info = machine()
    info.update(sqlite_version=sqlite3.sqlite_version,
                aiosqlite=getattr(aiosqlite, "__version__", None),
                msgpack=".".join(map(str, msgpack.version)))
    print(f"machine: {info['nproc']} CPUs, {info['cpu_model']}, Python {info['python']}, "
          f"SQLite {info['sqlite_version']}", flush=True)
    report: dict[str, Any] = {
        "benchmark": "store", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info,
        "source": source_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "targets": {"get_events_p99_ms": TARGET_GET_EVENTS_P99_MS,
                    "get_retained_p99_ms": TARGET_RETAINED_MS},
    }
    started = time.monotonic()
    failed: BaseException | None = None
    if opts.dir is not None:
        opts.dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="cairn-bench-store-", dir=opts.dir)
    try:
        asyncio.run(run(opts, Path(tmp), report))
    except (Exception, KeyboardInterrupt) as e:
        failed = e
        report["error"] = f"{type(e).__name__}: {e}"
    finally:
        if opts.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report["total_s"] = round(time.monotonic() - started, 1)
    if "populate" in report:
        print_report(report)
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"details: {opts.output}")
    if failed is not None:
        print(f"benchmark failed: {report['error']}", file=sys.stderr)
        if not isinstance(failed, KeyboardInterrupt):
            raise failed
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
