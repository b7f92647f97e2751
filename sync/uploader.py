"""The edge uploader: history after the watermark -> batch files -> sink -> watermark.

It runs as its own process beside the router (``cairn sync``) and reads the router's SQLite
store directly (WAL allows a reader next to the writer), in ``seq`` order. Reading the file
rather than calling the router keeps a large backlog cheap to drain and works while the
router is down; the store module owns every SQL statement it uses.

Each batch is a gzip of JSON Lines, one publication per line with ``gateway_id`` and
``seq``, plus a manifest (gateway id, first/last seq, count, sha256, schema version, and
the clock anchors and gap records the central job needs). The watermark moves only after
the sink confirmed both files, so a batch may be sent twice but never lost; re-sent batches
are harmless because the central job dedupes on ``(gateway_id, seq)``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gateway.clock import rfc3339
from gateway.store import HistoryReader
from sync.sinks import SinkError

log = logging.getLogger("cairn.sync")

SCHEMA_VERSION = 1


class Sink(Protocol):
    def describe(self) -> str: ...
    def put(self, name: str, data: bytes) -> None: ...


@dataclass
class Batch:
    first_seq: int
    last_seq: int
    count: int
    data: bytes
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.manifest["file"]


@dataclass
class SyncStatus:
    gateway_id: str
    sink: str
    state: str = "starting"  # ok | retrying | idle
    synced_seq: int = 0
    backlog: int = 0
    last_success: str | None = None
    last_attempt: str | None = None
    last_error: str | None = None
    rate_events_per_s: float | None = None
    batches: int = 0
    events: int = 0


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode_rows(gateway_id: str, rows: list[dict[str, Any]]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        for row in rows:
            line = {"gateway_id": gateway_id, "timestamp": rfc3339(row["wall_ms"]), **row}
            gz.write(json.dumps(line, default=_json_default, separators=(",", ":")).encode())
            gz.write(b"\n")
    return buffer.getvalue()


@dataclass
class Uploader:
    gateway_id: str
    reader: HistoryReader
    sink: Sink
    status_file: Path
    batch_events: int = 10_000
    batch_bytes: int = 8 * 1024 * 1024
    bandwidth: int = 0  # bytes/s, 0 = no cap
    status: SyncStatus = field(init=False)

    def __post_init__(self) -> None:
        self.status = SyncStatus(self.gateway_id, self.sink.describe(),
                                 synced_seq=self.reader.synced_seq())

    # -- one batch -----------------------------------------------------------------------

    def next_batch(self) -> Batch | None:
        rows = self.reader.publications_after(self.status.synced_seq, self.batch_events)
        if not rows:
            return None
        data = encode_rows(self.gateway_id, rows)
        while len(data) > self.batch_bytes and len(rows) > 1:
            rows = rows[: max(1, len(rows) * self.batch_bytes // len(data) * 9 // 10)]
            data = encode_rows(self.gateway_id, rows)
        first, last = rows[0]["seq"], rows[-1]["seq"]
        boots = {row["boot_id"] for row in rows}
        name = f"{self.gateway_id}/{first:012d}-{last:012d}.jsonl.gz"
        manifest = {
            "schema": SCHEMA_VERSION,
            "gateway_id": self.gateway_id,
            "file": name,
            "first_seq": first,
            "last_seq": last,
            "count": len(rows),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "created": rfc3339(int(time.time() * 1000)),
            "anchors": [a for a in self.reader.anchors() if a["boot_id"] in boots],
            "gaps": [g for g in self.reader.gaps()
                     if g["last_seq"] is not None and g["first_seq"] is not None
                     and g["last_seq"] > self.status.synced_seq and g["first_seq"] <= last],
        }
        return Batch(first, last, len(rows), data, manifest)

    def ship(self, batch: Batch) -> None:
        """Data first, manifest last; then (and only then) the watermark."""
        started = time.monotonic()
        self.sink.put(batch.name, batch.data)
        self.sink.put(batch.name.removesuffix(".jsonl.gz") + ".manifest.json",
                      json.dumps(batch.manifest, indent=1).encode())
        self.reader.set_synced_seq(batch.last_seq)
        self.status.synced_seq = batch.last_seq
        self.status.batches += 1
        self.status.events += batch.count
        if self.bandwidth:
            rest = len(batch.data) / self.bandwidth - (time.monotonic() - started)
            if rest > 0:
                time.sleep(rest)

    # -- loops ---------------------------------------------------------------------------

    def drain(self) -> int:
        """Ship batches until nothing is left; raises SinkError when the sink fails."""
        shipped = 0
        started = time.monotonic()
        total = self.reader.backlog(self.status.synced_seq)
        while (batch := self.next_batch()) is not None:
            self.status.last_attempt = rfc3339(int(time.time() * 1000))
            self.ship(batch)
            shipped += batch.count
            elapsed = max(time.monotonic() - started, 1e-6)
            self.status.rate_events_per_s = round(shipped / elapsed, 1)
            self.status.backlog = max(total - shipped, 0)
            if total > self.batch_events:
                eta = self.status.backlog / (shipped / elapsed)
                log.info("synced %d/%d events (%.0f events/s, %s left)", shipped, total,
                         shipped / elapsed, _duration(eta))
            self._mark_success()
        self.status.backlog = 0
        return shipped

    def once(self) -> int:
        """``cairn sync --once``: drain the backlog, or raise SinkError."""
        try:
            shipped = self.drain()
        except SinkError as e:
            self._mark_failure(str(e))
            raise
        if shipped == 0:
            self.status.state = "idle"
            self._mark_success()
        return shipped

    def run(self, interval: float = 60.0, max_backoff: float = 600.0,
            stop: Any = None) -> None:
        """Long-running mode: drain whenever there is something, back off (with jitter)
        while the sink fails, and retry at once when a retry succeeds."""
        backoff = 0.0
        while stop is None or not stop.is_set():
            try:
                self.drain()
                backoff = 0.0
                self.status.state = "ok"
                self._mark_success()
                wait = interval
            except SinkError as e:
                self._mark_failure(str(e))
                backoff = min(max(backoff * 2, 1.0), max_backoff)
                wait = backoff * (0.5 + random.random() / 2)
                log.warning("sync failed: %s; %d events waiting; retrying in %.0f s", e,
                            self.status.backlog, wait)
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)

    # -- status --------------------------------------------------------------------------

    def _mark_success(self) -> None:
        self.status.last_success = rfc3339(int(time.time() * 1000))
        self.status.last_error = None
        if self.status.state in ("starting", "retrying"):
            self.status.state = "ok"
        self._write_status()

    def _mark_failure(self, error: str) -> None:
        self.status.state = "retrying"
        self.status.last_error = error
        self.status.backlog = self.reader.backlog(self.status.synced_seq)
        self._write_status()

    def _write_status(self) -> None:
        """A small JSON file the router's status procedure (and the dashboard) shows."""
        temp = self.status_file.with_suffix(".tmp")
        try:
            temp.write_text(json.dumps(asdict(self.status), indent=1))
            os.replace(temp, self.status_file)
        except OSError as e:
            log.warning("cannot write %s: %s", self.status_file, e)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
