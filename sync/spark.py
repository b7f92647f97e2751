"""``cairn spark``: the central jobs. Landed batches -> one Parquet table -> reports.

The uploaders land ``<gateway_id>/<first>-<last>.jsonl.gz`` batches and, once a batch is
complete, its ``.manifest.json``. :func:`ingest` (one-shot) and :func:`ingest_stream`
(Structured Streaming, ``availableNow``, checkpointed) both hand the manifests they find to
:func:`ingest_manifests`, which

1. checks each manifest and its batch, in the JVM next to the data: the data file exists
   and has the manifest's size and sha256 (:func:`_bytes_problems`); its lines number
   ``count`` (a short gzip stream holds fewer), each a whole event of the manifest's
   gateway, no seq twice, the lowest and highest the manifest's. A batch that fails is moved to
   the quarantine directory (or left in place and logged when there is none) with one clear
   report line, and the job goes on with the rest;
2. reads the good batches once, and stages their rows without those the table (or another
   batch of this run) already holds, so re-running over the same files adds nothing. Which
   batches can overlap rows of the table is told by the ingest log (a row per batch), not by
   reading the table (:func:`_touching`). Most batches (seqs first..last without a hole,
   nothing logged or in the run overlapping them) are read, checked and written in one pass
   (:func:`_write_one_pass`); the others are read and kept, checked one by one, deduped with
   an anti-join on ``(gateway_id, seq)`` against the table in their ranges, then written
   (:func:`_check_lines`);
3. re-bases the time of rows recorded before the gateway's clock was synchronized (see
   :func:`reference_anchors`), keeping the raw ``timestamp``/``wall_ms``; rows are
   partitioned by the UTC date of the corrected ``event_time``;
4. when this run brought anchors that change how rows ingested earlier are re-based (the
   usual case: batches are shipped long before the clock is set), rewrites the partitions
   holding those rows (staged, then swapped in; an interrupted swap is finished by the next
   run);
5. commits the staged rows with the new clock anchors, the gateways' loss records and the
   ingest log's rows for the batches (one journaled move: the log holds a batch exactly when
   the table holds its rows).

Layout of the table directory (a local path or any Hadoop file system: hdfs://, s3a://):

    TABLE/date=2026-11-22/part-*.parquet   the events
    TABLE/_anchors/    clock anchors from the manifests (read deduplicated on gateway_id, id)
    TABLE/_gaps/       loss records of the gateways (events dropped there)
    TABLE/_batches/    the ingest log: one row per batch ingested or quarantined
    TABLE/_staging/    appends (with their side-table rows) and partition rewrites in progress
    TABLE/_lock        the table lock (sync.table_lock): ingests exclusive, reports shared

Spark skips names starting with ``_`` when it reads TABLE, so the table reads as the events
alone. Ingests (batch or streaming) of one table take turns: the second waits for the lock.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import unquote

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cairn.sync.batch_format import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    ManifestError,
    data_of,
    manifest_name,
    parse_manifest,
)
from cairn.sync.table_lock import locked

log = logging.getLogger("cairn.spark")

ROWS_PER_FILE = 2_000_000     # aim for Parquet files of about this many rows
BROADCAST_KEYS = 2_000_000    # existing keys up to this many are broadcast for the anti-join
NOT_LANDED = "not landed"
COMPACT_FILES = 64           # side tables are compacted into one file beyond this many
LOCK_WAIT_S = 600.0          # how long a run waits for the table lock before giving up
CHUNK_BATCHES = 20_000       # batch mode: batches per step (bounds the driver's memory)

# Settings every job needs; the session gets them at start and each job sets them again
# (the session may have been made by someone else).
JOB_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # write a few date partitions at once instead of sorting each task's rows by date first
    # (halves the time of the append on two cores)
    "spark.sql.maxConcurrentOutputFileWriters": "16",
    # a read of N listed files first checks them in a Spark job of min(N, 10000) tasks:
    # for thousands of small batches that alone took 20 s per read; 32 tasks list as fast
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "32",
}

# One line of a batch, as the uploader writes it. ``args``, ``kwargs``, ``details`` and
# ``audience`` are read as strings: Spark keeps the raw JSON of an object or array there.
EVENT_SCHEMA = T.StructType([
    T.StructField("gateway_id", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("publication", T.LongType()),
    T.StructField("realm", T.StringType()),
    T.StructField("topic", T.StringType()),
    T.StructField("wall_ms", T.LongType()),
    T.StructField("boot_id", T.StringType()),
    T.StructField("boottime_ns", T.LongType()),
    T.StructField("clock_synced", T.BooleanType()),
    T.StructField("authid", T.StringType()),
    T.StructField("authrole", T.StringType()),
    T.StructField("audience", T.StringType()),
    T.StructField("details", T.StringType()),
    T.StructField("args", T.StringType()),
    T.StructField("kwargs", T.StringType()),
])

TABLE_SCHEMA = T.StructType([
    T.StructField("gateway_id", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("publication", T.LongType()),
    T.StructField("realm", T.StringType()),
    T.StructField("topic", T.StringType()),
    T.StructField("timestamp", T.TimestampType()),      # raw wall clock of the gateway
    T.StructField("wall_ms", T.LongType()),             # the same, as it was stored
    T.StructField("boot_id", T.StringType()),
    T.StructField("boottime_ns", T.LongType()),
    T.StructField("clock_synced", T.BooleanType()),
    T.StructField("event_time", T.TimestampType()),     # corrected time
    T.StructField("time_estimated", T.BooleanType()),   # event_time was re-based
    T.StructField("time_anchor", T.LongType()),         # id of the anchor it was re-based on
    T.StructField("authid", T.StringType()),
    T.StructField("authrole", T.StringType()),
    T.StructField("audience", T.StringType()),
    T.StructField("details", T.StringType()),
    T.StructField("args", T.StringType()),
    T.StructField("kwargs", T.StringType()),
    T.StructField("batch", T.StringType()),             # the batch file it came in
    T.StructField("ingested_at", T.TimestampType()),
    T.StructField("date", T.DateType()),                # partition: UTC date of event_time
])
TABLE_COLUMNS = [f.name for f in TABLE_SCHEMA.fields]

ANCHOR_SCHEMA = T.StructType([
    T.StructField("gateway_id", T.StringType()),
    T.StructField("id", T.LongType()),
    T.StructField("reason", T.StringType()),
    T.StructField("boot_id", T.StringType()),
    T.StructField("boottime_ns", T.LongType()),
    T.StructField("wall_ns", T.LongType()),
    T.StructField("offset_before_ns", T.LongType()),
    T.StructField("clock_synced", T.BooleanType()),
    T.StructField("after_seq", T.LongType()),
])

GAP_SCHEMA = T.StructType([
    T.StructField("gateway_id", T.StringType()),
    T.StructField("id", T.LongType()),
    T.StructField("realm", T.StringType()),
    T.StructField("rule", T.LongType()),
    T.StructField("first_seq", T.LongType()),
    T.StructField("last_seq", T.LongType()),
    T.StructField("count", T.LongType()),
    T.StructField("reason", T.StringType()),
    T.StructField("wall_ms", T.LongType()),
])

BATCH_LOG_SCHEMA = T.StructType([
    T.StructField("gateway_id", T.StringType()),
    T.StructField("file", T.StringType()),
    T.StructField("sha256", T.StringType()),
    T.StructField("after_seq", T.LongType()),
    T.StructField("first_seq", T.LongType()),
    T.StructField("last_seq", T.LongType()),
    T.StructField("count", T.LongType()),
    T.StructField("status", T.StringType()),   # ingested | quarantined
    T.StructField("reason", T.StringType()),
    T.StructField("manifest", T.StringType()),
    # the manifest file's size and modification time when read: a later listing that shows
    # the same skips reading it again
    T.StructField("manifest_bytes", T.LongType()),
    T.StructField("manifest_mtime_ms", T.LongType()),
    T.StructField("run", T.StringType()),
    T.StructField("logged_at", T.TimestampType()),
])

REF_SCHEMA = T.StructType([
    T.StructField("gateway_id", T.StringType()),
    T.StructField("boot_id", T.StringType()),
    T.StructField("ref_id", T.LongType()),
    T.StructField("ref_wall_ns", T.LongType()),
    T.StructField("ref_boottime_ns", T.LongType()),
])


# -- the session ---------------------------------------------------------------------------

def session(master: str = "local[*]", conf: dict[str, str] | None = None,
            app: str = "cairn") -> SparkSession:
    """A SparkSession on ``master`` (``local[*]``, ``spark://...``, ``yarn``, ``k8s://...``).
    Executors run ``spark.pyspark.python`` when given; local masters default to this
    interpreter, others to ``python3`` on the workers (which need no Cairn: it is shipped)."""
    settings = {**JOB_CONF, "spark.ui.showConsoleProgress": "false"}
    python = (conf or {}).get("spark.pyspark.python")
    if python:  # PySpark takes the executors' Python from the environment, not the conf
        os.environ["PYSPARK_PYTHON"] = python
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # 200 shuffle partitions are for clusters; on one machine a few per core do better
        cores = master.removeprefix("local").strip("[]").split(",")[0]
        cores = int(cores) if cores.isdigit() else os.cpu_count() or 1
        settings["spark.sql.shuffle.partitions"] = str(max(2, 2 * cores))
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _prepare(spark: SparkSession) -> None:
    for key, value in JOB_CONF.items():
        spark.conf.set(key, value)
    ship_code(spark)


# Cairn's packages the executors import (cairn.sync.spark and what it imports), by their
# folders. Workers of a cluster need Python and PySpark, not Cairn: the job ships these itself.
SHIPPED_PACKAGES = ("sync", "gateway")


def code_zip(directory: str | None = None) -> str:
    """A zip of :data:`SHIPPED_PACKAGES` (their ``.py`` files, under ``cairn/`` as installed),
    named by its content's hash so that a changed Cairn gets a new name (Spark refuses a
    second file of the same name)."""
    import hashlib
    import tempfile
    import zipfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = sorted(
        os.path.relpath(os.path.join(folder, name), root)
        for package in SHIPPED_PACKAGES
        for folder, _, names in os.walk(os.path.join(root, package))
        for name in names if name.endswith(".py"))
    digest = hashlib.sha256()
    for rel in sources:
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read())
    target = os.path.join(directory or tempfile.gettempdir(),
                          f"cairn-{digest.hexdigest()[:16]}.zip")
    if not os.path.exists(target):  # write aside and rename: concurrent jobs share the name
        temp = f"{target}.{os.getpid()}.tmp"
        with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("cairn/__init__.py", "")  # zipimport finds regular packages only
            for rel in sources:
                z.write(os.path.join(root, rel), f"cairn/{rel}")
        os.replace(temp, target)
    return target


def ship_code(spark: SparkSession) -> None:
    """Make Cairn importable on the executors (once per SparkContext): addPyFile puts the
    zip on every executor's Python path, as ``--py-files`` would."""
    sc = spark.sparkContext
    name = os.path.basename(code_zip())
    if any(os.path.basename(p) == name for p in sc._python_includes):
        return
    sc.addPyFile(code_zip())


# -- files, through Hadoop's FileSystem (local, HDFS, S3A: whatever the cluster reads) -----

class Files:
    def __init__(self, spark: SparkSession) -> None:
        self._jvm = spark._jvm
        self._conf = spark._jsc.hadoopConfiguration()

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def qualify(self, path: str) -> str:
        """``landing`` -> ``file:/work/landing``: the form Spark reports paths in."""
        p = self._path(path)
        return self._fs(p).makeQualified(p).toString().rstrip("/")

    @staticmethod
    def from_uri(uri: str) -> str:
        """A path as Spark's ``_metadata.file_path`` gives it (URL-encoded) -> plain, as
        Hadoop's ``Path(URI).toString()`` has it (decoded in Python: a call into the JVM
        per file cost seconds per thousand batches)."""
        return unquote(uri)

    def exists(self, path: str) -> bool:
        p = self._path(path)
        return bool(self._fs(p).exists(p))

    def glob(self, pattern: str) -> list[str]:
        p = self._path(pattern)
        found = self._fs(p).globStatus(p)
        return [] if found is None else [s.getPath().toString() for s in found]

    def matches(self, pattern: str) -> bool:
        """Whether anything matches ``pattern`` (without a call per match, as glob makes)."""
        p = self._path(pattern)
        found = self._fs(p).globStatus(p)
        return found is not None and len(found) > 0

    def children(self, path: str) -> list[str]:
        p = self._path(path)
        fs = self._fs(p)
        if not fs.exists(p):
            return []
        return [s.getPath().toString() for s in fs.listStatus(p)]

    def mkdirs(self, path: str) -> None:
        p = self._path(path)
        self._fs(p).mkdirs(p)

    def delete(self, path: str) -> None:
        p = self._path(path)
        fs = self._fs(p)
        if fs.exists(p):
            fs.delete(p, True)

    def move(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)
        src_fs, dst_fs = self._fs(src), self._fs(dst)
        dst_fs.mkdirs(dst.getParent())
        if dst_fs.exists(dst):
            dst_fs.delete(dst, True)
        if src_fs.getUri().equals(dst_fs.getUri()) and src_fs.rename(src, dst):
            return
        ok = self._jvm.org.apache.hadoop.fs.FileUtil.copy(src_fs, src, dst_fs, dst, True,
                                                          self._conf)
        if not ok:
            raise OSError(f"cannot move {source} to {target}")

    def create_new(self, path: str, text: str) -> bool:
        """Create ``path`` holding ``text`` unless it exists (atomic on HDFS); False if it
        did."""
        p = self._path(path)
        try:
            out = self._fs(p).create(p, False)
        except Exception as e:  # py4j wraps FileAlreadyExistsException
            if "FileAlreadyExists" in str(e) or "already exists" in str(e):
                return False
            raise
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        return True

    def write_text(self, path: str, text: str) -> None:
        p = self._path(path)
        out = self._fs(p).create(p, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()

    def read_text(self, path: str) -> str:
        p = self._path(path)
        stream = self._fs(p).open(p)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode()


def _name(path: str) -> str:
    """The last two parts of a path: ``gateway/file``, how batches are named in reports."""
    return "/".join(path.rstrip("/").split("/")[-2:])


# -- time correction -----------------------------------------------------------------------

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


def _with_event_time(rows: DataFrame, refs: DataFrame) -> DataFrame:
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


# -- checking batches ----------------------------------------------------------------------

# the fields every event has (NOT NULL in the gateway's store)
REQUIRED = ("gateway_id", "seq", "publication", "realm", "topic", "wall_ms", "boot_id",
            "boottime_ns", "clock_synced")


@dataclass
class _Candidate:
    manifest_path: str
    data_path: str
    manifest: dict[str, Any]
    data_uri: str = ""  # data_path as Spark's _metadata.file_path gives it (URL-encoded)

    @property
    def name(self) -> str:
        return _name(self.data_path)


def _bytes_problems(spark: SparkSession, candidates: list[_Candidate]) -> dict[str, str]:
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
        problem = _bytes_problem(c.manifest, *sums.get(c.data_uri, (None, None)))
        if problem:
            problems[c.data_path] = problem
    return problems


def _bytes_problem(manifest: dict[str, Any], length: int | None,
                   sha256: str | None) -> str | None:
    if length is None or sha256 is None:
        return "Spark could not read the data file"
    if length != manifest["bytes"]:
        return f"{length} bytes, the manifest says {manifest['bytes']} (truncated?)"
    if sha256 != manifest["sha256"]:
        return (f"sha256 {sha256[:16]}... differs from the manifest's "
                f"{manifest['sha256'][:16]}...")
    return None


def _parse(spark: SparkSession, batches: list[_Candidate]) -> DataFrame:
    """The lines of ``batches`` as events, with the ``uri`` of the file each came from."""
    return (spark.read.option("ignoreCorruptFiles", True)  # a short gzip: fewer lines
            .schema(EVENT_SCHEMA).json([c.data_path for c in batches])
            .withColumn("uri", F.col("_metadata.file_path")))


def _read_lines(spark: SparkSession, candidates: list[_Candidate]) -> DataFrame:
    """Every line of the batches, parsed once and kept (memory, then disk): the line checks,
    the conflict check and the append all read this, not the files again. ``pos`` is the
    line's read position (gzip is not splittable: one task reads a file top to bottom)."""
    return (_parse(spark, candidates)
            .withColumn("pos", F.monotonically_increasing_id())
            .persist(StorageLevel.MEMORY_AND_DISK))


def _line_problems(lines: DataFrame, candidates: list[_Candidate]) -> dict[str, str]:
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
        problem = _lines_problem(c.manifest, found.get(c.data_uri))
        if problem:
            problems[c.data_path] = problem
    return problems


def _lines_problem(manifest: dict[str, Any], batch: Any) -> str | None:
    """What is wrong with one batch's lines (``batch``: its row of the per-file checks)."""
    count, gateway_id = manifest["count"], manifest["gateway_id"]
    if batch is None or batch.lines != count:
        return f"{0 if batch is None else batch.lines} lines, the manifest says {count}"
    if batch.incomplete:
        bad = batch.first_bad
        what = ("is not JSON" if len(bad.missing) == len(REQUIRED)
                else f"has no {', '.join(bad.missing)}")
        return (f"{batch.incomplete} lines are not events of the batch format: "
                f"line {bad.pos - batch.top + 1} {what}")
    others = sorted(g for g in batch.gateways if g != gateway_id)
    if others:
        return f"rows of gateway {', '.join(others[:3])} in a batch of {gateway_id!r}"
    if batch.first != manifest["first_seq"] or batch.last != manifest["last_seq"]:
        return (f"seqs {batch.first}..{batch.last}, the manifest says "
                f"{manifest['first_seq']}..{manifest['last_seq']}")
    if batch.seqs != count:
        return f"{count - batch.seqs} lines repeat a seq of the batch"
    return None


# -- ingest --------------------------------------------------------------------------------

@dataclass
class IngestStats:
    manifests: int = 0        # manifests looked at
    ingested: int = 0         # batches read into the table
    one_pass: int = 0         # of those, batches read, checked and written in one pass
    already: int = 0          # batches skipped: the same file was ingested before
    unread: int = 0           # of those, manifests not read: listed as when ingested
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (batch, reason)
    waiting: int = 0          # data files whose manifest has not landed (batch mode)
    rows_read: int = 0
    rows_added: int = 0
    rows_estimated: int = 0   # of the rows added, those with a re-based event_time
    rows_rebased: int = 0     # rows already in the table re-based with newly arrived anchors
    micro_batches: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step

    def timed(self, phase: str, started: float) -> float:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - started
        return now

    @property
    def duplicates(self) -> int:
        return self.rows_read - self.rows_added

    def count_added(self, totals: dict[str, Any]) -> None:
        self.rows_added += int(totals.get("rows") or 0)
        self.rows_estimated += int(totals.get("estimated") or 0)

    def add(self, other: IngestStats) -> None:
        for name in ("manifests", "ingested", "one_pass", "already", "unread", "waiting",
                     "rows_read", "rows_added", "rows_estimated", "rows_rebased"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.quarantined += other.quarantined
        for phase, seconds in other.phases.items():
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def summary(self) -> str:
        rate = self.rows_read / self.seconds if self.seconds else 0.0
        text = (f"{self.manifests} manifests: {self.ingested} batches ingested"
                + (f" ({self.one_pass} in one pass)" if self.one_pass else "")
                + f", {self.already} already in the table"
                + (f" ({self.unread} unchanged since, not read again)" if self.unread else "")
                + f", {len(self.quarantined)} quarantined"
                + (f", {self.waiting} data files waiting for their manifest"
                   if self.waiting else "")
                + f"; {self.rows_read} rows read, {self.rows_added} added "
                f"({self.duplicates} duplicates, {self.rows_estimated} with estimated time)")
        if self.rows_rebased:
            text += f"; {self.rows_rebased} earlier rows re-based on new clock anchors"
        if self.micro_batches:
            text += f"; {self.micro_batches} micro-batches"
        return text + f"; {self.seconds:.1f} s ({rate:,.0f} rows/s)"


class TableDir:
    """Paths of a table directory and reads of its side tables."""

    def __init__(self, spark: SparkSession, files: Files, root: str) -> None:
        self.spark, self.files, self.root = spark, files, root
        self.anchors = f"{root}/_anchors"
        self.gaps = f"{root}/_gaps"
        self.batches = f"{root}/_batches"
        self.staging = f"{root}/_staging"

    def events(self) -> DataFrame | None:
        if not self.files.matches(f"{self.root}/date=*"):
            return None
        return self.spark.read.schema(TABLE_SCHEMA).parquet(self.root)

    def _side(self, path: str, schema: T.StructType) -> DataFrame:
        if not self.files.matches(f"{path}/*.parquet"):
            return self.spark.createDataFrame([], schema)
        return self.spark.read.schema(schema).parquet(path)

    def anchor_frame(self) -> DataFrame:
        return self._side(self.anchors, ANCHOR_SCHEMA).dropDuplicates(["gateway_id", "id"])

    def gap_frame(self) -> DataFrame:
        return self._side(self.gaps, GAP_SCHEMA).dropDuplicates(["gateway_id", "id"])

    def batch_frame(self) -> DataFrame:
        return self._side(self.batches, BATCH_LOG_SCHEMA)

    def _sides(self) -> dict[str, T.StructType]:
        """The side tables (the ingest log last: it moves in after what it vouches for)."""
        return {self.anchors: ANCHOR_SCHEMA, self.gaps: GAP_SCHEMA,
                self.batches: BATCH_LOG_SCHEMA}

    def append(self, path: str, rows: list[tuple], schema: T.StructType,
               stage: str | None = None) -> None:
        """Append to side table ``path`` (one small file per run), compacting it now and
        then; or with ``stage``, into that staged append, to move in with its rows."""
        if not rows:
            return
        target = f"{stage}/{path.rsplit('/', 1)[-1]}" if stage else path
        frame = self.spark.createDataFrame(rows, schema).coalesce(1)
        frame.write.mode("append").parquet(target)
        if not stage:
            self._compact(path, schema)

    def _compact(self, path: str, schema: T.StructType) -> None:
        """Readers of side tables tolerate duplicate rows, so compaction writes the merged
        file first and deletes the small ones after: a crash between leaves duplicates,
        never a loss."""
        parts = self.files.glob(f"{path}/part-*.parquet")
        if len(parts) > COMPACT_FILES:
            merged = self.spark.read.schema(schema).parquet(*parts).distinct().coalesce(1)
            merged.write.mode("append").parquet(path)
            for part in parts:
                self.files.delete(part)

    def recover(self) -> None:
        """Finish a partition swap or a commit that a crash interrupted; drop unfinished
        staging."""
        for stage in self.files.children(self.staging):
            journal = f"{stage}/_SWAP"
            if self.files.exists(journal):
                dates = json.loads(self.files.read_text(journal))
                log.warning("finishing an interrupted rewrite of %d partitions", len(dates))
                self.swap(stage, dates)
            elif self.files.exists(f"{stage}/_COMMIT"):
                log.warning("finishing an interrupted commit of staged rows")
                self._move_in(stage)
            else:
                self.files.delete(stage)

    def commit(self, stage: str) -> None:
        """Move the files of a staged append (``stage/date=D/*.parquet``, then the side
        tables' rows that came with them: ``stage/_anchors``, ``_gaps``, ``_batches``) into
        the table. The journal written first makes the next run finish a move a crash
        interrupted: a batch is in the ingest log exactly when its rows are in the table."""
        self.files.write_text(f"{stage}/_COMMIT", "")
        self._move_in(stage)
        for path, schema in self._sides().items():
            self._compact(path, schema)

    def _move_in(self, stage: str) -> None:
        for part in self.files.glob(f"{stage}/date=*/*.parquet"):
            self.files.move(part, f"{self.root}/{_name(part)}")  # date=D/part-...parquet
        for side in self._sides():
            for part in self.files.glob(f"{stage}/{side.rsplit('/', 1)[-1]}/*.parquet"):
                self.files.move(part, f"{side}/{part.rsplit('/', 1)[-1]}")
        self.files.delete(stage)

    def swap(self, stage: str, dates: list[str]) -> None:
        for d in dates:
            staged, live = f"{stage}/date={d}", f"{self.root}/date={d}"
            if self.files.exists(staged):
                self.files.delete(live)
                self.files.move(staged, live)
                if not self.files.glob(f"{live}/*.parquet"):
                    self.files.delete(live)
        self.files.delete(stage)


def ingest(spark: SparkSession, landing: str, table: str, quarantine: str | None = None,
           wait: float = LOCK_WAIT_S, chunk: int = CHUNK_BATCHES,
           archive: str | None = None) -> IngestStats:
    """One-shot ingest of every batch under ``landing`` whose manifest has landed, holding
    the table's exclusive lock (waiting up to ``wait`` seconds for it), ``chunk`` batches
    per step. With ``archive``, batches leave the landing for it once ingested."""
    started = time.monotonic()
    _prepare(spark)
    files = Files(spark)
    landing, table = files.qualify(landing), files.qualify(table)
    quarantine = files.qualify(quarantine) if quarantine else None
    archive = files.qualify(archive) if archive else None
    with locked(table, files, exclusive=True, wait=wait, what=f"an ingest of {landing}"):
        stats = _ingest_locked(spark, files, landing, table, quarantine, chunk, archive)
    stats.seconds = time.monotonic() - started
    return stats


def _ingest_locked(spark: SparkSession, files: Files, landing: str, table: str,
                   quarantine: str | None, chunk: int, archive: str | None) -> IngestStats:
    """The landing listed once, by Spark (one job, no call into the JVM per file), then its
    manifests ``chunk`` at a time: a landing of millions of files is never read or verified
    all at once."""
    started = time.monotonic()
    store = TableDir(spark, files, table)
    store.recover()
    landed = _landed(spark, files, landing, store)
    manifest_uris = sorted(u for u in landed.uris
                           if u.endswith(MANIFEST_SUFFIX) and u not in landed.unchanged)
    stats = IngestStats()
    stats.timed("listing", started)
    stats.waiting = sum(1 for u in landed.uris if u.endswith(DATA_SUFFIX)
                        and manifest_name(u) not in landed.uris)
    stats.manifests = stats.already = stats.unread = len(landed.unchanged)
    if archive:
        for manifest_path, gateway in landed.unchanged.values():
            _move_batch(files, manifest_path, data_of(manifest_path), f"{archive}/{gateway}")
    for start in range(0, max(len(manifest_uris), 1), chunk):
        stats.add(_ingest_paths(spark, files, manifest_uris[start:start + chunk], table,
                                quarantine, landed.uris, archive))
    return stats


class LandingError(RuntimeError):
    """The landing cannot be listed (nothing in the table was touched)."""


@dataclass
class _Landed:
    """What a listing of the landing found."""
    uris: set[str]  # the files in its gateway directories, as _metadata.file_path gives them
    # {manifest URI: (path, gateway)} of the manifests ingested before and listed with the
    # size and modification time they had then: not read again
    unchanged: dict[str, tuple[str, str]]


def _landed(spark: SparkSession, files: Files, landing: str, store: TableDir) -> _Landed:
    from py4j.protocol import Py4JJavaError

    if not files.exists(landing):
        return _Landed(set(), {})
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
    return _Landed({r.uri for r in batch_files},  # files deeper down are not batches
                   _unchanged(spark, store, [r for r in batch_files
                                             if r.uri.endswith(MANIFEST_SUFFIX)]))


def _unchanged(spark: SparkSession, store: TableDir,
               manifests: list[Any]) -> dict[str, tuple[str, str]]:
    """Of the listed ``manifests`` (path, uri, bytes, mtime_ms), those the ingest log holds
    as ingested with the same size and modification time: one join, the listed side
    broadcast (a shuffle of the listing cost more than the listing on a cluster)."""
    if not manifests or not store.files.matches(f"{store.batches}/*.parquet"):
        return {}
    listed = spark.createDataFrame([tuple(r) for r in manifests],
                                   "path string, uri string, bytes long, mtime_ms long")
    ingested = (store.batch_frame().where(F.col("status") == "ingested")
                .select(F.col("manifest").alias("path"), F.col("manifest_bytes").alias("bytes"),
                        F.col("manifest_mtime_ms").alias("mtime_ms"), "gateway_id"))
    return {r.uri: (r.path, r.gateway_id) for r in F.broadcast(listed)
            .join(ingested, ["path", "bytes", "mtime_ms"]).select("uri", "path", "gateway_id")
            .collect()}


class LandedManifest(NamedTuple):
    """A manifest as read, with the size and modification time a later listing compares."""
    uri: str  # as Spark's _metadata.file_path gives it
    text: str
    bytes: int | None = None
    mtime_ms: int | None = None


def _manifest_columns() -> list[Column]:
    """The columns of :class:`LandedManifest`, from a text read with ``wholetext``."""
    return [F.col("_metadata.file_path").alias("uri"), F.col("value").alias("text"),
            F.col("_metadata.file_size").alias("bytes"),
            F.unix_millis("_metadata.file_modification_time").alias("mtime_ms")]


def _ingest_paths(spark: SparkSession, files: Files, manifest_uris: list[str], table: str,
                  quarantine: str | None, landed: set[str],
                  archive: str | None) -> IngestStats:
    started = time.monotonic()
    manifests: list[LandedManifest] = []
    if manifest_uris:
        # (text()'s own wholetext argument would override an option)
        frame = (spark.read.text([files.from_uri(u) for u in manifest_uris], wholetext=True)
                 .select(*_manifest_columns()))
        manifests = [LandedManifest(*r) for r in frame.collect()]
    read_s = time.monotonic() - started
    stats = ingest_manifests(spark, manifests, table, quarantine, files, landed, archive)
    stats.phases["manifests"] = stats.phases.get("manifests", 0.0) + read_s
    if len(manifest_uris) > 1:
        log.info("%s", stats.summary())
    return stats


def ingest_stream(spark: SparkSession, landing: str, table: str, checkpoint: str,
                  quarantine: str | None = None, max_batches: int = 1000,
                  wait: float = LOCK_WAIT_S, archive: str | None = None) -> IngestStats:
    """Structured Streaming over the manifests landing under ``landing``, trigger
    ``availableNow``: everything that landed since the last run (the checkpoint remembers
    which manifests were seen), in micro-batches of at most ``max_batches`` manifests, then
    stop. Each micro-batch is verified and ingested by :func:`ingest_manifests` in
    ``foreachBatch``; a re-run micro-batch adds nothing (the anti-join). Holds the table's
    exclusive lock for the whole run."""
    started = time.monotonic()
    _prepare(spark)
    files = Files(spark)
    landing, table = files.qualify(landing), files.qualify(table)
    checkpoint = files.qualify(checkpoint)
    quarantine = files.qualify(quarantine) if quarantine else None
    archive = files.qualify(archive) if archive else None
    with locked(table, files, exclusive=True, wait=wait, what=f"a streaming ingest of {landing}"):
        total = _stream_locked(spark, files, landing, table, checkpoint, quarantine,
                               max_batches, archive)
    total.seconds = time.monotonic() - started
    return total


def _stream_locked(spark: SparkSession, files: Files, landing: str, table: str,
                   checkpoint: str, quarantine: str | None, max_batches: int,
                   archive: str | None) -> IngestStats:
    TableDir(spark, files, table).recover()
    total = IngestStats()

    def each(frame: DataFrame, batch_id: int) -> None:
        manifests = [LandedManifest(*r) for r in frame.collect()]
        stats = ingest_manifests(frame.sparkSession, manifests, table, quarantine, files,
                                 archive=archive)
        total.add(stats)
        total.micro_batches += 1
        log.info("micro-batch %d: %s", batch_id, stats.summary())

    stream = (spark.readStream.format("text").option("wholetext", True)
              .option("maxFilesPerTrigger", max_batches)
              .load(f"{landing}/*/*{MANIFEST_SUFFIX}")
              .select(*_manifest_columns()))
    query = (stream.writeStream.foreachBatch(each)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return total


def ingest_manifests(spark: SparkSession, manifests: list[LandedManifest], table: str,
                     quarantine: str | None = None, files: Files | None = None,
                     landed: set[str] | None = None,
                     archive: str | None = None) -> IngestStats:
    """Verify, dedupe, re-base and append the batches of ``manifests`` into ``table``. ``landed``:
    the URIs of the files known to be there (else each data file is looked for). Bad
    batches go to ``quarantine``, ingested ones (this time or before) to ``archive``."""
    started = time.monotonic()
    files = files or Files(spark)
    store = TableDir(spark, files, table)
    run = uuid.uuid4().hex[:12]
    stats = IngestStats(manifests=len(manifests))
    log_rows: list[tuple] = []
    stamps = {files.from_uri(m.uri): (m.bytes, m.mtime_ms) for m in manifests}

    def log_row(manifest_path: str, m: dict[str, Any], gateway: str | None, file: str,
                status: str, reason: str | None = None) -> tuple:
        """A row of the ingest log (:data:`BATCH_LOG_SCHEMA`)."""
        return (gateway, file, m.get("sha256"), m.get("after_seq"), m.get("first_seq"),
                m.get("last_seq"), m.get("count"), status, reason, manifest_path,
                *stamps.get(manifest_path, (None, None)), run, _now())

    def reject(manifest_path: str, data_path: str, manifest: dict[str, Any] | None,
               reason: str) -> None:
        m = manifest or {}
        gateway = m.get("gateway_id") if isinstance(m.get("gateway_id"), str) else None
        where = _quarantine(files, quarantine, manifest_path, data_path, gateway, reason)
        name = _name(data_path)
        stats.quarantined.append((name, reason))
        log.warning("quarantined %s: %s (%s)", name, reason, where)
        log_rows.append(log_row(manifest_path, m, gateway, m.get("file") or name,
                                "quarantined", reason))

    parsed: list[_Candidate] = []
    for manifest_uri, text, *_ in manifests:
        manifest_path = files.from_uri(manifest_uri)
        data_path = data_of(manifest_path)
        try:
            parsed.append(_Candidate(manifest_path, data_path, parse_manifest(text),
                                     data_of(manifest_uri)))
        except ManifestError as e:
            reject(manifest_path, data_path, None, str(e))
    done = set()
    if parsed:  # which of these batches are in the table already (same file, same bytes)
        names = sorted({c.manifest["file"] for c in parsed})
        done = {(r.file, r.sha256) for r in store.batch_frame()
                .where((F.col("status") == "ingested") & F.col("file").isin(names))
                .select("file", "sha256").collect()}
    candidates: list[_Candidate] = []
    already: list[_Candidate] = []
    for c in parsed:
        m = c.manifest
        if (m["file"], m["sha256"]) in done:
            already.append(c)
        elif m["file"] != c.name or not m["file"].startswith(m["gateway_id"] + "/"):
            # a manifest vouches only for the file beside it, in its own gateway's directory
            reject(c.manifest_path, c.data_path, m,
                   f"manifest of gateway {m['gateway_id']!r} names {m['file']}")
        elif (c.data_uri not in landed) if landed is not None else (
                not files.exists(c.data_path)):
            reject(c.manifest_path, c.data_path, m, "the data file is missing")
        else:
            candidates.append(c)
    clock = stats.timed("manifests", started)
    problems = _bytes_problems(spark, candidates)
    clock = stats.timed("verify bytes", clock)
    sound = [c for c in candidates if c.data_path not in problems]
    had_rows = store.events() is not None
    touching = _touching(spark, store, sound)  # one look at the log for the whole chunk
    one_pass = _one_pass_batches(sound, touching)
    clock = stats.timed("overlaps", clock)
    in_one_pass = {c.data_path for c in one_pass}
    read: list[DataFrame] = []  # the lines read and kept, to let go of at the end
    stage = f"{store.staging}/{run}"  # rows and side-table rows, committed together
    try:
        problems.update(_check_lines(spark, store, [c for c in sound
                                                     if c.data_path not in in_one_pass],
                                     touching, read))
        clock = stats.timed("read+check lines", clock)
        good = [c for c in candidates if c.data_path not in problems]
        anchors = _anchors(spark, store, good)
        stats.rows_read = sum(c.manifest["count"] for c in good)
        if one_pass:
            if _write_one_pass(spark, one_pass, anchors, stats, stage, run):
                stats.one_pass = len(one_pass)
            else:
                log.warning("%d batches read in one pass are not all what their manifests "
                            "say: checking them one by one", len(one_pass))
                found = _check_lines(spark, store, one_pass, touching, read)
                problems.update(found)
                in_one_pass = set()
                if found:
                    good = [c for c in good if c.data_path not in found]
                    anchors = _anchors(spark, store, good)
                    stats.rows_read = sum(c.manifest["count"] for c in good)
            clock = stats.timed("read+check+write in one pass", clock)
        for c in candidates:
            if c.data_path in problems:
                reject(c.manifest_path, c.data_path, c.manifest, problems[c.data_path])
        checked = [c for c in good if c.data_path not in in_one_pass]
        if checked:
            _append_checked(spark, store, read, checked, touching, anchors, stats, stage,
                            run)
        if good:
            _record_anchors(spark, store, anchors, had_rows, stats, stage)
            clock = time.monotonic()
            store.append(store.batches, [
                log_row(c.manifest_path, c.manifest, c.manifest["gateway_id"],
                        c.manifest["file"], "ingested") for c in good], BATCH_LOG_SCHEMA, stage)
            store.commit(stage)
            clock = stats.timed("commit", clock)
    finally:
        for frame in read:
            frame.unpersist()
    clock = time.monotonic()
    store.append(store.batches, log_rows, BATCH_LOG_SCHEMA)  # the quarantined
    clock = stats.timed("log", clock)
    if archive:  # after the log: a crash between leaves batches the next run finds done
        for c in good + already:
            _move_batch(files, c.manifest_path, c.data_path,
                        f"{archive}/{c.manifest['gateway_id']}")
        stats.timed("archive", clock)
    stats.already = len(already)
    stats.ingested = len(good)
    stats.seconds = time.monotonic() - started
    return stats


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC).replace(tzinfo=None)


@dataclass
class _Anchors:
    """What the good batches of a run bring besides rows."""
    new: dict[tuple[str, int], dict[str, Any]]  # clock anchors the table does not have yet
    refs: dict[tuple[str, str], dict[str, Any]]  # the reference anchor of each boot
    frame: DataFrame                             # refs, to join rows with
    gaps: dict[tuple[str, int], tuple]           # loss records
    moved: set[tuple[str, str]]  # boots with rows in the table whose reference this run moved


def _anchors(spark: SparkSession, store: TableDir, good: list[_Candidate]) -> _Anchors:
    """The clock anchors the table knows plus those ``good`` brings, and its loss records."""
    known = [r.asDict() for r in store.anchor_frame().collect()]
    known_keys = {(a["gateway_id"], a["id"]) for a in known}
    new: dict[tuple[str, int], dict[str, Any]] = {}
    gaps: dict[tuple[str, int], tuple] = {}
    for c in good:
        gw = c.manifest["gateway_id"]
        for a in c.manifest.get("anchors", []):
            key = (gw, int(a["id"]))
            if key not in known_keys:
                new[key] = {
                    "gateway_id": gw, "id": int(a["id"]), "reason": str(a["reason"]),
                    "boot_id": str(a["boot_id"]), "boottime_ns": int(a["boottime_ns"]),
                    "wall_ns": int(a["wall_ns"]),
                    "offset_before_ns": None if a.get("offset_before_ns") is None
                    else int(a["offset_before_ns"]),
                    "clock_synced": bool(a["clock_synced"]), "after_seq": int(a["after_seq"])}
        for g in c.manifest.get("gaps", []):
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
    return _Anchors(new, refs, _refs_frame(spark, refs), gaps, moved)


def _record_anchors(spark: SparkSession, store: TableDir, anchors: _Anchors, had_rows: bool,
                    stats: IngestStats, stage: str) -> None:
    """Re-base rows ingested earlier whose boot got another reference anchor in this run
    (an anchor that leaves a boot's reference as it was changes no row: no table scan),
    then stage the new anchors and loss records for their side tables."""
    clock = time.monotonic()
    if anchors.moved and had_rows:
        stats.rows_rebased = _rebase(spark, store, anchors.moved, {
            k: v for k, v in anchors.refs.items() if k in anchors.moved})
        clock = stats.timed("rebase", clock)
    store.append(store.anchors, [tuple(a[f.name] for f in ANCHOR_SCHEMA.fields)
                                 for a in anchors.new.values()], ANCHOR_SCHEMA, stage)
    store.append(store.gaps, list(anchors.gaps.values()), GAP_SCHEMA, stage)
    stats.timed("side tables", clock)


def _one_pass_batches(sound: list[_Candidate], touching: set[str]) -> list[_Candidate]:
    """The batches that can be checked while they are written (:func:`_write_one_pass`):
    seqs first..last without a hole (so which (file, seq) pairs it holds is known), no other
    batch of this run overlapping, no row of the table in their range (nothing to dedupe or
    compare). The others are read and checked one by one first (:func:`_check_lines`)."""
    shared = _overlapping(sound)
    plain = [c for c in sound if c.data_path not in shared and c.manifest["count"]
             == c.manifest["last_seq"] - c.manifest["first_seq"] + 1]
    return [c for c in plain if c.data_uri not in touching]


def _ranges(spark: SparkSession, batches: list[_Candidate]) -> DataFrame:
    """(uri, gw, lo, hi): each batch's data URI, gateway and seq range, from its manifest."""
    return spark.createDataFrame(
        [(c.data_uri, c.manifest["gateway_id"], c.manifest["first_seq"],
          c.manifest["last_seq"]) for c in batches], "uri string, gw string, lo long, hi long")


def _touching(spark: SparkSession, store: TableDir, candidates: list[_Candidate]) -> set[str]:
    """The data URIs of ``candidates`` whose seq range overlaps a batch the ingest log holds:
    the only ones the table can hold rows in the range of, since a batch's rows and its log
    row are committed together. One join with the log, which has a row per batch: the
    table itself is not read, however long it grows."""
    if not candidates:
        return set()
    ranges = _ranges(spark, candidates)
    log_ = store.batch_frame().where(F.col("status") == "ingested")
    return {r.uri for r in F.broadcast(ranges).join(
        log_, (F.col("gw") == log_.gateway_id) & (F.col("lo") <= log_.last_seq)
        & (F.col("hi") >= log_.first_seq)).select("uri").distinct().collect()}


def _in_ranges(spark: SparkSession, table: DataFrame,
               ranges: list[tuple[str, int, int, str]]) -> DataFrame:
    """(gateway_id, seq, tag) of the rows of ``table`` inside ``ranges`` ([(gateway, first
    seq, last seq, tag)], not overlapping each other): a broadcast join on the ranges, not
    one OR per range (a thousand of those overflowed the JVM's stack), behind a coarse
    filter that lets Parquet skip row groups."""
    bounds = spark.createDataFrame(ranges, "range_gateway string, lo long, hi long, tag string")
    coarse = (F.col("gateway_id").isin(sorted({gw for gw, _, _, _ in ranges}))
              & F.col("seq").between(min(lo for _, lo, _, _ in ranges),
                                     max(hi for _, _, hi, _ in ranges)))
    return (table.where(coarse).select("gateway_id", "seq")
            .join(F.broadcast(bounds), (F.col("gateway_id") == F.col("range_gateway"))
                  & F.col("seq").between(F.col("lo"), F.col("hi")))
            .select("gateway_id", "seq", "tag"))


def _write_one_pass(spark: SparkSession, batches: list[_Candidate], anchors: _Anchors,
                    stats: IngestStats, stage: str, run: str) -> bool:
    """Read ``batches`` once and write their rows to ``stage``, the run's staging directory,
    checking them on the way with totals rather than batch by batch: every line a whole
    event of its batch's gateway with a seq in the batch's range, as many lines as the
    manifests say, and the sum of a hash of (file, seq) over the lines equal to its sum over
    every seq of the ranges (a seq twice and another missing would change it). Whether all
    holds; if not, nothing is left written."""
    ranges = _ranges(spark, batches)
    # two sums of 31-bit halves of a 64-bit hash: longs that cannot overflow (ANSI mode)
    hashed = F.xxhash64("uri", "seq")
    fingerprint = F.array(F.sum(hashed.bitwiseAND(0x7FFFFFFF)),
                          F.sum(F.shiftrightunsigned(hashed, 33)))
    rows = _parse(spark, batches).join(F.broadcast(ranges), "uri", "left")
    sound = ((F.col("gateway_id") == F.col("gw"))
             & F.col("seq").between(F.col("lo"), F.col("hi")))
    for name in REQUIRED:
        sound &= F.col(name).isNotNull()
    lines = sum(c.manifest["count"] for c in batches)
    totals = _write_rows(spark, rows, anchors, stage, len(batches), lines, run, {
        "unsound": F.count_if(~F.coalesce(sound, F.lit(False))), "fingerprint": fingerprint})
    expected = (ranges.select("uri", F.explode(F.sequence("lo", "hi")).alias("seq"))
                .agg(fingerprint.alias("sum")).first()["sum"])
    if totals["rows"] == lines and not totals["unsound"] and totals["fingerprint"] == expected:
        stats.count_added(totals)
        return True
    Files(spark).delete(stage)
    return False


def _check_lines(spark: SparkSession, store: TableDir, batches: list[_Candidate],
                 touching: set[str], read: list[DataFrame]) -> dict[str, str]:
    """{data path: problem} for ``batches``, read (and kept: appended to ``read``) and
    checked one by one: their lines, then seqs the table holds for other events."""
    if not batches:
        return {}
    lines = _read_lines(spark, batches)
    read.append(lines)
    problems = _line_problems(lines, batches)
    problems.update(_conflicts(spark, store, lines, [c for c in batches
                                                     if c.data_path not in problems], touching))
    return problems


def _append_checked(spark: SparkSession, store: TableDir, read: list[DataFrame],
                    good: list[_Candidate], touching: set[str], anchors: _Anchors,
                    stats: IngestStats, stage: str, run: str) -> None:
    """Write the rows of the ``good`` batches among the lines ``read`` to ``stage``, without
    those the table (or another batch of this run) already holds. The table is read only
    in the ranges of batches that overlap one the ingest log holds."""
    lines = read[0]
    for more in read[1:]:
        lines = lines.unionByName(more)
    uris = [c.data_uri for c in good]
    rows = lines.where(F.col("uri").isin(uris))
    # only batches that overlap another of this run are deduped among themselves: a
    # shuffle of every row would cost more than the whole read
    overlapping = _overlapping(good)
    if overlapping:
        shared = F.col("uri").isin([c.data_uri for c in good if c.data_path in overlapping])
        rows = rows.where(~shared).unionByName(
            rows.where(shared).dropDuplicates(["gateway_id", "seq"]))
    existing = store.events()
    clock = time.monotonic()
    if existing is not None and any(c.data_uri in touching for c in good):
        ranges: dict[str, tuple[int, int]] = {}
        for c in good:
            if c.data_uri not in touching:
                continue
            gw, m = c.manifest["gateway_id"], c.manifest
            lo, hi = ranges.get(gw, (m["first_seq"], m["last_seq"]))
            ranges[gw] = (min(lo, m["first_seq"]), max(hi, m["last_seq"]))
        keys = _in_ranges(spark, existing, [(gw, lo, hi, gw) for gw, (lo, hi)
                                            in ranges.items()]).select("gateway_id", "seq")
        held = keys.count()
        if held:
            rows = rows.join(F.broadcast(keys) if held <= BROADCAST_KEYS else keys,
                             ["gateway_id", "seq"], "left_anti")
    clock = stats.timed("existing keys", clock)
    stats.count_added(_write_rows(spark, rows, anchors, stage, len(good),
                                  sum(c.manifest["count"] for c in good), run))
    stats.timed("write", clock)


def _write_rows(spark: SparkSession, rows: DataFrame, anchors: _Anchors, path: str,
                batches: int, lines: int, run: str,
                checks: dict[str, Column] | None = None) -> dict[str, Any]:
    """Re-base and append ``rows`` (parsed lines with their ``uri``; from ``batches`` batches
    of ``lines`` lines) to the table layout at ``path``, partitioned by date. Returns the
    totals observed on the way: rows, estimated (re-based), and ``checks``."""
    observed = Observation(f"ingest-{run}-{uuid.uuid4().hex[:6]}")
    rows = (_with_event_time(rows, anchors.frame)
            .withColumn("timestamp", F.timestamp_millis("wall_ms"))
            .withColumn("ingested_at", F.current_timestamp())
            # gateway/file (a regular expression here cost half the time of the read)
            .withColumn("batch", F.substring_index("uri", "/", -2))
            .observe(observed, F.count(F.lit(1)).alias("rows"),
                     F.sum(F.col("time_estimated").cast("long")).alias("estimated"),
                     *[e.alias(name) for name, e in (checks or {}).items()])
            .select(*TABLE_COLUMNS))
    parallelism = spark.sparkContext.defaultParallelism  # files of ~ROWS_PER_FILE rows, in
    waves = math.ceil(lines / ROWS_PER_FILE / parallelism)  # whole waves of tasks
    parts = max(1, min(batches, waves * parallelism))
    rows.coalesce(parts).write.mode("append").partitionBy("date").parquet(path)
    return observed.get


# what makes a row the same event when a batch re-sends a seq the table holds
IDENTITY = ["publication", "topic", "wall_ms", "boot_id", "boottime_ns", "kwargs"]


def _conflicts(spark: SparkSession, store: TableDir, lines: DataFrame | None,
               candidates: list[_Candidate], touching: set[str]) -> dict[str, str]:
    """{data path: problem} for batches re-using seqs the table holds for other events (a
    gateway whose store was reset, or another gateway under its id). Only the rows of
    batches whose range overlaps an ingested batch's are compared."""
    existing = store.events()
    if existing is None or lines is None or not candidates:
        return {}
    compared = [c for c in candidates if c.data_uri in touching]
    if not compared:
        return {}
    ranges = _ranges(spark, compared)
    new = (lines.where(F.col("uri").isin([c.data_uri for c in compared]))
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


def _overlapping(good: list[_Candidate]) -> set[str]:
    """The data paths of batches whose seq range overlaps another batch's of the same
    gateway in this run (they may hold the same (gateway_id, seq))."""
    by_gateway: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for c in good:
        by_gateway[c.manifest["gateway_id"]].append(
            (c.manifest["first_seq"], c.manifest["last_seq"], c.data_path))
    found: set[str] = set()
    for ranges in by_gateway.values():
        ranges.sort()
        reach, holder = None, None  # the furthest last_seq so far, and its batch
        for first, last, path in ranges:
            if reach is not None and first <= reach:
                found.update((path, holder))
            if reach is None or last > reach:
                reach, holder = last, path
    return found


def _rebase(spark: SparkSession, store: TableDir, boots: set[tuple[str, str]],
            refs: dict[tuple[str, str], dict[str, Any]]) -> int:
    """Re-base the rows of ``boots`` whose event_time was computed with another reference
    than ``refs`` now gives; rewrite the partitions they leave and enter. Returns how many."""
    table = store.events()
    if table is None:
        return 0
    boots_frame = spark.createDataFrame(sorted(boots), "gateway_id string, boot_id string")
    refs_frame = _refs_frame(spark, refs)
    stale = (table.where(~F.col("clock_synced"))
             .join(F.broadcast(boots_frame), ["gateway_id", "boot_id"], "left_semi")
             .join(F.broadcast(refs_frame.select("gateway_id", "boot_id", "ref_id")),
                   ["gateway_id", "boot_id"], "left")
             .where(~F.col("time_anchor").eqNullSafe(F.col("ref_id")))
             .drop("ref_id")).cache()
    try:
        old_dates = {r.date for r in stale.select("date").distinct().collect()}
        if not old_dates:
            return 0
        corrected = (_with_event_time(
            stale.drop("event_time", "time_estimated", "time_anchor", "date"), refs_frame)
            .select(*TABLE_COLUMNS)).cache()
        count = corrected.count()
        new_dates = {r.date for r in corrected.select("date").distinct().collect()}
        dates = sorted(str(d) for d in old_dates | new_dates)
        keep = (table.where(F.col("date").isin(sorted(old_dates | new_dates)))
                .join(stale.select("gateway_id", "seq"), ["gateway_id", "seq"], "left_anti"))
        stage = f"{store.staging}/{uuid.uuid4().hex[:12]}"
        (keep.unionByName(corrected).write.mode("error").partitionBy("date").parquet(stage))
        for d in dates:
            if not store.files.exists(f"{stage}/date={d}"):
                store.files.mkdirs(f"{stage}/date={d}")  # this partition ends up empty
        store.files.write_text(f"{stage}/_SWAP", json.dumps(dates))
        store.swap(stage, dates)
        log.info("re-based %d rows ingested earlier; rewrote partitions %s", count,
                 ", ".join(dates))
        corrected.unpersist()
        return count
    finally:
        stale.unpersist()


def _move_batch(files: Files, manifest_path: str, data_path: str, target: str) -> None:
    """Move a batch's files (whichever exist) into directory ``target``, the data file first:
    a manifest a crash leaves behind finds its batch in the ingest log the next time."""
    for path in (data_path, manifest_path):
        if files.exists(path):
            files.move(path, f"{target}/{path.rsplit('/', 1)[-1]}")


def _quarantine(files: Files, quarantine: str | None, manifest_path: str, data_path: str,
                gateway: str | None, reason: str) -> str:
    """Move a bad batch (both files, whichever exist) aside with a note of why."""
    if quarantine is None:
        return "left in place: no quarantine directory given"
    target = f"{quarantine}/{gateway or manifest_path.rstrip('/').split('/')[-2]}"
    _move_batch(files, manifest_path, data_path, target)
    stem = data_path.rsplit("/", 1)[-1].removesuffix(DATA_SUFFIX)
    files.write_text(f"{target}/{stem}.reason.json", json.dumps(
        {"batch": _name(data_path), "reason": reason, "quarantined": _now().isoformat() + "Z",
         "from": data_path}, indent=1))
    return f"moved to {target}"


# -- reports -------------------------------------------------------------------------------

def loss_intervals(store: TableDir) -> list[tuple[str, int, int, str]]:
    """Seq ranges lost per gateway: ranges no ingested batch covers (a batch covers
    ``after_seq+1 .. last_seq``), and the gateways' own loss records. Non-overlapping."""
    covered: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in (store.batch_frame().where(F.col("status") == "ingested")
              .select("gateway_id", "after_seq", "first_seq", "last_seq").collect()):
        start = r.first_seq if r.after_seq is None else r.after_seq + 1
        covered[r.gateway_id].append((start, r.last_seq))
    dropped: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for r in store.gap_frame().collect():
        if r.first_seq is not None and r.last_seq is not None:
            dropped[r.gateway_id].append((r.first_seq, r.last_seq,
                                          f"dropped on the gateway: {r.reason}"))
    result = []
    for gw in sorted(set(covered) | set(dropped)):
        holes = []
        spans = sorted(covered.get(gw, []))
        reach = None
        for start, end in spans:
            if reach is not None and start > reach + 1:
                holes.append((reach + 1, start - 1))
            reach = end if reach is None else max(reach, end)
        for lo, hi, reason in sorted(dropped.get(gw, [])):
            result.append((gw, lo, hi, reason))
            holes = [piece for a, b in holes for piece in _minus((a, b), (lo, hi))]
        result += [(gw, a, b, NOT_LANDED) for a, b in holes]
    return sorted(result)


def _minus(span: tuple[int, int], cut: tuple[int, int]) -> list[tuple[int, int]]:
    (a, b), (c, d) = span, cut
    if d < a or c > b:
        return [span]
    return [p for p in ((a, c - 1), (d + 1, b)) if p[0] <= p[1]]


def gap_report(spark: SparkSession, store: TableDir, events: DataFrame) -> tuple[DataFrame,
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
        loss_intervals(store),
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


def clock_steps_report(store: TableDir) -> DataFrame:
    """One line per step of a gateway's wall clock: when (boottime, seq), from what to
    what, by how much (seconds, + forward)."""
    by_boot = Window.partitionBy("gateway_id", "boot_id").orderBy("id")
    return (store.anchor_frame().where(F.col("reason") == "step")
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


@dataclass
class Report:
    out: str
    counts: dict[str, int]
    lines: list[str]


def report(spark: SparkSession, table: str, out: str, wait: float = LOCK_WAIT_S) -> Report:
    """Write the gap, gateway, daily, hourly and clock reports under ``out`` (each as
    Parquet ``out/<name>/`` and as one CSV file ``out/<name>.csv``) and ``report.html``
    (plots, :mod:`sync.report_html`), and summarize them. Holds the
    table's shared lock: no ingest changes the table while the report reads it."""
    _prepare(spark)
    files = Files(spark)
    table, out = files.qualify(table), files.qualify(out)
    with locked(table, files, exclusive=False, wait=wait, what="a report"):
        return _report_locked(spark, files, table, out)


def _report_locked(spark: SparkSession, files: Files, table: str, out: str) -> Report:
    store = TableDir(spark, files, table)
    if any(files.exists(f"{stage}/_SWAP") for stage in files.children(store.staging)):
        log.warning("an interrupted partition rewrite is pending in %s: the next ingest "
                    "finishes it; until then some re-based rows may be missing", store.staging)
    events = store.events()
    if events is None:
        raise FileNotFoundError(f"no events in {table} (has an ingest run?)")
    events = events.cache()
    gaps, gateways = gap_report(spark, store, events)
    gateways = _with_batches(gateways, store)
    frames = {"gaps": gaps, "gateways": gateways, "hourly": hourly_report(events),
              "clock_steps": clock_steps_report(store), "unsynced": unsynced_report(events),
              "daily": events.groupBy("gateway_id", "date").agg(F.count(F.lit(1)).alias("rows"))
              .orderBy("gateway_id", "date")}
    counts = {}
    for name, frame in frames.items():
        frame = frame.cache()
        counts[name] = frame.count()
        frame.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
        _write_csv(files, frame, f"{out}/{name}.csv")
    lines = []
    for g in gateways.collect():
        lines.append(
            f"{g.gateway_id}: {g.events} events, seq {g.min_seq}..{g.max_seq}, "
            f"{g.not_landed} not landed, {g.dropped_on_gateway} dropped on the gateway "
            f"({g.gaps} gaps), {g.not_history} seqs never history, {g.estimated} with "
            f"estimated time, {g.boots} boots")
    steps = frames["clock_steps"].agg(F.max(F.abs("step_s")).alias("largest")).first()
    lines.append(f"{counts['hourly']} sensor-hours; {counts['clock_steps']} clock steps"
                 + (f" (largest {steps.largest:,.0f} s)" if counts["clock_steps"] else "")
                 + f"; {counts['unsynced']} spans of unsynchronized time")
    _write_html(files, frames, f"{out}/report.html")
    events.unpersist()
    return Report(out, counts, lines)


def _with_batches(gateways: DataFrame, store: TableDir) -> DataFrame:
    """Adds when each gateway's last batch was ingested and how many were quarantined."""
    log_ = store.batch_frame().groupBy("gateway_id").agg(
        F.max(F.when(F.col("status") == "ingested", F.col("logged_at")))
        .alias("last_batch_ingested"),
        F.sum((F.col("status") == "quarantined").cast("long")).alias("quarantined"))
    return (gateways.join(log_, "gateway_id", "left").fillna(0, ["quarantined"])
            .orderBy("gateway_id"))


def _write_html(files: Files, frames: dict[str, DataFrame], path: str) -> None:
    from cairn.sync import report_html

    def rows(name: str) -> list[dict[str, Any]]:
        return [r.asDict() for r in frames[name].collect()]

    files.write_text(path, report_html.page(rows("gateways"), rows("gaps"), rows("daily"),
                                            rows("unsynced"), _now().isoformat(" ", "seconds")
                                            + " UTC"))


def _write_csv(files: Files, frame: DataFrame, path: str) -> None:
    """One CSV file with a header (Spark writes a directory of parts: keep the one part)."""
    temp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    frame.coalesce(1).write.mode("overwrite").option("header", True).csv(temp)
    parts = files.glob(f"{temp}/part-*")
    if parts:
        files.move(parts[0], path)
    else:  # no rows: a header alone
        files.write_text(path, ",".join(frame.columns) + "\n")
    files.delete(temp)


# -- command line ---------------------------------------------------------------------------

def _conf(pairs: list[str] | None) -> dict[str, str]:
    conf = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf wants KEY=VALUE, not {pair!r}")
        conf[key.strip()] = value
    return conf


def main(args: Any) -> int:
    """``cairn spark ingest|report`` (argparse namespace from sync.cli)."""
    try:
        conf = _conf(args.conf)
    except ValueError as e:
        print(f"cairn spark: {e}", file=sys.stderr)
        return 2
    if args.spark_command == "ingest" and args.streaming and not args.checkpoint:
        print("cairn spark ingest: --streaming needs --checkpoint DIR", file=sys.stderr)
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
                                      args.archive)
            else:
                stats = ingest(spark, args.landing, args.table, args.quarantine, args.wait,
                               args.max_batches or CHUNK_BATCHES, args.archive)
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
