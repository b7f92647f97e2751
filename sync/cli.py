"""``cairn sync``: ship history to the central sink, once or for as long as it runs.

```toml
[sync]
# "dir:/mnt/share/cairn", an http(s) URL ({name} is replaced by the batch file's name),
# or "s3://BUCKET/PREFIX" (sync.sinks.s3: endpoint, region, access_key_id,
# secret_access_key*, addressing, verify_etag)
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

from cairn.base.config_tools import ConfigError, Validator, optional_secret
from cairn.base.data_dir import db_path, signing_key_path, sync_status_path
from cairn.formats import batch_signature
from cairn.gateway.core import config as gateway_config
from cairn.gateway.core.config import read_document
from cairn.gateway.store import HistoryReader
from cairn.sync import metered
from cairn.sync.sinks import SCHEMES, Sink, SinkError, open_sink, prefixes, scheme_of
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
    # the sink's own settings, checked by its scheme (sync.sinks.Scheme.parse): an s3://
    # sink's sync.sinks.s3.S3Config; None for a sink without keys of its own
    sink_settings: Any = None


def parse_sync(data: dict[str, Any], source: str) -> SyncConfig:
    v = Validator(source)
    t = v.table(data, "sync")
    at = "sync"
    v.keys(t, at, {"sink", "gateway_id", "token", "token_file", "token_env", "username",
                   "password", "password_file", "password_env", "batch_events", "batch_bytes",
                   "interval", "timeout", "max_backoff", "bandwidth", "verify_tls",
                   "redirect_hosts", "daily_bytes", "on_metered"} |
           {key for scheme in SCHEMES.values() for key in scheme.keys})
    sink = v.get(t, at, "sink", str, None)
    if not sink:
        raise ConfigError(source, f"{at}.sink", "missing: a directory (dir:/path) or an "
                                                "http(s):// URL to PUT batches to")
    scheme = scheme_of(sink)  # one of sync.sinks.SCHEMES
    if scheme is None:
        raise ConfigError(source, f"{at}.sink", f"must start with {prefixes()}, not {sink!r}")
    for key in sorted(t.keys() - scheme.keys):
        # a key of another kind of sink is a mistake worth an error, not a key ignored
        owner = next((s for s in SCHEMES.values() if key in s.keys), None)
        if owner is not None:
            raise ConfigError(source, f"{at}.{key}", f"only for an {owner.prefix} sink")
    sink_settings = scheme.parse(v, t, at, sink) if scheme.parse else None
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
        on_metered=metered.parse_policy(v, t, at), sink_settings=sink_settings, **numbers)


def make_sink(config: SyncConfig) -> Sink:
    """The sink of ``[sync] sink``, by its URL scheme (sync.sinks.SCHEMES)."""
    return open_sink(config.sink, config)


def add_commands(commands: Any) -> None:
    sync = commands.add_parser(
        "sync", help="ship history batches to the central sink",
        description="Ship stored history in seq order to the [sync] sink as gzip JSON Lines "
                    "batches with manifests. Runs until stopped, or once with --once.")
    sync.add_argument("--config", metavar="FILE", required=True, help="TOML config file")
    sync.add_argument("--once", action="store_true",
                      help="drain the backlog and exit (0 ok, 1 the sink failed)")
    sync.add_argument("--show-key", action="store_true",
                      help="print this gateway's line for the central side's --gateway-keys "
                           "file (its id and the public key its batches are signed with, "
                           "made if it has none yet) and exit")


def main(args: argparse.Namespace) -> int:
    try:
        data, source = read_document(args.config)
        config = parse_sync(data, source)
    except ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return 2
    try:
        signing_key = batch_signature.gateway_key(signing_key_path(config.data_dir),
                                                  owner_like=config.data_dir)
    except (OSError, ValueError) as e:
        # unsigned batches would be quarantined by a fleet that checks keys: none is sent
        log.error("cannot use the gateway's signing key %s: %s",
                  signing_key_path(config.data_dir), e)
        return 1
    if args.show_key:
        print(f"{config.gateway_id} {batch_signature.public_text(signing_key.public_key())}")
        return 0
    try:
        reader = HistoryReader(db_path(config.data_dir))
    except (FileNotFoundError, OSError) as e:
        log.error("cannot open the store: %s", e)
        return 1
    uploader = Uploader(config.gateway_id, reader, make_sink(config),
                        sync_status_path(config.data_dir), config.batch_events,
                        config.batch_bytes, config.daily_bytes, on_metered=config.on_metered,
                        signing_key=signing_key)
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
