"""Verifying a batch against its manifest: its bytes (size, sha256) and its lines (count,
whole events of its gateway, its seq range, no seq twice). The problems are worked out in
plain Python from per-batch totals (:func:`bytes_problem`, :func:`lines_problem`); the totals
come from one Spark pass each, next to the data.

A batch over :data:`CHECKED_BYTES` is first counted as a stream on the executors and no
further than its manifest's count + 1 lines (:func:`expansion_problems`): a few MiB of
bzip2 can hold gigabytes of well-formed lines (1,848:1 for repeated lean lines), which Spark
would parse and cache to the last before counting them (an 8 MiB batch: ~15 GB, about 13
minutes of ingest). A smaller batch is parsed, then quarantined (64 KiB of those repeated
lines: ~120 MB)."""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import (
    CHECKED_BYTES,
    REQUIRED,
    Candidate,
    bytes_problem,
    lines_past,
    lines_problem,
)
from cairn.central.spark.lean import parse_lean
from cairn.central.spark.schemas import EVENT_SCHEMA
from cairn.central.spark.session import batch_reader
from cairn.formats.batch import MAX_BOOTTIME_NS, MAX_WALL_MS


def bytes_problems(spark: SparkSession, candidates: list[Candidate]) -> dict[str, str]:
    """{data path: problem} for the batches whose raw bytes are not what the manifest says:
    one pass in the JVM, next to the data, bringing back a length and a sha256 per batch."""
    if not candidates:
        return {}
    sums = {r.uri: (r.length, r.sha256) for r in (
        spark.read.format("binaryFile").load([c.data_path for c in candidates])
        .select(F.col("_metadata.file_path").alias("uri"), "length",
                F.sha2("content", 256).alias("sha256"))
        .collect())}
    problems = {}
    for c in candidates:
        problem = bytes_problem(c.manifest, *sums.get(c.data_uri, (None, None)))
        if problem:
            problems[c.data_path] = problem
    return problems


def expansion_problems(spark: SparkSession, candidates: list[Candidate]) -> dict[str, str]:
    """{data path: problem} for the batches over CHECKED_BYTES that hold more lines than
    their manifest counts, each read on an executor no further than the line past it (one
    pass over the files, only when there are such batches: none costs no Python worker)."""
    big = [c for c in candidates if c.manifest["bytes"] > CHECKED_BYTES]
    if not big:
        return {}
    counts = {c.data_uri: c.manifest["count"] for c in big}
    past = F.udf(lambda uri, content: uri in counts and lines_past(content, uri, counts[uri]),
                 "boolean", useArrow=False)  # pickled rows: the job needs no pyarrow
    flagged = {r.uri for r in (
        spark.read.format("binaryFile").load([c.data_path for c in big])
        .select(F.col("_metadata.file_path").alias("uri"), "content")
        .where(past("uri", "content")).select("uri").collect())}
    return {c.data_path: (f"more lines than the {c.manifest['count']} its manifest counts "
                          f"(not read past line {c.manifest['count'] + 1})")
            for c in big if c.data_uri in flagged}


# times past these are no times (batch_format's bounds keep every later sum in a long)
_TIME_BOUNDS = {"wall_ms": (-MAX_WALL_MS, MAX_WALL_MS), "boottime_ns": (0, MAX_BOOTTIME_NS)}


def parse_batches(spark: SparkSession, batches: list[Candidate]) -> DataFrame:
    """The lines of ``batches`` as events, with the ``uri`` of the file each came from
    (schema 2's lean lines decoded to schema 1's); a time out of bounds is missing, so its
    line is not a whole event."""
    full = [c for c in batches if c.manifest["schema"] == 1]
    lean = [c for c in batches if c.manifest["schema"] == 2]
    frames = [parse_lean(spark, lean)] if lean else []
    if full or not lean:
        frames.insert(0, batch_reader(spark).schema(EVENT_SCHEMA)
                      .json([c.data_path for c in full])
                      .withColumn("uri", F.col("_metadata.file_path")))
    lines = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
    return lines.withColumns({name: F.when(F.col(name).between(low, high), F.col(name))
                              for name, (low, high) in _TIME_BOUNDS.items()})


def read_lines(spark: SparkSession, candidates: list[Candidate]) -> DataFrame:
    """Every line of the batches, parsed once and kept (memory, then disk): the line checks,
    the conflict check and the append all read this, not the files again. ``pos`` is the
    line's read position (gzip is not splittable: one task reads a file top to bottom)."""
    return (parse_batches(spark, candidates)
            .withColumn("pos", F.monotonically_increasing_id())
            .persist(StorageLevel.MEMORY_AND_DISK))


def line_problems(lines: DataFrame, candidates: list[Candidate]) -> dict[str, str]:
    """Per batch: its lines, those that are not whole events (and the first of them), the
    lowest and highest seq, the seqs that are there more than once, the gateways named.
    (A file's lines have consecutive read positions: one task reads it top to bottom.)"""
    if not candidates:
        return {}
    missing = F.filter(F.array(*[F.when(F.col(f).isNull(), F.lit(f)) for f in REQUIRED]),
                       lambda f: f.isNotNull())
    per_file = (lines.select("uri", "pos", "gateway_id", "seq", missing.alias("missing"))
                .groupBy("uri")
                .agg(F.count(F.lit(1)).alias("lines"),
                     F.count_if(F.size("missing") > 0).alias("incomplete"),
                     (F.min_by(F.struct("pos", "missing"), F.when(F.size("missing") > 0,
                                                                 F.col("pos")))
                      .alias("first_bad")),
                     F.min("pos").alias("top"),
                     F.min("seq").alias("first"), F.max("seq").alias("last"),
                     F.count_distinct("seq").alias("seqs"),
                     F.collect_set("gateway_id").alias("gateways")))
    found = {r.uri: r for r in per_file.collect()}
    problems = {}
    for c in candidates:
        problem = lines_problem(c.manifest, found.get(c.data_uri))
        if problem:
            problems[c.data_path] = problem
    return problems


