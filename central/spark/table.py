"""The table: a directory of Parquet files with side tables, and the commit protocol that
keeps them in step, written down here as delta's ``PROTOCOL.md`` does for its log.

Layout (a local path or any Hadoop file system):

    TABLE/date=D/part-*.parquet   the events, partitioned by the UTC date of event_time
    TABLE/_anchors/               clock anchors (read deduplicated on gateway_id, id)
    TABLE/_gaps/                  the gateways' loss records (read deduplicated likewise)
    TABLE/_batches/               the ingest log: one row per batch ingested or quarantined
    TABLE/_staging/<id>/          a staged append or a staged partition rewrite
    TABLE/_lock                   central.table_lock: ingests exclusive, reports shared

Spark skips names starting with ``_`` when it reads TABLE, so the table reads as the events
alone. Every change below happens under the exclusive lock.

**Append** (an ingest run, :meth:`Table.commit`). The run writes everything it adds under
``_staging/<run>/``: the rows as ``date=D/part-*.parquet`` and the side tables' new rows as
``_anchors/``, ``_gaps/`` and ``_batches/`` (the log rows of exactly the batches whose rows
are staged). Then, in this order:

1. the empty journal ``_staging/<run>/_COMMIT`` is written;
2. the row files are moved to ``TABLE/date=D/``;
3. the side tables' files are moved in: ``_anchors``, ``_gaps``, then ``_batches`` last (the
   log vouches for what moved before it);
4. the staging directory is deleted;
5. side tables of more than :data:`COMPACT_FILES` files are compacted: the merged file is
   written before the small ones are deleted (readers tolerate duplicates, never a loss).

Log rows of quarantined batches vouch for no rows: they are appended to ``_batches/``
directly, after the commit.

**Rewrite** (re-basing rows on new clock anchors, :meth:`Table.swap`). The new content of
every partition it touches is written to ``_staging/<id>/date=D/`` (an empty directory for a
partition that ends up empty), then the journal ``_staging/<id>/_SWAP`` listing the dates;
then, date by date, the live partition is deleted and the staged one moved in.

**Recovery** (:meth:`Table.recover`, first thing in every ingest). For each directory under
``_staging/``: with ``_SWAP``, the swap is finished (dates already moved have no staged
directory left); with ``_COMMIT``, the remaining moves of steps 2-4 are made (moved files are
no longer staged); with neither, the run died before committing: the directory is deleted and
the table is as if it never ran.

**Invariant**: once recovered, the ingest log holds a batch as ``ingested`` exactly when the
table holds its rows. Ingests rely on it instead of reading the table: a batch logged with
the same file and sha256 is skipped, only batches whose seq range overlaps a logged one are
compared and deduped against the table's rows, and a manifest listed with the size and
modification time the log has is not read again."""

from __future__ import annotations

import json
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from cairn.central.plan import name_of
from cairn.central.spark.files import Files
from cairn.central.spark.schemas import (
    ANCHOR_SCHEMA,
    BATCH_LOG_SCHEMA,
    GAP_SCHEMA,
    TABLE_SCHEMA,
)

log = logging.getLogger("cairn.spark")

COMPACT_FILES = 64           # side tables are compacted into one file beyond this many
LOCK_WAIT_S = 600.0          # how long a run waits for the table lock before giving up


class Table:
    """A table directory: its paths, reads of its events and side tables, and the moves of
    the protocol above (:meth:`commit`, :meth:`swap`, :meth:`recover`)."""

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
            self.files.move(part, f"{self.root}/{name_of(part)}")  # date=D/part-...parquet
        for side in self._sides():
            for part in self.files.glob(f"{stage}/{side.rsplit('/', 1)[-1]}/*.parquet"):
                self.files.move(part, f"{side}/{part.rsplit('/', 1)[-1]}")
        self.files.delete(stage)

    def swap(self, stage: str, dates: list[str]) -> None:
        """Replace partitions ``dates`` with their staged rewrite (``stage/date=D``, an empty
        one for a partition that ends up empty); the caller wrote ``stage/_SWAP`` first.
        Idempotent: a date whose staged directory is gone was swapped already."""
        for d in dates:
            staged, live = f"{stage}/date={d}", f"{self.root}/date={d}"
            if self.files.exists(staged):
                self.files.delete(live)
                self.files.move(staged, live)
                if not self.files.glob(f"{live}/*.parquet"):
                    self.files.delete(live)
        self.files.delete(stage)


TableDir = Table  # its name before the split (tests and bench/ use it)
