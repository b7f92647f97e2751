"""A landing of many files: what batch mode pays for every file still in the landing.

``cairn spark ingest`` in batch mode lists the whole landing in one Spark job, joined with
the ingest log, and reads every manifest still there but those listed as they were when
ingested (``--archive`` moves ingested batches out). This lands ``--batches`` one-row
batches (twice as many files) over 1,000 gateway directories, then measures on ``local[2]``
with ``--driver-memory``: the listing (seconds, the driver's JVM heap after it, the Python
set of URIs it returns), the ingest of one chunk of ``--chunk`` batches (manifests read,
checked, written), and the listing again (the chunk's manifests now known unchanged: what a
re-run pays for them instead of reading them). A listing that does not fit the driver fails
here the way it would in the job.

    .venv/bin/python -m bench.spark_landing [--batches 500000] [--driver-memory 1g]

Table on stdout, details in ``bench/results/spark_landing.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.spark import machine, table
from bench.spark_fleet import T0_MS, fleet_row
from cairn.formats.batch import manifest_name
from cairn.sync.uploader import build_batch

RESULTS = Path(__file__).resolve().parent / "results" / "spark_landing.json"
GATEWAYS = 1000


def _land(args: tuple[Path, int, int]) -> int:
    """Gateway ``g``'s share: one-row batches, seqs 1, 2, ..."""
    landing, g, batches = args
    gw = f"gw-{g:04d}"
    (landing / gw).mkdir(parents=True, exist_ok=True)
    for seq in range(1, batches + 1):
        batch = build_batch(gw, [fleet_row(gw, seq, T0_MS + seq * 60_000, f"boot-{gw}", seq * 10**9,
                                      True, 0)], seq - 1, [], [])
        (landing / batch.name).write_bytes(batch.data)
        (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))
    return batches


def land(landing: Path, batches: int) -> int:
    jobs = [(landing, g, batches // GATEWAYS) for g in range(GATEWAYS)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return sum(pool.map(_land, jobs, chunksize=20))


def measure(work: Path, opts: argparse.Namespace) -> dict[str, Any]:
    from cairn.central import spark as jobs

    spark = jobs.session("local[2]", {"spark.driver.memory": opts.driver_memory,
                                      "spark.ui.enabled": "false"}, app="cairn-bench-landing")
    jobs.prepare(spark)
    files = jobs.Files(spark)
    landing, tbl = files.qualify(str(work / "landing")), files.qualify(str(work / "table"))
    store = jobs.TableDir(spark, files, tbl)
    out: dict[str, Any] = {}
    runtime = spark._jvm.java.lang.Runtime.getRuntime()
    try:
        tracemalloc.start()
        started = time.perf_counter()
        landed = jobs.landed_manifests(spark, files, landing, store).uris
        out["listing_s"] = round(time.perf_counter() - started, 1)
        out["listed_files"] = len(landed)
        out["python_set_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20)
        tracemalloc.stop()
        spark._jvm.java.lang.System.gc()
        out["driver_heap_mb"] = round((runtime.totalMemory() - runtime.freeMemory()) / 2**20)
        manifests = sorted(u for u in landed if u.endswith(jobs.MANIFEST_SUFFIX))[:opts.chunk]
        started = time.perf_counter()
        stats = jobs.ingest_paths(spark, files, manifests, tbl, None, landed, None)
        out["chunk_s"] = round(time.perf_counter() - started, 1)
        out["chunk_batches"] = stats.ingested
        out["chunk_phases_s"] = {k: round(v, 1) for k, v in stats.phases.items()}
        started = time.perf_counter()
        out["unchanged"] = len(jobs.landed_manifests(spark, files, landing, store).unchanged)
        out["relisting_s"] = round(time.perf_counter() - started, 1)
    except Exception as e:  # the failure is the figure: how the job would fail
        out["error"] = str(e).splitlines()[0][:300]
    finally:
        spark.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=500_000)
    p.add_argument("--chunk", type=int, default=20_000)
    p.add_argument("--driver-memory", default="1g")
    p.add_argument("--dir", help="work here and keep it (default: a temporary directory)")
    p.add_argument("--output", type=Path, default=RESULTS)
    opts = p.parse_args(argv)
    work = Path(opts.dir or tempfile.mkdtemp(prefix="cairn-bench-landing-"))
    if not (work / "landing").exists():
        started = time.perf_counter()
        land(work / "landing", opts.batches)
        print(f"landed {opts.batches:,} batches in {time.perf_counter() - started:.0f} s",
              file=sys.stderr)
    shutil.rmtree(work / "table", ignore_errors=True)
    result = measure(work, opts)
    print(table(["files", "driver memory", "listing s", "driver heap MB", "URI set MB",
                 f"chunk of {opts.chunk:,} s", "listing again s", "unchanged", "error"],
                [[f"{result.get('listed_files', 0):,}", opts.driver_memory,
                  *(str(result.get(k, "-")) for k in (
                      "listing_s", "driver_heap_mb", "python_set_mb", "chunk_s",
                      "relisting_s", "unchanged")),
                  result.get("error", "")]]))
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps({
        "benchmark": "cairn spark ingest, a landing of many files", "machine": machine(),
        "settings": {k: str(v) for k, v in vars(opts).items()}, "result": result},
        indent=2) + "\n")
    if not opts.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
