"""The reports on the table: data loss (gaps and their causes), per-gateway totals, hourly
sensor readings, clock steps, spans of unsynchronized time, rows per day; written as Parquet,
CSV and one HTML page. :func:`loss_intervals` works out the loss in plain Python from the
ingest log and the gateways' loss records."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from cairn.central import fleet
from cairn.central.plan import NOT_LANDED, loss_intervals
from cairn.central.spark.files import Files, utc_now
from cairn.central.spark.session import prepare
from cairn.central.spark.table import LOCK_WAIT_S, Table
from cairn.central.table_lock import locked
from cairn.formats.health import OWN_AUTHID
from cairn.formats.health import TOPIC as HEALTH_TOPIC

log = logging.getLogger("cairn.spark")

FLEET_LINES = 20  # the most urgent gateways the summary names (all are in fleet.csv)


def _table_losses(table: Table) -> list[tuple[str, int, int, str]]:
    """:func:`loss_intervals` of the table's ingest log and loss records."""
    return loss_intervals(
        [tuple(r) for r in table.batch_frame().where(F.col("status") == "ingested")
         .select("gateway_id", "after_seq", "first_seq", "last_seq").collect()],
        [tuple(r) for r in table.gap_frame()
         .select("gateway_id", "first_seq", "last_seq", "reason").collect()])


def gap_report(spark: SparkSession, table: Table, events: DataFrame) -> tuple[DataFrame,
                                                                             DataFrame]:
    """(gaps, gateways): the missing seq ranges between each gateway's lowest and highest
    seq that are data loss, with their cause (a batch that never landed, or events the
    gateway dropped) and the times around them; and one line per gateway. Seqs that are
    missing but covered by a landed batch were never history (retained-only publications
    take a seq too): they are counted in ``not_history``, not reported as loss."""
    by_seq = Window.partitionBy("gateway_id").orderBy("seq")
    holes = (events.select("gateway_id", "seq", "event_time")
             .withColumn("prev_seq", F.lag("seq").over(by_seq))
             .withColumn("prev_time", F.lag("event_time").over(by_seq))
             .where(F.col("seq") - F.col("prev_seq") > 1)
             .select("gateway_id", (F.col("prev_seq") + 1).alias("hole_first"),
                     (F.col("seq") - 1).alias("hole_last"),
                     F.col("prev_time").alias("after_time"),
                     F.col("event_time").alias("before_time")))
    loss = spark.createDataFrame(
        _table_losses(table),
        "gateway_id string, loss_first long, loss_last long, cause string")
    gaps = (holes.join(F.broadcast(loss), (holes.gateway_id == loss.gateway_id)
                       & (loss.loss_first <= holes.hole_last)
                       & (loss.loss_last >= holes.hole_first))
            .select(holes.gateway_id,
                    F.greatest("hole_first", "loss_first").alias("first_seq"),
                    F.least("hole_last", "loss_last").alias("last_seq"),
                    "cause", "after_time", "before_time")
            .withColumn("missing", F.col("last_seq") - F.col("first_seq") + 1)
            .select("gateway_id", "first_seq", "last_seq", "missing", "cause", "after_time",
                    "before_time")
            .orderBy("gateway_id", "first_seq")).cache()
    lost = gaps.groupBy("gateway_id").agg(
        F.sum(F.when(F.col("cause") == NOT_LANDED, F.col("missing")).otherwise(0))
        .alias("not_landed"),
        F.sum(F.when(F.col("cause") != NOT_LANDED, F.col("missing")).otherwise(0))
        .alias("dropped_on_gateway"),
        F.count(F.lit(1)).alias("gaps"))
    gateways = (events.groupBy("gateway_id").agg(
        F.count(F.lit(1)).alias("events"), F.min("seq").alias("min_seq"),
        F.max("seq").alias("max_seq"), F.min("event_time").alias("first_time"),
        F.max("event_time").alias("last_time"),
        F.sum(F.col("time_estimated").cast("long")).alias("estimated"),
        F.countDistinct("boot_id").alias("boots"))
        .join(lost, "gateway_id", "left").fillna(0, ["not_landed", "dropped_on_gateway", "gaps"])
        .withColumn("not_history", F.col("max_seq") - F.col("min_seq") + 1 - F.col("events")
                    - F.col("not_landed") - F.col("dropped_on_gateway"))
        .select("gateway_id", "events", "min_seq", "max_seq", "gaps", "not_landed",
                "dropped_on_gateway", "not_history", "estimated", "boots", "first_time",
                "last_time")
        .orderBy("gateway_id"))
    return gaps, gateways


def hourly_report(events: DataFrame) -> DataFrame:
    """Per gateway, realm, topic and hour of corrected time: count, min/mean/max of
    ``kwargs.temperature`` and ``kwargs.humidity`` (rows with neither are left out)."""
    readings = events.select(
        "gateway_id", "realm", "topic", F.date_trunc("hour", "event_time").alias("hour"),
        F.expr("try_cast(get_json_object(kwargs, '$.temperature') AS DOUBLE)")
        .alias("temperature"),
        F.expr("try_cast(get_json_object(kwargs, '$.humidity') AS DOUBLE)").alias("humidity"),
        "time_estimated",
    ).where(F.col("temperature").isNotNull() | F.col("humidity").isNotNull())
    return (readings.groupBy("gateway_id", "realm", "topic", "hour").agg(
        F.count(F.lit(1)).alias("readings"),
        F.min("temperature").alias("temperature_min"),
        F.avg("temperature").alias("temperature_mean"),
        F.max("temperature").alias("temperature_max"),
        F.min("humidity").alias("humidity_min"),
        F.avg("humidity").alias("humidity_mean"),
        F.max("humidity").alias("humidity_max"),
        F.sum(F.col("time_estimated").cast("long")).alias("estimated"))
        .orderBy("gateway_id", "realm", "topic", "hour"))


def clock_steps_report(table: Table) -> DataFrame:
    """One line per step of a gateway's wall clock: when (boottime, seq), from what to
    what, by how much (seconds, + forward)."""
    by_boot = Window.partitionBy("gateway_id", "boot_id").orderBy("id")
    return (table.anchor_frame().where(F.col("reason") == "step")
            .withColumn("step", F.row_number().over(by_boot))
            .select("gateway_id", "boot_id", "step", F.col("id").alias("anchor_id"),
                    "after_seq", (F.col("boottime_ns") / 1e9).alias("boottime_s"),
                    F.timestamp_micros(F.floor((F.col("boottime_ns")
                                                + F.col("offset_before_ns")) / 1000)
                                       .cast("long")).alias("wall_before"),
                    F.timestamp_micros(F.floor(F.col("wall_ns") / 1000).cast("long"))
                    .alias("wall_after"),
                    ((F.col("wall_ns") - F.col("boottime_ns") - F.col("offset_before_ns"))
                     / 1e9).alias("step_s"),
                    "clock_synced")
            .orderBy("gateway_id", "boot_id", "step"))


def unsynced_report(events: DataFrame) -> DataFrame:
    """Spans of consecutive events (per boot, in seq order) recorded while the gateway's
    clock was not synchronized: raw and corrected start/end, whether all were re-based and
    by how much on average (``rebased_by_s``: corrected minus raw time)."""
    by_boot = Window.partitionBy("gateway_id", "boot_id").orderBy("seq")
    by_state = Window.partitionBy("gateway_id", "boot_id", "clock_synced").orderBy("seq")
    runs = (events.select("gateway_id", "boot_id", "seq", "clock_synced", "timestamp",
                          "event_time", "time_estimated")
            .withColumn("run", F.row_number().over(by_boot) - F.row_number().over(by_state))
            .where(~F.col("clock_synced")))
    return (runs.groupBy("gateway_id", "boot_id", "run").agg(
        F.min("seq").alias("first_seq"), F.max("seq").alias("last_seq"),
        F.count(F.lit(1)).alias("events"),
        F.min("timestamp").alias("raw_start"), F.max("timestamp").alias("raw_end"),
        F.min("event_time").alias("start"), F.max("event_time").alias("end"),
        F.bool_and("time_estimated").alias("estimated"),
        (F.avg(F.unix_micros("event_time") - F.unix_micros("timestamp")) / 1e6)
        .alias("rebased_by_s"))
        .withColumn("duration_s", (F.unix_micros("end") - F.unix_micros("start")) / 1e6)
        .drop("run").orderBy("gateway_id", "first_seq"))


def fleet_report(spark: SparkSession, events: DataFrame, gateways: DataFrame,
                 now: datetime) -> DataFrame:
    """One row per gateway (:mod:`central.fleet`): its newest health record, when it was last
    seen and its losses (``gateways``, of :func:`gap_report`), flagged and in urgency order.
    One aggregate here; the rules run on the driver over a row per gateway."""
    own = (F.col("topic") == HEALTH_TOPIC) & (F.col("authid") == OWN_AUTHID)
    health = events.groupBy("gateway_id").agg(
        F.max_by("kwargs", F.when(own, F.col("seq"))).alias("health"),
        F.max_by(F.unix_micros("event_time"), F.when(own, F.col("seq"))).alias("health_us"),
        F.bool_or("clock_synced").alias("ever_synced"))
    facts = [fleet.Facts(r.gateway_id, _seconds(r.last_us), _seconds(r.health_us), r.health,
                         bool(r.ever_synced), r.gaps, r.not_landed, r.dropped_on_gateway)
             for r in gateways.join(health, "gateway_id", "left")
             .select("gateway_id", F.unix_micros("last_time").alias("last_us"), "health",
                     "health_us", "ever_synced", "gaps", "not_landed", "dropped_on_gateway")
             .collect()]
    return spark.createDataFrame(fleet.fleet(facts, now), fleet.COLUMNS).orderBy("urgency")


def _seconds(micros: int | None) -> float | None:
    return None if micros is None else micros / 1e6


@dataclass
class SparkReport:
    """What :func:`report` wrote: where, the rows of each report, a summary's lines."""
    out: str
    counts: dict[str, int]
    lines: list[str]


def report(spark: SparkSession, table: str, out: str, wait: float = LOCK_WAIT_S,
           now: datetime | None = None) -> SparkReport:
    """Write the gap, gateway, daily, hourly, clock and fleet reports under ``out`` (each as
    Parquet ``out/<name>/`` and as one CSV file ``out/<name>.csv``) and ``report.html``
    (plots, :mod:`central.report_html`), and summarize them. ``now``: what the fleet report
    measures silence against (default: the time of the run). Holds the
    table's shared lock: no ingest changes the table while the report reads it."""
    prepare(spark)
    files = Files(spark)
    table, out = files.qualify(table), files.qualify(out)
    with locked(table, files, exclusive=False, wait=wait, what="a report"):
        return _report_locked(spark, files, table, out, now or utc_now())


def _report_locked(spark: SparkSession, files: Files, table_path: str,
                   out: str, now: datetime) -> SparkReport:
    table = Table(spark, files, table_path)
    if any(files.exists(f"{stage}/_SWAP") for stage in files.children(table.staging)):
        log.warning("an interrupted partition rewrite is pending in %s: the next ingest "
                    "finishes it; until then some re-based rows may be missing", table.staging)
    events = table.events()
    if events is None:
        raise FileNotFoundError(f"no events in {table_path} (has an ingest run?)")
    events = events.cache()
    gaps, gateways = gap_report(spark, table, events)
    gateways = _with_batches(gateways, table)
    frames = {"gaps": gaps, "gateways": gateways, "hourly": hourly_report(events),
              "clock_steps": clock_steps_report(table), "unsynced": unsynced_report(events),
              "daily": events.groupBy("gateway_id", "date").agg(F.count(F.lit(1)).alias("rows"))
              .orderBy("gateway_id", "date"),
              "fleet": fleet_report(spark, events, gateways, now)}
    counts = {}
    for name, frame in frames.items():  # each read by the summary and the page below too
        frames[name] = frame = frame.cache()
        counts[name] = frame.count()
        frame.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
        _write_csv(files, frame, f"{out}/{name}.csv")
    lines = []
    for g in frames["gateways"].collect():
        lines.append(
            f"{g.gateway_id}: {g.events} events, seq {g.min_seq}..{g.max_seq}, "
            f"{g.not_landed} not landed, {g.dropped_on_gateway} dropped on the gateway "
            f"({g.gaps} gaps), {g.not_history} seqs never history, {g.estimated} with "
            f"estimated time, {g.boots} boots")
    steps = frames["clock_steps"].agg(F.max(F.abs("step_s")).alias("largest")).first()
    lines.append(f"{counts['hourly']} sensor-hours; {counts['clock_steps']} clock steps"
                 + (f" (largest {steps.largest:,.0f} s)" if counts["clock_steps"] else "")
                 + f"; {counts['unsynced']} spans of unsynchronized time")
    flagged = frames["fleet"].where(F.col("flags").isNotNull())
    lines.append(f"fleet: {flagged.count()} of {counts['fleet']} gateways need attention"
                 + "".join(f"\n  {g.urgency}. {g.gateway_id}: {g.reasons}"
                           for g in flagged.limit(FLEET_LINES).collect()))
    _write_html(files, frames, f"{out}/report.html")
    for frame in [*frames.values(), events]:
        frame.unpersist()
    return SparkReport(out, counts, lines)


def _with_batches(gateways: DataFrame, table: Table) -> DataFrame:
    """Adds when each gateway's last batch was ingested and how many were quarantined."""
    log_ = table.batch_frame().groupBy("gateway_id").agg(
        F.max(F.when(F.col("status") == "ingested", F.col("logged_at")))
        .alias("last_batch_ingested"),
        F.sum((F.col("status") == "quarantined").cast("long")).alias("quarantined"))
    return (gateways.join(log_, "gateway_id", "left").fillna(0, ["quarantined"])
            .orderBy("gateway_id"))


Report = SparkReport  # its name before the split


def _write_html(files: Files, frames: dict[str, DataFrame], path: str) -> None:
    from cairn.central import report_html

    def rows(name: str) -> list[dict[str, Any]]:
        return [r.asDict() for r in frames[name].collect()]

    files.write_text(path, report_html.page(rows("gateways"), rows("gaps"), rows("daily"),
                                            rows("unsynced"), utc_now().isoformat(" ", "seconds")
                                            + " UTC", rows("fleet")))


# what a spreadsheet reads as a formula at a cell's start (OWASP, CSV injection)
FORMULA_STARTS = "=+-@\t\r"


def _write_csv(files: Files, frame: DataFrame, path: str) -> None:
    """One CSV file with a header (Spark writes a directory of parts: keep the one part), as
    RFC 4180 says (a quote inside a quoted cell is doubled: Spark's default, a backslash, is
    read by Python's csv, Excel and LibreOffice as more columns), cells kept as they are (no
    trimming), and each text cell that starts like a formula behind a ``'``: a gateway's
    text must not run in the spreadsheet of whoever opens the report."""
    temp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    (_inert(frame).coalesce(1).write.mode("overwrite").option("header", True)
     .option("escape", '"').option("ignoreLeadingWhiteSpace", False)
     .option("ignoreTrailingWhiteSpace", False).csv(temp))
    parts = files.glob(f"{temp}/part-*")
    if parts:
        files.move(parts[0], path)
    else:  # no rows: a header alone
        files.write_text(path, ",".join(frame.columns) + "\n")
    files.delete(temp)


def _inert(frame: DataFrame) -> DataFrame:
    """``frame`` with a ``'`` before each text cell that starts with one of FORMULA_STARTS."""
    starts = "^[" + "".join(f"\\x{ord(c):02x}" for c in FORMULA_STARTS) + "]"
    return frame.select([
        F.when(F.col(name).rlike(starts), F.concat(F.lit("'"), F.col(name)))
        .otherwise(F.col(name)).alias(name) if kind == "string" else F.col(name)
        for name, kind in frame.dtypes])
