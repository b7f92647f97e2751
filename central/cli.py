"""``cairn spark``: the central jobs' command (the jobs need PySpark, imported only when one
runs: ``cairn --help`` works without it)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_commands(commands: Any) -> None:
    spark = commands.add_parser(
        "spark", help="central jobs (PySpark): ingest landed batches, write reports",
        description="The central side of history sync, on any Spark master. Needs PySpark "
                    "(pip install 'cairn[spark]') and a Java runtime.")
    spark.set_defaults(spark_parser=spark, spark_command=None)
    jobs = spark.add_subparsers(dest="spark_command", metavar="JOB")
    ingest = jobs.add_parser(
        "ingest", help="landed batches -> the Parquet table (deduplicated, time-corrected)",
        description="Read the batches under --landing whose manifest has landed, check each "
                    "against its manifest (size, sha256, line count; a bad batch is "
                    "quarantined and the job goes on), drop rows the table already holds "
                    "(by gateway_id and seq), re-base timestamps taken before the clock was "
                    "synchronized, and append to the Parquet table under --table, "
                    "partitioned by date. Re-running adds nothing new. Paths may be local or "
                    "any Hadoop file system URL (hdfs://, s3a://).")
    ingest.add_argument("--landing", required=True, metavar="DIR",
                        help="where the sinks land batches (<gateway>/<first>-<last>.*)")
    ingest.add_argument("--table", required=True, metavar="DIR", help="the Parquet table")
    ingest.add_argument("--quarantine", metavar="DIR",
                        help="move bad batches here with a note of why (default: leave them "
                             "in place and report them)")
    ingest.add_argument("--archive", metavar="DIR",
                        help="move batches here once ingested (or found ingested before), "
                             "so that the landing holds only what is pending (default: "
                             "leave them; batch mode lists the whole landing each run)")
    ingest.add_argument("--gateway-keys", metavar="FILE",
                        help="ingest only batches signed by a key this file lists for their "
                             "gateway (lines of GATEWAY_ID ed25519:KEY, as `cairn sync "
                             "--show-key` prints them); the others are quarantined")
    ingest.add_argument("--streaming", action="store_true",
                        help="Structured Streaming (trigger availableNow) with --checkpoint: "
                             "only manifests that landed since the last run are read")
    ingest.add_argument("--checkpoint", metavar="DIR", help="streaming checkpoint directory")
    ingest.add_argument("--max-batches", type=int, metavar="N",
                        help="batches per step: per micro-batch when streaming (default "
                             "1000), per chunk in batch mode (default 20000)")
    report = jobs.add_parser(
        "report", help="gap, hourly sensor, clock and fleet reports from the table",
        description="Write reports from the table under --out, each as Parquet (<name>/) "
                    "and as one CSV file (<name>.csv): gaps (missing seq ranges that are "
                    "data loss, per gateway), gateways (one line each: rows, first/last "
                    "seq, gaps, re-based rows, last batch ingested, batches quarantined), "
                    "daily (rows per gateway per day), hourly (per-sensor min/mean/max "
                    "temperature and humidity by corrected hour), clock_steps (each step of "
                    "a gateway clock and its size), unsynced (spans of events recorded "
                    "before the clock was synchronized, and how far they were re-based) and "
                    "fleet (one line per gateway from its newest health record, flagged "
                    "with reasons, most urgent first); plus report.html, a page with the "
                    "fleet and plots that opens without a server. Prints a short summary "
                    "ending with the gateways that need attention.")
    report.add_argument("--table", required=True, metavar="DIR", help="the Parquet table")
    report.add_argument("--out", required=True, metavar="DIR", help="where reports go")
    for job in (ingest, report):
        job.add_argument("--master", default="local[*]", metavar="URL",
                         help="Spark master: local[*] (default), local[N], spark://HOST:PORT, "
                              "yarn, k8s://https://HOST:PORT")
        job.add_argument("--conf", action="append", metavar="KEY=VALUE",
                         help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)")
        job.add_argument("--wait", type=float, default=600, metavar="SECONDS",
                         help="how long to wait for the table's lock (one ingest at a time; "
                              "reports wait for an ingest to finish) before giving up with "
                              "exit 1 (default 600)")



def main(args: argparse.Namespace) -> int:
    if args.spark_command is None:
        args.spark_parser.print_help(sys.stderr)
        return 2
    try:
        from cairn.central import spark
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith(("pyspark", "py4j")):
            raise
        print("cairn spark: PySpark is not installed: pip install 'cairn[spark]' (and a Java "
              "runtime)", file=sys.stderr)
        return 1
    return spark.main(args)

