"""Spark ingest benchmark: rows/s of ``cairn spark ingest`` on ``local[2]`` for 1M and 10M
rows, and how the time grows from one to the other.

Run from the repository root::

    .venv/bin/python -m bench.spark [--rows 1000000,10000000] [--master local[2]]

What it does:

1. **generate** (timed separately, not part of the result): landing batches exactly as the
   uploader writes them (``sync.uploader.build_batch``: gzip JSON Lines + manifest) for
   ``--gateways`` gateways, ``--batch-events`` rows per batch, 100 sensor topics per gateway
   at 10 events/s of wall time, kwargs ``{temperature, humidity}``. One gateway in ten
   spends its first hour with an unsynchronized clock (start anchor, then a synchronized
   step), so the time correction has rows to re-base. Two processes generate in parallel.
2. **ingest**: one Spark session (``--master``, ``spark.driver.memory`` 4g) and an untimed
   200,000-row warm-up ingest (a fresh JVM runs the first few hundred thousand rows at
   about half speed while the JIT compiles), then for each size a fresh table:
   ``central.spark.ingest`` (list + read manifests, verify every batch on the executors:
   sha256, gunzip, line count; read JSON; anti-join against the table; re-base; write
   Parquet partitioned by date). Wall time, rows/s, Parquet bytes, seconds per step.
3. **re-run** the same ingest (everything already ingested: the idempotent no-op) and, for
   the smallest size, **re-land** all its batches under other names (so every row is a
   duplicate the anti-join must drop).

The table goes to stdout, the details to ``bench/results/spark.json``. The default run
takes about five minutes on two cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pubsub import cpu_model
from cairn.base.clock_readings import rfc3339
from cairn.formats.batch import encode_rows, manifest_name
from cairn.sync.uploader import build_batch

RESULTS = Path(__file__).resolve().parent / "results" / "spark.json"
T0_MS = 1_795_000_000_000
HOUR_NS = 3600 * 10**9
WARM_UP_ROWS = 200_000  # the JIT needs a few hundred thousand rows to settle


LINE = ('{"gateway_id":"%s","timestamp":"%s.%03dZ","seq":%d,"publication":%d,'
        '"realm":"realm1","topic":"%s","wall_ms":%d,"boot_id":"%s","boottime_ns":%d,'
        '"clock_synced":%s,"authid":"modbus-1","authrole":"device","audience":null,'
        '"details":{"topic":"%s"},"args":[],"kwargs":{"temperature":%r,"humidity":%r}}')


def _gateway_batches(args: tuple[Path, str, int, int, int, bool, int]) -> int:
    """Write all batches of one gateway; returns bytes written. Lines come from a template
    (3x faster than encode_rows); :func:`check_template` proves they are the same bytes."""
    landing, gateway, rows, batch_events, seed, unsynced_hour, name_offset = args
    rng = random.Random(seed)
    boot = f"boot-{gateway}"
    skew_ns = -T0_MS * 10**6 + 10**9 if unsynced_hour else 0  # 1970 until the step
    step_b = 5 * 10**9 + HOUR_NS
    anchors = [{"id": 1, "reason": "start", "boot_id": boot, "boottime_ns": 5 * 10**9,
                "wall_ns": T0_MS * 10**6 + 5 * 10**9 + skew_ns, "offset_before_ns": None,
                "clock_synced": not unsynced_hour, "after_seq": 0}]
    if unsynced_hour:
        anchors.append({"id": 2, "reason": "step", "boot_id": boot, "boottime_ns": step_b,
                        "wall_ns": T0_MS * 10**6 + step_b, "offset_before_ns": T0_MS * 10**6
                        + skew_ns, "clock_synced": True, "after_seq": 36_000})
    written = 0
    after = 0
    for start in range(0, rows, batch_events):
        seqs, lines = [], []
        second, prefix = None, ""
        for i in range(start, min(rows, start + batch_events)):
            b = 5 * 10**9 + i * 100_000_000 + rng.randrange(100_000_000)
            synced = not unsynced_hour or b >= step_b
            wall_ms = (T0_MS * 10**6 + b + (0 if synced else skew_ns)) // 10**6
            if wall_ms // 1000 != second:
                second = wall_ms // 1000
                prefix = rfc3339(second * 1000)[:-5]
            topic = f"sensor.dev{rng.randrange(100):04d}"
            lines.append(LINE % (
                gateway, prefix, wall_ms % 1000, i + 1, rng.getrandbits(53) or 1, topic,
                wall_ms, boot, b, "true" if synced else "false", topic,
                round(rng.uniform(-5, 35), 1), round(rng.uniform(20, 95), 1)))
            seqs.append({"seq": i + 1, "boot_id": boot})
        lines.append("")
        data = gzip.compress("\n".join(lines).encode(), compresslevel=6, mtime=0)
        result = build_batch(gateway, seqs, after, anchors, [], data, schema=1)
        after = seqs[-1]["seq"]
        name = result.name
        if name_offset:  # the same rows under another name (a re-sent batch)
            name = name.replace(".jsonl.gz", f"-{name_offset}.jsonl.gz")
            result.manifest["file"] = name
        path = landing / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(result.data)
        (landing / manifest_name(name)).write_text(json.dumps(result.manifest, indent=1))
        written += len(result.data)
    return written


def check_template() -> None:
    """The template's batch is byte for byte what the uploader encodes from the same rows."""
    with tempfile.TemporaryDirectory() as d:
        _gateway_batches((Path(d), "gw-x", 50, 50, 1, True, 0))
        data = next(Path(d).glob("gw-x/*.jsonl.gz")).read_bytes()
    rows = [json.loads(line) for line in gzip.decompress(data).splitlines()]
    for row in rows:
        del row["gateway_id"], row["timestamp"]
    if encode_rows("gw-x", rows) != data:
        raise AssertionError("the generator's lines differ from formats.batch.encode_rows")


def generate(landing: Path, rows: int, gateways: int, batch_events: int,
             name_offset: int = 0) -> int:
    per = [rows // gateways + (1 if g < rows % gateways else 0) for g in range(gateways)]
    jobs = [(landing, f"gw-{g:03d}", n, batch_events, 1000 + g, g % 10 == 0, name_offset)
            for g, n in enumerate(per) if n]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return sum(pool.map(_gateway_batches, jobs))


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()
               and not p.name.endswith(".crc"))


def machine() -> dict[str, Any]:
    model = cpu_model()
    import pyspark

    # others may be running things on the machine: say how busy it was
    return {"cpu": model, "cpus": os.cpu_count(), "load_average_1_5_15": os.getloadavg(),
            "python": sys.version.split()[0],
            "pyspark": pyspark.__version__, "platform": platform.platform()}


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(x).rjust(w) if i else str(x).ljust(w)
                       for i, (x, w) in enumerate(zip(row, widths, strict=True)))
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000000,10000000",
                        help="comma-separated sizes (default 1000000,10000000)")
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--batch-events", type=int, default=10_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    opts = parser.parse_args(argv)
    sizes = [int(x) for x in opts.rows.split(",")]

    from cairn.central import spark as jobs

    check_template()
    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-spark-", dir=opts.dir))
    results: list[dict[str, Any]] = []
    try:
        started = time.perf_counter()
        spark = jobs.session(opts.master, {"spark.driver.memory": opts.driver_memory,
                                           "spark.ui.enabled": "false"}, app="cairn-bench")
        startup_s = time.perf_counter() - started
        generate(work / "warm-up", WARM_UP_ROWS, 2, opts.batch_events)  # JIT, Python workers
        warm_up = jobs.ingest(spark, str(work / "warm-up"), str(work / "warm-up-table"))
        for n in sizes:
            landing, tbl = work / f"landing-{n}", work / f"table-{n}"
            started = time.perf_counter()
            landed = generate(landing, n, opts.gateways, opts.batch_events)
            generate_s = time.perf_counter() - started
            stats = jobs.ingest(spark, str(landing), str(tbl))
            ok = stats.rows_added == n and not stats.quarantined
            estimated = stats.rows_estimated
            rerun = jobs.ingest(spark, str(landing), str(tbl))
            ok = ok and rerun.rows_added == 0 and rerun.already == stats.ingested
            result = {
                "rows": n, "batches": stats.ingested, "landed_bytes": landed,
                "generate_s": round(generate_s, 1), "ingest_s": round(stats.seconds, 1),
                "rows_per_s": round(n / stats.seconds), "estimated_rows": estimated,
                "parquet_bytes": tree_bytes(tbl), "rerun_s": round(rerun.seconds, 1),
                "phases_s": {k: round(v, 1) for k, v in stats.phases.items()}, "ok": ok}
            if n == min(sizes):  # every row again, under new names: all duplicates
                generate(landing, n, opts.gateways, opts.batch_events, name_offset=1)
                dup = jobs.ingest(spark, str(landing), str(tbl))
                result.update(duplicates_s=round(dup.seconds, 1),
                              duplicates_rows_per_s=round(dup.rows_read / dup.seconds),
                              duplicates_phases_s={k: round(v, 1)
                                                   for k, v in dup.phases.items()})
                result["ok"] = ok and dup.rows_added == 0 and dup.duplicates == n
            results.append(result)
            shutil.rmtree(landing, ignore_errors=True)
            print(f"{n:,} rows: {stats.summary()}", file=sys.stderr)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = [[f"{r['rows']:,}", f"{r['batches']:,}", f"{r['landed_bytes'] / 1e6:,.0f}",
             f"{r['ingest_s']:.1f}", f"{r['rows_per_s']:,}",
             f"{r['parquet_bytes'] / 1e6:,.0f}", f"{r['rerun_s']:.1f}",
             f"{r['duplicates_s']:.1f}" if "duplicates_s" in r else "-",
             "ok" if r["ok"] else "FAILED"] for r in results]
    print(f"Spark ingest on {opts.master}; not counted: session start {startup_s:.1f} s, a "
          f"{WARM_UP_ROWS:,}-row warm-up ingest {warm_up.seconds:.1f} s (a fresh JVM: "
          f"{WARM_UP_ROWS / warm_up.seconds:,.0f} rows/s)")
    print(table(["rows", "batches", "landed MB", "ingest s", "rows/s", "parquet MB",
                 "re-run s", "all-dup s", "check"], rows))
    for r in results:
        print(f"{r['rows']:,} rows, seconds per step: "
              + ", ".join(f"{k} {v}" for k, v in r["phases_s"].items()))
    print(f"machine load (1 min average): {load_at_start[0]:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end, {os.cpu_count()} CPUs")
    growth = None
    if len(results) >= 2:
        a, b = results[0], results[-1]
        growth = {"rows_ratio": b["rows"] / a["rows"],
                  "time_ratio": round(b["ingest_s"] / a["ingest_s"], 2),
                  "marginal_rows_per_s": round((b["rows"] - a["rows"])
                                               / (b["ingest_s"] - a["ingest_s"]))}
        print(f"{growth['rows_ratio']:.0f}x the rows took {growth['time_ratio']}x the time; "
              f"marginal rate {growth['marginal_rows_per_s']:,} rows/s (fixed cost per run "
              f"~{a['ingest_s'] - a['rows'] / growth['marginal_rows_per_s']:.1f} s)")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps({
        "benchmark": "cairn spark ingest", "machine": machine(),
        "load_average_at_start": load_at_start,
        "settings": {"master": opts.master, "driver_memory": opts.driver_memory,
                     "gateways": opts.gateways, "batch_events": opts.batch_events},
        "session_start_s": round(startup_s, 1), "warm_up_rows": WARM_UP_ROWS,
        "warm_up_s": round(warm_up.seconds, 1), "results": results, "growth": growth,
    }, indent=2) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
