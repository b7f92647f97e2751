"""``cairn spark``: the central jobs. Landed batches -> one Parquet table -> reports.

The uploaders land ``<gateway_id>/<first>-<last>.jsonl.bz2`` batches (``.jsonl.gz`` from
uploaders of schema 1: :mod:`cairn.formats.batch`) and, once a batch is complete, its
``.manifest.json``. :func:`ingest` (one-shot) and :func:`ingest_stream`
(Structured Streaming) verify them, dedupe them against the table, re-base the time of rows
recorded before the gateway's clock was synchronized and commit them; :func:`report` writes
the reports. The modules, in the order an ingest goes through them:

    schemas   the rows of a batch, of the table and of its side tables; the job settings
    session   the Spark session; Cairn's code shipped to the executors
    files     files through Hadoop's FileSystem (local, HDFS, S3A)
    table     the table directory and its commit protocol (read its docstring first)
    landing   listing the landing, reading manifests, archive and quarantine moves
    verify    a batch against its manifest: bytes and lines
    dedupe    which batches overlap the table or each other; seqs re-used for other events
    rebase    clock anchors and the corrected event_time; re-basing rows ingested earlier
    write     staging a run's rows (in one pass, or checked and deduped)
    stats     the counts and timings of an ingest
    ingest    ingest, ingest_stream and IngestRun, the steps of one run
    reports   the loss, gateway, hourly, clock, unsynchronized-time and fleet reports (the
              fleet's rules are plain Python in central.fleet)
    cli       ``cairn spark ingest|report``

This package re-exports what callers import from ``cairn.central.spark``, the module it was."""

from cairn.central.plan import (
    NOT_LANDED,
    REQUIRED,
    SHIPPED_PACKAGES,
    Candidate,
    code_zip,
    loss_intervals,
    overlapping_batches,
    reference_anchors,
)
from cairn.central.spark.cli import main
from cairn.central.spark.files import Files
from cairn.central.spark.ingest import (
    CHUNK_BATCHES,
    IngestRun,
    ingest,
    ingest_manifests,
    ingest_paths,
    ingest_stream,
)
from cairn.central.spark.landing import LandedManifest, LandingError, landed_manifests
from cairn.central.spark.reports import (
    Report,
    SparkReport,
    clock_steps_report,
    fleet_report,
    gap_report,
    hourly_report,
    report,
    unsynced_report,
)
from cairn.central.spark.schemas import (
    ANCHOR_SCHEMA,
    BATCH_LOG_SCHEMA,
    EVENT_SCHEMA,
    GAP_SCHEMA,
    JOB_CONF,
    REF_SCHEMA,
    TABLE_COLUMNS,
    TABLE_SCHEMA,
)
from cairn.central.spark.session import prepare, session, ship_code
from cairn.central.spark.table import COMPACT_FILES, LOCK_WAIT_S, Table, TableDir
from cairn.central.stats import IngestStats
from cairn.formats.batch import DATA_SUFFIXES, MANIFEST_SUFFIX

# (the functions ingest and session shadow the modules of the same name here: reach those
# as cairn.central.spark.ingest / .session through sys.modules or `from ... import`)
__all__ = [
    "ANCHOR_SCHEMA", "BATCH_LOG_SCHEMA", "CHUNK_BATCHES", "COMPACT_FILES", "DATA_SUFFIXES",
    "EVENT_SCHEMA", "GAP_SCHEMA", "JOB_CONF", "LOCK_WAIT_S", "MANIFEST_SUFFIX", "NOT_LANDED",
    "REF_SCHEMA", "REQUIRED", "SHIPPED_PACKAGES", "TABLE_COLUMNS", "TABLE_SCHEMA",
    "Files", "IngestRun", "IngestStats", "LandedManifest", "LandingError", "Report",
    "SparkReport", "Table", "TableDir",
    "clock_steps_report", "code_zip", "fleet_report", "gap_report", "hourly_report", "ingest",
    "ingest_manifests", "ingest_stream", "loss_intervals", "main", "reference_anchors",
    "report", "session", "ship_code", "unsynced_report",
    # private helpers that tests and bench/ reach for
    "Candidate", "ingest_paths", "landed_manifests", "overlapping_batches", "prepare",
]
