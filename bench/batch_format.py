"""Batch format benchmark: bytes on the wire per reading, schema 1 (gzip JSON Lines) against
schema 2 (the lean bzip2 lines), and the Spark ingest rate of each on the same rows.

Run from the repository root (not part of ``make test``)::

    .venv/bin/python -m bench.batch_format [--rows 200000] [--repeats 2]

1. **wire**: realistic temperature/humidity readings (``harness.readings``: 20 and 200
   sensors polled every 10 s) as the uploader batches them (``sync.uploader.build_batch``,
   data file and manifest, HTTP headers not counted): a backlog drained in batches of
   10,000 rows, and a link that is up, one batch a minute. Also the encoder's CPU time.
2. **ingest**: ``--rows`` rows (20 gateways of 20 sensors, batches of 10,000 rows, one
   gateway in ten with a clock re-based) landed in each schema and ingested by
   ``cairn spark ingest`` on ``local[2]`` into an empty table, ``--repeats`` times each, the
   order alternated, after an untimed warm-up (a fresh JVM's JIT); medians.

The table goes to stdout, the details to ``bench/results/batch_format.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.spark import machine, table
from cairn.formats.batch import manifest_name
from cairn.sync.uploader import build_batch
from harness.readings import BOOT, BOOTED_MS, KEY, readings

RESULTS = Path(__file__).resolve().parent / "results" / "batch_format.json"
SCHEMAS = (1, 2)
BACKLOG_BATCH = 10_000
ANCHORS = [{"id": 1, "reason": "start", "boot_id": BOOT, "boottime_ns": 10**9,
            "wall_ns": BOOTED_MS * 10**6 + 10**9, "offset_before_ns": None,
            "clock_synced": True, "after_seq": 0}]


def batches(rows: list[dict[str, Any]], size: int, schema: int,
            gateway: str = "gw-0001") -> list[Any]:
    out, after = [], rows[0]["seq"] - 1
    for start in range(0, len(rows), size):
        chunk = rows[start:start + size]
        out.append(build_batch(gateway, chunk, after, ANCHORS, [], key=KEY, schema=schema))
        after = chunk[-1]["seq"]
    return out


def wire(sensors: int, rows: int) -> dict[str, Any]:
    """Bytes per reading for each schema: backlog batches and one-minute batches."""
    data = readings(sensors, rows)
    minute = sensors * 6  # one reading per 10 s per sensor
    result: dict[str, Any] = {"sensors": sensors, "readings": rows}
    for schema in SCHEMAS:
        started = time.process_time()
        backlog = batches(data, BACKLOG_BATCH, schema)
        cpu_s = time.process_time() - started
        online = batches(data, minute, schema)
        result[f"schema{schema}"] = {
            "backlog_bytes_per_reading": round(sum(b.size for b in backlog) / rows, 2),
            "backlog_data_bytes_per_reading": round(sum(len(b.data) for b in backlog) / rows, 2),
            "minute_bytes_per_reading": round(sum(b.size for b in online) / rows, 2),
            "minute_manifest_bytes": round(statistics.mean(len(b.manifest_bytes)
                                                           for b in online)),
            "encode_us_per_reading": round(cpu_s / rows * 1e6, 1)}
    return result


def land(landing: Path, rows: int, schema: int) -> int:
    """``rows`` readings of 20 gateways in ``schema``; one gateway in ten re-based."""
    per = rows // 20
    for g in range(20):
        data = readings(20, per, seed=g)
        if g % 10 == 0:  # clock unsynchronized: every row re-based on the boot's anchor
            for r in data:
                r["clock_synced"] = False
        for batch in batches(data, BACKLOG_BATCH, schema, f"gw-{g:04d}"):
            (landing / batch.name).parent.mkdir(parents=True, exist_ok=True)
            (landing / batch.name).write_bytes(batch.data)
            (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))
    return per * 20


def ingest_rates(rows: int, repeats: int, work: Path) -> dict[str, Any]:
    from cairn.central import spark as jobs

    spark = jobs.session("local[2]", {"spark.ui.enabled": "false",
                                      "spark.driver.memory": "2g"}, app="cairn-bench-format")
    try:
        for schema in SCHEMAS:
            land(work / f"landing-{schema}", rows, schema)
            land(work / f"warm-{schema}", 20_000, schema)
            jobs.ingest(spark, str(work / f"warm-{schema}"), str(work / f"warm-table-{schema}"))
        seconds: dict[int, list[float]] = {s: [] for s in SCHEMAS}
        phases: dict[int, list[dict[str, float]]] = {s: [] for s in SCHEMAS}
        for i in range(repeats):
            for schema in SCHEMAS if i % 2 == 0 else reversed(SCHEMAS):
                table_path = work / f"table-{schema}-{i}"
                stats = jobs.ingest(spark, str(work / f"landing-{schema}"), str(table_path))
                if stats.rows_added != rows or stats.quarantined:
                    raise AssertionError(f"schema {schema}: {stats.summary()}")
                seconds[schema].append(stats.seconds)
                phases[schema].append({k: round(v, 2) for k, v in stats.phases.items()})
                shutil.rmtree(table_path)
    finally:
        spark.stop()
    return {f"schema{s}": {"seconds": [round(x, 2) for x in seconds[s]],
                           "rows_per_s": round(rows / statistics.median(seconds[s])),
                           "phases_s": phases[s]}
            for s in SCHEMAS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows ingested per schema")
    parser.add_argument("--wire-rows", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-spark", action="store_true", help="bytes on the wire only")
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    opts = parser.parse_args(argv)

    load_at_start = os.getloadavg()
    sizes = [wire(sensors, opts.wire_rows) for sensors in (20, 200)]
    print(table(["sensors", "schema", "B/reading backlog", "of which data", "B/reading 1-min",
                 "manifest B", "encode us/reading"],
                [[str(w["sensors"]), str(s), *(str(w[f"schema{s}"][k]) for k in (
                    "backlog_bytes_per_reading", "backlog_data_bytes_per_reading",
                    "minute_bytes_per_reading", "minute_manifest_bytes",
                    "encode_us_per_reading"))] for w in sizes for s in SCHEMAS]))
    rates = None
    if not opts.no_spark:
        work = Path(tempfile.mkdtemp(prefix="cairn-bench-format-", dir=opts.dir))
        try:
            rates = ingest_rates(opts.rows, opts.repeats, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(table(["schema", "rows", "ingest s (each run)", "rows/s (median)"],
                    [[str(s), f"{opts.rows:,}", ", ".join(map(str, rates[f"schema{s}"]["seconds"])),
                      f"{rates[f'schema{s}']['rows_per_s']:,}"] for s in SCHEMAS]))
    print(f"machine load (1 min average): {load_at_start[0]:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end, {os.cpu_count()} CPUs")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps({
        "benchmark": "batch format: bytes on the wire and ingest rate, schema 1 vs 2",
        "machine": machine(), "load_average_at_start": load_at_start,
        "settings": {"rows": opts.rows, "wire_rows": opts.wire_rows, "repeats": opts.repeats,
                     "backlog_batch": BACKLOG_BATCH},
        "wire": sizes, "ingest": rates}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
