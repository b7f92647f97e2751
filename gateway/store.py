"""The store: publications (history), retained events, stable subscription ids, clock
anchors and gap records, in one SQLite file in WAL mode behind aiosqlite.

Writes are grouped: :meth:`Store.append` queues a row and returns a future that resolves
once the transaction holding it is committed with ``synchronous=FULL`` (fsync). The writer
commits as soon as someone waits for durability (an acknowledged publish) and otherwise at
most every :attr:`Store.flush_interval` seconds, so whatever arrives while one commit runs
goes into the next: group commit. Reads use a second connection and never block writes.

Ordering is always by ``seq``, a strictly increasing number assigned on receipt. The highest
seq ever handed to the database is kept in ``meta``, so pruning the newest rows can never
lead to a seq being reused after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import msgpack

from gateway.clock import Anchor, rfc3339
from gateway.patterns import wildcard_matches

log = logging.getLogger("cairn.store")

SCHEMA_VERSION = 1
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
]


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
        return bool(self.publications or self.subscriptions or self.anchors or self.gaps)


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


class Store:
    flush_interval = 0.05  # the bound on what a power cut may take without acknowledge
    max_batch = 5000

    def __init__(self, path: Path, writer: aiosqlite.Connection,
                 reader: aiosqlite.Connection) -> None:
        self.path = path
        self._writer = writer
        self._reader = reader
        self._pending = _Pending()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self.next_seq = 1
        self.commit_latencies: list[float] = []  # seconds, recent commits (for metrics)
        self.failed_writes = 0
        self._transaction = asyncio.Lock()  # one transaction at a time on the writer

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path) -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        _refuse_newer_schema(path)  # before anything could touch the file
        writer = await aiosqlite.connect(path, isolation_level=None)
        try:
            await _configure(writer)
            await _migrate(writer, path)
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await writer.close()
            raise
        await reader.execute("PRAGMA query_only = ON")
        await reader.create_function("eligible", 3, eligible, deterministic=True)
        await reader.create_function("wildcard_match", 2, wildcard_matches, deterministic=True)
        store = cls(path, writer, reader)
        store.next_seq = await store._highest_seq() + 1
        store._task = asyncio.get_running_loop().create_task(store._write_loop())
        return store

    async def _highest_seq(self) -> int:
        values = []
        for sql in ("SELECT value FROM meta WHERE key = 'highest_seq'",
                    "SELECT MAX(seq) FROM publications", "SELECT MAX(seq) FROM retained"):
            async with self._writer.execute(sql) as cur:
                row = await cur.fetchone()
                if row and row[0] is not None:
                    values.append(int(row[0]))
        return max(values, default=0)

    async def close(self) -> None:
        """Flush everything queued, then close both connections."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(sqlite3.Error):
            await self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
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
        return self._waiter()

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None:
        self._pending.subscriptions.append((sub_id, realm, uri, match, created))
        self._wake.set()

    def add_anchor(self, anchor: Anchor) -> None:
        self._pending.anchors.append((anchor, self.next_seq - 1))

    def add_gap(self, gap: Gap) -> None:
        self._pending.gaps.append(gap)

    def _waiter(self) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
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

    async def _write_loop(self) -> None:
        backoff = 0.0  # > 0 while writes fail: retry slower, unless someone is waiting
        while True:
            if not self._pending and self._closing:
                return
            if not self._wake.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), backoff or self.flush_interval)
            self._wake.clear()
            if not self._pending:
                continue
            batch, self._pending = self._pending, _Pending()
            started = time.perf_counter()
            try:
                await self._commit(batch)
            except sqlite3.Error as e:
                if not backoff:
                    log.error("the store cannot write (%s): acknowledged publishes get an "
                              "error, live routing goes on; retrying", e)
                backoff = min(max(backoff * 2, 0.1), 5.0)
                self._fail(batch, e)
                if self._closing:
                    log.error("closing with unwritten data: %d publications lost",
                              len(self._pending.publications))
                    return
                continue
            if backoff:
                log.warning("the store writes again")
                backoff = 0.0
            self.commit_latencies.append(time.perf_counter() - started)
            del self.commit_latencies[:-1000]
            for w in batch.waiters:
                if not w.done():
                    w.set_result(None)

    def _fail(self, batch: _Pending, e: sqlite3.Error) -> None:
        self.failed_writes += len(batch.publications)
        error = StorageError(f"the store could not write: {e}")
        for w in batch.waiters:
            if not w.done():
                w.set_exception(error)
                w.exception()  # a waiter nobody awaits must not log "never retrieved"
        self._record_loss(batch, str(e))

    def _record_loss(self, batch: _Pending, reason: str) -> None:
        """Publications that failed to store are recorded as a gap (retried with the next
        batch, so the record survives once the disk has room again)."""
        lost = [p for p in batch.publications if p.history_rule is not None]
        if lost:
            self._pending.gaps.append(Gap(lost[0].realm, None, lost[0].seq, lost[-1].seq,
                                          len(lost), f"write failed: {reason}"))
        # The router already serves these retained values: keep trying to store them.
        self._pending.publications.extend(
            dataclasses.replace(p, history_rule=None) for p in batch.publications if p.retain)
        self._pending.subscriptions.extend(batch.subscriptions)
        self._pending.anchors.extend(batch.anchors)
        self._pending.gaps.extend(batch.gaps)

    async def _commit(self, batch: _Pending) -> None:
        async with self._transaction:
            try:
                await self._commit_locked(batch)
            except sqlite3.Error:
                with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                    await self._writer.execute("ROLLBACK")
                raise

    async def _commit_locked(self, batch: _Pending) -> None:
        db = self._writer
        await db.execute("BEGIN IMMEDIATE")
        history = [p for p in batch.publications if p.history_rule is not None]
        if history:
            await db.executemany(
                "INSERT INTO publications (seq, publication, realm, topic, rule, wall_ms, "
                "boot_id, boottime_ns, clock_synced, authid, authrole, audience, details, "
                "payload, retain) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [(p.seq, p.publication, p.realm, p.topic, p.history_rule, p.wall_ms, p.boot_id,
                  p.boottime_ns, int(p.clock_synced), p.authid, p.authrole,
                  json.dumps(p.audience) if p.audience else None, json.dumps(p.details),
                  p.payload(), int(p.retain)) for p in history])
        retained = [p for p in batch.publications if p.retain]
        if retained:
            # a retried older row must never replace a newer one
            await db.executemany(
                "INSERT INTO retained (realm, topic, audience_key, seq, publication,"
                " wall_ms, authid, authrole, audience, details, payload)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (realm, topic, audience_key) DO UPDATE SET seq = excluded.seq,"
                " publication = excluded.publication, wall_ms = excluded.wall_ms,"
                " authid = excluded.authid, authrole = excluded.authrole,"
                " audience = excluded.audience, details = excluded.details,"
                " payload = excluded.payload WHERE excluded.seq > retained.seq",
                [(p.realm, p.topic, p.audience_key, p.seq, p.publication, p.wall_ms, p.authid,
                  p.authrole, json.dumps(p.audience) if p.audience else None,
                  json.dumps(p.details), p.payload()) for p in retained])
        if batch.subscriptions:
            await db.executemany(
                "INSERT OR IGNORE INTO subscriptions (id, realm, uri, match, created)"
                " VALUES (?,?,?,?,?)", batch.subscriptions)
        if batch.anchors:
            await db.executemany(
                "INSERT INTO anchors (reason, boot_id, boottime_ns, wall_ns, offset_before_ns,"
                " clock_synced, after_seq) VALUES (?,?,?,?,?,?,?)",
                [(a.reason, a.boot_id, a.boottime_ns, a.wall_ns, a.offset_before_ns,
                  int(a.synced), after) for a, after in batch.anchors])
        if batch.gaps:
            now = int(time.time() * 1000)
            await db.executemany(
                "INSERT INTO gaps (realm, rule, first_seq, last_seq, count, reason, wall_ms)"
                " VALUES (?,?,?,?,?,?,?)",
                [(g.realm, g.rule, g.first_seq, g.last_seq, g.count, g.reason, now)
                 for g in batch.gaps])
        if batch.publications:
            highest = max(p.seq for p in batch.publications)
            await db.execute(
                "INSERT INTO meta (key, value) VALUES ('highest_seq', ?) ON CONFLICT(key) "
                "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)", (highest,))
        await db.execute("COMMIT")

    # -- bounds --------------------------------------------------------------------------

    async def set_synced_seq(self, seq: int) -> None:
        """Everything up to ``seq`` has reached the central sink (the uploader says so)."""
        async with self._transaction:
            await self._writer.execute(
                "INSERT INTO meta (key, value) VALUES ('synced_seq', ?) ON CONFLICT(key) "
                "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)", (seq,))

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
        gaps: list[Gap] = []
        synced = await self.synced_seq()
        async with self._transaction:
            db = self._writer
            await db.execute("BEGIN IMMEDIATE")
            try:
                for rule in rules:
                    where, params = "realm = ? AND rule = ?", [rule.realm, rule.index]
                    (count,), = await self._fetch(
                        f"SELECT COUNT(*) FROM publications WHERE {where}", params)
                    if count > rule.max_events:
                        gaps += await self._drop(where, params, count - rule.max_events,
                                                 synced, rule, "max_events")
                    if rule.max_age_ms is not None and clock_synced:
                        age_where = f"{where} AND clock_synced = 1 AND wall_ms < ?"
                        age_params = [*params, now_ms - rule.max_age_ms]
                        (old,), = await self._fetch(
                            f"SELECT COUNT(*) FROM publications WHERE {age_where}", age_params)
                        if old:
                            gaps += await self._drop(age_where, age_params, old, synced, rule,
                                                     "max_age")
                while await self._used_bytes() > max_bytes:
                    dropped = await self._drop("1", [], 1000, synced, None, "max_store_bytes")
                    if not dropped:
                        break
                    gaps += dropped
                now = int(time.time() * 1000)
                await db.executemany(
                    "INSERT INTO gaps (realm, rule, first_seq, last_seq, count, reason, wall_ms)"
                    " VALUES (?,?,?,?,?,?,?)",
                    [(g.realm, g.rule, g.first_seq, g.last_seq, g.count, g.reason, now)
                     for g in gaps])
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise
        if gaps:
            await self._writer.execute("PRAGMA incremental_vacuum")
            for g in gaps:
                log.warning("dropped %d events (seq %s..%s, %s) to stay within %s", g.count,
                            g.first_seq, g.last_seq, g.realm or "all realms", g.reason)
        return gaps

    async def _drop(self, where: str, params: list[Any], count: int, synced: int,
                    rule: PruneRule | None, reason: str) -> list[Gap]:
        """Delete the ``count`` oldest rows matching ``where``: synced ones first."""
        victims = await self._fetch(
            f"SELECT seq, realm FROM publications WHERE {where} "
            f"ORDER BY seq > ?, seq LIMIT ?", [*params, synced, count])
        if not victims:
            return []
        await self._writer.executemany("DELETE FROM publications WHERE seq = ?",
                                       [(seq,) for seq, _ in victims])
        seqs = [seq for seq, _ in victims]
        return [Gap(rule.realm if rule else None, rule.index if rule else None,
                    min(seqs), max(seqs), len(seqs), reason)]

    async def _fetch(self, sql: str, params: Iterable[Any]) -> list[tuple[Any, ...]]:
        async with self._writer.execute(sql, tuple(params)) as cur:
            return [tuple(row) for row in await cur.fetchall()]

    async def _used_bytes(self) -> int:
        (pages, free, size), = await self._fetch(
            "SELECT * FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()", ())
        return (pages - free) * size

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
        rows = await self.query(
            "SELECT seq FROM publications WHERE publication = ? AND +realm = ?",
            (publication, realm))
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


async def _configure(db: aiosqlite.Connection) -> None:
    await db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect on a new database
    await db.execute("PRAGMA journal_mode = WAL")
    await db.execute("PRAGMA synchronous = FULL")
    await db.execute("PRAGMA foreign_keys = ON")
    await db.execute("PRAGMA wal_autocheckpoint = 4000")  # pages: fewer, larger checkpoints


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


async def _migrate(db: aiosqlite.Connection, path: Path) -> None:
    async with db.execute("PRAGMA user_version") as cur:
        version = (await cur.fetchone())[0]
    for target in range(version + 1, SCHEMA_VERSION + 1):
        log.info("migrating %s to schema version %d", path, target)
        await db.execute("BEGIN IMMEDIATE")
        try:
            await _execute_statements(db, MIGRATIONS[target - 1])
            await db.execute(f"PRAGMA user_version = {target}")
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise


async def _execute_statements(db: aiosqlite.Connection, script: str) -> None:
    # executescript() would COMMIT first; run statement by statement inside our transaction
    for statement in script.split(";"):
        if statement.strip():
            await db.execute(statement)


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
