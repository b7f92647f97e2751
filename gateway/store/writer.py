"""The store: publications (history), retained events, stable subscription ids, clock
anchors and gap records, in one SQLite file in WAL mode.

Writes are grouped: :meth:`Store.append` queues a row with the time it may wait for its
commit and returns a future that resolves once the transaction holding it is committed with
``synchronous=FULL`` (fsync). The commit loop (gateway.store.commit) commits the whole
pending batch at the earliest deadline of its items: at once for an acknowledged publish
on a rule without a commit window, after the rule's ``commit_window`` on one with,
:attr:`Store.flush_interval` for the rest, and at once when the batch is full (a few hundred
rows: waiting longer would save the card little and hold the publishers back); whatever
arrives while one commit runs goes into the next: group commit. Fewer commits are the
biggest lever on the card's wear (each one writes the pages it dirtied, the WAL frame
headers and a file-system flush). One thread owns the writing connection and each commit
is a single call into it (rows built, inserted and committed there), so a commit costs the
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
(:mod:`formats.publication_ids`), and the rows per history rule and the retained slots of
stored publications are kept in memory and written back now and then (:class:`StoreState`).
Before, a batch of ten readings of ten sensors dirtied 25 pages, now about 5.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiosqlite

from cairn.base.clock_readings import Anchor
from cairn.formats.publication_ids import PublicationIds, new_key
from cairn.gateway.core.publication import Restored, StorageError, StoredPublication
from cairn.gateway.store.commit import CommitLoop, Pending
from cairn.gateway.store.damage import Damage, describe, reading
from cairn.gateway.store.pruning import Gap, Pruner, PruneRule, insert_gaps, used_bytes
from cairn.gateway.store.reader import StoreReader, eligible
from cairn.gateway.store.rows import BATCH_SCHEMA, MAX_BATCH_ROWS, BatchRows, insert_batch
from cairn.gateway.store.schema import (
    RAISE_META,
    configure,
    encode_state,
    fetch_all,
    highest_seq,
    migrate,
    put_meta,
    read_meta,
    read_meta_int,
    refuse_newer_schema,
    transaction,
)
from cairn.gateway.store.state import StoreState, Topics

log = logging.getLogger("cairn.store")

_QUEUE_FULL = "the store's queue was full"


class WriterThread:
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


class StoreWriter:
    """The store as the shell uses it: the group-commit writer, with its reader beside it
    (:attr:`reader`). See the module's docstring."""

    unavailable: str | None = None  # why not: UnavailableStore says (this one is open)
    flush_interval = 0.05  # the bound on what a power cut may take without acknowledge
    write_back_interval = 300.0  # seconds between write-backs of StoreState...
    write_back_rows = 20_000  # ...or rows: what start-up reads again after a power cut
    max_queue_bytes = 4 * 2**20  # router.limits.max_store_queue_bytes: past it, congested
    refuse_factor = 4  # past this many times it, publications are refused (not queued)

    def __init__(self, path: Path, writer: WriterThread, reader: StoreReader,
                 state: StoreState, topics: Topics, publication_ids: PublicationIds) -> None:
        self.path = path
        self.publication_ids = publication_ids
        self.topics = topics
        self.reader = reader
        self._writer = writer
        self._state = state
        # when to commit (gateway.store.commit); what a commit writes is here
        self.commits = CommitLoop(self._commit_counted, self._fail, lambda: self.flush_interval)
        # after the highest seq handed out: raised by append(), never counted here (the
        # core's Sequence hands seqs out); an anchor and the close record it
        self.next_seq = state.top + 1
        self.failed_writes = 0
        self.queued_bytes = 0  # payloads queued or being committed
        self.on_drained: Callable[[], None] | None = None  # called when no more congested
        # (history rules, router.max_store_bytes): checked after each commit, so a storm is
        # pruned as it comes, not a minute later
        self.bounds: tuple[list[PruneRule], int] | None = None
        self._transaction = asyncio.Lock()  # one transaction at a time on the writer
        self._rows = BatchRows(topics)  # the writer thread's
        self._pruner = Pruner(state, topics, self._rows)  # the writer thread's
        # asyncio.get_running_loop() costs a getpid() system call: once per append is too much
        self._loop = asyncio.get_running_loop()

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path, seq_floor: int = 0) -> StoreWriter:
        """Open (create, migrate) the store. ``seq_floor``: seqs known to be used already
        (shipped upstream) even if this database does not hold them: none is handed out
        again."""
        path.parent.mkdir(parents=True, exist_ok=True)
        refuse_newer_schema(path)  # before anything could touch the file
        writer = WriterThread()
        try:
            state, topics, key, legacy, damage = await writer.run(_open_writer, writer, path,
                                                                  seq_floor)
            reader = reading(await aiosqlite.connect(path, isolation_level=None))
        except BaseException:
            await writer.close()
            raise
        await reader.execute("PRAGMA query_only = ON")
        await reader.create_function("eligible", 3, eligible, deterministic=True)
        ids = PublicationIds(key)
        reads = StoreReader(reader, state, topics, ids, legacy, damage)
        await reader.set_progress_handler(reads._interrupt_read, 10_000)  # ~1 ms of work
        store = cls(path, writer, reads, state, topics, ids)
        store.commits.start()
        return store

    async def close(self) -> None:
        """Flush everything queued and write the state back, then close both connections."""
        await self.commits.stop()
        with contextlib.suppress(sqlite3.Error):  # every seq handed out, stored or not
            async with self._transaction:
                await self._writer.run(self._write_back_at_close)
        # the reader first: a read left open (a query whose caller was cancelled, say the
        # health record's at a stop) would hold the checkpoint for the whole busy timeout
        await self.reader.close()
        with contextlib.suppress(sqlite3.Error):
            await self._writer.run(fetch_all, self._writer.db, "PRAGMA wal_checkpoint(TRUNCATE)")
        await self._writer.close()

    # -- writing -------------------------------------------------------------------------

    def append(self, pub: StoredPublication, within: float | None = None) -> asyncio.Future:
        """Queue a publication (its seq and publication id from the core's
        :class:`~gateway.core.session.Sequence`, seeded from this store) to be
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
        self.next_seq = max(self.next_seq, pub.seq + 1)  # the highest handed out, plus one
        self.commits.add(pub, size, self.flush_interval if within is None else within)
        return self.commits.waiter()

    @property
    def damaged_rows(self) -> dict[str, int]:
        """Rows the store's reads left out since it opened, by table (gateway.store.damage)."""
        return dict(self.reader.damage.rows)

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
            gaps = self.commits.pending.gaps
            last = gaps[-1] if gaps else None
            if last is not None and last.reason == reason and last.realm == pub.realm:
                last.last_seq, last.count = pub.seq, last.count + 1
            else:
                gaps.append(Gap(pub.realm, None, pub.seq, pub.seq, 1, reason))
            self.commits.within(self.flush_interval)
        future = self._loop.create_future()
        future.set_exception(StorageError(error))
        future.exception()  # a refusal nobody awaits must not log "never retrieved"
        return future

    record_window = 5.0  # seconds a subscription record may wait: a burst shares a commit

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None:
        """A kept subscription, so its id survives a restart (committed within
        :attr:`record_window`; one lost to a power cut before is made anew)."""
        self.commits.pending.subscriptions.append((sub_id, realm, uri, match, created))
        self.commits.within(self.record_window)

    def remove_subscription(self, sub_id: int) -> None:
        """A kept subscription that is forgotten (committed with the next batch)."""
        self.commits.pending.forgotten.append(("DELETE FROM subscriptions WHERE id = ?", (sub_id,)))
        self.commits.within(self.record_window)

    def forget_retained(self, pub: StoredPublication) -> None:
        """A retained slot no longer kept (a bound was lowered, or it made room for another):
        ``pub`` and anything older in it, not a newer publication of the slot (one in the
        same batch included); committed with the next batch."""
        self.commits.pending.forgotten.append((
            "DELETE FROM retained WHERE realm = ? AND topic = ? AND audience_key = ?"
            " AND seq <= ?", (*pub.slot, pub.seq)))
        forgotten = self.commits.pending.forgotten_slots
        forgotten[pub.slot] = max(pub.seq, forgotten.get(pub.slot, 0))
        kept = self._state.retained.get(pub.slot)
        if kept is not None and kept.seq <= pub.seq:
            del self._state.retained[pub.slot]
        self.commits.within(self.record_window)

    def add_anchor(self, anchor: Anchor, after_seq: int | None = None) -> None:
        """A clock anchor for the seqs after ``after_seq`` (default: the last one assigned),
        committed with the publication that noticed it (appended next)."""
        self.commits.pending.anchors.append((anchor, self.next_seq - 1 if after_seq is None
                                      else after_seq))

    @property
    def commit_latencies(self) -> list[float]:
        """Seconds, recent commits (for metrics)."""
        return self.commits.latencies

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        await self.commits.flush()

    def _fail(self, batch: Pending, e: Exception, retry_retained: bool = True) -> None:
        self.failed_writes += len(batch.publications)
        error = StorageError(f"the store could not write: {e}")
        for w in batch.waiters:
            if not w.done():
                w.set_exception(error)
                w.exception()  # a waiter nobody awaits must not log "never retrieved"
        self._record_loss(batch, str(e), retry_retained)

    def _record_loss(self, batch: Pending, reason: str, retry_retained: bool) -> None:
        """Publications that failed to store are recorded as a gap (retried with the next
        batch, so the record survives once the disk has room again)."""
        lost = [p for p in batch.publications if p.history_rule is not None]
        if lost:
            self.commits.pending.gaps.append(Gap(lost[0].realm, None, lost[0].seq, lost[-1].seq,
                                          len(lost), f"write failed: {reason}"))
        # The router already serves these retained values: keep trying to store them.
        if retry_retained:
            again = [dataclasses.replace(p, history_rule=None) for p in batch.publications
                     if p.retain]
            self.commits.pending.publications.extend(again)
            retried = sum(p.size for p in again)
            self.commits.pending.size += retried
            self.queued_bytes += retried
        self.commits.pending.subscriptions.extend(batch.subscriptions)
        self.commits.pending.forgotten.extend(batch.forgotten)
        forgotten = self.commits.pending.forgotten_slots
        for key, seq in batch.forgotten_slots.items():
            forgotten[key] = max(seq, forgotten.get(key, 0))
        self.commits.pending.anchors.extend(batch.anchors)
        self.commits.pending.gaps.extend(batch.gaps)

    async def _commit_counted(self, batch: Pending) -> None:
        """Commit, then take the batch's bytes off the queue (failed or not: what is retried
        is queued again); tell the shell once the queue is down to half its bound."""
        held = sum(p.size for p in batch.publications)
        try:
            await self._commit(batch)
        finally:
            self.queued_bytes -= held
            if self.queued_bytes <= self.max_queue_bytes // 2 and self.on_drained is not None:
                self.on_drained()

    async def _commit(self, batch: Pending) -> None:
        async with self._transaction:
            await self._commit_locked(batch)

    async def _commit_locked(self, batch: Pending) -> None:
        await self._writer.run(self._commit_batch, batch)

    # the writer thread: the batch is no longer touched by the event loop

    def _commit_batch(self, batch: Pending) -> None:
        db = self._writer.db
        state = self._state
        new_topics: dict[tuple[str, str], int] = {}
        rows, slots = self._rows.batch(batch.publications, new_topics)
        for key, seq in batch.forgotten_slots.items():  # forgotten after it was published
            if key in slots and slots[key].seq <= seq:
                del slots[key]
        counts = Counter((p.realm, p.history_rule) for p in batch.publications
                         if p.history_rule is not None)
        top = max(state.top, max((p.seq for p in batch.publications), default=0))
        write_back = (state.rows + len(batch.publications) >= self.write_back_rows
                      or time.monotonic() - state.written >= self.write_back_interval)
        if write_back:
            rows += self._rows.slots({**state.retained, **slots})
        if len(rows) <= MAX_BATCH_ROWS and not batch.has_records() and not write_back:
            insert_batch(db, rows)  # autocommit: the usual case, one statement
        else:
            with transaction(db):
                for start in range(0, len(rows), MAX_BATCH_ROWS):
                    insert_batch(db, rows[start:start + MAX_BATCH_ROWS])
                _write_records(db, batch)
                if write_back:
                    put_meta(db, "state", encode_state(top, state.counts + counts))
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
        if used_bytes(db) <= max_bytes and all(
                counts[(r.realm, r.index)] - r.max_events < self.prune_budget for r in rules):
            return
        gaps, _ = self._pruner.drop(db, rules, max_bytes, 0, False,
                                    read_meta_int(db, "synced_seq") or 0, self.prune_budget)
        for g in gaps:  # (what is left over goes with the next commit's check)
            log.warning("dropped %d events (seq %s..%s) to stay within %s", g.count,
                        g.first_seq, g.last_seq, g.reason)

    def _write_back_at_close(self) -> None:
        """The state, and every seq handed out, stored or not, so none is ever reused."""
        db = self._writer.db
        state = self._state
        with transaction(db):
            rows = self._rows.slots(state.retained)
            for start in range(0, len(rows), MAX_BATCH_ROWS):
                insert_batch(db, rows[start:start + MAX_BATCH_ROWS])
            put_meta(db, "state", encode_state(state.top, state.counts))
            db.execute(RAISE_META, ("highest_seq", self.next_seq - 1))
        state.retained, state.seq, state.rows = {}, state.top, 0

    # -- bounds --------------------------------------------------------------------------

    async def set_synced_seq(self, seq: int) -> None:
        """Everything up to ``seq`` has reached the central sink (the uploader says so)."""
        async with self._transaction:
            await self._writer.run(fetch_all, self._writer.db, RAISE_META, ("synced_seq", seq))

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
                        await self.reader.load_subscriptions(), await self.reader.load_retained(),
                        self.topics.names())


Store = StoreWriter  # the name the shell, tests and bench import


# -- the writer thread's side: plain sqlite3 on the writing connection ------------------------


def _open_writer(writer: WriterThread, path: Path, seq_floor: int
                 ) -> tuple[StoreState, Topics, bytes, int, Damage]:
    """Open, migrate, and read what the store keeps in memory: its state, the topics, the
    publication id key (made with a new database) and the last seq with a random id; and
    the damaged rows these reads left out."""
    writer.connect(path)
    db = reading(writer.db)
    configure(db)
    migrate(db, path)
    for statement in BATCH_SCHEMA:  # TEMP: this connection's, not the file's
        db.execute(statement)
    damage = Damage()
    topics = Topics.load(db, damage)
    state = StoreState.load(db, topics, damage)
    state.top = highest_seq(db, damage)
    if state.top < seq_floor:
        log.warning("%s holds seqs up to %d only, but seqs up to %d were used (shipped "
                    "upstream): new ones start after %d", path, state.top, seq_floor, seq_floor)
        db.execute(RAISE_META, ("highest_seq", seq_floor))
        state.top = seq_floor
    key = _publication_key(db, damage)
    return state, topics, key, read_meta_int(db, "legacy_publication_seq", damage) or 0, damage


def _publication_key(db: sqlite3.Connection, damage: Damage) -> bytes:
    """The key of the publication ids (formats.publication_ids), made with a new database.
    A damaged one is made anew: stored rows keep the ids they were sent with, but those can
    no longer be looked up (get_events with after_publication...)."""
    stored = read_meta(db, "publication_key")
    if stored is not None:
        with contextlib.suppress(TypeError, ValueError):
            if len(key := bytes.fromhex(stored)) == 16:
                return key
        damage.found("meta", "key publication_key", f"value holds {describe(stored)}, not a key:"
                     f" a new one is made, and the stored publications' ids cannot be looked"
                     f" up any more")
    key = new_key()
    put_meta(db, "publication_key", key.hex())
    return key


def _write_records(db: sqlite3.Connection, batch: Pending) -> None:
    """A batch's records besides publications: subscriptions, deletions, anchors, gaps."""
    if batch.subscriptions:  # replacing a stored row of the same (realm, uri, match):
        db.executemany(  # one the router could not read (damaged) and made anew
            "INSERT OR REPLACE INTO subscriptions (id, realm, uri, match, created)"
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
        insert_gaps(db, batch.gaps)
