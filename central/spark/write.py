"""Writing a run's rows to its staging directory: in one pass, checked by totals on the way
(:func:`write_one_pass`), or, for batches checked one by one, without the rows the table or
another batch of the run holds (:func:`append_checked`). Both re-base the rows' time and
partition them by date (:func:`_write_rows`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import (
    REQUIRED,
    Anchors,
    Candidate,
    output_parts,
    overlapping_batches,
    touched_ranges,
)
from cairn.central.spark.dedupe import in_ranges, ranges_of
from cairn.central.spark.files import Files
from cairn.central.spark.rebase import with_event_time
from cairn.central.spark.schemas import TABLE_COLUMNS
from cairn.central.spark.session import one_of
from cairn.central.spark.table import Table
from cairn.central.spark.verify import parse_batches
from cairn.central.stats import IngestStats
from cairn.formats.batch import event_ranges

BROADCAST_KEYS = 2_000_000    # existing keys up to this many are broadcast for the anti-join


def write_one_pass(spark: SparkSession, batches: list[Candidate], anchors: Anchors,
                    stats: IngestStats, stage: str, run: str) -> bool:
    """Read ``batches`` once and write their rows to ``stage``, the run's staging directory,
    checking them on the way with totals rather than batch by batch: every line a whole
    event of its batch's gateway with a seq in the batch's range, as many lines as the
    manifests say, and the sum of a hash of (file, seq) over the lines equal to its sum over
    the seqs the manifests say the batches hold (a seq twice, or one in a hole, and another
    missing would change it). Whether all holds; if not, nothing is left written."""
    ranges = ranges_of(spark, batches)
    # two sums of 31-bit halves of a 64-bit hash: longs that cannot overflow (ANSI mode)
    hashed = F.xxhash64("uri", "seq")
    fingerprint = F.array(F.sum(hashed.bitwiseAND(0x7FFFFFFF)),
                          F.sum(F.shiftrightunsigned(hashed, 33)))
    rows = parse_batches(spark, batches).join(F.broadcast(ranges), "uri", "left")
    sound = ((F.col("gateway_id") == F.col("gw"))
             & F.col("seq").between(F.col("lo"), F.col("hi")))
    for name in REQUIRED:
        sound &= F.col(name).isNotNull()
    lines = sum(c.manifest["count"] for c in batches)
    totals = _write_rows(spark, rows, anchors, stage, len(batches), lines, run, {
        "unsound": F.count_if(~F.coalesce(sound, F.lit(False))), "fingerprint": fingerprint})
    if totals["rows"] == lines and not totals["unsound"] and \
            totals["fingerprint"] == _expected_fingerprint(spark, batches, fingerprint):
        stats.count_added(totals)
        return True
    Files(spark).delete(stage)
    return False


def _expected_fingerprint(spark: SparkSession, batches: list[Candidate],
                          fingerprint: Column) -> Any:
    """``fingerprint`` over the (file, seq) of every row the manifests say the batches hold:
    as many seqs as they count (asked only once the lines read matched that), however far
    apart a hostile manifest puts its first and last seq."""
    held = spark.createDataFrame(
        [(c.data_uri, lo, hi) for c in batches for lo, hi in event_ranges(c.manifest)],
        "uri string, lo long, hi long")
    return (held.select("uri", F.explode(F.sequence("lo", "hi")).alias("seq"))
            .agg(fingerprint.alias("sum")).first()["sum"])


def append_checked(spark: SparkSession, table: Table, read: list[DataFrame],
                    good: list[Candidate], touching: set[str], anchors: Anchors,
                    stats: IngestStats, stage: str, run: str) -> None:
    """Write the rows of the ``good`` batches among the lines ``read`` to ``stage``, without
    those the table (or another batch of this run) already holds. The table is read only
    in the ranges of batches that overlap one the ingest log holds."""
    lines = read[0]
    for more in read[1:]:
        lines = lines.unionByName(more)
    uris = [c.data_uri for c in good]
    rows = lines.where(one_of("uri", uris))
    # only batches that overlap another of this run are deduped among themselves: a
    # shuffle of every row would cost more than the whole read
    overlapping = overlapping_batches(good)
    if overlapping:
        shared = one_of("uri", [c.data_uri for c in good if c.data_path in overlapping])
        rows = rows.where(~shared).unionByName(
            rows.where(shared).dropDuplicates(["gateway_id", "seq"]))
    existing = table.events()
    clock = time.monotonic()
    if existing is not None and any(c.data_uri in touching for c in good):
        ranges = touched_ranges(good, touching)
        keys = in_ranges(spark, existing, [(gw, lo, hi, gw) for gw, (lo, hi)
                                            in ranges.items()]).select("gateway_id", "seq")
        held = keys.count()
        if held:
            rows = rows.join(F.broadcast(keys) if held <= BROADCAST_KEYS else keys,
                             ["gateway_id", "seq"], "left_anti")
    clock = stats.timed("existing keys", clock)
    stats.count_added(_write_rows(spark, rows, anchors, stage, len(good),
                                  sum(c.manifest["count"] for c in good), run))
    stats.timed("write", clock)


def _write_rows(spark: SparkSession, rows: DataFrame, anchors: Anchors, path: str,
                batches: int, lines: int, run: str,
                checks: dict[str, Column] | None = None) -> dict[str, Any]:
    """Re-base and append ``rows`` (parsed lines with their ``uri``; from ``batches`` batches
    of ``lines`` lines) to the table layout at ``path``, partitioned by date. Returns the
    totals observed on the way: rows, estimated (re-based), and ``checks``."""
    observed = Observation(f"ingest-{run}-{uuid.uuid4().hex[:6]}")
    rows = (with_event_time(rows, anchors.frame)
            .withColumn("timestamp", F.timestamp_millis("wall_ms"))
            .withColumn("ingested_at", F.current_timestamp())
            # gateway/file (a regular expression here cost half the time of the read)
            .withColumn("batch", F.substring_index("uri", "/", -2))
            .observe(observed, F.count(F.lit(1)).alias("rows"),
                     F.sum(F.col("time_estimated").cast("long")).alias("estimated"),
                     *[e.alias(name) for name, e in (checks or {}).items()])
            .select(*TABLE_COLUMNS))
    parts = output_parts(batches, lines, spark.sparkContext.defaultParallelism)
    rows.coalesce(parts).write.mode("append").partitionBy("date").parquet(path)
    return observed.get


