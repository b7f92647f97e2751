"""The edge uploader: history after the watermark -> batch files -> sink -> watermark.

It runs as its own process beside the router (``cairn sync``) and reads the router's SQLite
store directly (WAL allows a reader next to the writer), in ``seq`` order. Reading the file
rather than calling the router keeps a large backlog cheap to drain and works while the
router is down; the store module owns every SQL statement it uses.

Each batch is a data file of one publication per line (the lean schema 2 of
:mod:`formats.batch`: bzip2, about 3 bytes a reading) plus a manifest (gateway id,
first/last seq, count, sha256, schema version, and the clock anchors, gap records, boots,
realms and publication id key the central job needs), signed by the gateway's own key
(:mod:`formats.batch_signature`). The watermark moves only after
the sink confirmed both files, so a batch may be sent twice but never lost; re-sent batches
are harmless because the central job dedupes on ``(gateway_id, seq)``.

A manifest's ``after_seq`` is the watermark the batch was read after: the batch holds every
history row with ``after_seq < seq <= last_seq``. Seqs in that range that are absent were
never history (retained-only publications take a seq too) or were dropped on the gateway
(then a gap record says so), so the central gap report can tell a batch that never landed
from numbers that were never meant to arrive.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cairn.base.clock_readings import rfc3339
from cairn.base.data_dir import (
    AGING,
    CARRIED,
    SyncStatus,
    read_sync_status_file,
    write_sync_status,
)
from cairn.formats import batch_signature
from cairn.formats.batch import (
    SCHEMA_VERSION,
    build_manifest,
    encode_lean,
    encode_rows,
    manifest_name,
    row_of,
)
from cairn.formats.health import TOPIC as HEALTH_TOPIC
from cairn.gateway.store import Damaged, HistoryReader
from cairn.sync import budget, metered
from cairn.sync.sinks import Sink, SinkError

log = logging.getLogger("cairn.sync")

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

    @property
    def manifest_bytes(self) -> bytes:
        return json.dumps(self.manifest, separators=(",", ":")).encode()  # bytes on the wire

    @property
    def size(self) -> int:
        """Bytes on the wire: the data and the manifest (HTTP headers not counted)."""
        return len(self.data) + len(self.manifest_bytes)


def _damaged_gap(row: Damaged) -> dict[str, Any]:
    """A damaged history row as a gap record of its batch (ids of the store's own gaps are
    positive, so these cannot collide)."""
    return {"id": -row.seq, "realm": row.realm, "rule": None, "first_seq": row.seq,
            "last_seq": row.seq, "count": 1, "reason": f"damaged: {row.why}",
            "wall_ms": row.wall_ms}


OVER_BUDGET = "over budget"  # the reason of a gap of a row too large for any day's budget


def _over_budget_gap(row: dict[str, Any], size: int, daily: int) -> dict[str, Any]:
    """A history row whose batch alone is larger than a whole day's budget, as a gap record
    of the batch after it (ids as :func:`_damaged_gap`'s: a row is damaged or readable)."""
    return {"id": -row["seq"], "realm": row["realm"], "rule": None,
            "first_seq": row["seq"], "last_seq": row["seq"], "count": 1,
            "reason": f"{OVER_BUDGET}: {size} bytes alone, more than a day's {daily} bytes "
                      f"([sync] daily_bytes): kept in the store, not shipped",
            "wall_ms": row["wall_ms"]}


def build_batch(gateway_id: str, rows: list[dict[str, Any]], after_seq: int,
                anchors: list[dict[str, Any]], gaps: list[dict[str, Any]],
                data: bytes | None = None, key: bytes | None = None,
                schema: int = SCHEMA_VERSION,
                signing_key: Ed25519PrivateKey | None = None) -> Batch:
    """The batch of ``rows`` (in seq order, every history row after ``after_seq`` up to the
    last one) with its manifest, signed with ``signing_key`` (the gateway's). ``anchors`` and
    ``gaps`` are the store's records; the ones that concern this batch are picked here.
    ``key``: the store's publication id key (schema 2 leaves out the ids it gives); schema 1
    is written only to test its reader."""
    if data is None:
        data = encode_lean(rows, key) if schema == 2 else encode_rows(gateway_id, rows)
    first, last = rows[0]["seq"], rows[-1]["seq"]
    manifest = build_manifest(gateway_id, rows, data, after_seq, anchors, gaps,
                              int(time.time() * 1000), key, schema)
    if signing_key is not None:
        manifest = batch_signature.sign(manifest, signing_key)
    return Batch(first, last, len(rows), data, manifest)


@dataclass
class Uploader:
    gateway_id: str
    reader: HistoryReader
    sink: Sink
    status_file: Path
    batch_events: int = 10_000
    batch_bytes: int = 8 * 1024 * 1024
    daily_bytes: int = 0  # [sync] daily_bytes: past it only health records go (sync.budget)
    status: SyncStatus = field(init=False)
    progress_interval: float = 5.0  # seconds between progress lines while draining
    status_interval: float = 600.0  # seconds between rewrites of a status that only aged
    on_metered: str = "send"  # [sync] on_metered: "wait" holds batches back on a metered link
    metered: Callable[[], int | None] = metered.read_metered  # NMMetered now (None: unknown)
    signing_key: Ed25519PrivateKey | None = None  # the gateway's: signs every manifest

    def __post_init__(self) -> None:
        self.status = SyncStatus(self.gateway_id, self.sink.describe(),
                                 synced_seq=self.reader.synced_seq(),
                                 budget_bytes=self.daily_bytes)
        last = read_sync_status_file(self.status_file) or {}
        for key, kind in CARRIED.items():  # bytes sent, the budget's window, health ahead
            if isinstance(last.get(key), kind):
                setattr(self.status, key, last[key])
        self._written: tuple[dict[str, Any], float] | None = None
        if hasattr(self.sink, "uplink_clock"):  # sync.sinks.s3: what this boot measured before
            self.sink.uplink_clock.resume(self.status.uplink_clock)
        # rows no day's budget carries, by seq: their gap records, until shipped (each run
        # finds them again: the same row against the same budget)
        self._left_out: dict[int, dict[str, Any]] = {}
        self._said_over_budget = False  # logged once per spell, not every interval
        self._said_health_held = False  # so is the floor of health records reached

    # -- one batch -----------------------------------------------------------------------

    def next_batch(self) -> Batch | None:
        """The next batch of the backlog within ``batch_bytes`` and what the day's budget
        has left; None when nothing waits, or when the budget cannot carry even one row
        (``status.health_only``: then only health records go, see :meth:`ship_health`).
        A row no day's budget can carry is left out as a gap (:meth:`_leave_out`)."""
        self.status.health_only = False
        while True:
            rows, damaged = self._readable_rows()
            if not rows:
                return None
            room = budget.room(self.status)
            batch = self._fitted(rows, damaged, min(self.batch_bytes, room))
            if batch.size <= room:
                return batch
            if not self._larger_than_a_day(batch):
                self.status.health_only = True
                return None
            self._leave_out(rows[0], batch.size)

    def _fitted(self, rows: list[dict[str, Any]], damaged: list[Damaged], limit: float
                ) -> Batch:
        """The batch of the first of ``rows`` that fit in ``limit`` bytes (one at least)."""
        batch = self._batch(rows, damaged)
        while batch.size > limit and len(rows) > 1:
            rows = rows[: max(1, int(len(rows) * limit // batch.size * 9 // 10))]
            batch = self._batch(rows, damaged)
        return batch

    def _larger_than_a_day(self, batch: Batch) -> bool:
        """One row whose batch is larger than a whole day's budget, though a batch's
        manifest fits in one: the row itself is too large (a budget smaller than a manifest
        carries no row at all: health records only, as documented for daily_bytes = 1)."""
        daily = self.status.budget_bytes
        return batch.count == 1 and batch.size > daily >= len(batch.manifest_bytes)

    def _leave_out(self, row: dict[str, Any], size: int) -> None:
        """Records ``row`` (``size`` bytes as a batch of its own) as an "over budget" gap,
        which ships in the manifest of the batch after it, so that the watermark moves on.
        Not shipped alone on a fresh window instead: the budget is the operator's bound on a
        metered link, and anyone who may publish to a history topic could then spend days'
        worth with one row, every day, and hold later readings back a day per such row.
        The row stays in the store (get_events reads it) until retention drops it."""
        self._left_out[row["seq"]] = _over_budget_gap(row, size, self.status.budget_bytes)

    def _batch(self, rows: list[dict[str, Any]], damaged: list[Damaged]) -> Batch:
        last = rows[-1]["seq"]
        lost = [_damaged_gap(r) for r in damaged if r.seq < last] + \
            [gap for seq, gap in self._left_out.items() if self.status.synced_seq < seq < last]
        return build_batch(self.gateway_id, rows, self.status.synced_seq,
                           self.reader.anchors(), self.reader.gaps() + lost,
                           key=self.reader.publication_key(), signing_key=self.signing_key)

    def _readable_rows(self) -> tuple[list[dict[str, Any]], list[Damaged]]:
        """The next rows that can be shipped, and the damaged ones before and among them.
        Damaged rows go in a batch's manifest as gaps (reason "damaged: ..."), so they ride
        with the next good row: a backlog that ends in them waits for one. So do the rows
        left out over budget (:meth:`_leave_out`), which are not among these."""
        after, damaged = self.status.synced_seq, []
        while True:
            window = self.reader.publications_after(after, self.batch_events)
            good = [row_of(r) for r in window
                    if not isinstance(r, Damaged) and r.seq not in self._left_out]
            damaged += [r for r in window if isinstance(r, Damaged)]
            if good or len(window) < self.batch_events:
                return good, damaged
            after = window[-1].seq  # a whole window of damage: look past it

    def _put(self, batch: Batch) -> None:
        """Data first, manifest last, each counted as sent (and against the budget) whether
        or not the sink took it: a sink that took the data and refused every manifest was
        once sent 6 MB in a minute against a 1 MB day, none of it counted."""
        try:
            self._send(batch.name, batch.data)
            self._send(manifest_name(batch.name), batch.manifest_bytes)
        finally:
            if hasattr(self.sink, "uplink_clock"):
                self.status.uplink_clock = self.sink.uplink_clock.view()

    def _send(self, name: str, data: bytes) -> None:
        """One file: a sink that counts what it puts on the wire (sync.sinks.http and s3:
        request heads, a redirect, a re-signed try) says how many bytes, the others' are
        the body."""
        before = getattr(self.sink, "sent", None)
        try:
            self.sink.put(name, data)
        finally:
            size = len(data) if before is None else self.sink.sent - before
            self.status.bytes_sent += size
            self.status.budget_used += size if self.status.budget_bytes else 0

    def ship_health(self) -> int:
        """The budget is spent: ship the health records not shipped yet, each as a batch of
        its own (it covers its seq alone), without moving the watermark; the backlog sends
        them again, once the budget allows (the central table keeps one of each). They go
        past the budget up to its floor (budget.health_room); the rest wait for the next
        window, in the backlog."""
        after = max(self.status.synced_seq, self.status.health_seq)
        shipped = 0
        for pub in self.reader.topic_after(after, HEALTH_TOPIC, 100):
            if not isinstance(pub, Damaged):
                row = row_of(pub)
                batch = build_batch(self.gateway_id, [row], row["seq"] - 1,
                                    self.reader.anchors(), self.reader.gaps(),
                                    key=self.reader.publication_key(),
                                    signing_key=self.signing_key)
                if batch.size > budget.health_room(self.status):
                    self._health_held()
                    break
                self._put(batch)
                shipped += 1
            self.status.health_seq = pub.seq
        return shipped

    def _health_held(self) -> None:
        if not self._said_health_held:
            log.warning("health records past the budget's floor (%d bytes beyond %d): the "
                        "rest wait for the next window, in %s", budget.HEALTH_FLOOR_BYTES,
                        self.status.budget_bytes, _duration(budget.ends_in_s(self.status)))
        self._said_health_held = True

    def ship(self, batch: Batch) -> None:
        """Data first, manifest last; then (and only then) the watermark."""
        self._put(batch)
        self.reader.set_synced_seq(batch.last_seq)
        self.status.synced_seq = batch.last_seq
        self.status.batches += 1
        self.status.events += batch.count
        for gap in batch.manifest["gaps"]:
            if gap["id"] < 0 and gap["first_seq"] > batch.manifest["after_seq"]:
                self._count_left_out(gap)
        self._left_out = {seq: gap for seq, gap in self._left_out.items()
                          if seq > batch.last_seq}

    def _count_left_out(self, gap: dict[str, Any]) -> None:
        """A row this uploader left out of a batch it shipped, in the status and the log."""
        if gap["reason"].startswith(OVER_BUDGET):
            self.status.over_budget_rows += 1
            self.status.last_over_budget = {k: gap[k] for k in ("first_seq", "last_seq",
                                                                "reason")}
            log.warning("history row seq %d is larger than any day's budget (%s): shipped as "
                        "a gap", gap["first_seq"], gap["reason"])
            return
        self.status.damaged_rows += 1
        self.status.last_damaged = {k: gap[k] for k in ("first_seq", "reason")}
        log.warning("history row seq %d could not be read (%s): shipped as a gap",
                    gap["first_seq"], gap["reason"])

    # -- loops ---------------------------------------------------------------------------

    def drain(self) -> int:
        """Ship batches until nothing is left; raises SinkError when the sink fails."""
        shipped = 0
        started = last_line = time.monotonic()
        total = self.reader.backlog(self.status.synced_seq)
        self.status.backlog = total
        while (batch := self.next_batch()) is not None:
            self.status.last_attempt = rfc3339(int(time.time() * 1000))
            self.ship(batch)
            shipped += batch.count
            now = time.monotonic()
            elapsed = max(now - started, 1e-6)
            self.status.rate_events_per_s = round(shipped / elapsed, 1)
            self.status.backlog = max(total - shipped, 0)
            if total > self.batch_events and (now - last_line >= self.progress_interval
                                              or not self.status.backlog):
                last_line = now
                eta = self.status.backlog / (shipped / elapsed)
                log.info("synced %d/%d events (%.0f events/s, %s left)", shipped, total,
                         shipped / elapsed, _duration(eta))
            self._mark_success()
        if self.status.health_only:
            self._over_budget(shipped)
        else:
            self.status.backlog = 0
            self._said_over_budget = self._said_health_held = False
        return shipped

    def _over_budget(self, shipped: int) -> None:
        self.status.backlog = self.reader.backlog(self.status.synced_seq)
        health = self.ship_health()
        if not self._said_over_budget:
            log.warning("daily budget spent (%d of %d bytes): only health records go; %d "
                        "events wait for the next window, in %s", self.status.budget_used,
                        self.status.budget_bytes, self.status.backlog,
                        _duration(budget.ends_in_s(self.status)))
        self._said_over_budget = True
        if health or shipped:
            self._mark_success()

    def held_back(self) -> bool:
        """Whether to send nothing now: told to wait for an unmetered link, and on a metered
        one. Says so in the status and, once a spell, in the log."""
        value = self.metered() if self.on_metered == "wait" else None
        if not metered.holds_back(self.on_metered, value):
            if self.status.state == "waiting":
                log.info("the link is not metered any more: syncing")
                self.status.state, self.status.waiting_for = "ok", None
                self.status.waiting_since = None
            return False
        if self.status.state != "waiting":
            self.status.backlog = self.reader.backlog(self.status.synced_seq)
            self.status.waiting_since = rfc3339(int(time.time() * 1000))
            log.info("the link is metered (NetworkManager: %s) and [sync] on_metered = "
                     "\"wait\": %d events wait for an unmetered one", metered.METERED[value],
                     self.status.backlog)
        self.status.state = "waiting"
        self.status.waiting_for = "an unmetered link (on_metered = \"wait\")"
        self._write_status()
        return True

    def once(self) -> int:
        """``cairn sync --once``: drain the backlog, or raise SinkError."""
        if self.held_back():
            return 0
        try:
            shipped = self.drain()
        except SinkError as e:
            self._mark_failure(str(e))
            raise
        if shipped == 0:
            self.status.state = "idle"
        self._mark_success(force=True)
        return shipped

    def run(self, interval: float = 60.0, max_backoff: float = 600.0,
            stop: Any = None) -> None:
        """Long-running mode: drain whenever there is something, back off (with jitter)
        while the sink fails, and retry at once when a retry succeeds. A retry waits at most
        ``interval`` (and ``max_backoff``): a link back after an outage of any length is
        used within one interval, as an idle uploader would notice new readings."""
        backoff = 0.0
        while stop is None or not stop.is_set():
            wait = interval  # also while held back on a metered link: look again then
            if not self.held_back():
                try:
                    self.drain()
                    backoff = 0.0
                    self.status.state = "ok"
                    self._mark_success()
                except SinkError as e:
                    self._mark_failure(str(e))
                    backoff = min(max(backoff * 2, 1.0), max_backoff, interval)
                    wait = backoff * (0.5 + random.random() / 2)
                    log.warning("sync failed: %s; %d events waiting; retrying in %s", e,
                                self.status.backlog, _duration(wait) if wait >= 1 else
                                f"{wait:.2f}s")
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)

    # -- status --------------------------------------------------------------------------

    def _mark_success(self, force: bool = False) -> None:
        self.status.last_success = rfc3339(int(time.time() * 1000))
        self.status.last_error = None
        if self.status.state in ("starting", "retrying"):
            self.status.state = "ok"
        self._write_status(force)

    def _mark_failure(self, error: str) -> None:
        self.status.state = "retrying"
        self.status.last_error = error
        self.status.backlog = self.reader.backlog(self.status.synced_seq)
        self._write_status()

    def _write_status(self, force: bool = False) -> None:
        """A small JSON file the router's status procedure (and the dashboard) shows.
        Each rewrite costs the card a new file and a journal commit, so a status in which
        only the times moved (an idle check every minute) is rewritten at most every
        ``status_interval``: its ``last_success`` may be that old."""
        status = asdict(self.status)
        lasting = {k: v for k, v in status.items() if k not in AGING}
        if not force and self._written is not None and self._written[0] == lasting and \
                time.monotonic() - self._written[1] < self.status_interval:
            return
        try:
            write_sync_status(self.status_file, self.status)
        except OSError as e:
            log.warning("cannot write %s: %s", self.status_file, e)
            return
        self._written = lasting, time.monotonic()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
