"""The schemas of ``cairn spark``: a batch's lines as read, the table's rows, its side tables
(clock anchors, loss records, the ingest log), and the settings every job runs with. No I/O."""

from __future__ import annotations

from pyspark.sql import types as T

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


# the fields every event has (NOT NULL in the gateway's store)
REQUIRED = ("gateway_id", "seq", "publication", "realm", "topic", "wall_ms", "boot_id",
            "boottime_ns", "clock_synced")
