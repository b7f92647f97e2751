"""The store: publications (history), retained events, stable subscription ids, clock
anchors and gap records, in one SQLite file in WAL mode.

Writes are grouped: :meth:`Store.append` queues a row and returns a future that resolves
once the transaction holding it is committed with ``synchronous=FULL`` (fsync). The writer
commits as soon as someone waits for durability (an acknowledged publish) and otherwise
:attr:`Store.flush_interval` seconds after the first row of a batch was queued, so whatever
arrives while one commit runs goes into the next: group commit. With nothing queued, no
timer runs. One thread owns the writing connection and each commit is
a single call into it (rows built, inserted and committed there), so a commit costs the
event loop one thread round trip however many rows it holds. Reads use a second connection
(aiosqlite) and never block writes.

Ordering is always by ``seq``, a strictly increasing number assigned on receipt. At start-up
the next seq follows the highest of the stored rows, the gap records and ``highest_seq`` in
``meta``, which is raised by every transaction that deletes rows (pruning) and at close, so
pruning the newest rows can never lead to a seq being reused after a restart. (Raising it in
every commit would cost one more page written per commit.)

Write amplification (SD-card wear) comes from pages: every page a commit dirties is written
once to the WAL and once more at the next checkpoint. So the hot insert path avoids random
keys (publication ids are random, so they are indexed by seq chunk first: see schema
version 2), rows go in as multi-row INSERTs, and a batch writes each retained slot once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import msgpack

from gateway.clock import Anchor, rfc3339
from gateway.patterns import wildcard_matches

log = logging.getLogger("cairn.store")

SCHEMA_VERSION = 2
MIGRATIONS: list[str] = [
    # version 1
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE publications (
        seq INTEGER PRIMARY KEY,
        publication INTEGER NOT NULL,
        realm TEXT NOT NULL,
        topic TEXT NOT NULL,
        rule INTEGER,                 -- index of the history rule that stored it
        wall_ms INTEGER NOT NULL,     -- wall clock on receipt (may be wrong, may jump)
        boot_id TEXT NOT NULL,
        boottime_ns INTEGER NOT NULL, -- CLOCK_BOOTTIME on receipt: monotonic within a boot
        clock_synced INTEGER NOT NULL,
        authid TEXT,
        authrole TEXT,
        audience TEXT,                -- JSON of the authid/authrole black/white lists, or NULL
        details TEXT,                 -- JSON: topic, and publisher when disclosed
        payload BLOB NOT NULL,        -- msgpack [args, kwargs]
        retain INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX publications_topic ON publications (realm, topic, seq);
    CREATE INDEX publications_publication ON publications (publication);
    CREATE INDEX publications_time ON publications (realm, wall_ms);
    CREATE INDEX publications_rule ON publications (rule, seq);
    CREATE TABLE retained (
        realm TEXT NOT NULL,
        topic TEXT NOT NULL,
        audience_key TEXT NOT NULL,   -- '' for the slot every subscriber is eligible for
        seq INTEGER NOT NULL,
        publication INTEGER NOT NULL,
        wall_ms INTEGER NOT NULL,
        authid TEXT,
        authrole TEXT,
        audience TEXT,
        details TEXT,
        payload BLOB NOT NULL,
        PRIMARY KEY (realm, topic, audience_key)
    );
    CREATE TABLE subscriptions (
        id INTEGER PRIMARY KEY,
        realm TEXT NOT NULL,
        uri TEXT NOT NULL,
        match TEXT NOT NULL,
        created TEXT NOT NULL,
        UNIQUE (realm, uri, match)
    );
    CREATE TABLE anchors (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        reason TEXT NOT NULL,
        boot_id TEXT NOT NULL,
        boottime_ns INTEGER NOT NULL,
        wall_ns INTEGER NOT NULL,
        offset_before_ns INTEGER,
        clock_synced INTEGER NOT NULL,
        after_seq INTEGER NOT NULL    -- the last seq assigned before the anchor
    );
    CREATE TABLE gaps (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        realm TEXT,
        rule INTEGER,
        first_seq INTEGER,
        last_seq INTEGER,
        count INTEGER NOT NULL,
        reason TEXT NOT NULL,
        wall_ms INTEGER NOT NULL
    );
    """,
    # version 2: the random-key index on publication put every new row on a random page of
    # a large index (about one 4 KiB page written per event, twice). Keyed by seq chunk
    # first, new rows all land in the few pages of the newest chunk.
    """
    DROP INDEX publications_publication;
    CREATE INDEX publications_chunk_publication ON publications ((seq >> 10), publication);
    """,
]

# A batch of publications goes in as ONE statement: a multi-row INSERT into a TEMP view
# whose trigger (run by SQLite, per row, without the GIL) writes the history row and the
# retained slot. Without BEGIN it is its own transaction, so the commit and its fsync
# happen in the same sqlite3_step. Each statement the writer thread runs gives up the GIL
# and must win it back from the busy event loop (waking up at every release the loop
# makes): executemany costs that once per row, this once per commit.
_BATCH_COLUMNS = ("seq", "publication", "realm", "topic", "rule", "wall_ms", "boot_id",
                  "boottime_ns", "clock_synced", "authid", "authrole", "audience", "details",
                  "payload", "retain", "audience_key", "slot")
_BATCH_SCHEMA = [
    f"CREATE TEMP VIEW publication_batch ({', '.join(_BATCH_COLUMNS)}) AS SELECT "
    + ", ".join(["NULL"] * len(_BATCH_COLUMNS)) + " WHERE 0",
    # slot: the newest publication of the batch for its retained slot; and a retried
    # older row must never replace a newer one
    """CREATE TEMP TRIGGER publication_batch_insert INSTEAD OF INSERT ON publication_batch
    BEGIN
      INSERT INTO publications (seq, publication, realm, topic, rule, wall_ms, boot_id,
          boottime_ns, clock_synced, authid, authrole, audience, details, payload, retain)
        SELECT NEW.seq, NEW.publication, NEW.realm, NEW.topic, NEW.rule, NEW.wall_ms,
          NEW.boot_id, NEW.boottime_ns, NEW.clock_synced, NEW.authid, NEW.authrole,
          NEW.audience, NEW.details, NEW.payload, NEW.retain
        WHERE NEW.rule IS NOT NULL;
      INSERT INTO retained (realm, topic, audience_key, seq, publication, wall_ms, authid,
          authrole, audience, details, payload)
        SELECT NEW.realm, NEW.topic, NEW.audience_key, NEW.seq, NEW.publication, NEW.wall_ms,
          NEW.authid, NEW.authrole, NEW.audience, NEW.details, NEW.payload
        WHERE NEW.slot
        ON CONFLICT (realm, topic, audience_key) DO UPDATE SET seq = excluded.seq,
          publication = excluded.publication, wall_ms = excluded.wall_ms,
          authid = excluded.authid, authrole = excluded.authrole,
          audience = excluded.audience, details = excluded.details,
          payload = excluded.payload
        WHERE excluded.seq > retained.seq;
    END""",
]
# Statements are padded with rows of NULLs (filtered out) to a power of two, so a dozen
# prepared statements serve every batch size; bigger batches take several statements.
_MAX_BATCH_ROWS = 1024  # x 17 parameters: within SQLite's limit of 32,766
_RAISE_META = ("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
               "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)")
# Probe each chunk of 1,024 seqs, newest first, on the (seq >> 10, publication) index (the
# expression must stay exactly the index's): ~1,000 index seeks per million rows, ~1 ms.
_SEQ_OF_PUBLICATION = (
    "WITH RECURSIVE chunk(k) AS ("
    " SELECT (SELECT MAX(seq) FROM publications) >> 10"
    " UNION ALL SELECT k - 1 FROM chunk"
    " WHERE k > (SELECT MIN(seq) FROM publications) >> 10)"
    " SELECT p.seq FROM chunk CROSS JOIN publications AS p"
    " WHERE (p.seq >> 10) = chunk.k AND p.publication = ? AND +p.realm = ? LIMIT 1")


class StorageError(Exception):
    """A write could not be made durable (disk full, read-only filesystem, I/O error)."""


class SchemaTooNew(Exception):
    """The database was written by a newer Cairn; refuse rather than corrupt it."""


@dataclass(eq=False)
class StoredPublication:
    """One publication as the store keeps it (history row and/or retained slot)."""

    seq: int
    publication: int
    realm: str
    topic: str
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    wall_ms: int
    boot_id: str
    boottime_ns: int
    clock_synced: bool
    authid: str | None = None
    authrole: str | None = None
    audience: dict[str, list[Any]] | None = None
    details: dict[str, Any] = field(default_factory=dict)
    history_rule: int | None = None   # store in history under this rule
    retain: bool = False              # make it the topic's retained event
    # pieces of its retained EVENT, encoded once (gateway.retention.RetainedEvent; in memory)
    events: dict[bool, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def audience_key(self) -> str:
        return json.dumps(self.audience, sort_keys=True) if self.audience else ""

    def payload(self) -> bytes:
        return msgpack.packb([self.args, self.kwargs], use_bin_type=True)


@dataclass
class Gap:
    realm: str | None
    rule: int | None
    first_seq: int | None
    last_seq: int | None
    count: int
    reason: str


@dataclass(frozen=True)
class PruneRule:
    """The bounds of one history rule of one realm."""

    realm: str
    index: int
    max_events: int
    max_age_ms: int | None


@dataclass
class _Pending:
    publications: list[StoredPublication] = field(default_factory=list)
    subscriptions: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    anchors: list[tuple[Anchor, int]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    waiters: list[asyncio.Future] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.publications or self.has_records())

    def has_records(self) -> bool:
        return bool(self.subscriptions or self.anchors or self.gaps)


def audience_allows(audience: dict[str, list[Any]] | None, authid: str | None,
                    authrole: str | None) -> bool:
    """Would a session with this authid/authrole have received a publication with these
    authid/authrole black/white lists?"""
    if not audience:
        return True
    if authid in audience.get("exclude_authid", ()) or \
            authrole in audience.get("exclude_authrole", ()):
        return False
    if "eligible_authid" in audience and authid not in audience["eligible_authid"]:
        return False
    return not ("eligible_authrole" in audience and authrole not in audience["eligible_authrole"])


def eligible(audience_json: str | None, authid: str | None, authrole: str | None) -> bool:
    """audience_allows over the stored JSON: registered as an SQL function for history."""
    return audience_allows(json.loads(audience_json) if audience_json else None, authid, authrole)


class _WriterThread:
    """The one connection that writes, and the one thread that uses it."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="cairn-store-writer")
        self.db: sqlite3.Connection | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def connect(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    async def close(self) -> None:
        if self.db is not None:
            await self.run(self.db.close)
        self._executor.shutdown(wait=True)


class Store:
    flush_interval = 0.05  # the bound on what a power cut may take without acknowledge
    max_batch = 5000

    def __init__(self, path: Path, writer: _WriterThread,
                 reader: aiosqlite.Connection) -> None:
        self.path = path
        self._writer = writer
        self._reader = reader
        self._pending = _Pending()
        self._wake = asyncio.Event()  # set: commit what is pending now
        self._deadline: asyncio.TimerHandle | None = None  # sets _wake for a pending batch
        self._backoff = 0.0  # > 0 while writes fail: retry slower, unless someone is waiting
        self._task: asyncio.Task | None = None
        self._closing = False
        self.next_seq = 1
        self.commit_latencies: list[float] = []  # seconds, recent commits (for metrics)
        self.failed_writes = 0
        self._transaction = asyncio.Lock()  # one transaction at a time on the writer
        # the writer thread's
        self._details_json: dict[str, str] = {}  # topic -> '{"topic": topic}'
        self._packer = msgpack.Packer()  # as StoredPublication.payload, without a new Packer
        # asyncio.get_running_loop() costs a getpid() system call: once per append is too much
        self._loop = asyncio.get_running_loop()

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path) -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        _refuse_newer_schema(path)  # before anything could touch the file
        writer = _WriterThread()
        try:
            await writer.run(_open_writer, writer, path)
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await writer.close()
            raise
        await reader.execute("PRAGMA query_only = ON")
        await reader.create_function("eligible", 3, eligible, deterministic=True)
        await reader.create_function("wildcard_match", 2, wildcard_matches, deterministic=True)
        store = cls(path, writer, reader)
        store.next_seq = await writer.run(_highest_seq, writer.db) + 1
        store._task = store._loop.create_task(store._write_loop())
        return store

    async def close(self) -> None:
        """Flush everything queued, then close both connections."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(sqlite3.Error):  # every seq handed out, stored or not
            await self._writer.run(_fetch, self._writer.db, _RAISE_META,
                                   ("highest_seq", self.next_seq - 1))
        with contextlib.suppress(sqlite3.Error):
            await self._writer.run(_fetch, self._writer.db, "PRAGMA wal_checkpoint(TRUNCATE)")
        await self._reader.close()
        await self._writer.close()

    # -- writing -------------------------------------------------------------------------

    def assign_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def append(self, pub: StoredPublication) -> asyncio.Future:
        """Queue a publication; the future resolves when it is durable (or fails with
        StorageError)."""
        self._pending.publications.append(pub)
        self._queued()
        return self._waiter()

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None:
        self._pending.subscriptions.append((sub_id, realm, uri, match, created))
        self._wake.set()

    def add_anchor(self, anchor: Anchor) -> None:
        self._pending.anchors.append((anchor, self.next_seq - 1))
        self._queued()

    def add_gap(self, gap: Gap) -> None:
        self._pending.gaps.append(gap)
        self._queued()

    def _queued(self) -> None:
        # The first item of a batch gives it flush_interval to fill up: no timer runs while
        # nothing is queued, so an idle router sleeps.
        if self._deadline is None and not self._backoff:
            self._deadline = self._loop.call_later(self.flush_interval, self._wake.set)

    def _waiter(self) -> asyncio.Future:
        # one future per caller, not one per batch: cancelling one awaiting task must not
        # cancel the others' acknowledgements
        future = self._loop.create_future()
        self._pending.waiters.append(future)
        return future

    def request_flush(self) -> None:
        """Someone is waiting for durability: commit as soon as the writer is free."""
        self._wake.set()

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        if self._pending:
            future = self._waiter()
            self._wake.set()
            await future

    async def _wait_for_work(self) -> None:
        if not self._wake.is_set():
            retry = self._loop.call_later(self._backoff, self._wake.set) if self._backoff else None
            try:
                await self._wake.wait()
            finally:
                if retry is not None:
                    retry.cancel()
        self._wake.clear()

    async def _write_loop(self) -> None:
        while True:
            if not self._pending and self._closing:
                return
            if self._pending:  # left over from a failed batch
                self._queued()
            await self._wait_for_work()
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if not self._pending:
                continue
            batch, self._pending = self._pending, _Pending()
            started = time.perf_counter()
            try:
                await self._commit(batch)
            except sqlite3.Error as e:
                if not self._backoff:
                    log.error("the store cannot write (%s): acknowledged publishes get an "
                              "error, live routing goes on; retrying", e)
                self._backoff = min(max(self._backoff * 2, 0.1), 5.0)
                self._fail(batch, e)
                if self._closing:
                    log.error("closing with unwritten data: %d publications lost",
                              len(self._pending.publications))
                    return
                continue
            except Exception as e:  # a bug (say, a value msgpack cannot pack): lose this
                log.exception("the store could not write a batch")  # batch, not the store
                self._fail(batch, e, retry_retained=False)
                continue
            if self._backoff:
                log.warning("the store writes again")
                self._backoff = 0.0
            self.commit_latencies.append(time.perf_counter() - started)
            del self.commit_latencies[:-1000]
            for w in batch.waiters:
                if not w.done():
                    w.set_result(None)

    def _fail(self, batch: _Pending, e: Exception, retry_retained: bool = True) -> None:
        self.failed_writes += len(batch.publications)
        error = StorageError(f"the store could not write: {e}")
        for w in batch.waiters:
            if not w.done():
                w.set_exception(error)
                w.exception()  # a waiter nobody awaits must not log "never retrieved"
        self._record_loss(batch, str(e), retry_retained)

    def _record_loss(self, batch: _Pending, reason: str, retry_retained: bool) -> None:
        """Publications that failed to store are recorded as a gap (retried with the next
        batch, so the record survives once the disk has room again)."""
        lost = [p for p in batch.publications if p.history_rule is not None]
        if lost:
            self._pending.gaps.append(Gap(lost[0].realm, None, lost[0].seq, lost[-1].seq,
                                          len(lost), f"write failed: {reason}"))
        # The router already serves these retained values: keep trying to store them.
        if retry_retained:
            self._pending.publications.extend(
                dataclasses.replace(p, history_rule=None) for p in batch.publications
                if p.retain)
        self._pending.subscriptions.extend(batch.subscriptions)
        self._pending.anchors.extend(batch.anchors)
        self._pending.gaps.extend(batch.gaps)

    async def _commit(self, batch: _Pending) -> None:
        async with self._transaction:
            await self._commit_locked(batch)

    async def _commit_locked(self, batch: _Pending) -> None:
        await self._writer.run(self._commit_batch, batch)

    # the writer thread: the batch is no longer touched by the event loop

    def _commit_batch(self, batch: _Pending) -> None:
        db = self._writer.db
        rows = self._batch_rows(batch.publications)
        if len(rows) <= _MAX_BATCH_ROWS and not batch.has_records():
            _insert_batch(db, rows)  # autocommit: the usual case, one statement
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for start in range(0, len(rows), _MAX_BATCH_ROWS):
                _insert_batch(db, rows[start:start + _MAX_BATCH_ROWS])
            self._write_records(db, batch)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                db.execute("ROLLBACK")
            raise

    def _batch_rows(self, pubs: list[StoredPublication]) -> list[tuple[Any, ...]]:
        """A row per history publication, and per retained slot the newest publication of
        the batch (a topic published 100 times in one batch is upserted once)."""
        newest: dict[tuple[str, str, str], StoredPublication] = {}
        for p in pubs:
            if p.retain:
                key = (p.realm, p.topic, p.audience_key)
                other = newest.get(key)
                if other is None or p.seq > other.seq:
                    newest[key] = p
        slots = {id(p): key[2] for key, p in newest.items()}
        pack = self._packer.pack
        rows = []
        for p in pubs:
            audience_key = slots.get(id(p))
            if p.history_rule is None and audience_key is None:
                continue  # retained only, and a newer one of its slot is in the batch
            rows.append((
                p.seq, p.publication, p.realm, p.topic, p.history_rule, p.wall_ms, p.boot_id,
                p.boottime_ns, int(p.clock_synced), p.authid, p.authrole,
                json.dumps(p.audience) if p.audience else None, self._details(p),
                pack([p.args, p.kwargs]), int(p.retain), audience_key,
                int(audience_key is not None)))
        return rows

    def _details(self, p: StoredPublication) -> str:
        """The details as JSON; the usual ``{"topic": topic}`` from a cache."""
        details = p.details
        if len(details) != 1 or details.get("topic") != p.topic:
            return json.dumps(details)
        text = self._details_json.get(p.topic)
        if text is None:
            if len(self._details_json) >= 10_000:
                self._details_json.clear()
            text = self._details_json[p.topic] = json.dumps(details)
        return text

    @staticmethod
    def _write_records(db: sqlite3.Connection, batch: _Pending) -> None:
        if batch.subscriptions:
            db.executemany(
                "INSERT OR IGNORE INTO subscriptions (id, realm, uri, match, created)"
                " VALUES (?,?,?,?,?)", batch.subscriptions)
        if batch.anchors:
            db.executemany(
                "INSERT INTO anchors (reason, boot_id, boottime_ns, wall_ns, offset_before_ns,"
                " clock_synced, after_seq) VALUES (?,?,?,?,?,?,?)",
                [(a.reason, a.boot_id, a.boottime_ns, a.wall_ns, a.offset_before_ns,
                  int(a.synced), after) for a, after in batch.anchors])
        if batch.gaps:
            _insert_gaps(db, batch.gaps)

    # -- bounds --------------------------------------------------------------------------

    async def set_synced_seq(self, seq: int) -> None:
        """Everything up to ``seq`` has reached the central sink (the uploader says so)."""
        async with self._transaction:
            await self._writer.run(_fetch, self._writer.db, _RAISE_META, ("synced_seq", seq))

    async def synced_seq(self) -> int:
        rows = await self.query("SELECT value FROM meta WHERE key = 'synced_seq'", ())
        return int(rows[0][0]) if rows else 0

    async def prune(self, rules: list[PruneRule], max_bytes: int, now_ms: int,
                    clock_synced: bool) -> list[Gap]:
        """Drop what is over the bounds, synced events first, and record each drop as a gap.

        ``max_age`` is applied only while the clock is synchronized and only to events
        recorded with a synchronized clock: a Pi that boots in 1970 must not mistake
        everything it stored for ancient history.
        """
        synced = await self.synced_seq()
        async with self._transaction:
            gaps = await self._writer.run(_prune, self._writer.db, rules, max_bytes, now_ms,
                                          clock_synced, synced)
        for g in gaps:
            log.warning("dropped %d events (seq %s..%s, %s) to stay within %s", g.count,
                        g.first_seq, g.last_seq, g.realm or "all realms", g.reason)
        return gaps

    async def gaps(self) -> list[tuple[Any, ...]]:
        return await self.query(
            "SELECT realm, rule, first_seq, last_seq, count, reason, wall_ms FROM gaps "
            "ORDER BY id", ())

    # -- reading -------------------------------------------------------------------------

    async def load_subscriptions(self) -> list[tuple[int, str, str, str, str]]:
        async with self._reader.execute(
                "SELECT id, realm, uri, match, created FROM subscriptions") as cur:
            return [tuple(row) for row in await cur.fetchall()]

    async def load_retained(self) -> list[StoredPublication]:
        async with self._reader.execute(
                "SELECT seq, publication, realm, topic, wall_ms, authid, authrole, audience,"
                " details, payload FROM retained ORDER BY seq") as cur:
            rows = await cur.fetchall()
        result = []
        for seq, publication, realm, topic, wall_ms, authid, authrole, audience, details, \
                payload in rows:
            args, kwargs = msgpack.unpackb(payload, raw=False)
            result.append(StoredPublication(
                seq, publication, realm, topic, args, kwargs, wall_ms, "", 0, False,
                authid, authrole, json.loads(audience) if audience else None,
                json.loads(details) if details else {}, retain=True))
        return result

    async def query(self, sql: str, params: Iterable[Any]) -> list[tuple[Any, ...]]:
        async with self._reader.execute(sql, tuple(params)) as cur:
            return [tuple(row) for row in await cur.fetchall()]

    async def seq_of_publication(self, realm: str, publication: int) -> int | None:
        rows = await self.query(_SEQ_OF_PUBLICATION, (publication, realm))
        return rows[0][0] if rows else None

    async def summary(self, realm: str) -> dict[str, Any]:
        """Size and span of the stored history, for status displays."""
        (count, first, last, oldest, newest), = await self.query(
            "SELECT COUNT(*), MIN(seq), MAX(seq), MIN(wall_ms), MAX(wall_ms) FROM publications"
            " WHERE realm = ?", (realm,))
        (gaps, dropped), = await self.query(
            "SELECT COUNT(*), COALESCE(SUM(count), 0) FROM gaps WHERE realm = ? OR realm IS NULL",
            (realm,))
        (anchors,), = await self.query(
            "SELECT COUNT(*) FROM anchors WHERE reason = 'step'", ())
        return {"bytes": await self.size_bytes(), "events": count, "first_seq": first,
                "last_seq": last, "synced_seq": await self.synced_seq(),
                "oldest": rfc3339(oldest) if oldest is not None else None,
                "newest": rfc3339(newest) if newest is not None else None,
                "gaps": gaps, "dropped_events": dropped, "clock_steps": anchors}

    async def size_bytes(self) -> int:
        rows = await self.query("SELECT page_count * page_size FROM pragma_page_count(), "
                                "pragma_page_size()", ())
        return int(rows[0][0]) if rows else 0


# -- the writer thread's side: plain sqlite3 on the writing connection ------------------------


def _open_writer(writer: _WriterThread, path: Path) -> None:
    writer.connect(path)
    _configure(writer.db)
    _migrate(writer.db, path)
    for statement in _BATCH_SCHEMA:  # TEMP: this connection's, not the file's
        writer.db.execute(statement)


@functools.cache
def _batch_sql(rows: int) -> str:
    row = "(" + ",".join("?" * len(_BATCH_COLUMNS)) + ")"
    return (f"INSERT INTO publication_batch SELECT * FROM (VALUES {','.join([row] * rows)})"
            " WHERE column1 IS NOT NULL")


_NULL_ROW = (None,) * len(_BATCH_COLUMNS)


def _insert_batch(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """INSERT up to _MAX_BATCH_ROWS ``rows`` into publication_batch in one statement."""
    if not rows:
        return
    size = 1 << (len(rows) - 1).bit_length()  # the next power of two
    values = [value for row in rows for value in row]
    values += _NULL_ROW * (size - len(rows))
    db.execute(_batch_sql(size), values)


def _fetch(db: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
    return db.execute(sql, tuple(params)).fetchall()


def _highest_seq(db: sqlite3.Connection) -> int:
    values = []
    for sql in ("SELECT value FROM meta WHERE key = 'highest_seq'",
                "SELECT MAX(seq) FROM publications", "SELECT MAX(seq) FROM retained",
                "SELECT MAX(last_seq) FROM gaps"):
        row = db.execute(sql).fetchone()
        if row and row[0] is not None:
            values.append(int(row[0]))
    return max(values, default=0)


def _insert_gaps(db: sqlite3.Connection, gaps: list[Gap]) -> None:
    now = int(time.time() * 1000)
    db.executemany(
        "INSERT INTO gaps (realm, rule, first_seq, last_seq, count, reason, wall_ms)"
        " VALUES (?,?,?,?,?,?,?)",
        [(g.realm, g.rule, g.first_seq, g.last_seq, g.count, g.reason, now) for g in gaps])


def _prune(db: sqlite3.Connection, rules: list[PruneRule], max_bytes: int, now_ms: int,
           clock_synced: bool, synced: int) -> list[Gap]:
    gaps: list[Gap] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(_RAISE_META, ("highest_seq", _highest_seq(db)))  # before deleting any
        for rule in rules:
            where, params = "realm = ? AND rule = ?", [rule.realm, rule.index]
            (count,), = _fetch(db, f"SELECT COUNT(*) FROM publications WHERE {where}", params)
            if count > rule.max_events:
                gaps += _drop(db, where, params, count - rule.max_events, synced, rule,
                              "max_events")
            if rule.max_age_ms is not None and clock_synced:
                age_where = f"{where} AND clock_synced = 1 AND wall_ms < ?"
                age_params = [*params, now_ms - rule.max_age_ms]
                (old,), = _fetch(db, f"SELECT COUNT(*) FROM publications WHERE {age_where}",
                                 age_params)
                if old:
                    gaps += _drop(db, age_where, age_params, old, synced, rule, "max_age")
        while _used_bytes(db) > max_bytes:
            dropped = _drop(db, "1", [], 1000, synced, None, "max_store_bytes")
            if not dropped:
                break
            gaps += dropped
        _insert_gaps(db, gaps)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    if gaps:
        _fetch(db, "PRAGMA incremental_vacuum")
    return gaps


def _drop(db: sqlite3.Connection, where: str, params: list[Any], count: int, synced: int,
          rule: PruneRule | None, reason: str) -> list[Gap]:
    """Delete the ``count`` oldest rows matching ``where``: synced ones first."""
    victims = _fetch(db, f"SELECT seq, realm FROM publications WHERE {where} "
                         f"ORDER BY seq > ?, seq LIMIT ?", [*params, synced, count])
    if not victims:
        return []
    db.executemany("DELETE FROM publications WHERE seq = ?", [(seq,) for seq, _ in victims])
    seqs = [seq for seq, _ in victims]
    return [Gap(rule.realm if rule else None, rule.index if rule else None,
                min(seqs), max(seqs), len(seqs), reason)]


def _used_bytes(db: sqlite3.Connection) -> int:
    (pages, free, size), = _fetch(
        db, "SELECT * FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()")
    return (pages - free) * size


def _configure(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect on a new database
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA wal_autocheckpoint = 4000")  # pages: fewer, larger checkpoints


def _refuse_newer_schema(path: Path) -> None:
    """Read the schema version without writing: even setting pragmas would change the file
    of a newer release."""
    if not path.exists():
        return
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{path} has schema version {version}, but this Cairn knows only up to "
            f"{SCHEMA_VERSION}: it was written by a newer release. Upgrade Cairn, or restore "
            f"a backup made by this release; refusing to start rather than corrupt it.")


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    for target in range(version + 1, SCHEMA_VERSION + 1):
        log.info("migrating %s to schema version %d", path, target)
        db.execute("BEGIN IMMEDIATE")
        try:
            # executescript() would COMMIT first; run statement by statement inside ours
            for statement in MIGRATIONS[target - 1].split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {target}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


class HistoryReader:
    """Blocking, read-mostly access for the uploader process (``cairn sync``), which runs
    beside the router: WAL lets it read while the router writes. Its only write is the
    synced watermark, a one-row upsert that waits its turn (``busy_timeout``)."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no store at {path} (has the router run with this "
                                    f"data_dir?)")
        self.path = path
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA busy_timeout = 30000")

    def close(self) -> None:
        self.db.close()

    def highest_seq(self) -> int:
        row = self.db.execute("SELECT MAX(seq) FROM publications").fetchone()
        return row[0] or 0

    def synced_seq(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'synced_seq'").fetchone()
        return int(row[0]) if row else 0

    def set_synced_seq(self, seq: int) -> None:
        self.db.execute(
            "INSERT INTO meta (key, value) VALUES ('synced_seq', ?) ON CONFLICT(key) "
            "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)", (seq,))

    def backlog(self, after_seq: int) -> int:
        return self.db.execute("SELECT COUNT(*) FROM publications WHERE seq > ?",
                               (after_seq,)).fetchone()[0]

    def publications_after(self, seq: int, limit: int) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT seq, publication, realm, topic, wall_ms, boot_id, boottime_ns, "
            "clock_synced, authid, authrole, audience, details, payload FROM publications "
            "WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)).fetchall()
        result = []
        for (seq_, publication, realm, topic, wall_ms, boot_id, boottime_ns, synced, authid,
             authrole, audience, details, payload) in rows:
            args, kwargs = msgpack.unpackb(payload, raw=False)
            result.append({
                "seq": seq_, "publication": publication, "realm": realm, "topic": topic,
                "wall_ms": wall_ms, "boot_id": boot_id, "boottime_ns": boottime_ns,
                "clock_synced": bool(synced), "authid": authid, "authrole": authrole,
                "audience": json.loads(audience) if audience else None,
                "details": json.loads(details) if details else {},
                "args": args, "kwargs": kwargs})
        return result

    def anchors(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT id, reason, boot_id, boottime_ns, wall_ns, offset_before_ns, clock_synced,"
            " after_seq FROM anchors ORDER BY id").fetchall()
        keys = ("id", "reason", "boot_id", "boottime_ns", "wall_ns", "offset_before_ns",
                "clock_synced", "after_seq")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def gaps(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT id, realm, rule, first_seq, last_seq, count, reason, wall_ms FROM gaps "
            "ORDER BY id").fetchall()
        keys = ("id", "realm", "rule", "first_seq", "last_seq", "count", "reason", "wall_ms")
        return [dict(zip(keys, row, strict=True)) for row in rows]
