"""The landing, where gateways' batches arrive: listing it (one Spark job), telling which
manifests the ingest log has seen unchanged, reading manifests, and moving batches out of it
(to the archive once ingested, to the quarantine with a note when bad)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import name_of
from cairn.central.spark.files import Files, utc_now
from cairn.central.spark.table import Table
from cairn.formats.batch import MANIFEST_SUFFIX, MAX_MANIFEST_BYTES, stem


class LandingError(RuntimeError):
    """The landing cannot be listed (nothing in the table was touched)."""


@dataclass
class Landed:
    """What a listing of the landing found."""
    uris: set[str]  # the files in its gateway directories, as _metadata.file_path gives them
    # {manifest URI: (bytes, mtime_ms)} of the manifests over MAX_MANIFEST_BYTES: not read
    oversized: dict[str, tuple[int, int]]
    # {manifest URI: (path, gateway)} of the manifests ingested before and listed with the
    # size and modification time they had then: not read again
    unchanged: dict[str, tuple[str, str]]


def landed_manifests(spark: SparkSession, files: Files, landing: str, table: Table) -> Landed:
    from py4j.protocol import Py4JJavaError

    if not files.exists(landing):
        return Landed(set(), {}, {})
    try:
        # listing the tree from the top lists a directory per call (a glob of gateway/file
        # checked each of 20,000 files on its own: 9-18 s against 6)
        listed = (spark.read.format("binaryFile").option("recursiveFileLookup", True)
                  .load(landing)
                  .select("path", F.col("_metadata.file_path").alias("uri"),
                          F.col("length").alias("bytes"),
                          F.unix_millis("modificationTime").alias("mtime_ms"))
                  .collect())
    except Py4JJavaError as e:  # a landing of millions of files: the driver's heap
        raise LandingError(
            f"cannot list the landing {landing}: {e.java_exception.toString()}. Batch mode "
            "lists every file there: a million take about 1 GB of the driver's heap (--conf "
            "spark.driver.memory=4g); --archive DIR keeps the landing to what is pending"
        ) from None
    batch_files = [r for r in listed if r.path[len(landing) + 1:].count("/") == 1]
    manifests = [r for r in batch_files if r.uri.endswith(MANIFEST_SUFFIX)]
    return Landed({r.uri for r in batch_files},  # files deeper down are not batches
                   {r.uri: (r.bytes, r.mtime_ms) for r in manifests
                    if r.bytes > MAX_MANIFEST_BYTES},
                   _unchanged(spark, table, manifests))


def _unchanged(spark: SparkSession, table: Table,
               manifests: list[Any]) -> dict[str, tuple[str, str]]:
    """Of the listed ``manifests`` (path, uri, bytes, mtime_ms), those the ingest log holds
    as ingested with the same size and modification time: one join, the listed side
    broadcast (a shuffle of the listing cost more than the listing on a cluster)."""
    if not manifests or not table.files.matches(f"{table.batches}/*.parquet"):
        return {}
    listed = spark.createDataFrame([tuple(r) for r in manifests],
                                   "path string, uri string, bytes long, mtime_ms long")
    ingested = (table.batch_frame().where(F.col("status") == "ingested")
                .select(F.col("manifest").alias("path"), F.col("manifest_bytes").alias("bytes"),
                        F.col("manifest_mtime_ms").alias("mtime_ms"), "gateway_id"))
    return {r.uri: (r.path, r.gateway_id) for r in F.broadcast(listed)
            .join(ingested, ["path", "bytes", "mtime_ms"]).select("uri", "path", "gateway_id")
            .collect()}


class LandedManifest(NamedTuple):
    """A manifest as read, with the size and modification time a later listing compares."""
    uri: str  # as Spark's _metadata.file_path gives it
    text: str | None  # None: over MAX_MANIFEST_BYTES, not read
    bytes: int | None = None
    mtime_ms: int | None = None


def read_manifests(spark: SparkSession, files: Files, uris: list[str],
                   oversized: dict[str, tuple[int, int]]) -> list[LandedManifest]:
    """The manifests ``uris``; those in ``oversized`` ({URI: (bytes, mtime_ms)}) are not read
    (a whole text of 1 GiB ran the driver's heap out). Manifests on the local file system
    are read here, in the driver: the Spark job that reads the others, next to them, costs
    a few tenths of a second however few there are (a thousand local ones: 2.5 s)."""
    manifests = [LandedManifest(u, None, *oversized[u]) for u in uris if u in oversized]
    elsewhere = []
    for uri in (u for u in uris if u not in oversized):
        path = Files.local(files.from_uri(uri))
        if path is None:
            elsewhere.append(uri)
        else:
            manifests += _read_local(uri, path)
    return manifests + read_with_spark(spark, files, elsewhere)


def _read_local(uri: str, path: str) -> list[LandedManifest]:
    """The manifest at local ``path`` (none if it left since the listing), with the size and
    modification time Hadoop's listing gives it."""
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return []
    text = data.decode(errors="replace") if len(data) <= MAX_MANIFEST_BYTES else None
    return [LandedManifest(uri, text, stat.st_size, stat.st_mtime_ns // 1_000_000)]


def read_with_spark(spark: SparkSession, files: Files, uris: list[str]) -> list[LandedManifest]:
    """The manifests ``uris``, read in one Spark job."""
    if not uris:
        return []
    # (text()'s own wholetext argument would override an option)
    frame = spark.read.text([files.from_uri(u) for u in uris], wholetext=True).select(
        F.col("_metadata.file_path").alias("uri"), F.col("value").alias("text"),
        F.col("_metadata.file_size").alias("bytes"),
        F.unix_millis("_metadata.file_modification_time").alias("mtime_ms"))
    return [LandedManifest(*r) for r in frame.collect()]


def move_batch(files: Files, manifest_path: str, data_path: str, target: str) -> None:
    """Move a batch's files (whichever exist) into directory ``target``, the data file first:
    a manifest a crash leaves behind finds its batch in the ingest log the next time."""
    for path in (data_path, manifest_path):
        if files.exists(path):
            files.move(path, f"{target}/{path.rsplit('/', 1)[-1]}")


def quarantine_batch(files: Files, quarantine: str | None, manifest_path: str, data_path: str,
                reason: str) -> str:
    """Move a bad batch (both files, whichever exist) aside with a note of why, under the
    name of the landing directory it came from: never a name its manifest gives (a
    ``gateway_id`` of ``../..`` moved the files and wrote the note outside the quarantine)."""
    if quarantine is None:
        return "left in place: no quarantine directory given"
    target = f"{quarantine}/{manifest_path.rstrip('/').split('/')[-2]}"
    move_batch(files, manifest_path, data_path, target)
    files.write_text(f"{target}/{stem(data_path.rsplit('/', 1)[-1])}.reason.json", json.dumps(
        {"batch": name_of(data_path), "reason": reason, "quarantined": utc_now().isoformat() + "Z",
         "from": data_path}, indent=1))
    return f"moved to {target}"
