"""Ingest: landed batches into the table. :func:`ingest` (one-shot) and :func:`ingest_stream`
(Structured Streaming, ``availableNow``, checkpointed) hand the manifests they find to an
:class:`IngestRun`, which

1. checks each manifest and its batch, in the JVM next to the data (:mod:`.verify`). A batch
   that fails is moved to the quarantine directory (or left in place and logged when there is
   none) with one clear report line, and the run goes on with the rest;
2. reads the good batches once, and stages their rows without those the table (or another
   batch of this run) already holds (:mod:`.dedupe`, :mod:`.write`). Which batches can
   overlap rows of the table is told by the ingest log, not by reading the table;
3. re-bases the time of rows recorded before the gateway's clock was synchronized
   (:mod:`.rebase`), and rewrites the partitions of rows ingested earlier whose reference
   anchor this run moved;
4. commits the staged rows with the new clock anchors, loss records and ingest log rows
   (:meth:`Table.commit <cairn.central.spark.table.Table.commit>`, one journaled move);
5. logs the quarantined batches, then archives the ingested ones."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import Anchors, Candidate, name_of, one_pass_batches, triage
from cairn.central.spark.dedupe import check_lines, touching_batches
from cairn.central.spark.files import Files, utc_now
from cairn.central.spark.landing import (
    Landed,
    LandedManifest,
    landed_manifests,
    move_batch,
    quarantine_batch,
    read_manifests,
)
from cairn.central.spark.rebase import anchors_of, rebase_boots
from cairn.central.spark.schemas import ANCHOR_SCHEMA, BATCH_LOG_SCHEMA, GAP_SCHEMA
from cairn.central.spark.session import one_of, prepare
from cairn.central.spark.table import LOCK_WAIT_S, Table
from cairn.central.spark.verify import bytes_problems, expansion_problems
from cairn.central.spark.write import append_checked, write_one_pass
from cairn.central.stats import IngestStats
from cairn.central.table_lock import locked
from cairn.formats.batch import (
    MANIFEST_SUFFIX,
    MAX_MANIFEST_BYTES,
    ManifestError,
    data_candidates,
    data_of,
    is_data,
    manifest_name,
    parse_manifest,
)

if TYPE_CHECKING:
    from cairn.formats.batch_signature import GatewayKeys

log = logging.getLogger("cairn.spark")

CHUNK_BATCHES = 20_000       # batch mode: batches per step (bounds the driver's memory)


def ingest(spark: SparkSession, landing: str, table: str, quarantine: str | None = None,
           wait: float = LOCK_WAIT_S, chunk: int = CHUNK_BATCHES,
           archive: str | None = None, keys: GatewayKeys | None = None) -> IngestStats:
    """One-shot ingest of every batch under ``landing`` whose manifest has landed, holding
    the table's exclusive lock (waiting up to ``wait`` seconds for it), ``chunk`` batches
    per step. With ``archive``, batches leave the landing for it once ingested; with
    ``keys``, only batches signed by a key it lists for their gateway are ingested."""
    started = time.monotonic()
    prepare(spark)
    files = Files(spark)
    landing, table = files.qualify(landing), files.qualify(table)
    quarantine = files.qualify(quarantine) if quarantine else None
    archive = files.qualify(archive) if archive else None
    with locked(table, files, exclusive=True, wait=wait, what=f"an ingest of {landing}"):
        stats = _ingest_locked(spark, files, landing, table, quarantine, chunk, archive, keys)
    stats.seconds = time.monotonic() - started
    return stats


def _ingest_locked(spark: SparkSession, files: Files, landing: str, table_path: str,
                   quarantine: str | None, chunk: int, archive: str | None,
                   keys: GatewayKeys | None) -> IngestStats:
    """The landing listed once, by Spark (one job, no call into the JVM per file), then its
    manifests ``chunk`` at a time: a landing of millions of files is never read or verified
    all at once."""
    started = time.monotonic()
    table = Table(spark, files, table_path)
    table.recover()
    landed = landed_manifests(spark, files, landing, table)
    manifest_uris = sorted(u for u in landed.uris
                           if u.endswith(MANIFEST_SUFFIX) and u not in landed.unchanged)
    stats = IngestStats()
    stats.timed("listing", started)
    stats.waiting = sum(1 for u in landed.uris if is_data(u)
                        and manifest_name(u) not in landed.uris)
    stats.manifests = stats.already = stats.unread = len(landed.unchanged)
    if archive:
        for manifest_path, gateway in landed.unchanged.values():
            for data_path in data_candidates(manifest_path):  # whichever schema it was
                move_batch(files, manifest_path, data_path, f"{archive}/{gateway}")
    for start in range(0, max(len(manifest_uris), 1), chunk):
        stats.add(ingest_paths(spark, files, manifest_uris[start:start + chunk], table_path,
                                quarantine, landed, archive, keys))
    return stats


def ingest_paths(spark: SparkSession, files: Files, manifest_uris: list[str],
                  table_path: str, quarantine: str | None, landed: Landed,
                  archive: str | None, keys: GatewayKeys | None = None) -> IngestStats:
    """Read the manifests ``manifest_uris`` and ingest their batches (an oversized manifest
    is not read: :func:`~cairn.central.spark.landing.read_manifests`)."""
    started = time.monotonic()
    manifests = read_manifests(spark, files, manifest_uris, landed.oversized)
    read_s = time.monotonic() - started
    stats = ingest_manifests(spark, manifests, table_path, quarantine, files, landed.uris,
                             archive, keys)
    stats.phases["manifests"] = stats.phases.get("manifests", 0.0) + read_s
    if len(manifest_uris) > 1:
        log.info("%s", stats.summary())
    return stats


def ingest_stream(spark: SparkSession, landing: str, table: str, checkpoint: str,
                  quarantine: str | None = None, max_batches: int = 1000,
                  wait: float = LOCK_WAIT_S, archive: str | None = None,
                  keys: GatewayKeys | None = None) -> IngestStats:
    """Structured Streaming over the manifests landing under ``landing``, trigger
    ``availableNow``: everything that landed since the last run (the checkpoint remembers
    which manifests were seen), in micro-batches of at most ``max_batches`` manifests, then
    stop. Each micro-batch is verified and ingested by :func:`ingest_manifests` in
    ``foreachBatch``; a re-run micro-batch adds nothing (the anti-join). Holds the table's
    exclusive lock for the whole run. ``keys`` as for :func:`ingest`."""
    started = time.monotonic()
    prepare(spark)
    files = Files(spark)
    landing, table = files.qualify(landing), files.qualify(table)
    checkpoint = files.qualify(checkpoint)
    quarantine = files.qualify(quarantine) if quarantine else None
    archive = files.qualify(archive) if archive else None
    with locked(table, files, exclusive=True, wait=wait, what=f"a streaming ingest of {landing}"):
        total = _stream_locked(spark, files, landing, table, checkpoint, quarantine,
                               max_batches, archive, keys)
    total.seconds = time.monotonic() - started
    return total


# binaryFile's own schema: a streaming source must be given one
_BINARY_FILE = "path string, modificationTime timestamp, length long, content binary"


def _stream_locked(spark: SparkSession, files: Files, landing: str, table_path: str,
                   checkpoint: str, quarantine: str | None, max_batches: int,
                   archive: str | None, keys: GatewayKeys | None) -> IngestStats:
    Table(spark, files, table_path).recover()
    total = IngestStats()

    def each(frame: DataFrame, batch_id: int) -> None:
        listed = {r.uri: (r.bytes, r.mtime_ms) for r in frame.collect()}
        oversized = {uri: stamp for uri, stamp in listed.items()
                     if stamp[0] > MAX_MANIFEST_BYTES}
        manifests = read_manifests(frame.sparkSession, files, sorted(listed), oversized)
        stats = ingest_manifests(frame.sparkSession, manifests, table_path, quarantine,
                                 files, archive=archive, keys=keys)
        total.add(stats)
        total.micro_batches += 1
        log.info("micro-batch %d: %s", batch_id, stats.summary())

    # listed, not read (binaryFile reads no content unless asked for it): a manifest is
    # read by the batch path's reader, which leaves an oversized one unread
    stream = (spark.readStream.format("binaryFile").schema(_BINARY_FILE)
              .option("maxFilesPerTrigger", max_batches)
              .load(f"{landing}/*/*{MANIFEST_SUFFIX}")
              .select(F.col("_metadata.file_path").alias("uri"), F.col("length").alias("bytes"),
                      F.unix_millis("modificationTime").alias("mtime_ms")))
    query = (stream.writeStream.foreachBatch(each)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return total


def ingest_manifests(spark: SparkSession, manifests: list[LandedManifest], table: str,
                     quarantine: str | None = None, files: Files | None = None,
                     landed: set[str] | None = None, archive: str | None = None,
                     keys: GatewayKeys | None = None) -> IngestStats:
    """Verify, dedupe, re-base and append the batches of ``manifests`` into ``table``. ``landed``:
    the URIs of the files known to be there (else each data file is looked for). Bad
    batches go to ``quarantine``, ingested ones (this time or before) to ``archive``."""
    return IngestRun(spark, manifests, table, quarantine, files, landed, archive,
                     keys).execute()


class IngestRun:
    """One ingest of a list of manifests (a chunk of a one-shot ingest, a micro-batch of a
    streaming one) into the table, as steps: :meth:`execute` reads as the module docstring's
    list. The run's state (its problems, the quarantined batches' log rows, the lines it
    keeps) lives here, where each step sees it."""

    def __init__(self, spark: SparkSession, manifests: list[LandedManifest], table: str,
                 quarantine: str | None = None, files: Files | None = None,
                 landed: set[str] | None = None, archive: str | None = None,
                 keys: GatewayKeys | None = None) -> None:
        self.started = self.clock = time.monotonic()  # clock: where the current phase began
        self.spark, self.manifests = spark, manifests
        self.files = files or Files(spark)
        self.table = Table(spark, self.files, table)
        self.quarantine, self.landed, self.archive = quarantine, landed, archive
        self.keys = keys  # the fleet's gateway keys, or None: the landing folder is trusted
        self.run = uuid.uuid4().hex[:12]
        # the run's rows and side-table rows, committed together
        self.stage = f"{self.table.staging}/{self.run}"
        self.stats = IngestStats(manifests=len(manifests))
        self.stamps = {self.files.from_uri(m.uri): (m.bytes, m.mtime_ms) for m in manifests}
        self.log_rows: list[tuple] = []       # of the quarantined batches, logged at the end
        self.problems: dict[str, str] = {}    # {data path: problem} of the candidates
        self.read: list[DataFrame] = []       # the lines read and kept, let go of at the end
        self.touching: set[str] = set()       # data URIs of batches overlapping logged ones
        self.had_rows = False                 # whether the table had rows before this run

    def execute(self) -> IngestStats:
        candidates, already = self.triage(self.parse())
        self.clock = self.stats.timed("manifests", self.started)
        try:
            good = self.verify_and_write(candidates)
        finally:
            for frame in self.read:
                frame.unpersist()
        clock = self.log_quarantined()
        if self.archive:  # after the log: a crash between leaves batches the next run finds done
            self.archive_batches(good + already, clock)
        self.stats.already = len(already)
        self.stats.ingested = len(good)
        self.stats.seconds = time.monotonic() - self.started
        return self.stats

    def parse(self) -> list[Candidate]:
        """The batches whose manifest parses; the others are rejected."""
        parsed: list[Candidate] = []
        for manifest_uri, text, size, _ in self.manifests:
            manifest_path = self.files.from_uri(manifest_uri)
            try:
                if text is None:
                    raise ManifestError(f"manifest of {size} bytes, over the "
                                        f"{MAX_MANIFEST_BYTES} a manifest may have: not read")
                m = parse_manifest(text)
            except ManifestError as e:  # whichever data file it has goes aside with it
                data_path = next((d for d in data_candidates(manifest_path)
                                  if self.files.exists(d)), data_of(manifest_path))
                self.reject(manifest_path, data_path, None, str(e))
                continue
            parsed.append(Candidate(manifest_path, data_of(manifest_path, m["schema"]), m,
                                     data_of(manifest_uri, m["schema"])))
        return parsed

    def triage(self, parsed: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
        """(candidates, already): the batches to verify, and those the table has (same file,
        same bytes); the others are rejected."""
        candidates, already, rejected = triage(parsed, self.ingested_before(parsed),
                                                self.landed_data, self.keys)
        for c, reason in rejected:
            self.reject(c.manifest_path, c.data_path, c.manifest, reason)
        return candidates, already

    def ingested_before(self, parsed: list[Candidate]) -> set[tuple[str, str]]:
        """(file, sha256) of the batches of ``parsed`` the ingest log holds as ingested."""
        if not parsed:
            return set()
        names = sorted({c.manifest["file"] for c in parsed})
        return {(r.file, r.sha256) for r in self.table.batch_frame()
                .where((F.col("status") == "ingested") & one_of("file", names))
                .select("file", "sha256").collect()}

    def landed_data(self, c: Candidate) -> bool:
        """Whether the batch's data file is there (in the listing, else looked for)."""
        if self.landed is not None:
            return c.data_uri in self.landed
        return self.files.exists(c.data_path)

    def verify_and_write(self, candidates: list[Candidate]) -> list[Candidate]:
        """Check the ``candidates``, reject the bad, stage the good ones' rows and commit
        them. Returns the good ones."""
        sound = self.verify_bytes(candidates)
        one_pass = self.plan(sound)
        in_one_pass = {c.data_path for c in one_pass}
        self.check_lines([c for c in sound if c.data_path not in in_one_pass])
        good = [c for c in candidates if c.data_path not in self.problems]
        anchors = self.gather_anchors(good)
        if one_pass:
            good, anchors, one_pass = self.write_one_pass(one_pass, good, anchors)
        for c in candidates:
            if c.data_path in self.problems:
                self.reject(c.manifest_path, c.data_path, c.manifest, self.problems[c.data_path])
        in_one_pass = {c.data_path for c in one_pass}
        checked = [c for c in good if c.data_path not in in_one_pass]
        if checked:
            append_checked(self.spark, self.table, self.read, checked, self.touching, anchors,
                            self.stats, self.stage, self.run)
        if good:
            self.commit(good, anchors)
        return good

    def verify_bytes(self, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates whose bytes are what their manifest says (and, over CHECKED_BYTES,
        that do not hold more lines than it counts)."""
        self.problems = bytes_problems(self.spark, candidates)
        self.problems.update(expansion_problems(
            self.spark, [c for c in candidates if c.data_path not in self.problems]))
        self.clock = self.stats.timed("verify bytes", self.clock)
        return [c for c in candidates if c.data_path not in self.problems]

    def plan(self, sound: list[Candidate]) -> list[Candidate]:
        """The batches to check while writing them (the others are checked first)."""
        self.had_rows = self.table.events() is not None
        self.touching = touching_batches(self.spark, self.table, sound)  # one look at the log
        one_pass = one_pass_batches(sound, self.touching)
        self.clock = self.stats.timed("overlaps", self.clock)
        return one_pass

    def check_lines(self, batches: list[Candidate]) -> None:
        self.problems.update(check_lines(self.spark, self.table, batches, self.touching,
                                          self.read))
        self.clock = self.stats.timed("read+check lines", self.clock)

    def gather_anchors(self, good: list[Candidate]) -> Anchors:
        anchors = anchors_of(self.spark, self.table, good)
        self.stats.rows_read = sum(c.manifest["count"] for c in good)
        return anchors

    def write_one_pass(self, one_pass: list[Candidate], good: list[Candidate],
                       anchors: Anchors) -> tuple[list[Candidate], Anchors, list[Candidate]]:
        """Write ``one_pass`` checked by totals; if the totals are off, check them one by one
        instead (they join the checked batches). Returns good, anchors, the batches written."""
        if write_one_pass(self.spark, one_pass, anchors, self.stats, self.stage, self.run):
            self.stats.one_pass = len(one_pass)
        else:
            log.warning("%d batches read in one pass are not all what their manifests "
                        "say: checking them one by one", len(one_pass))
            found = check_lines(self.spark, self.table, one_pass, self.touching, self.read)
            self.problems.update(found)
            if found:
                good = [c for c in good if c.data_path not in found]
                anchors = self.gather_anchors(good)
            one_pass = []
        self.clock = self.stats.timed("read+check+write in one pass", self.clock)
        return good, anchors, one_pass

    def commit(self, good: list[Candidate], anchors: Anchors) -> None:
        """Stage the side tables' rows of the ``good`` batches, then commit the run."""
        self.record_anchors(anchors)
        clock = time.monotonic()
        self.table.append(self.table.batches, [
            self.log_row(c.manifest_path, c.manifest, c.manifest["gateway_id"],
                         c.manifest["file"], "ingested") for c in good],
            BATCH_LOG_SCHEMA, self.stage)
        self.table.commit(self.stage)
        self.stats.timed("commit", clock)

    def record_anchors(self, anchors: Anchors) -> None:
        """Re-base rows ingested earlier whose boot got another reference anchor in this run
        (an anchor that leaves a boot's reference as it was changes no row: no table scan),
        then stage the new anchors and loss records for their side tables."""
        clock = time.monotonic()
        if anchors.moved and self.had_rows:
            self.stats.rows_rebased = rebase_boots(self.spark, self.table, anchors.moved, {
                k: v for k, v in anchors.refs.items() if k in anchors.moved})
            clock = self.stats.timed("rebase", clock)
        self.table.append(self.table.anchors, [tuple(a[f.name] for f in ANCHOR_SCHEMA.fields)
                                               for a in anchors.new.values()],
                          ANCHOR_SCHEMA, self.stage)
        self.table.append(self.table.gaps, list(anchors.gaps.values()), GAP_SCHEMA, self.stage)
        self.stats.timed("side tables", clock)

    def log_quarantined(self) -> float:
        """Log the quarantined batches (no rows of theirs to move in: no staging)."""
        clock = time.monotonic()
        self.table.append(self.table.batches, self.log_rows, BATCH_LOG_SCHEMA)
        return self.stats.timed("log", clock)

    def archive_batches(self, batches: list[Candidate], clock: float) -> None:
        for c in batches:
            move_batch(self.files, c.manifest_path, c.data_path,
                        f"{self.archive}/{c.manifest['gateway_id']}")
        self.stats.timed("archive", clock)

    def log_row(self, manifest_path: str, m: dict[str, Any], gateway: str | None, file: str,
                status: str, reason: str | None = None) -> tuple:
        """A row of the ingest log (:data:`BATCH_LOG_SCHEMA`)."""
        return (gateway, file, m.get("sha256"), m.get("after_seq"), m.get("first_seq"),
                m.get("last_seq"), m.get("count"), status, reason, manifest_path,
                *self.stamps.get(manifest_path, (None, None)), self.run, utc_now())

    def reject(self, manifest_path: str, data_path: str, manifest: dict[str, Any] | None,
               reason: str) -> None:
        """Quarantine a batch, count it, and keep its log row for the end of the run."""
        m = manifest or {}
        gateway = m.get("gateway_id") if isinstance(m.get("gateway_id"), str) else None
        where = quarantine_batch(self.files, self.quarantine, manifest_path, data_path, reason)
        name = name_of(data_path)
        self.stats.quarantined.append((name, reason))
        log.warning("quarantined %s: %s (%s)", name, reason, where)
        self.log_rows.append(self.log_row(manifest_path, m, gateway, m.get("file") or name,
                                          "quarantined", reason))
