"""``cairn spark ingest|report``: the command line's side of the jobs (the parser is in
:mod:`cairn.central.cli`)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from pyspark.sql import SparkSession

from cairn.central.plan import conf_pairs
from cairn.central.spark.ingest import CHUNK_BATCHES, ingest, ingest_stream
from cairn.central.spark.landing import LandingError
from cairn.central.spark.reports import report
from cairn.central.spark.session import session
from cairn.formats.batch_signature import GatewayKeys

log = logging.getLogger("cairn.spark")


def main(args: Any) -> int:
    """``cairn spark ingest|report`` (argparse namespace from sync.cli)."""
    try:
        conf = conf_pairs(args.conf)
    except ValueError as e:
        print(f"cairn spark: {e}", file=sys.stderr)
        return 2
    if args.spark_command == "ingest" and args.streaming and not args.checkpoint:
        print("cairn spark ingest: --streaming needs --checkpoint DIR", file=sys.stderr)
        return 2
    keys = None
    if args.spark_command == "ingest" and args.gateway_keys:
        try:
            keys = GatewayKeys.read(args.gateway_keys)
        except (OSError, ValueError) as e:
            print(f"cairn spark ingest: --gateway-keys: {e}", file=sys.stderr)
            return 2
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    created = SparkSession.getActiveSession() is None
    spark = session(args.master, conf, app=f"cairn-{args.spark_command}")
    try:
        if args.spark_command == "ingest":
            if args.streaming:
                stats = ingest_stream(spark, args.landing, args.table, args.checkpoint,
                                      args.quarantine, args.max_batches or 1000, args.wait,
                                      args.archive, keys)
            else:
                stats = ingest(spark, args.landing, args.table, args.quarantine, args.wait,
                               args.max_batches or CHUNK_BATCHES, args.archive, keys)
            for name, reason in stats.quarantined:
                print(f"quarantined {name}: {reason}")
            print(stats.summary())
            return 0
        result = report(spark, args.table, args.out, args.wait)
        for line in result.lines:
            print(line)
        print(f"reports in {result.out}: "
              + ", ".join(f"{name} ({n} rows)" for name, n in result.counts.items()))
        return 0
    except (PySparkException, Py4JError, OSError, LandingError) as e:
        log.error("spark %s failed: %s", args.spark_command, str(e).splitlines()[0])
        return 1
    finally:
        if created:
            spark.stop()
