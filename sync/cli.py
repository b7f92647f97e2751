"""``cairn sync``: ship history to the central sink, once or for as long as it runs.

```toml
[sync]
# "dir:/mnt/share/cairn", an http(s) URL ({name} is replaced by the batch file's name),
# or "s3://BUCKET/PREFIX" (sync.s3: endpoint, region, access_key_id, secret_access_key*,
# addressing, verify_etag)
sink = "https://hdfs.example/webhdfs/v1/cairn/{name}?op=CREATE&overwrite=true"
gateway_id = "greenhouse-7"     # default: the host name
token_env = "CAIRN_SYNC_TOKEN"  # bearer token (or token / token_file); or username + password
batch_events = 10000            # events per batch file
batch_bytes = 8388608           # compressed bytes per batch file
interval = 60                   # seconds between checks while there is nothing to send
timeout = 30                    # seconds a whole HTTP request may take
redirect_hosts = []             # hosts a redirect may hand a batch to (WebHDFS datanodes)
max_backoff = 600               # seconds, the longest wait between retries (at most interval)
bandwidth = 0                   # bytes/s cap, 0 = none
daily_bytes = 0                 # bytes a day; past it only health records go; 0 = no limit
on_metered = "send"             # or "wait": on a metered link (cellular) wait for another
verify_tls = true
```
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.gateway import config as gateway_config
from cairn.gateway.config import read_document
from cairn.gateway.config_tools import ConfigError, Validator, secret
from cairn.gateway.data_dir import db_path, sync_status_path
from cairn.gateway.store import HistoryReader
from cairn.sync import metered, s3
from cairn.sync.sinks import DirectorySink, HttpSink, SinkError
from cairn.sync.uploader import Uploader

log = logging.getLogger("cairn.sync")
GATEWAY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class SyncConfig:
    sink: str
    data_dir: Path
    gateway_id: str
    token: str | None = None
    username: str | None = None
    password: str | None = None
    batch_events: int = 10_000
    batch_bytes: int = 8 * 1024 * 1024
    interval: float = 60.0
    timeout: float = 30.0
    max_backoff: float = 600.0
    bandwidth: int = 0
    daily_bytes: int = 0  # 0: no limit (sync.budget)
    verify_tls: bool = True
    redirect_hosts: tuple[str, ...] = ()
    on_metered: str = "send"  # or "wait" (sync.metered)
    s3: s3.S3Config | None = None  # an s3:// sink's settings (sync.s3)


def optional_secret(v: Validator, t: dict[str, Any], at: str, name: str) -> str | None:
    keys = {name: "secret", f"{name}_file": "secret_file", f"{name}_env": "secret_env"}
    renamed = {keys[k]: value for k, value in t.items() if k in keys}
    try:
        return secret(v, renamed, at)
    except ConfigError as e:  # name the key the user wrote
        key = e.key.replace("secret", name)
        raise ConfigError(e.source, key, e.problem) from None


def parse_sync(data: dict[str, Any], source: str) -> SyncConfig:
    v = Validator(source)
    t = v.table(data, "sync")
    at = "sync"
    v.keys(t, at, {"sink", "gateway_id", "token", "token_file", "token_env", "username",
                   "password", "password_file", "password_env", "batch_events", "batch_bytes",
                   "interval", "timeout", "max_backoff", "bandwidth", "verify_tls",
                   "redirect_hosts", "daily_bytes", "on_metered"} | s3.KEYS)
    sink = v.get(t, at, "sink", str, None)
    if not sink:
        raise ConfigError(source, f"{at}.sink", "missing: a directory (dir:/path) or an "
                                                "http(s):// URL to PUT batches to")
    if not sink.startswith(("dir:", "http://", "https://", "s3://")):
        raise ConfigError(source, f"{at}.sink",
                          f"must start with dir:, http://, https:// or s3://, not {sink!r}")
    if sink.startswith("s3://"):
        s3_config = s3.parse(v, t, at, sink, optional_secret(v, t, at, "secret_access_key"))
    else:
        s3_config = None
        s3.refuse_keys(v, t, at)
    router = gateway_config.parse_router(v, v.table(data, "router"), "router")
    numbers = {}
    for key, default in (("interval", 60.0), ("timeout", 30.0), ("max_backoff", 600.0)):
        value = t.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(source, f"{at}.{key}", f"must be a positive number of seconds, "
                                                     f"not {value!r}")
        numbers[key] = float(value)
    gateway_id = v.get(t, at, "gateway_id", str, socket.gethostname())
    if not GATEWAY_ID.fullmatch(gateway_id):
        raise ConfigError(source, f"{at}.gateway_id",
                          f"{gateway_id!r} is not a usable name: letters, digits, '.', '_' and "
                          f"'-', starting with a letter or digit (it names a directory)")
    bandwidth = v.get(t, at, "bandwidth", int, 0)
    if bandwidth < 0:
        raise ConfigError(source, f"{at}.bandwidth", "must be 0 (no cap) or bytes per second")
    daily_bytes = v.get(t, at, "daily_bytes", int, 0)
    if daily_bytes < 0:
        raise ConfigError(source, f"{at}.daily_bytes",
                          f"must be 0 (no limit) or bytes a day, not {daily_bytes}")
    redirect_hosts = v.get(t, at, "redirect_hosts", list, [])
    if not all(isinstance(h, str) and h and "/" not in h for h in redirect_hosts):
        raise ConfigError(source, f"{at}.redirect_hosts",
                          f"must be a list of host names, not {redirect_hosts!r}")
    return SyncConfig(
        sink=sink, data_dir=router.data_dir,
        gateway_id=gateway_id,
        token=optional_secret(v, t, at, "token"),
        username=v.get(t, at, "username", str, None),
        password=optional_secret(v, t, at, "password"),
        batch_events=v.positive(t, at, "batch_events", 10_000),
        batch_bytes=v.positive(t, at, "batch_bytes", 8 * 1024 * 1024),
        bandwidth=bandwidth, daily_bytes=daily_bytes,
        verify_tls=v.get(t, at, "verify_tls", bool, True),
        redirect_hosts=tuple(h.lower() for h in redirect_hosts),
        on_metered=metered.parse_policy(v, t, at), s3=s3_config, **numbers)


gateway_config.SECTION_CHECKS["sync"] = parse_sync  # a change of cairn.toml is checked whole


def make_sink(config: SyncConfig) -> DirectorySink | HttpSink | s3.S3Sink:
    if config.s3 is not None:
        return s3.S3Sink(config.s3, timeout=config.timeout, verify_tls=config.verify_tls,
                         bandwidth=config.bandwidth)
    if config.sink.startswith("dir:"):
        return DirectorySink(Path(config.sink.removeprefix("dir:")), config.bandwidth)
    return HttpSink(config.sink, token=config.token, username=config.username,
                    password=config.password, timeout=config.timeout,
                    verify_tls=config.verify_tls, bandwidth=config.bandwidth,
                    redirect_hosts=config.redirect_hosts)


def add_commands(commands: Any) -> None:
    sync = commands.add_parser(
        "sync", help="ship history batches to the central sink",
        description="Ship stored history in seq order to the [sync] sink as gzip JSON Lines "
                    "batches with manifests. Runs until stopped, or once with --once.")
    sync.add_argument("--config", metavar="FILE", required=True, help="TOML config file")
    sync.add_argument("--once", action="store_true",
                      help="drain the backlog and exit (0 ok, 1 the sink failed)")

    spark = commands.add_parser(
        "spark", help="central jobs (PySpark): ingest landed batches, write reports",
        description="The central side of history sync, on any Spark master. Needs PySpark "
                    "(pip install 'cairn[spark]') and a Java runtime.")
    spark.set_defaults(spark_parser=spark, spark_command=None)
    jobs = spark.add_subparsers(dest="spark_command", metavar="JOB")
    ingest = jobs.add_parser(
        "ingest", help="landed batches -> the Parquet table (deduplicated, time-corrected)",
        description="Read the batches under --landing whose manifest has landed, check each "
                    "against its manifest (size, sha256, line count; a bad batch is "
                    "quarantined and the job goes on), drop rows the table already holds "
                    "(by gateway_id and seq), re-base timestamps taken before the clock was "
                    "synchronized, and append to the Parquet table under --table, "
                    "partitioned by date. Re-running adds nothing new. Paths may be local or "
                    "any Hadoop file system URL (hdfs://, s3a://).")
    ingest.add_argument("--landing", required=True, metavar="DIR",
                        help="where the sinks land batches (<gateway>/<first>-<last>.*)")
    ingest.add_argument("--table", required=True, metavar="DIR", help="the Parquet table")
    ingest.add_argument("--quarantine", metavar="DIR",
                        help="move bad batches here with a note of why (default: leave them "
                             "in place and report them)")
    ingest.add_argument("--archive", metavar="DIR",
                        help="move batches here once ingested (or found ingested before), "
                             "so that the landing holds only what is pending (default: "
                             "leave them; batch mode lists the whole landing each run)")
    ingest.add_argument("--streaming", action="store_true",
                        help="Structured Streaming (trigger availableNow) with --checkpoint: "
                             "only manifests that landed since the last run are read")
    ingest.add_argument("--checkpoint", metavar="DIR", help="streaming checkpoint directory")
    ingest.add_argument("--max-batches", type=int, metavar="N",
                        help="batches per step: per micro-batch when streaming (default "
                             "1000), per chunk in batch mode (default 20000)")
    report = jobs.add_parser(
        "report", help="gap, hourly sensor, clock and fleet reports from the table",
        description="Write reports from the table under --out, each as Parquet (<name>/) "
                    "and as one CSV file (<name>.csv): gaps (missing seq ranges that are "
                    "data loss, per gateway), gateways (one line each: rows, first/last "
                    "seq, gaps, re-based rows, last batch ingested, batches quarantined), "
                    "daily (rows per gateway per day), hourly (per-sensor min/mean/max "
                    "temperature and humidity by corrected hour), clock_steps (each step of "
                    "a gateway clock and its size), unsynced (spans of events recorded "
                    "before the clock was synchronized, and how far they were re-based) and "
                    "fleet (one line per gateway from its newest health record, flagged "
                    "with reasons, most urgent first); plus report.html, a page with the "
                    "fleet and plots that opens without a server. Prints a short summary "
                    "ending with the gateways that need attention.")
    report.add_argument("--table", required=True, metavar="DIR", help="the Parquet table")
    report.add_argument("--out", required=True, metavar="DIR", help="where reports go")
    for job in (ingest, report):
        job.add_argument("--master", default="local[*]", metavar="URL",
                         help="Spark master: local[*] (default), local[N], spark://HOST:PORT, "
                              "yarn, k8s://https://HOST:PORT")
        job.add_argument("--conf", action="append", metavar="KEY=VALUE",
                         help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)")
        job.add_argument("--wait", type=float, default=600, metavar="SECONDS",
                         help="how long to wait for the table's lock (one ingest at a time; "
                              "reports wait for an ingest to finish) before giving up with "
                              "exit 1 (default 600)")


def main(args: argparse.Namespace) -> int:
    if args.command == "spark":
        return spark_main(args)
    try:
        data, source = read_document(args.config)
        config = parse_sync(data, source)
    except ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return 2
    try:
        reader = HistoryReader(db_path(config.data_dir))
    except (FileNotFoundError, OSError) as e:
        log.error("cannot open the store: %s", e)
        return 1
    uploader = Uploader(config.gateway_id, reader, make_sink(config),
                        sync_status_path(config.data_dir), config.batch_events,
                        config.batch_bytes, config.daily_bytes, on_metered=config.on_metered)
    log.info("syncing %s (gateway %s) to %s from seq %d", config.data_dir, config.gateway_id,
             uploader.sink.describe(), uploader.status.synced_seq)
    try:
        if args.once:
            try:
                shipped = uploader.once()
            except SinkError as e:
                log.error("sync failed: %s", e)
                return 1
            log.info("synced %d events; watermark seq %d", shipped, uploader.status.synced_seq)
            return 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        uploader.run(config.interval, config.max_backoff, stop)
        return 0
    finally:
        reader.close()


def spark_main(args: argparse.Namespace) -> int:
    if args.spark_command is None:
        args.spark_parser.print_help(sys.stderr)
        return 2
    try:
        from cairn.sync import spark
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith(("pyspark", "py4j")):
            raise
        print("cairn spark: PySpark is not installed: pip install 'cairn[spark]' (and a Java "
              "runtime)", file=sys.stderr)
        return 1
    return spark.main(args)

