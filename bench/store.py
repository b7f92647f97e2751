"""Store benchmark for the Cairn router: durable publishes, history queries, retained
events and bytes written per stored event, all measured through the real router process.

Run from the repository root::

    .venv/bin/python -m bench.store [--quick] [--events 1000000] [--profile]
    .venv/bin/python -m bench.store --only publish,bytes   # the durable part only

What it does, in order:

1. **populate** (not through the router, timed separately): a fresh database in a temporary
   directory is filled with ``gateway.store.Store`` itself (``Store.open``, ``append``,
   ``flush``, ``close``; seqs from ``core.Sequence``): ``--events`` history rows on
   ``sensor.dev0000`` .. ``sensor.dev0099`` (each topic ~1 %) and, every 5,000th,
   ``sensor.door.front``; 10 events/s of wall time (so 1,000,000 events span ~28 hours),
   kwargs ``{temperature, humidity}``, rule 0; and ``--retained`` retained-only rows on
   ``state.dev00000`` .. (no history rule covers ``state``).
2. the router (``python -m cairn.app.cli router``, via ``harness.process.RouterProcess``)
   starts on that data dir with one realm whose history rule is prefix ``sensor`` (its
   ``max_events`` is raised so that pruning never deletes rows during the run). Every
   measurement below goes through it, with lean RawSocket/msgpack WAMP clients in this
   process (:class:`bench.lean_wamp.WampClient`), over 127.0.0.1 only.
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
   (:class:`bench.ack_publishers.AckPublisher`: pre-serialized msgpack frames, only the
   request id changes) spread over ``--client-procs`` processes; the generator check runs
   the largest case against a trivial server that answers PUBLISHED at once, to show the
   clients' ceiling.
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
   ``gateway.core.history.history_query`` on a ``Store`` opened on the same file, recording the
   SQL it runs, so the report can show ``EXPLAIN QUERY PLAN`` and the bare SQL time next to the
   router's round trip.

The parts: :mod:`bench.store_data` (1), :mod:`bench.history_queries` (3, 7),
:mod:`bench.ack_publishers` (5), :mod:`bench.measure` (the readings), this module (2, 4, 6,
the report). The table goes to stdout, the details (machine, settings, plans, router log
problems) to ``bench/results/store.json``. ``--profile`` samples the router with py-spy
while it answers retained subscriptions (and the slowest get_events case) and during the
largest durable publish case (samples per thread: event loop, store writer), and lists its
hot spots.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from bench.ack_publishers import bench_publish, generator_check
from bench.history_queries import bench_get_events, diagnose_get_events, make_query
from bench.lean_wamp import WampClient
from bench.measure import (
    CpuMeter,
    block_device_stat,
    db_files_size,
    device_sectors_written,
    file_bytes,
    filesystem_of,
    fmt_ms,
    fsync_baseline,
    latency_summary,
    proc_io,
    rounded,
)
from bench.pubsub import (
    Profiler,
    machine,
    source_version,
)
from bench.store_data import (
    DEVICES,
    HISTORY_PREFIX,
    RETAINED_PREFIX,
    SPARSE_PREFIX,
    device_topic,
    populate,
    reading,
)
from cairn.gateway.shell.metrics import quantile
from harness.config import NO_READ_BUDGET, history_rule, open_realm
from harness.process import RouterProcess

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# max_events above the default (1,000,000): the minute's pruning never deletes rows mid-run
REALM = open_realm(history=[history_rule("sensor", max_events=100_000_000)])

TARGET_GET_EVENTS_P99_MS = 20.0
TARGET_RETAINED_MS = 100.0
TARGET_DURABLE_PER_S = 20_000  # with 16 publishers (issue 9)
PHASES = ("get_events", "retained", "publish", "bytes")

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
            "first_event_p50_ms": rounded(quantile([v / 1e6 for v in first_event_lat], 0.5)),
            "problems": problems[:5], "ok": not problems}


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
        f"[router.limits]\nmax_retained = {opts.retained + 100_000}\n{NO_READ_BUDGET}"))
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
        log = router.log_lines()
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
