"""Which batches of a run can hold rows the table (or another batch of the run) holds, and
what to do about it: the one-pass choice and the overlaps among a run's batches (plain
Python, :func:`one_pass_batches`, :func:`overlapping_batches`, :func:`touched_ranges`), the
batches overlapping the ingest log (:func:`touching_batches`, one join with the log), the reading
and checking of the others one by one (:func:`check_lines`), and seqs re-used for other
events (:func:`_conflicts`)."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import Candidate
from cairn.central.spark.session import one_of
from cairn.central.spark.table import Table
from cairn.central.spark.verify import line_problems, read_lines


def ranges_of(spark: SparkSession, batches: list[Candidate]) -> DataFrame:
    """(uri, gw, lo, hi): each batch's data URI, gateway and seq range, from its manifest."""
    return spark.createDataFrame(
        [(c.data_uri, c.manifest["gateway_id"], c.manifest["first_seq"],
          c.manifest["last_seq"]) for c in batches], "uri string, gw string, lo long, hi long")


def touching_batches(spark: SparkSession, table: Table, candidates: list[Candidate]) -> set[str]:
    """The data URIs of ``candidates`` whose seq range overlaps a batch the ingest log holds:
    the only ones the table can hold rows in the range of, since a batch's rows and its log
    row are committed together. One join with the log, which has a row per batch: the
    table itself is not read, however long it grows."""
    if not candidates:
        return set()
    ranges = ranges_of(spark, candidates)
    log_ = table.batch_frame().where(F.col("status") == "ingested")
    return {r.uri for r in F.broadcast(ranges).join(
        log_, (F.col("gw") == log_.gateway_id) & (F.col("lo") <= log_.last_seq)
        & (F.col("hi") >= log_.first_seq)).select("uri").distinct().collect()}


def in_ranges(spark: SparkSession, table: DataFrame,
               ranges: list[tuple[str, int, int, str]]) -> DataFrame:
    """(gateway_id, seq, tag) of the rows of ``table`` inside ``ranges`` ([(gateway, first
    seq, last seq, tag)], not overlapping each other): a broadcast join on the ranges, not
    one OR per range (a thousand of those overflowed the JVM's stack), behind a coarse
    filter that lets Parquet skip row groups."""
    bounds = spark.createDataFrame(ranges, "range_gateway string, lo long, hi long, tag string")
    coarse = (one_of("gateway_id", sorted({gw for gw, _, _, _ in ranges}))
              & F.col("seq").between(min(lo for _, lo, _, _ in ranges),
                                     max(hi for _, _, hi, _ in ranges)))
    return (table.where(coarse).select("gateway_id", "seq")
            .join(F.broadcast(bounds), (F.col("gateway_id") == F.col("range_gateway"))
                  & F.col("seq").between(F.col("lo"), F.col("hi")))
            .select("gateway_id", "seq", "tag"))


def check_lines(spark: SparkSession, table: Table, batches: list[Candidate],
                 touching: set[str], read: list[DataFrame]) -> dict[str, str]:
    """{data path: problem} for ``batches``, read (and kept: appended to ``read``) and
    checked one by one: their lines, then seqs the table holds for other events."""
    if not batches:
        return {}
    lines = read_lines(spark, batches)
    read.append(lines)
    problems = line_problems(lines, batches)
    problems.update(_conflicts(spark, table, lines, [c for c in batches
                                                     if c.data_path not in problems], touching))
    return problems


# what makes a row the same event when a batch re-sends a seq the table holds
IDENTITY = ["publication", "topic", "wall_ms", "boot_id", "boottime_ns", "kwargs"]


def _conflicts(spark: SparkSession, table: Table, lines: DataFrame | None,
               candidates: list[Candidate], touching: set[str]) -> dict[str, str]:
    """{data path: problem} for batches re-using seqs the table holds for other events (a
    gateway whose store was reset, or another gateway under its id). Only the rows of
    batches whose range overlaps an ingested batch's are compared."""
    existing = table.events()
    if existing is None or lines is None or not candidates:
        return {}
    compared = [c for c in candidates if c.data_uri in touching]
    if not compared:
        return {}
    ranges = ranges_of(spark, compared)
    new = (lines.where(one_of("uri", [c.data_uri for c in compared]))
           .select("gateway_id", "seq", "uri", *IDENTITY))
    old = (existing.join(F.broadcast(ranges),
                         (existing.gateway_id == F.col("gw"))
                         & existing.seq.between(F.col("lo"), F.col("hi")), "left_semi")
           .select("gateway_id", "seq", *[F.col(c).alias(f"old_{c}") for c in IDENTITY]))
    differs = None
    for c in IDENTITY:
        one = ~F.col(c).eqNullSafe(F.col(f"old_{c}"))
        differs = one if differs is None else differs | one
    found = (new.join(old, ["gateway_id", "seq"]).where(differs).groupBy("uri")
             .agg(F.count(F.lit(1)).alias("n"), F.min("seq").alias("seq")).collect())
    by_uri = {c.data_uri: c.data_path for c in candidates}
    return {by_uri[r.uri]: f"{r.n} rows re-use seqs the table holds for other events "
            f"(first: seq {r.seq}); was the gateway's store reset, or is another gateway "
            "using its id?" for r in found}


