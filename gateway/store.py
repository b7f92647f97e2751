"""The store: publications (history), retained events, stable subscription ids, clock
anchors and gap records, in one SQLite file in WAL mode.

Writes are grouped: :meth:`Store.append` queues a row with the time it may wait for its
commit and returns a future that resolves once the transaction holding it is committed with
``synchronous=FULL`` (fsync). The writer commits the whole pending batch at the earliest
deadline of its items: at once for an acknowledged publish on a rule without a commit
window, after the rule's ``commit_window`` on one with, :attr:`Store.flush_interval` for
the rest; whatever arrives while one commit runs goes into the next: group commit. Fewer
commits are the biggest lever on the card's wear (each one writes the pages it dirtied, the
WAL frame headers and a file-system flush). With nothing queued, no timer runs. One thread
owns the writing connection and each commit is
a single call into it (rows built, inserted and committed there), so a commit costs the
event loop one thread round trip however many rows it holds. Reads use a second connection
(aiosqlite) and never block writes.

Ordering is always by ``seq``, a strictly increasing number assigned on receipt. At start-up
the next seq follows the highest of the stored rows, the gap records and ``highest_seq`` in
``meta``, which is raised by every transaction that deletes rows (pruning) and at close, so
pruning the newest rows can never lead to a seq being reused after a restart. (Raising it in
every commit would cost one more page written per commit.)

Write amplification (SD-card wear) comes from pages: every page a commit dirties is written
once to the WAL and once more at the next checkpoint, and an index page that splits rewrites
its neighbours. So a commit touches as few pages as possible: the rows go in as multi-row
INSERTs at the end of the table, and the one secondary index, ``publications_scan``, is in
seq order too, so both only grow at their ends (schema version 3). What other indexes used
to give is had another way: a stored publication's id is computed from its seq
(:mod:`gateway.publication_ids`), and the rows per history rule and the retained slots of
stored publications are kept in memory and written back now and then (:class:`_State`).
Before, a batch of ten readings of ten sensors dirtied 25 pages, now about 5.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import msgpack

from cairn.gateway.clock import Anchor, rfc3339
from cairn.gateway.patterns import matches
from cairn.gateway.publication import (
    HistoryRead,
    ReadAbandoned,
    ReadTimeout,
    Restored,
    Slot,
    StorageError,
    StoredPublication,
    UnknownPublication,
    audience_allows,
)
from cairn.gateway.publication_ids import PublicationIds, new_key

log = logging.getLogger("cairn.store")

SCHEMA_VERSION = 3
# What queries and pruning walk: per history row, in seq order, its topic (an id from
# ``topics``), rule and timestamp. A table, not an index: SQLite appends to a table's last
# page and starts a new one when it is full, but an index page that fills is split with its
# neighbours, so an index in seq order cost a commit of ten readings 2.7 pages, this table
# 1.2 (and a topic index one page per topic). ``topics`` holds each (realm, topic) once.
_HISTORY_SCAN = """
    CREATE TABLE topics (id INTEGER PRIMARY KEY, realm TEXT NOT NULL, topic TEXT NOT NULL,
                         UNIQUE (realm, topic));
    CREATE TABLE history_scan (seq INTEGER PRIMARY KEY, topic INTEGER NOT NULL,
                               rule INTEGER NOT NULL, wall_ms INTEGER NOT NULL,
                               clock_synced INTEGER NOT NULL);
"""


def _version_3(db: sqlite3.Connection) -> None:
    """Fewer pages per commit: history_scan instead of four indexes. The topic index put
    each topic's newest entries on a page of their own (a commit of ten sensors' readings
    dirtied ten of its pages, and splits rewrote their neighbours); the publication, time
    and rule indexes a few more."""
    for statement in _HISTORY_SCAN.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT INTO topics (realm, topic) SELECT DISTINCT realm, topic FROM publications")
    db.execute("INSERT INTO history_scan SELECT p.seq, t.id, p.rule, p.wall_ms, p.clock_synced"
               " FROM publications AS p JOIN topics AS t USING (realm, topic)")
    for name in ("publications_topic", "publications_time", "publications_rule",
                 "publications_chunk_publication"):
        db.execute(f"DROP INDEX {name}")
    (top,) = db.execute("SELECT MAX(seq) FROM publications").fetchone()
    if top is not None:  # rows from before keep their random ids, found through this index,
        db.execute(  # which no new row enters
            "CREATE INDEX publications_legacy_publication ON publications"
            f" ((seq >> 10), publication) WHERE seq <= {int(top)}")
    _put_meta(db, "legacy_publication_seq", int(top or 0))
    counts = Counter({(realm, rule): n for realm, rule, n in db.execute(
        "SELECT realm, rule, COUNT(*) FROM publications GROUP BY realm, rule")})
    _put_meta(db, "state", _State.encode(_highest_seq(db), counts))  # retained: all there


MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
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
    _version_3,
]

# A batch of publications goes in as ONE statement: a multi-row INSERT into a TEMP view
# whose trigger (run by SQLite, per row, without the GIL) writes the history row and the
# retained slot. Without BEGIN it is its own transaction, so the commit and its fsync
# happen in the same sqlite3_step. Each statement the writer thread runs gives up the GIL
# and must win it back from the busy event loop (waking up at every release the loop
# makes): executemany costs that once per row, this once per commit.
_BATCH_COLUMNS = ("seq", "publication", "realm", "topic", "rule", "wall_ms", "boot_id",
                  "boottime_ns", "clock_synced", "authid", "authrole", "audience", "details",
                  "payload", "retain", "audience_key", "slot", "topic_id", "new_topic")
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
      INSERT INTO history_scan (seq, topic, rule, wall_ms, clock_synced)
        SELECT NEW.seq, NEW.topic_id, NEW.rule, NEW.wall_ms, NEW.clock_synced
        WHERE NEW.rule IS NOT NULL;
      INSERT INTO topics (id, realm, topic) SELECT NEW.topic_id, NEW.realm, NEW.topic
        WHERE NEW.new_topic;
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
_MAX_BATCH_ROWS = 1024  # x 19 parameters: within SQLite's limit of 32,766
_RAISE_META = ("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
               "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)")
_PUT_META = ("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
             "DO UPDATE SET value = excluded.value")
# Rows from before schema version 3 (random publication ids, seq up to {legacy}): probe each
# chunk of 1,024 seqs, newest first, on the partial (seq >> 10, publication) index (the
# expression and the bound must stay exactly the index's): ~1,000 seeks per million rows.
_LEGACY_SEQ_OF_PUBLICATION = (
    "WITH RECURSIVE chunk(k) AS ("
    " SELECT MIN({legacy}, (SELECT MAX(seq) FROM publications)) >> 10"
    " UNION ALL SELECT k - 1 FROM chunk"
    " WHERE k > (SELECT MIN(seq) FROM publications) >> 10)"
    " SELECT p.seq FROM chunk CROSS JOIN publications AS p"
    " WHERE (p.seq >> 10) = chunk.k AND p.publication = ? AND +p.realm = ?"
    " AND p.seq <= {legacy} LIMIT 1")
_STORED_ROW = ("seq, publication, realm, topic, wall_ms, boot_id, boottime_ns, clock_synced,"
               " authid, authrole, audience, details, payload")


_QUEUE_FULL = "the store's queue was full"


def _never() -> bool:
    return False


class SchemaTooNew(Exception):
    """The database was written by a newer Cairn; refuse rather than corrupt it."""


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
    forgotten: list[tuple[Any, ...]] = field(default_factory=list)  # (sql, params)
    anchors: list[tuple[Anchor, int]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    waiters: list[asyncio.Future] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.publications or self.has_records())

    def has_records(self) -> bool:
        return bool(self.subscriptions or self.forgotten or self.anchors or self.gaps)


class Topics:
    """Every (realm, topic) stored in history, with the small id history_scan names it by.
    Held in memory (a deployment has hundreds or thousands of topics, not millions): a
    subscription's pattern is matched against these names once per query instead of
    against every row. Only the writer thread adds, after a commit, by replacing the dict,
    so the event loop never reads one half-changed."""

    def __init__(self, rows: Iterable[tuple[int, str, str]] = ()) -> None:
        self._ids: dict[tuple[str, str], int] = {(realm, topic): i for i, realm, topic in rows}
        self.next_id = max(self._ids.values(), default=0) + 1

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, realm: str, topic: str) -> int | None:
        return self._ids.get((realm, topic))

    def add(self, new: dict[tuple[str, str], int]) -> None:
        if new:
            self._ids = {**self._ids, **new}
            self.next_id = max(new.values()) + 1

    def matching(self, realm: str, uri: str, match: str,
                 visible: Callable[[str], bool] | None = None) -> list[int]:
        """The ids of the realm's topics a subscription (uri, match) matches (and, given
        ``visible``, that it says yes to)."""
        if match == "exact":
            found = self._ids.get((realm, uri))
            return [] if found is None else [found]
        return [i for (r, topic), i in self._ids.items()
                if r == realm and matches(uri, match, topic) and (visible is None or
                                                                   visible(topic))]

    def of_realm(self, realm: str) -> list[int]:
        return [i for (r, _), i in self._ids.items() if r == realm]


@dataclass
class _State:
    """What the store knows of its history without reading it: the rows per (realm, rule),
    for pruning and status, and the retained slots of stored publications newer than the
    retained table. Writing these with every commit would cost the card a page or more per
    commit; instead the writer writes them back with a commit now and then
    (:attr:`Store.write_back_interval`, :attr:`Store.write_back_rows`) and at close, with
    the seq they are complete up to. At start-up the rows after that seq are read again.
    The writer thread owns it; ``counts`` is replaced, never changed, so the event loop may
    read it."""

    seq: int = 0      # the counts and the retained table cover every row up to here
    top: int = 0      # the highest seq committed
    counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    retained: dict[Slot, StoredPublication] = field(default_factory=dict)
    rows: int = 0     # rows committed since the last write-back
    written: float = field(default_factory=time.monotonic)

    @staticmethod
    def encode(seq: int, counts: Counter[tuple[str, int]]) -> str:
        return json.dumps({"seq": seq, "counts": [[r, i, n] for (r, i), n in counts.items()]})

    @classmethod
    def load(cls, db: sqlite3.Connection) -> _State:
        row = db.execute("SELECT value FROM meta WHERE key = 'state'").fetchone()
        state = cls()
        if row:
            data = json.loads(row[0])
            state.seq = data["seq"]
            state.counts = Counter({(r, i): n for r, i, n in data["counts"]})
        for realm, rule, n in db.execute(
                "SELECT t.realm, s.rule, COUNT(*) FROM history_scan AS s JOIN topics AS t"
                " ON t.id = s.topic WHERE s.seq > ? GROUP BY t.realm, s.rule", (state.seq,)):
            state.counts[(realm, rule)] += n
        for row in db.execute(  # the newest of each slot (audience: its JSON, same key)
                f"SELECT {_STORED_ROW} FROM publications WHERE seq IN (SELECT MAX(seq) FROM"
                f" publications WHERE seq > ? AND retain = 1 GROUP BY realm, topic, audience)"
                f" ORDER BY seq", (state.seq,)):
            pub = StoredPublication.from_row(row, retain=True)
            state.retained[pub.slot] = pub
        state.top = state.seq
        return state


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


class _Rows:
    """Publications as rows of publication_batch, on the writer thread: a topic new to
    history gets its id here, and the usual details JSON comes from a cache."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self._details_json: dict[str, str] = {}  # topic -> '{"topic": topic}'

    def batch(self, pubs: list[StoredPublication], new_topics: dict[tuple[str, str], int]
              ) -> tuple[list[tuple[Any, ...]], dict[Slot, StoredPublication]]:
        """A row per history publication, and per retained slot the newest publication of
        the batch (a topic published 100 times in one batch is upserted once). A retained
        publication with no history goes to the retained table now (it has no other home);
        the slots of stored ones are returned, to be written back later. Topics stored for
        the first time get an id in ``new_topics``."""
        newest: dict[Slot, StoredPublication] = {}
        for p in pubs:
            if p.retain:
                other = newest.get(p.slot)
                if other is None or p.seq > other.seq:
                    newest[p.slot] = p
        slots = {key: p for key, p in newest.items() if p.history_rule is not None}
        direct = {id(p): key[2] for key, p in newest.items() if p.history_rule is None}
        rows = []
        for p in pubs:
            audience_key = direct.get(id(p))
            if p.history_rule is None and audience_key is None:
                continue  # retained only, and a newer one of its slot is in the batch
            rows.append(self.row(p, p.history_rule, audience_key, new_topics))
        return rows, slots

    def slots(self, slots: dict[Slot, StoredPublication]) -> list[tuple[Any, ...]]:
        """Rows that write retained slots only (no history row: rule NULL)."""
        return [self.row(p, None, key[2]) for key, p in slots.items()]

    def row(self, p: StoredPublication, rule: int | None, audience_key: str | None,
            new_topics: dict[tuple[str, str], int] | None = None) -> tuple[Any, ...]:
        """A row of publication_batch: a history row under ``rule`` (None: none), and the
        retained slot ``audience_key`` (None: none)."""
        topic_id, new = None, False
        if rule is not None:
            topic_id = self.topics.get(p.realm, p.topic)
            if topic_id is None:
                topic_id = new_topics.get((p.realm, p.topic))
                if topic_id is None:
                    topic_id = new_topics[(p.realm, p.topic)] = \
                        self.topics.next_id + len(new_topics)
                    new = True
        return (p.seq, p.publication, p.realm, p.topic, rule, p.wall_ms, p.boot_id,
                p.boottime_ns, int(p.clock_synced), p.authid, p.authrole,
                json.dumps(p.audience) if p.audience else None, self._details(p),
                p.payload(), int(p.retain), audience_key,
                int(audience_key is not None), topic_id, int(new))

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


class _Pruner:
    """Keeps history within its bounds on the writer thread: drops rows a transaction at a
    time (each drop recorded as a gap) and gives the freed pages back to the file system in
    steps that take about VACUUM_STEP_SECONDS, so a commit never waits long behind it."""

    vacuum_pages = 64  # pages one shrink step gives back; paced to VACUUM_STEP_SECONDS

    def __init__(self, state: _State, topics: Topics, rows: _Rows) -> None:
        self.state, self.topics, self.rows = state, topics, rows

    def drop(self, db: sqlite3.Connection, rules: list[PruneRule], max_bytes: int,
             now_ms: int, clock_synced: bool, synced: int, budget: int
             ) -> tuple[list[Gap], bool]:
        """One transaction of a prune, dropping at most ``budget`` rows: its gaps, and
        whether more is left to drop."""
        state = self.state
        # max_events is kept to within 0.1 %: a prune costs a transaction of its own (the
        # freed pages' bookkeeping and the state written back), so a full history is pruned
        # a thousand events at a time, not every minute for the two hundred that came.
        over = {rule: state.counts[(rule.realm, rule.index)] - rule.max_events
                for rule in rules}
        over = {rule: n if n > rule.max_events // 1000 else 0 for rule, n in over.items()}
        realms = {rule.realm: json.dumps(self.topics.of_realm(rule.realm)) for rule in rules}
        aged = {rule: _first_young(db, realms[rule.realm], rule, now_ms - rule.max_age_ms)
                for rule in rules
                if rule.max_age_ms is not None and clock_synced and
                state.counts[(rule.realm, rule.index)] > 0 and
                _has_old(db, realms[rule.realm], rule, now_ms - rule.max_age_ms)}
        if not aged and all(n <= 0 for n in over.values()) and _used_bytes(db) <= max_bytes:
            return [], False
        gaps: list[Gap] = []
        dropped: Counter[tuple[str, int]] = Counter()
        more = False
        with _transaction(db):
            db.execute(_RAISE_META, ("highest_seq", _highest_seq(db)))  # before deleting any
            for rule in rules:
                where, params = f"s.rule = ? AND s.{_IN_TOPICS}", [rule.index, realms[rule.realm]]
                if over[rule] > 0:
                    gaps += _drop(db, where, params, min(over[rule], budget), synced, rule,
                                  "max_events", dropped)
                    more = more or over[rule] > budget
                if rule in aged:
                    young = aged[rule]
                    age_where = (f"{where} AND s.clock_synced = 1 AND s.wall_ms < ?"
                                 + (" AND s.seq < ?" if young is not None else ""))
                    age_params = [*params, now_ms - rule.max_age_ms,
                                  *([young] if young is not None else [])]
                    aged_gaps = _drop(db, age_where, age_params, budget, synced, rule,
                                      "max_age", dropped)
                    more = more or sum(g.count for g in aged_gaps) == budget
                    gaps += aged_gaps
            while (used := _used_bytes(db)) > max_bytes:
                if sum(dropped.values()) >= budget:
                    more = True
                    break
                rows = max(sum(state.counts.values()) - sum(dropped.values()), 1)
                extra = _drop(db, "1", [], _rows_over(used, max_bytes, rows), synced, None,
                              "max_store_bytes", dropped)
                if not extra:
                    break
                gaps += extra
            _insert_gaps(db, gaps)
            counts = state.counts - dropped
            rows = self.rows.slots(state.retained)  # the rows dropped may be their only copy
            for start in range(0, len(rows), _MAX_BATCH_ROWS):
                _insert_batch(db, rows[start:start + _MAX_BATCH_ROWS])
            _put_meta(db, "state", _State.encode(state.top, counts))
        state.counts, state.retained, state.seq, state.rows = counts, {}, state.top, 0
        state.written = time.monotonic()
        return gaps, more

    def shrink_step(self, db: sqlite3.Connection) -> bool:
        """After a big drop (a storm, a lowered bound), give ``pages`` freed pages back to
        the file system; True while more are left. Small drops are reused by new rows.
        (executescript steps the pragma to the end: one execute() step frees a single page.)"""
        pages = self.vacuum_pages
        (free, total), = _fetch(db, "SELECT * FROM pragma_freelist_count(), pragma_page_count()")
        if free <= max(total // 4, 256):
            return False
        db.executescript(f"PRAGMA incremental_vacuum({pages})")
        return free - pages > max((total - pages) // 4, 256)

    def pace(self, took: float) -> None:
        """A page costs from 0.1 ms to 3.5 ms to give back (more, the longer the free list):
        steps are sized to take about VACUUM_STEP_SECONDS, so a commit waits no longer."""
        if took < VACUUM_STEP_SECONDS / 2:
            self.vacuum_pages = min(self.vacuum_pages * 2, 4096)
        elif took > VACUUM_STEP_SECONDS * 2:
            self.vacuum_pages = max(self.vacuum_pages // 2, 8)


class StoreReader:
    """The store's reading connection (aiosqlite, query-only): one read at a time, each
    interrupted at its deadline or as soon as nobody waits for it; history pages, the status
    summary and what a restart brings back. It shares the writer's in-memory view of the
    history (the topics, the counts per rule, the retained slots not yet written back)."""

    query_timeout = 60.0  # s: any read on the reader connection is interrupted past it

    def __init__(self, reader: aiosqlite.Connection, state: _State, topics: Topics,
                 publication_ids: PublicationIds, legacy_seq: int) -> None:
        self._reader = reader
        self._state = state
        self.topics = topics
        self.publication_ids = publication_ids
        self._legacy_sql = (_LEGACY_SEQ_OF_PUBLICATION.format(legacy=legacy_seq)
                            if legacy_seq else None)
        self._reading = asyncio.Lock()
        self._read_deadline = math.inf
        self._read_abandoned: Callable[[], bool] = _never

    async def close(self) -> None:
        await self._reader.close()

    async def synced_seq(self) -> int:
        rows = await self.query("SELECT value FROM meta WHERE key = 'synced_seq'", ())
        return int(rows[0][0]) if rows else 0

    async def gaps(self) -> list[tuple[Any, ...]]:
        return await self.query(
            "SELECT realm, rule, first_seq, last_seq, count, reason, wall_ms FROM gaps "
            "ORDER BY id", ())

    async def load_subscriptions(self) -> list[tuple[int, str, str, str, str]]:
        async with self._reader.execute(
                "SELECT id, realm, uri, match, created FROM subscriptions"
                " ORDER BY created, id") as cur:
            return [tuple(row) for row in await cur.fetchall()]

    async def load_retained(self) -> list[StoredPublication]:
        """Every retained slot, from the retained table and the stored publications newer
        than it, in receive order."""
        async with self._reader.execute(
                "SELECT seq, publication, realm, topic, wall_ms, NULL, NULL, NULL, authid,"
                " authrole, audience, details, payload FROM retained ORDER BY seq") as cur:
            rows = await cur.fetchall()
        slots = {}
        for row in rows:
            try:
                pub = StoredPublication.from_row(row, retain=True)
            except Exception as e:  # a damaged row must not keep the router from starting
                log.error("the retained event of %s in realm %s (seq %s) cannot be read (%s: "
                          "%s): left out; the topic has none until its next publication",
                          row[3], row[2], row[0], type(e).__name__, e)
                continue
            slots[pub.slot] = pub
        for key, pub in self._state.retained.items():
            if key not in slots or pub.seq > slots[key].seq:
                slots[key] = pub
        return sorted(slots.values(), key=lambda p: p.seq)

    async def query(self, sql: str, params: Iterable[Any], timeout: float | None = None,
                    abandoned: Callable[[], bool] | None = None) -> list[tuple[Any, ...]]:
        """Rows of a read; past ``timeout`` seconds (default :attr:`query_timeout`) SQLite
        interrupts it (ReadTimeout), and as soon as ``abandoned()`` is true (ReadAbandoned:
        nobody waits for the answer any more). One read at a time, so both are its own."""
        async with self._reading:
            self._read_deadline = time.monotonic() + (timeout or self.query_timeout)
            self._read_abandoned = abandoned or _never
            try:
                async with self._reader.execute(sql, tuple(params)) as cur:
                    return [tuple(row) for row in await cur.fetchall()]
            except sqlite3.OperationalError as e:
                if "interrupt" not in str(e):
                    raise
                if self._read_abandoned():
                    raise ReadAbandoned("the reader left") from None
                if time.monotonic() >= self._read_deadline:
                    raise ReadTimeout(
                        f"the read ran past {timeout or self.query_timeout:g} s") from None
                raise
            finally:
                self._read_deadline, self._read_abandoned = math.inf, _never

    def _interrupt_read(self) -> bool:  # SQLite's progress handler, on the reader's thread
        return time.monotonic() >= self._read_deadline or self._read_abandoned()

    async def seq_of_publication(self, realm: str, publication: int) -> int | None:
        seq = self.publication_ids.seq_of(publication)
        if await self.query("SELECT 1 FROM publications WHERE seq = ? AND publication = ?"
                            " AND realm = ?", (seq, publication, realm)):
            return seq
        if self._legacy_sql is None:
            return None
        rows = await self.query(self._legacy_sql, (publication, realm))
        return rows[0][0] if rows else None

    async def summary(self, realm: str) -> dict[str, Any]:
        """Size and span of the stored history, for status displays."""
        count = sum(n for (r, _), n in self._state.counts.items() if r == realm)
        topics = json.dumps(self.topics.of_realm(realm))
        ends = [await self.query(f"SELECT seq, wall_ms FROM history_scan WHERE {_IN_TOPICS}"
                                 f" ORDER BY seq {order} LIMIT 1", (topics,))
                if count else [] for order in ("ASC", "DESC")]
        (first, oldest), (last, newest) = [end[0] if end else (None, None) for end in ends]
        (gaps, dropped), = await self.query(
            "SELECT COUNT(*), COALESCE(SUM(count), 0) FROM gaps WHERE realm = ? OR realm IS NULL",
            (realm,))
        (anchors,), = await self.query(
            "SELECT COUNT(*) FROM anchors WHERE reason = 'step'", ())
        return {"bytes": await self.size_bytes(), "events": count,
                "first_seq": first, "last_seq": last, "synced_seq": await self.synced_seq(),
                "oldest": rfc3339(oldest) if oldest is not None else None,
                "newest": rfc3339(newest) if newest is not None else None,
                "gaps": gaps, "dropped_events": dropped, "clock_steps": anchors}

    async def read_history(self, read: HistoryRead) -> list[tuple[Any, ...]]:
        """The rows of a history page (see :meth:`history`); UnknownPublication when it names
        a publication the store does not hold."""
        conditions = [("wall_ms", op, ms) for op, ms in read.times]
        for argument, op, publication in read.publications:
            seq = await self.seq_of_publication(read.realm, publication)
            if seq is None:
                raise UnknownPublication(argument, publication)
            conditions.append(("seq", op, seq))
        return await self.history(self._topic_ids(read), conditions, read.caller, read.reverse,
                                  2**63 - 1 if read.reverse else 0, read.limit, read.timeout,
                                  read.abandoned)

    def _topic_ids(self, read: HistoryRead) -> list[int]:
        """The stored topics a history read covers: the subscription's matches, or the one
        topic asked for if the subscription matches it; of a pattern subscription, only
        those ``visible`` (so SQL never reads a row it must skip)."""
        pattern = read.match != "exact"
        if read.topic is None:
            return self.topics.matching(read.realm, read.uri, read.match,
                                        read.visible if pattern else None)
        if not matches(read.uri, read.match, read.topic) or (pattern and
                                                             not read.visible(read.topic)):
            return []
        found = self.topics.get(read.realm, read.topic)
        return [] if found is None else [found]

    async def history(self, topics: list[int], conditions: list[tuple[str, str, int]],
                      caller: tuple[str | None, str | None], reverse: bool, beyond: int,
                      limit: int, timeout: float | None = None,
                      abandoned: Callable[[], bool] | None = None) -> list[tuple[Any, ...]]:
        """Up to ``limit`` history rows of ``topics`` (ids) after seq ``beyond`` in receive
        order (before it, newest first, when ``reverse``) that meet every ``(column, op,
        value)`` of ``conditions`` (column seq or wall_ms) and the ``caller`` (authid,
        authrole) was eligible to receive: (seq, publication, topic, wall_ms, details,
        payload). Walks history_scan in seq order and reads only the rows that match."""
        if not topics:
            return []
        where = [f"s.{_IN_TOPICS}" if len(topics) > 1 else "s.topic = ?"]
        params: list[Any] = [json.dumps(topics) if len(topics) > 1 else topics[0]]
        for column, op, value in [*conditions, ("seq", "<" if reverse else ">", beyond)]:
            assert column in ("seq", "wall_ms") and op in ("<", "<=", ">", ">="), (column, op)
            where.append(f"s.{column} {op} ?")
            params.append(value)
        where.append("(p.audience IS NULL OR eligible(p.audience, ?, ?))")
        return await self.query(
            f"SELECT s.seq, p.publication, p.topic, s.wall_ms, p.details, p.payload"
            f" FROM history_scan AS s CROSS JOIN publications AS p ON p.seq = s.seq"
            f" WHERE {' AND '.join(where)} ORDER BY s.seq {'DESC' if reverse else 'ASC'}"
            f" LIMIT ?", [*params, *caller, limit], timeout, abandoned)

    async def size_bytes(self) -> int:
        rows = await self.query("SELECT page_count * page_size FROM pragma_page_count(), "
                                "pragma_page_size()", ())
        return int(rows[0][0]) if rows else 0


class Store:
    unavailable: str | None = None  # why not, for the store that could not open (below)
    flush_interval = 0.05  # the bound on what a power cut may take without acknowledge
    write_back_interval = 300.0  # seconds between write-backs of _State...
    write_back_rows = 20_000  # ...or rows: what start-up reads again after a power cut
    max_queue_bytes = 4 * 2**20  # router.limits.max_store_queue_bytes: past it, congested
    refuse_factor = 4  # past this many times it, publications are refused (not queued)

    def __init__(self, path: Path, writer: _WriterThread, reader: StoreReader,
                 state: _State, topics: Topics, publication_ids: PublicationIds) -> None:
        self.path = path
        self.publication_ids = publication_ids
        self.topics = topics
        self.reader = reader
        self._writer = writer
        self._state = state
        self._pending = _Pending()
        self._wake = asyncio.Event()  # set: commit what is pending now
        self._deadline: asyncio.TimerHandle | None = None  # sets _wake for a pending batch
        self._due = float("inf")  # loop time by which the pending batch must be committed
        self._backoff = 0.0  # > 0 while writes fail: retry slower, unless someone is waiting
        self._task: asyncio.Task | None = None
        self._closing = False
        self.next_seq = state.top + 1
        self.commit_latencies: list[float] = []  # seconds, recent commits (for metrics)
        self.failed_writes = 0
        self.queued_bytes = 0  # payloads queued or being committed
        self.on_drained: Callable[[], None] | None = None  # called when no more congested
        # (history rules, router.max_store_bytes): checked after each commit, so a storm is
        # pruned as it comes, not a minute later
        self.bounds: tuple[list[PruneRule], int] | None = None
        self._transaction = asyncio.Lock()  # one transaction at a time on the writer
        self._rows = _Rows(topics)  # the writer thread's
        self._pruner = _Pruner(state, topics, self._rows)  # the writer thread's
        # asyncio.get_running_loop() costs a getpid() system call: once per append is too much
        self._loop = asyncio.get_running_loop()

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path, seq_floor: int = 0) -> Store:
        """Open (create, migrate) the store. ``seq_floor``: seqs known to be used already
        (shipped upstream) even if this database does not hold them: none is handed out
        again."""
        path.parent.mkdir(parents=True, exist_ok=True)
        _refuse_newer_schema(path)  # before anything could touch the file
        writer = _WriterThread()
        try:
            state, topics, key, legacy = await writer.run(_open_writer, writer, path, seq_floor)
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await writer.close()
            raise
        await reader.execute("PRAGMA query_only = ON")
        await reader.create_function("eligible", 3, eligible, deterministic=True)
        ids = PublicationIds(key)
        reads = StoreReader(reader, state, topics, ids, legacy)
        await reader.set_progress_handler(reads._interrupt_read, 10_000)  # ~1 ms of work
        store = cls(path, writer, reads, state, topics, ids)
        store._task = store._loop.create_task(store._write_loop())
        return store

    async def close(self) -> None:
        """Flush everything queued and write the state back, then close both connections."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(sqlite3.Error):  # every seq handed out, stored or not
            async with self._transaction:
                await self._writer.run(self._write_back_at_close)
        with contextlib.suppress(sqlite3.Error):
            await self._writer.run(_fetch, self._writer.db, "PRAGMA wal_checkpoint(TRUNCATE)")
        await self.reader.close()
        await self._writer.close()

    # -- writing -------------------------------------------------------------------------

    def assign(self) -> tuple[int, int]:
        """The next seq and the publication id that goes with it."""
        seq = self.next_seq
        self.next_seq += 1
        return seq, self.publication_ids.of_seq(seq)

    def append(self, pub: StoredPublication, within: float | None = None) -> asyncio.Future:
        """Queue a publication (its seq and publication id from :meth:`assign` or the core's
        :class:`~gateway.core.Sequence`, seeded from this store) to be
        committed within ``within`` seconds (0: as soon as the writer is free; None:
        :attr:`flush_interval`). The future resolves when it is durable (or fails with
        StorageError)."""
        try:
            size = pub.size
        except Exception as e:  # a value msgpack cannot pack: a bug upstream, lose this one
            log.error("publication %s cannot be stored: %s", pub.publication, e)
            return self._refuse(pub, "write failed: cannot encode it", str(e))
        if self.queued_bytes + size > self.refuse_factor * self.max_queue_bytes:
            return self._refuse(pub, _QUEUE_FULL, f"the store's queue is full "
                                                  f"({self.queued_bytes} bytes wait for a commit)")
        self.queued_bytes += size
        self.next_seq = max(self.next_seq, pub.seq + 1)  # seqs the core assigned count too
        self._pending.publications.append(pub)
        self._commit_within(self.flush_interval if within is None else within)
        return self._waiter()

    @property
    def congested(self) -> bool:
        """More is waiting for its commit than ``max_queue_bytes``: the shell pauses the
        publishers that add to it (their TCP connections stop being read) until it drains."""
        return self.queued_bytes > self.max_queue_bytes

    def _refuse(self, pub: StoredPublication, reason: str, error: str) -> asyncio.Future:
        """A publication that is not stored (far past the queue's bound, with many
        publishers read at once before they were paused; or one that cannot be encoded):
        routed but not stored, its loss recorded as a gap."""
        self.failed_writes += 1
        if pub.history_rule is not None:
            gaps = self._pending.gaps
            last = gaps[-1] if gaps else None
            if last is not None and last.reason == reason and last.realm == pub.realm:
                last.last_seq, last.count = pub.seq, last.count + 1
            else:
                gaps.append(Gap(pub.realm, None, pub.seq, pub.seq, 1, reason))
            self._commit_within(self.flush_interval)
        future = self._loop.create_future()
        future.set_exception(StorageError(error))
        future.exception()  # a refusal nobody awaits must not log "never retrieved"
        return future

    record_window = 5.0  # seconds a subscription record may wait: a burst shares a commit

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None:
        """A kept subscription, so its id survives a restart (committed within
        :attr:`record_window`; one lost to a power cut before is made anew)."""
        self._pending.subscriptions.append((sub_id, realm, uri, match, created))
        self._commit_within(self.record_window)

    def remove_subscription(self, sub_id: int) -> None:
        """A kept subscription that is forgotten (committed with the next batch)."""
        self._pending.forgotten.append(("DELETE FROM subscriptions WHERE id = ?", (sub_id,)))
        self._commit_within(self.record_window)

    def forget_retained(self, pub: StoredPublication) -> None:
        """A retained slot no longer kept (a bound was lowered): committed with the next
        batch."""
        self._pending.forgotten.append((
            "DELETE FROM retained WHERE realm = ? AND topic = ? AND audience_key = ?",
            pub.slot))
        self._state.retained.pop(pub.slot, None)
        self._commit_within(self.record_window)

    def add_anchor(self, anchor: Anchor, after_seq: int | None = None) -> None:
        """A clock anchor for the seqs after ``after_seq`` (default: the last one assigned),
        committed with the publication that noticed it (appended next)."""
        self._pending.anchors.append((anchor, self.next_seq - 1 if after_seq is None
                                      else after_seq))

    def _commit_within(self, seconds: float) -> None:
        """The pending batch is committed at the earliest deadline any of its items asked
        for. No timer runs while nothing is queued, so an idle router sleeps; while writes
        fail, the backoff decides when to retry, unless someone waits (``seconds`` 0)."""
        if seconds <= 0:
            self._wake.set()
            return
        due = self._loop.time() + seconds
        if due >= self._due or self._backoff:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._due = due
        self._deadline = self._loop.call_at(due, self._wake.set)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._due = float("inf")

    def _waiter(self) -> asyncio.Future:
        # one future per caller, not one per batch: cancelling one awaiting task must not
        # cancel the others' acknowledgements
        future = self._loop.create_future()
        self._pending.waiters.append(future)
        return future

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
            await self._wait_for_work()
            if not self._pending:
                continue
            batch, self._pending = self._pending, _Pending()
            self._disarm()  # what comes during the commit arms a deadline of its own
            started = time.perf_counter()
            try:
                await self._commit_counted(batch)
            except sqlite3.Error as e:
                if not self._backoff:
                    log.error("the store cannot write (%s): acknowledged publishes get an "
                              "error, live routing goes on; retrying", e)
                self._backoff = min(max(self._backoff * 2, 0.1), 5.0)
                self._disarm()  # the backoff decides when to retry
                self._fail(batch, e)
                if self._closing:
                    log.error("closing with unwritten data: %d publications lost",
                              len(self._pending.publications))
                    return
                continue
            except Exception as e:  # a bug (say, a value msgpack cannot pack): lose this
                log.exception("the store could not write a batch")  # batch, not the store
                self._fail(batch, e, retry_retained=False)
                if self._pending:
                    self._commit_within(self.flush_interval)
                continue
            if self._backoff:
                log.warning("the store writes again")
                self._backoff = 0.0
                if self._pending:  # queued during the backoff, when no deadline was armed
                    self._commit_within(self.flush_interval)
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
            again = [dataclasses.replace(p, history_rule=None) for p in batch.publications
                     if p.retain]
            self._pending.publications.extend(again)
            self.queued_bytes += sum(p.size for p in again)
        self._pending.subscriptions.extend(batch.subscriptions)
        self._pending.forgotten.extend(batch.forgotten)
        self._pending.anchors.extend(batch.anchors)
        self._pending.gaps.extend(batch.gaps)

    async def _commit_counted(self, batch: _Pending) -> None:
        """Commit, then take the batch's bytes off the queue (failed or not: what is retried
        is queued again); tell the shell once the queue is down to half its bound."""
        held = sum(p.size for p in batch.publications)
        try:
            await self._commit(batch)
        finally:
            self.queued_bytes -= held
            if self.queued_bytes <= self.max_queue_bytes // 2 and self.on_drained is not None:
                self.on_drained()

    async def _commit(self, batch: _Pending) -> None:
        async with self._transaction:
            await self._commit_locked(batch)

    async def _commit_locked(self, batch: _Pending) -> None:
        await self._writer.run(self._commit_batch, batch)

    # the writer thread: the batch is no longer touched by the event loop

    def _commit_batch(self, batch: _Pending) -> None:
        db = self._writer.db
        state = self._state
        new_topics: dict[tuple[str, str], int] = {}
        rows, slots = self._rows.batch(batch.publications, new_topics)
        counts = Counter((p.realm, p.history_rule) for p in batch.publications
                         if p.history_rule is not None)
        top = max(state.top, max((p.seq for p in batch.publications), default=0))
        write_back = (state.rows + len(batch.publications) >= self.write_back_rows
                      or time.monotonic() - state.written >= self.write_back_interval)
        if write_back:
            rows += self._rows.slots({**state.retained, **slots})
        if len(rows) <= _MAX_BATCH_ROWS and not batch.has_records() and not write_back:
            _insert_batch(db, rows)  # autocommit: the usual case, one statement
        else:
            with _transaction(db):
                for start in range(0, len(rows), _MAX_BATCH_ROWS):
                    _insert_batch(db, rows[start:start + _MAX_BATCH_ROWS])
                _write_records(db, batch)
                if write_back:
                    _put_meta(db, "state", _State.encode(top, state.counts + counts))
        self.topics.add(new_topics)
        state.top = top
        state.counts = state.counts + counts
        if write_back:
            state.retained, state.seq, state.rows = {}, top, 0
            state.written = time.monotonic()
        else:
            state.retained.update(slots)
            state.rows += len(batch.publications)
        self._keep_within_bounds(db)

    def _keep_within_bounds(self, db: sqlite3.Connection) -> None:
        """After a commit: one prune transaction when the store is over ``max_store_bytes``
        or a rule is over ``max_events`` by a whole prune budget. A storm on a history topic
        is then dropped as it comes and its pages are reused, instead of growing the file
        (to a GiB in a minute on this machine) until the next maintenance pass."""
        if self.bounds is None:
            return
        rules, max_bytes = self.bounds
        counts = self._state.counts
        if _used_bytes(db) <= max_bytes and all(
                counts[(r.realm, r.index)] - r.max_events < self.prune_budget for r in rules):
            return
        synced = _fetch(db, "SELECT value FROM meta WHERE key = 'synced_seq'")
        gaps, _ = self._pruner.drop(db, rules, max_bytes, 0, False,
                                    int(synced[0][0]) if synced else 0, self.prune_budget)
        for g in gaps:  # (what is left over goes with the next commit's check)
            log.warning("dropped %d events (seq %s..%s) to stay within %s", g.count,
                        g.first_seq, g.last_seq, g.reason)

    def _write_back_at_close(self) -> None:
        """The state, and every seq handed out, stored or not, so none is ever reused."""
        db = self._writer.db
        state = self._state
        with _transaction(db):
            rows = self._rows.slots(state.retained)
            for start in range(0, len(rows), _MAX_BATCH_ROWS):
                _insert_batch(db, rows[start:start + _MAX_BATCH_ROWS])
            _put_meta(db, "state", _State.encode(state.top, state.counts))
            db.execute(_RAISE_META, ("highest_seq", self.next_seq - 1))
        state.retained, state.seq, state.rows = {}, state.top, 0

    # -- bounds --------------------------------------------------------------------------

    async def set_synced_seq(self, seq: int) -> None:
        """Everything up to ``seq`` has reached the central sink (the uploader says so)."""
        async with self._transaction:
            await self._writer.run(_fetch, self._writer.db, _RAISE_META, ("synced_seq", seq))

    async def prune(self, rules: list[PruneRule], max_bytes: int, now_ms: int,
                    clock_synced: bool) -> list[Gap]:
        """Drop what is over the bounds, synced events first, and record each drop as a gap.

        ``max_events`` may be exceeded by 0.1 % before events are dropped (then down to
        it). ``max_age`` is applied only while the clock is synchronized and only to events
        recorded with a synchronized clock: a Pi that boots in 1970 must not mistake
        everything it stored for ancient history. It drops in receive order, up to the
        first such event that is younger (there is no time index to find stragglers behind
        it: the bounds on count and bytes catch those). With nothing to drop, nothing is
        written.
        """
        synced = await self.reader.synced_seq()
        gaps: list[Gap] = []
        while True:  # a transaction per PRUNE_BUDGET rows: commits get the writer in between
            async with self._transaction:
                chunk, more = await self._writer.run(
                    self._pruner.drop, self._writer.db, rules, max_bytes, now_ms, clock_synced,
                    synced, self.prune_budget)
            gaps += chunk
            if not more:
                break
        shrinking = True
        while shrinking:  # a transaction per step, as above
            async with self._transaction:
                started = time.perf_counter()
                shrinking = await self._writer.run(self._pruner.shrink_step, self._writer.db)
                self._pruner.pace(time.perf_counter() - started)
        for g in gaps:
            log.warning("dropped %d events (seq %s..%s, %s) to stay within %s", g.count,
                        g.first_seq, g.last_seq, g.realm or "all realms", g.reason)
        return gaps

    prune_budget = 2000  # rows one prune transaction drops (a storm's prune: many of them)

    # -- reading -------------------------------------------------------------------------

    async def restored(self) -> Restored:
        """What the router continues from when it is built on this store."""
        return Restored(self.next_seq, self.publication_ids,
                        await self.reader.load_subscriptions(), await self.reader.load_retained())


# -- the writer thread's side: plain sqlite3 on the writing connection ------------------------


class UnavailableStore:
    """In the place of the store while it cannot be opened (disk full, read-only, damaged):
    the router routes without it. Nothing is stored (an acknowledged publication that would
    be gets StorageError), history cannot be read, what would be kept stays in memory."""

    congested = False
    queued_bytes = 0
    failed_writes = 0
    commit_latencies: tuple[float, ...] = ()
    on_drained: Callable[[], None] | None = None

    def __init__(self, reason: str) -> None:
        self.unavailable = reason
        self.reader = self  # its reads fail, or find nothing, as its writes do

    def _error(self) -> StorageError:
        return StorageError(f"the store is unavailable: {self.unavailable}")

    async def restored(self) -> Restored:
        return Restored()

    def append(self, pub: StoredPublication, within: float | None = None) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(self._error())
        future.exception()  # nobody may wait for it (no acknowledge): not worth a warning
        return future

    async def read_history(self, read: HistoryRead) -> list[tuple[Any, ...]]:
        raise self._error()

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None:
        """Kept in memory: the router stores it when the store opens."""

    def remove_subscription(self, sub_id: int) -> None:
        pass

    def forget_retained(self, pub: StoredPublication) -> None:
        pass

    def add_anchor(self, anchor: Anchor, after_seq: int | None = None) -> None:
        pass  # no publication is stored that it would date

    async def prune(self, rules: list[PruneRule], max_bytes: int, now_ms: int,
                    clock_synced: bool) -> list[Gap]:
        return []

    async def summary(self, realm: str) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        pass


def _open_writer(writer: _WriterThread, path: Path,
                 seq_floor: int) -> tuple[_State, Topics, bytes, int]:
    """Open, migrate, and read what the store keeps in memory: its state, the topics, the
    publication id key (made with a new database) and the last seq with a random id."""
    writer.connect(path)
    db = writer.db
    _configure(db)
    _migrate(db, path)
    for statement in _BATCH_SCHEMA:  # TEMP: this connection's, not the file's
        db.execute(statement)
    state = _State.load(db)
    state.top = _highest_seq(db)
    if state.top < seq_floor:
        log.warning("%s holds seqs up to %d only, but seqs up to %d were used (shipped "
                    "upstream): new ones start after %d", path, state.top, seq_floor, seq_floor)
        db.execute(_RAISE_META, ("highest_seq", seq_floor))
        state.top = seq_floor
    topics = Topics(db.execute("SELECT id, realm, topic FROM topics"))
    key = _meta(db, "publication_key")
    if key is None:
        key = new_key().hex()
        _put_meta(db, "publication_key", key)
    return state, topics, bytes.fromhex(key), int(_meta(db, "legacy_publication_seq") or 0)


def _write_records(db: sqlite3.Connection, batch: _Pending) -> None:
    """A batch's records besides publications: subscriptions, deletions, anchors, gaps."""
    if batch.subscriptions:
        db.executemany(
            "INSERT OR IGNORE INTO subscriptions (id, realm, uri, match, created)"
            " VALUES (?,?,?,?,?)", batch.subscriptions)
    for sql, params in batch.forgotten:
        db.execute(sql, params)
    if batch.anchors:
        db.executemany(
            "INSERT INTO anchors (reason, boot_id, boottime_ns, wall_ns, offset_before_ns,"
            " clock_synced, after_seq) VALUES (?,?,?,?,?,?,?)",
            [(a.reason, a.boot_id, a.boottime_ns, a.wall_ns, a.offset_before_ns,
              int(a.synced), after) for a, after in batch.anchors])
    if batch.gaps:
        _insert_gaps(db, batch.gaps)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
            db.execute("ROLLBACK")
        raise


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def _put_meta(db: sqlite3.Connection, key: str, value: Any) -> None:
    db.execute(_PUT_META, (key, value))


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


_IN_TOPICS = "topic IN (SELECT value FROM json_each(?))"


def _has_old(db: sqlite3.Connection, topics: str, rule: PruneRule, cutoff_ms: int) -> bool:
    """Is the oldest event of ``rule`` (of the realm's ``topics``, JSON) stamped by a
    synchronized clock older than the cutoff? (The walk stops at the first such event.)"""
    row = db.execute(f"SELECT wall_ms FROM history_scan WHERE rule = ? AND {_IN_TOPICS} AND"
                     f" clock_synced = 1 ORDER BY seq LIMIT 1", (rule.index, topics)).fetchone()
    return row is not None and row[0] < cutoff_ms


def _first_young(db: sqlite3.Connection, topics: str, rule: PruneRule,
                 cutoff_ms: int) -> int | None:
    """The seq of the first event of ``rule`` with a synchronized timestamp at or after the
    cutoff: max_age drops the old ones before it."""
    row = db.execute(f"SELECT seq FROM history_scan WHERE rule = ? AND {_IN_TOPICS} AND"
                     f" clock_synced = 1 AND wall_ms >= ? ORDER BY seq LIMIT 1",
                     (rule.index, topics, cutoff_ms)).fetchone()
    return row[0] if row else None


_DROP_CHUNK = 10_000
VACUUM_STEP_SECONDS = 0.05  # how long one shrink step may hold the writer


def _drop(db: sqlite3.Connection, where: str, params: list[Any], count: int | None,
          synced: int, rule: PruneRule | None, reason: str,
          dropped: Counter[tuple[str, int]]) -> list[Gap]:
    """Delete the ``count`` (None: all) oldest rows matching ``where`` (on history_scan),
    synced ones first, in seq order; count them by (realm, rule) in ``dropped``."""
    seqs: list[int] = []
    for synced_part in (f"s.seq <= {int(synced)}", f"s.seq > {int(synced)}"):
        while count is None or len(seqs) < count:
            want = _DROP_CHUNK if count is None else min(_DROP_CHUNK, count - len(seqs))
            victims = _fetch(db, f"SELECT s.seq, t.realm, s.rule FROM history_scan AS s"
                                 f" JOIN topics AS t ON t.id = s.topic WHERE {synced_part}"
                                 f" AND {where} ORDER BY s.seq LIMIT ?", [*params, want])
            doomed = [(seq,) for seq, _, _ in victims]
            db.executemany("DELETE FROM publications WHERE seq = ?", doomed)
            db.executemany("DELETE FROM history_scan WHERE seq = ?", doomed)
            seqs += [seq for seq, _, _ in victims]
            dropped.update((realm, index) for _, realm, index in victims)
            if len(victims) < want:
                break
    if not seqs:
        return []
    return [Gap(rule.realm if rule else None, rule.index if rule else None,
                min(seqs), max(seqs), len(seqs), reason)]


def _rows_over(used: int, max_bytes: int, rows: int) -> int:
    """About how many of ``rows`` rows, of average size, make up what is over the bound (at
    most a thousand at a time): 64 KiB events are not dropped a thousand at once."""
    return min(1000, -(-(used - max_bytes) * rows // used) + 1)


def _used_bytes(db: sqlite3.Connection) -> int:
    (pages, free, size), = _fetch(
        db, "SELECT * FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()")
    return (pages - free) * size


PAGE_SIZE = 1024


def _configure(db: sqlite3.Connection) -> None:
    # Both take effect on a new database only. Small pages: a commit writes whole pages to
    # the WAL, and most of a small commit's are the last, partly filled page of a table
    # (ten readings: 7 KiB of 1 KiB pages against 17 KiB of 4 KiB ones).
    db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    # Debian builds SQLite to overwrite every freed page with zeros, which writes each pruned
    # page a second time: FAST zeroes only what is being written anyway.
    db.execute("PRAGMA secure_delete = FAST")
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA wal_autocheckpoint = 4000")  # pages: fewer, larger checkpoints
    db.execute("PRAGMA journal_size_limit = 4194304")  # a WAL grown by a storm shrinks back


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
        migration = MIGRATIONS[target - 1]
        with _transaction(db):
            if callable(migration):
                migration(db)
            else:  # executescript() would COMMIT first; run statement by statement in ours
                for statement in migration.split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version = {target}")


def _exported(row: tuple[Any, ...]) -> dict[str, Any]:
    """A history row as the uploader ships it; one that cannot be decoded (a damaged page
    or payload) as ``{"seq", "realm", "topic", "wall_ms", "damaged": why}``."""
    (seq, publication, realm, topic, wall_ms, boot_id, boottime_ns, synced, authid, authrole,
     audience, details, payload) = row
    try:
        args, kwargs = msgpack.unpackb(payload, raw=False)
        return {"seq": seq, "publication": publication, "realm": realm, "topic": topic,
                "wall_ms": wall_ms, "boot_id": boot_id, "boottime_ns": boottime_ns,
                "clock_synced": bool(synced), "authid": authid, "authrole": authrole,
                "audience": json.loads(audience) if audience else None,
                "details": json.loads(details) if details else {},
                "args": args, "kwargs": kwargs}
    except Exception as e:  # whatever the damage, this one row is lost, not the history
        return {"seq": seq, "realm": realm, "topic": topic, "wall_ms": wall_ms,
                "damaged": f"{type(e).__name__}: {e}"[:200]}


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
        return [_exported(row) for row in rows]

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
