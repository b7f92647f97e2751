"""Clock correction: which anchor each boot's unsynchronized rows are re-based on
(:func:`reference_anchors`, plain Python), the corrected ``event_time`` of new rows, and the
re-basing of rows ingested earlier when a run brings anchors that move their reference
(a staged partition rewrite, :meth:`Table.swap <cairn.central.spark.table.Table.swap>`)."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import Anchors, Candidate, anchor_changes
from cairn.central.spark.schemas import REF_SCHEMA, TABLE_COLUMNS
from cairn.central.spark.table import Table

log = logging.getLogger("cairn.spark")


def _refs_frame(spark: SparkSession, refs: dict[tuple[str, str], dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame(
        [(gw, boot, a["id"], a["wall_ns"], a["boottime_ns"]) for (gw, boot), a in refs.items()],
        REF_SCHEMA)


def with_event_time(rows: DataFrame, refs: DataFrame) -> DataFrame:
    """Adds event_time, time_estimated, time_anchor and date to rows (raw columns kept)."""
    joined = rows.join(F.broadcast(refs), ["gateway_id", "boot_id"], "left")
    estimated = ~F.col("clock_synced") & F.col("ref_id").isNotNull()
    corrected_ns = F.col("ref_wall_ns") - (F.col("ref_boottime_ns") - F.col("boottime_ns"))
    event_us = F.when(estimated, F.floor(corrected_ns / 1000)).otherwise(F.col("wall_ms") * 1000)
    return (joined
            .withColumn("event_time", F.timestamp_micros(event_us.cast("long")))
            .withColumn("time_estimated", estimated)
            .withColumn("time_anchor", F.when(estimated, F.col("ref_id")))
            .withColumn("date", F.to_date("event_time"))
            .drop("ref_id", "ref_wall_ns", "ref_boottime_ns"))


def anchors_of(spark: SparkSession, table: Table, good: list[Candidate]) -> Anchors:
    """The clock anchors the table knows plus those ``good`` brings, and its loss records."""
    known = [r.asDict() for r in table.anchor_frame().collect()]
    anchors = anchor_changes(known, [c.manifest for c in good])
    anchors.frame = _refs_frame(spark, anchors.refs)
    return anchors


def rebase_boots(spark: SparkSession, table: Table, boots: set[tuple[str, str]],
            refs: dict[tuple[str, str], dict[str, Any]]) -> int:
    """Re-base the rows of ``boots`` whose event_time was computed with another reference
    than ``refs`` now gives; rewrite the partitions they leave and enter. Returns how many."""
    events = table.events()
    if events is None:
        return 0
    boots_frame = spark.createDataFrame(sorted(boots), "gateway_id string, boot_id string")
    refs_frame = _refs_frame(spark, refs)
    stale = (events.where(~F.col("clock_synced"))
             .join(F.broadcast(boots_frame), ["gateway_id", "boot_id"], "left_semi")
             .join(F.broadcast(refs_frame.select("gateway_id", "boot_id", "ref_id")),
                   ["gateway_id", "boot_id"], "left")
             .where(~F.col("time_anchor").eqNullSafe(F.col("ref_id")))
             .drop("ref_id")).cache()
    try:
        old_dates = {r.date for r in stale.select("date").distinct().collect()}
        if not old_dates:
            return 0
        corrected = (with_event_time(
            stale.drop("event_time", "time_estimated", "time_anchor", "date"), refs_frame)
            .select(*TABLE_COLUMNS)).cache()
        count = corrected.count()
        new_dates = {r.date for r in corrected.select("date").distinct().collect()}
        dates = sorted(str(d) for d in old_dates | new_dates)
        keep = (events.where(F.col("date").isin(sorted(old_dates | new_dates)))
                .join(stale.select("gateway_id", "seq"), ["gateway_id", "seq"], "left_anti"))
        stage = f"{table.staging}/{uuid.uuid4().hex[:12]}"
        (keep.unionByName(corrected).write.mode("error").partitionBy("date").parquet(stage))
        for d in dates:
            if not table.files.exists(f"{stage}/date={d}"):
                table.files.mkdirs(f"{stage}/date={d}")  # this partition ends up empty
        table.files.write_text(f"{stage}/_SWAP", json.dumps(dates))
        table.swap(stage, dates)
        log.info("re-based %d rows ingested earlier; rewrote partitions %s", count,
                 ", ".join(dates))
        corrected.unpersist()
        return count
    finally:
        stale.unpersist()
