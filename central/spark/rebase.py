"""Clock correction: which anchor each boot's unsynchronized rows are re-based on
(:func:`reference_anchors`, plain Python), the corrected ``event_time`` of new rows, and the
re-basing of rows ingested earlier when a run brings anchors that move their reference
(a staged partition rewrite, :meth:`Table.swap <cairn.central.spark.table.Table.swap>`)."""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cairn.central.spark.schemas import REF_SCHEMA, TABLE_COLUMNS
from cairn.central.spark.table import Table
from cairn.central.spark.verify import Candidate

log = logging.getLogger("cairn.spark")


def reference_anchors(anchors: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The anchor each boot's unsynchronized timestamps are re-based on: the boot's first
    anchor taken with a synchronized clock, or failing that the anchor of its last step
    (the wall clock someone set). Keyed by (gateway_id, boot_id); boots without either are
    absent, and their rows keep their raw time.

    A row with boottime ``b`` then gets ``corrected = anchor.wall_ns - (anchor.boottime_ns
    - b)``: CLOCK_BOOTTIME runs steadily through the whole boot, the wall clock does not."""
    boots: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for anchor in anchors:
        boots[anchor["gateway_id"], anchor["boot_id"]].append(anchor)
    refs = {}
    for key, items in boots.items():
        items.sort(key=lambda a: a["id"])
        synced = [a for a in items if a["clock_synced"]]
        steps = [a for a in items if a["reason"] == "step"]
        if synced:
            refs[key] = synced[0]
        elif steps:
            refs[key] = steps[-1]
    return refs


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


@dataclass
class Anchors:
    """What the good batches of a run bring besides rows."""
    new: dict[tuple[str, int], dict[str, Any]]  # clock anchors the table does not have yet
    refs: dict[tuple[str, str], dict[str, Any]]  # the reference anchor of each boot
    gaps: dict[tuple[str, int], tuple]           # loss records
    moved: set[tuple[str, str]]  # boots with rows in the table whose reference this run moved
    frame: DataFrame | None = None               # refs, to join rows with (set by anchors_of)


def anchors_of(spark: SparkSession, table: Table, good: list[Candidate]) -> Anchors:
    """The clock anchors the table knows plus those ``good`` brings, and its loss records."""
    known = [r.asDict() for r in table.anchor_frame().collect()]
    anchors = anchor_changes(known, [c.manifest for c in good])
    anchors.frame = _refs_frame(spark, anchors.refs)
    return anchors


def anchor_changes(known: list[dict[str, Any]],
                    manifests: list[dict[str, Any]]) -> Anchors:
    """The anchors and loss records of ``manifests`` the table does not have (``known``: the
    anchors it has, as rows of ANCHOR_SCHEMA), each boot's reference anchor with them, and
    the boots with rows in the table whose reference they move."""
    known_keys = {(a["gateway_id"], a["id"]) for a in known}
    new: dict[tuple[str, int], dict[str, Any]] = {}
    gaps: dict[tuple[str, int], tuple] = {}
    for m in manifests:
        gw = m["gateway_id"]
        for a in m.get("anchors", []):
            key = (gw, int(a["id"]))
            if key not in known_keys:
                new[key] = _anchor_row(gw, a)
        for g in m.get("gaps", []):
            gaps[gw, int(g["id"])] = (gw, int(g["id"]), g.get("realm"), g.get("rule"),
                                      g.get("first_seq"), g.get("last_seq"), g.get("count"),
                                      g.get("reason"), g.get("wall_ms"))
    refs = reference_anchors(known + list(new.values()))
    before = reference_anchors(known)
    # only a boot the table has anchors of can have rows there: a batch carries every anchor
    # of its boots (the first, "start", taken before the boot's first row), and they are
    # committed with its rows
    known_boots = {(a["gateway_id"], a["boot_id"]) for a in known}
    moved = {boot for boot in {(a["gateway_id"], a["boot_id"]) for a in new.values()}
             if boot in known_boots and refs.get(boot) != before.get(boot)}
    return Anchors(new, refs, gaps, moved)


def _anchor_row(gateway_id: str, a: dict[str, Any]) -> dict[str, Any]:
    """A manifest's anchor as a row of ANCHOR_SCHEMA."""
    return {"gateway_id": gateway_id, "id": int(a["id"]), "reason": str(a["reason"]),
            "boot_id": str(a["boot_id"]), "boottime_ns": int(a["boottime_ns"]),
            "wall_ns": int(a["wall_ns"]),
            "offset_before_ns": None if a.get("offset_before_ns") is None
            else int(a["offset_before_ns"]),
            "clock_synced": bool(a["clock_synced"]), "after_seq": int(a["after_seq"])}


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
