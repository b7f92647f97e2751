"""Fleet-scale Spark ingest benchmark: 1,000 gateways' landed batches (10M rows by default),
``cairn spark ingest`` on ``local[2]`` and on a 2-worker standalone cluster, each against
the floor measured in the same session: a bare ``spark.read.json(the same files)
.write.parquet(...)`` (same explicit schema, no verification, dedupe or re-basing). Then
one new day into tables holding 1 and 30 days, and the fleet's next day into the table of
the main ingest and into one of 1 day (the checks against the table must not grow with it),
and streaming: every gateway lands a batch a minute, a streaming run (``availableNow``, as a
timer would start it) follows each minute; the time until the rows are queryable.

Run from the repository root (not part of ``make test``)::

    .venv/bin/python -m bench.spark_fleet [--rows 10000000] [--repeats 3] [--dir DIR]

With ``--dir`` the landing data is kept there and re-used by a run with the same sizes.

Landing data is what the uploader writes (``sync.uploader.build_batch``, i.e.
``formats.batch.encode_rows`` + manifest): per gateway 20 sensors, one row per 0.5 s,
batches of ``--batch-events`` rows. One gateway in ten starts with an unsynchronized
clock (1970 until a synchronized step: its first 30% of rows are re-based); one in twenty
has a batch that never landed and a loss record (50 rows dropped on the gateway); one in
twenty-five re-sent an overlapping batch under other bounds (duplicates to drop).

Each measurement runs in a driver process of its own per master (an untimed warm-up ingest
first: a fresh JVM's JIT), ``--repeats`` times, order alternated; medians are reported. The
machine is shared: the load average is recorded with every run. Table on stdout, details
in ``bench/results/spark_fleet.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.spark import machine, table, tree_bytes
from cairn.formats.batch import manifest_name
from cairn.sync.uploader import build_batch

SCHEMA = 1  # batches of schema 1, as measured before schema 2 (bench.batch_format compares)

RESULTS = Path(__file__).resolve().parent / "results" / "spark_fleet.json"
T0_MS = 1_795_000_000_000  # 2026-11-18
DAY_MS = 86_400_000
STEP_MS = 500  # one row per 0.5 s per gateway: 20 sensors at one reading per 10 s
WARM_UP_ROWS = 200_000
LANDINGS = ("landing", "warm-up", "day-00", "days-00-29", "day-30", "fleet-day")


# -- landing data -------------------------------------------------------------------------

def fleet_row(gw: str, seq: int, wall_ms: int, boot: str, boottime_ns: int, synced: bool,
         sensor: int) -> dict[str, Any]:
    topic = f"sensor.{gw}-s{sensor:02d}"
    return {"seq": seq, "publication": seq * 7919 % 2**53, "realm": "realm1", "topic": topic,
            "wall_ms": wall_ms, "boot_id": boot, "boottime_ns": boottime_ns,
            "clock_synced": synced, "authid": "modbus-1", "authrole": "device",
            "audience": None, "details": {"topic": topic}, "args": [],
            "kwargs": {"temperature": round(15 + (seq * 37 % 200) / 10, 1),
                       "humidity": round(40 + (seq * 53 % 500) / 10, 1)}}


def _gateway(args: tuple[Path, int, int, int, int, int]) -> tuple[int, int]:
    """Land one gateway's batches for one day; returns (unique rows landed, batches)."""
    landing, g, rows, batch_events, day, seq_base = args
    gw = f"gw-{g:04d}"
    boot = f"boot-{gw}-{day}"
    start_ms = T0_MS + day * DAY_MS + (g % 60) * 60_000
    unsynced_until = int(rows * 0.3) if g % 10 == 0 and day == 0 else 0
    anchors = [{"id": day * 2 + 1, "reason": "start", "boot_id": boot, "boottime_ns": 10**9,
                "wall_ns": (start_ms if not unsynced_until else 1000) * 10**6,
                "offset_before_ns": None, "clock_synced": not unsynced_until,
                "after_seq": seq_base}]
    if unsynced_until:  # NTP steps the clock from 1970 to the truth: a synced anchor
        b = 10**9 + unsynced_until * STEP_MS * 10**6
        anchors.append({"id": day * 2 + 2, "reason": "step", "boot_id": boot,
                        "boottime_ns": b, "wall_ns": start_ms * 10**6 + b - 10**9,
                        "offset_before_ns": 0, "clock_synced": True,
                        "after_seq": seq_base + unsynced_until})
    all_rows = []
    for i in range(rows):
        b = 10**9 + i * STEP_MS * 10**6
        synced = i >= unsynced_until
        wall = start_ms + i * STEP_MS if synced else 1000 + i * STEP_MS
        all_rows.append(fleet_row(gw, seq_base + i + 1, wall, boot, b, synced, i % 20))
    return _land_batches(landing, gw, g, all_rows, anchors, batch_events, seq_base)


def _land_batches(landing: Path, gw: str, g: int, rows: list[dict[str, Any]],
                  anchors: list[dict[str, Any]], batch_events: int,
                  seq_base: int) -> tuple[int, int]:
    chunks = [rows[i:i + batch_events] for i in range(0, len(rows), batch_events)]
    gaps: list[dict[str, Any]] = []
    if g % 20 == 5 and len(chunks) >= 4:
        chunks[2] = []  # never landed (the uploader's sink lost it)
        lost = chunks[3][10:60]  # dropped on the gateway, with its loss record
        chunks[3] = chunks[3][:10] + chunks[3][60:]
        gaps.append({"id": 1, "realm": "realm1", "rule": 0, "first_seq": lost[0]["seq"],
                     "last_seq": lost[-1]["seq"], "count": len(lost),
                     "reason": "max_events", "wall_ms": lost[0]["wall_ms"]})
    after, landed, batches = seq_base, set(), 0
    for chunk in chunks:
        if chunk:
            _write(landing, build_batch(gw, chunk, after, anchors, gaps, schema=SCHEMA))
            landed.update(r["seq"] for r in chunk)
            batches += 1
            after = chunk[-1]["seq"]
        else:
            after += batch_events
    if g % 25 == 7 and len(chunks) >= 2:  # re-sent: half of batch 1 and half of batch 2
        half = batch_events // 2
        resent = chunks[0][half:] + chunks[1][:half]
        _write(landing, build_batch(gw, resent, resent[0]["seq"] - 1, anchors, gaps, schema=SCHEMA))
        batches += 1
    return len(landed), batches


def _write(landing: Path, batch: Any) -> None:
    path = landing / batch.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(batch.data)
    (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))


def generate(landing: Path, rows: int, gateways: int, batch_events: int, day: int = 0,
             seq_base: int = 0) -> tuple[int, int]:
    """Land ``rows`` rows across ``gateways``; returns (unique rows, batch files)."""
    per = rows // gateways
    jobs = [(landing, g, per, batch_events, day, seq_base) for g in range(gateways)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        done = pool.map(_gateway, jobs, chunksize=max(1, gateways // 50))
    return sum(u for u, _ in done), sum(b for _, b in done)


# -- one driver: the measurements of one master --------------------------------------------

def _load() -> float:
    return round(os.getloadavg()[0], 1)


def _floor(spark: Any, landing: Path, out: Path) -> dict[str, Any]:
    from cairn.central import spark as jobs

    started = time.perf_counter()
    (spark.read.schema(jobs.EVENT_SCHEMA).json(str(landing / "*" / "*.jsonl.gz"))
     .write.mode("overwrite").parquet(str(out)))
    seconds = time.perf_counter() - started
    rows = spark.read.parquet(str(out)).count()
    shutil.rmtree(out, ignore_errors=True)
    return {"seconds": round(seconds, 1), "rows": rows, "load": _load()}


def _ingest(spark: Any, landing: Path, tbl: Path, keep: bool = False) -> dict[str, Any]:
    from cairn.central import spark as jobs

    shutil.rmtree(tbl, ignore_errors=True)
    stats = jobs.ingest(spark, str(landing), str(tbl))
    result = {"seconds": round(stats.seconds, 1), "rows_read": stats.rows_read,
              "rows_added": stats.rows_added, "estimated": stats.rows_estimated,
              "batches": stats.ingested, "one_pass": stats.one_pass,
              "quarantined": len(stats.quarantined), "load": _load(),
              "phases_s": {k: round(v, 1) for k, v in stats.phases.items()}}
    if not keep:
        shutil.rmtree(tbl, ignore_errors=True)
    return result


def _days(spark: Any, work: Path, repeats: int) -> dict[str, Any]:
    """One new day into a table of 1 day and one of 30 (built untimed, then copied); then
    the fleet's next day into the fleet's table (the last ingest's, kept) and into the table
    of 1 day."""
    from cairn.central import spark as jobs

    bases = {"1": work / "days-table-1", "30": work / "days-table-30", "fleet": work / "table"}
    for held, landing in (("1", "day-00"), ("30", "days-00-29")):
        if not bases[held].exists():
            jobs.ingest(spark, str(work / landing), str(bases[held]))
    runs: dict[str, list[dict[str, Any]]] = {}
    for landing, pair in (("day-30", ("1", "30")), ("fleet-day", ("1", "fleet"))):
        for r in range(repeats):
            for held in pair if r % 2 == 0 else pair[::-1]:
                tbl = work / "days-run"
                shutil.rmtree(tbl, ignore_errors=True)
                shutil.copytree(bases[held], tbl)
                stats = jobs.ingest(spark, str(work / landing), str(tbl))
                key = held if landing == "day-30" else f"{held}, next fleet day"
                runs.setdefault(key, []).append({
                    "seconds": round(stats.seconds, 1), "rows": stats.rows_added,
                    "load": _load(), "phases_s": {k: round(v, 1) for k, v
                                                  in stats.phases.items()}})
    shutil.rmtree(bases["fleet"], ignore_errors=True)
    return runs


MINUTE_ROWS = 60_000 // STEP_MS  # one gateway's rows per minute


def _land_minute(landing: Path, gateways: int, minute: int) -> int:
    """Each gateway lands its batch of one minute (what an uploader shipping every minute
    writes); returns the rows landed."""
    first = minute * MINUTE_ROWS
    for g in range(gateways):
        gw, boot = f"gw-{g:04d}", f"boot-gw-{g:04d}-s"
        rows = [fleet_row(gw, first + i + 1, T0_MS + (first + i) * STEP_MS, boot,
                     10**9 + (first + i) * STEP_MS * 10**6, True, i % 20)
                for i in range(MINUTE_ROWS)]
        anchor = {"id": 1, "reason": "start", "boot_id": boot, "boottime_ns": 10**9,
                  "wall_ns": T0_MS * 10**6, "offset_before_ns": None, "clock_synced": True,
                  "after_seq": 0}
        _write(landing, build_batch(gw, rows, first, [anchor], [], schema=SCHEMA))
    return gateways * MINUTE_ROWS


def _streaming(spark: Any, work: Path, gateways: int, minutes: int) -> list[dict[str, Any]]:
    """``minutes`` rounds of: every gateway lands a batch, then a streaming run (what a
    timer starts each minute) makes them queryable. Time from the last batch landing to
    its rows being counted in the table."""
    from pyspark.sql import functions as F

    from cairn.central import spark as jobs

    base = work / "streaming"
    shutil.rmtree(base, ignore_errors=True)
    landing, table = base / "landing", base / "table"
    rounds = []
    for minute in range(minutes):
        landed = _land_minute(landing, gateways, minute)
        started = time.perf_counter()
        stats = jobs.ingest_stream(spark, str(landing), str(table), str(base / "checkpoint"),
                                   max_batches=gateways)
        first, last = minute * MINUTE_ROWS + 1, (minute + 1) * MINUTE_ROWS
        queryable = (spark.read.parquet(str(table)).where(F.col("seq").between(first, last))
                     .count())
        rounds.append({"minute": minute, "landed_rows": landed, "queryable_rows": queryable,
                       "seconds": round(time.perf_counter() - started, 1),
                       "micro_batches": stats.micro_batches, "load": _load(),
                       "phases_s": {k: round(v, 1) for k, v in stats.phases.items()}})
        print(f"streaming minute {minute}: {rounds[-1]}", file=sys.stderr)
    return rounds


def drive(opts: argparse.Namespace) -> int:
    """The measurements in this process (a driver of ``opts.master``); JSON on stdout."""
    from cairn.central import spark as jobs

    conf = {"spark.driver.memory": opts.driver_memory, "spark.ui.enabled": "false",
            **dict(c.split("=", 1) for c in opts.conf or [])}
    spark = jobs.session(opts.master, conf, app="cairn-bench-fleet")
    work = Path(opts.work)
    jobs.ingest(spark, str(work / "warm-up"), str(work / f"warm-up-{os.getpid()}"))
    out: dict[str, Any] = {"ingest": [], "floor": []}
    for r in range(opts.repeats):
        order = ("ingest", "floor") if r % 2 == 0 else ("floor", "ingest")
        for what in order:
            if what == "ingest":
                last = r == opts.repeats - 1  # the fleet table, for the next day's ingest
                out["ingest"].append(_ingest(spark, work / "landing", work / "table",
                                             keep=opts.days and last))
            else:
                out["floor"].append(_floor(spark, work / "landing", work / "floor"))
            print(f"{opts.master} {what}: {out[what][-1]}", file=sys.stderr)
    if opts.days:
        out["days"] = _days(spark, work, opts.repeats)
    if opts.streaming_minutes:
        out["streaming"] = _streaming(spark, work, opts.gateways, opts.streaming_minutes)
    spark.stop()
    print(json.dumps(out))
    return 0


# -- the whole benchmark -------------------------------------------------------------------

def _run_driver(master: str, work: Path, opts: argparse.Namespace, conf: list[str],
                days: bool) -> dict[str, Any]:
    args = [sys.executable, "-m", "bench.spark_fleet", "--drive", "--master", master,
            "--work", str(work), "--repeats", str(opts.repeats),
            "--driver-memory", opts.driver_memory, "--gateways", str(opts.gateways),
            "--streaming-minutes", str(opts.streaming_minutes if days else 0),
            *(["--days"] if days else [])]
    for c in conf:
        args += ["--conf", c]
    done = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise RuntimeError(f"the {master} driver failed ({done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median_rate(runs: list[dict[str, Any]], rows: int) -> tuple[float, float]:
    seconds = statistics.median(r["seconds"] for r in runs)
    return seconds, rows / seconds


def _prepare_landing(work: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """Land everything (once: a ``--dir`` that has it keeps it for the next run)."""
    done = work / "landed.json"
    if done.exists():
        landed = json.loads(done.read_text())
        if landed["settings"] == _landing_settings(opts):
            return landed["landed"]
    for name in LANDINGS:
        shutil.rmtree(work / name, ignore_errors=True)
    started = time.perf_counter()
    unique, files = generate(work / "landing", opts.rows, opts.gateways, opts.batch_events)
    generate_s = time.perf_counter() - started
    generate(work / "warm-up", WARM_UP_ROWS, 20, opts.batch_events)
    per_day = opts.day_rows // opts.day_gateways
    for d in range(31):  # day 0 alone, days 0..29 together (the same files), day 30
        where = [work / "days-00-29"] if d < 30 else [work / "day-30"]
        for landing in where + ([work / "day-00"] if d == 0 else []):
            generate(landing, opts.day_rows, opts.day_gateways, opts.batch_events, day=d,
                     seq_base=d * per_day)
    # the fleet's next day: seqs after those of the main landing
    generate(work / "fleet-day", opts.day_rows, opts.day_gateways, opts.batch_events, day=1,
             seq_base=opts.rows // opts.gateways)
    landed = {"unique_rows": unique, "batches": files, "generate_s": round(generate_s, 1),
              "landed_bytes": tree_bytes(work / "landing")}
    done.write_text(json.dumps({"settings": _landing_settings(opts), "landed": landed}))
    return landed


def _landing_settings(opts: argparse.Namespace) -> dict[str, int]:
    return {k: getattr(opts, k) for k in ("rows", "gateways", "batch_events", "day_rows",
                                          "day_gateways")}


def main(argv: list[str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    if opts.drive:
        return drive(opts)
    from harness import spark_cluster

    work = Path(opts.dir or tempfile.mkdtemp(prefix="cairn-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    landed = _prepare_landing(work, opts)
    print(f"landed {landed}", file=sys.stderr)
    results = {}
    if not opts.no_local:
        results["local[2]"] = _run_driver("local[2]", work, opts, [], days=True)
    if not opts.no_cluster:
        with spark_cluster.running(work / "cluster", workers=2, cores=1,
                                   memory=opts.worker_memory) as cluster:
            conf = [f"{k}={v}" for k, v in cluster.conf().items()]
            results["cluster"] = _run_driver(cluster.master, work, opts, conf, days=False)
    _report(opts, landed, results)
    if not opts.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _report(opts: argparse.Namespace, landed: dict[str, Any], results: dict[str, Any]) -> None:
    rows = []
    summary: dict[str, Any] = {}
    for master, res in results.items():
        ingest_s, ingest_rate = _median_rate(res["ingest"], landed["unique_rows"])
        floor_s, floor_rate = _median_rate(res["floor"], landed["unique_rows"])
        ok = all(r["rows_added"] == landed["unique_rows"] and not r["quarantined"]
                 for r in res["ingest"])
        summary[master] = {"ingest_s": ingest_s, "floor_s": floor_s,
                           "ingest_rows_per_s": round(ingest_rate),
                           "floor_rows_per_s": round(floor_rate),
                           "ratio": round(ingest_rate / floor_rate, 2), "ok": ok}
        rows.append([master, f"{ingest_s:.1f}", f"{ingest_rate:,.0f}", f"{floor_s:.1f}",
                     f"{floor_rate:,.0f}", f"{ingest_rate / floor_rate:.2f}",
                     "ok" if ok else "FAILED"])
    print(f"{landed['unique_rows']:,} rows from {opts.gateways} gateways in "
          f"{landed['batches']:,} batches ({landed['landed_bytes'] / 1e6:,.0f} MB gzip); "
          f"medians of {opts.repeats} runs on a shared {os.cpu_count()}-CPU machine")
    print(table(["master", "ingest s", "rows/s", "floor s", "floor rows/s", "ingest/floor",
                 "check"], rows))
    local = results.get("local[2]", {})
    days = local.get("days")
    if days:
        median = {k: statistics.median(r["seconds"] for r in runs) for k, runs in days.items()}
        d1, d30 = median["1"], median["30"]
        f1, fleet = median["1, next fleet day"], median["fleet, next fleet day"]
        summary["new_day"] = {"table_1_day_s": d1, "table_30_days_s": d30,
                              "ratio": round(d30 / d1, 2), "next_fleet_day": {
                                  "table_1_day_s": f1, "fleet_table_s": fleet,
                                  "ratio": round(fleet / f1, 2)}}
        print(f"one new day ({opts.day_rows:,} rows) into a table of 1 day: {d1:.1f} s, "
              f"of 30 days ({30 * opts.day_rows:,} rows): {d30:.1f} s (x{d30 / d1:.2f}); "
              f"the fleet's next day into a table of 1 day: {f1:.1f} s, into the fleet's "
              f"({landed['unique_rows']:,} rows): {fleet:.1f} s (x{fleet / f1:.2f}); "
              "local[2], medians")
    streaming = local.get("streaming")
    if streaming:
        after = [r["seconds"] for r in streaming]
        summary["streaming"] = {"minutes": len(after), "median_s": statistics.median(after),
                                "max_s": max(after), "all_queryable": all(
                                    r["queryable_rows"] == r["landed_rows"] for r in streaming)}
        print(f"streaming, {opts.gateways:,} gateways landing a batch a minute: queryable "
              f"{statistics.median(after):.1f} s after the minute's batches landed (median "
              f"of {len(after)} minutes, max {max(after):.1f} s; add the timer's period)")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps({
        "benchmark": "cairn spark ingest, fleet", "machine": machine(), "landed": landed,
        "settings": {k: v for k, v in vars(opts).items() if k != "output"} | {
            "output": str(opts.output)},
        "summary": summary, "runs": results}, indent=2, default=str) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--gateways", type=int, default=1000)
    p.add_argument("--batch-events", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--day-rows", type=int, default=100_000, help="rows per day (days test)")
    p.add_argument("--day-gateways", type=int, default=100)
    p.add_argument("--streaming-minutes", type=int, default=10,
                   help="minutes of batches for the streaming test (local[2]; 0: none)")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--worker-memory", default="3g")
    p.add_argument("--no-cluster", action="store_true", help="local[2] only")
    p.add_argument("--no-local", action="store_true",
                   help="the cluster only (no new-day or streaming runs: those are local[2]'s)")
    p.add_argument("--dir", help="work here and keep it (default: a temporary directory)")
    p.add_argument("--output", type=Path, default=RESULTS)
    # internal: one driver's measurements
    p.add_argument("--drive", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--conf", action="append", help=argparse.SUPPRESS)
    p.add_argument("--days", action="store_true", help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    sys.exit(main())
