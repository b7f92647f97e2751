"""The schemas of ``cairn spark``: a batch's lines as read, the table's rows, its side tables
(clock anchors, loss records, the ingest log), and the settings every job runs with. No I/O."""

from __future__ import annotations

from pyspark.sql import types as T

from cairn.formats.batch import LEAN_FIELDS, ROW_FIELDS

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

_TYPES = {"string": T.StringType(), "long": T.LongType(), "boolean": T.BooleanType(),
          "timestamp": T.TimestampType(), "date": T.DateType()}


# One line of a batch, as the uploader writes it: batch_format.ROW_FIELDS, the row's one
# definition, behind the manifest's gateway_id. JSON values (``args``, ``kwargs``, ``details``,
# ``audience``) are read as strings: Spark keeps the raw JSON of an object or array there.
_ROW_TYPES = {"long": T.LongType(), "string": T.StringType(), "boolean": T.BooleanType(),
              "json": T.StringType()}
EVENT_SCHEMA = T.StructType([T.StructField("gateway_id", T.StringType())] + [
    T.StructField(f.name, _ROW_TYPES[f.type]) for f in ROW_FIELDS])
# One line of a schema 2 batch (batch_format.LEAN_FIELDS), as read before it is decoded
LEAN_SCHEMA = T.StructType([T.StructField(f.key, _ROW_TYPES[f.type]) for f in LEAN_FIELDS])


def _struct(*parts: str) -> T.StructType:
    """A schema of nullable fields from ``"name type, name type, ..."`` (the parts joined):
    Spark's own DDL parser needs a running JVM; this one needs none."""
    fields = [f.split() for f in " ".join(parts).split(",") if f.strip()]
    return T.StructType([T.StructField(name, _TYPES[kind]) for name, kind in fields])


TABLE_SCHEMA = _struct(
    "gateway_id string, seq long, publication long, realm string, topic string,"
    "timestamp timestamp,"          # raw wall clock of the gateway
    "wall_ms long,"                 # the same, as it was stored
    "boot_id string, boottime_ns long, clock_synced boolean,"
    "event_time timestamp,"         # corrected time
    "time_estimated boolean,"       # event_time was re-based
    "time_anchor long,"             # id of the anchor it was re-based on
    "authid string, authrole string, audience string, details string, args string,"
    "kwargs string,"
    "batch string,"                 # the batch file it came in
    "ingested_at timestamp,"
    "date date,"                    # partition: UTC date of event_time
)
TABLE_COLUMNS = [f.name for f in TABLE_SCHEMA.fields]

ANCHOR_SCHEMA = _struct(
    "gateway_id string, id long, reason string, boot_id string, boottime_ns long,"
    "wall_ns long, offset_before_ns long, clock_synced boolean, after_seq long,"
)

GAP_SCHEMA = _struct(
    "gateway_id string, id long, realm string, rule long, first_seq long, last_seq long,"
    "count long, reason string, wall_ms long,"
)

BATCH_LOG_SCHEMA = _struct(
    "gateway_id string, file string, sha256 string, after_seq long, first_seq long,"
    "last_seq long, count long,"
    "status string,"                # ingested | quarantined
    "reason string, manifest string,"
    # the manifest file's size and modification time when read: a later listing that shows
    # the same skips reading it again
    "manifest_bytes long, manifest_mtime_ms long, run string, logged_at timestamp,"
)

REF_SCHEMA = _struct(
    "gateway_id string, boot_id string, ref_id long, ref_wall_ns long,"
    "ref_boottime_ns long,"
)
