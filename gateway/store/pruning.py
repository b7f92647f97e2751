"""Keeping history within its bounds: the rules (:class:`PruneRule`), the drops, each recorded
as a :class:`Gap`, and giving freed pages back to the file system, on the writer thread."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cairn.gateway.store.rows import MAX_BATCH_ROWS, BatchRows, insert_batch
from cairn.gateway.store.schema import (
    IN_TOPICS,
    RAISE_META,
    encode_state,
    fetch_all,
    highest_seq,
    put_meta,
    transaction,
)
from cairn.gateway.store.state import StoreState, Topics


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


class Pruner:
    """Keeps history within its bounds on the writer thread: drops rows a transaction at a
    time (each drop recorded as a gap) and gives the freed pages back to the file system in
    steps that take about VACUUM_STEP_SECONDS, so a commit never waits long behind it."""

    vacuum_pages = 64  # pages one shrink step gives back; paced to VACUUM_STEP_SECONDS

    def __init__(self, state: StoreState, topics: Topics, rows: BatchRows) -> None:
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
        if not aged and all(n <= 0 for n in over.values()) and used_bytes(db) <= max_bytes:
            return [], False
        gaps: list[Gap] = []
        dropped: Counter[tuple[str, int]] = Counter()
        more = False
        with transaction(db):
            db.execute(RAISE_META, ("highest_seq", highest_seq(db)))  # before deleting any
            for rule in rules:
                where, params = f"s.rule = ? AND s.{IN_TOPICS}", [rule.index, realms[rule.realm]]
                if over[rule] > 0:
                    gaps += _drop(db, where, params, min(over[rule], budget), synced, rule,
                                  "max_events", dropped, self.topics)
                    more = more or over[rule] > budget
                if rule in aged:
                    young = aged[rule]
                    age_where = (f"{where} AND s.clock_synced = 1 AND s.wall_ms < ?"
                                 + (" AND s.seq < ?" if young is not None else ""))
                    age_params = [*params, now_ms - rule.max_age_ms,
                                  *([young] if young is not None else [])]
                    aged_gaps = _drop(db, age_where, age_params, budget, synced, rule,
                                      "max_age", dropped, self.topics)
                    more = more or sum(g.count for g in aged_gaps) == budget
                    gaps += aged_gaps
            while (used := used_bytes(db)) > max_bytes:
                if sum(dropped.values()) >= budget:
                    more = True
                    break
                rows = max(sum(state.counts.values()) - sum(dropped.values()), 1)
                extra = _drop(db, "1", [], _rows_over(used, max_bytes, rows), synced, None,
                              "max_store_bytes", dropped, self.topics)
                if not extra:
                    break
                gaps += extra
            insert_gaps(db, gaps)
            counts = state.counts - dropped
            rows = self.rows.slots(state.retained)  # the rows dropped may be their only copy
            for start in range(0, len(rows), MAX_BATCH_ROWS):
                insert_batch(db, rows[start:start + MAX_BATCH_ROWS])
            put_meta(db, "state", encode_state(state.top, counts))
        state.counts, state.retained, state.seq, state.rows = counts, {}, state.top, 0
        state.written = time.monotonic()
        return gaps, more

    def shrink_step(self, db: sqlite3.Connection) -> bool:
        """After a big drop (a storm, a lowered bound), give ``pages`` freed pages back to
        the file system; True while more are left. Small drops are reused by new rows.
        (executescript steps the pragma to the end: one execute() step frees a single page.)"""
        pages = self.vacuum_pages
        (free, total), = fetch_all(db, "SELECT * FROM pragma_freelist_count(), pragma_page_count()")
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


def insert_gaps(db: sqlite3.Connection, gaps: list[Gap]) -> None:
    now = int(time.time() * 1000)
    db.executemany(
        "INSERT INTO gaps (realm, rule, first_seq, last_seq, count, reason, wall_ms)"
        " VALUES (?,?,?,?,?,?,?)",
        [(g.realm, g.rule, g.first_seq, g.last_seq, g.count, g.reason, now) for g in gaps])


def _has_old(db: sqlite3.Connection, topics: str, rule: PruneRule, cutoff_ms: int) -> bool:
    """Is the oldest event of ``rule`` (of the realm's ``topics``, JSON) stamped by a
    synchronized clock older than the cutoff? (The walk stops at the first such event.)"""
    row = db.execute(f"SELECT wall_ms FROM history_scan WHERE rule = ? AND {IN_TOPICS} AND"
                     f" clock_synced = 1 ORDER BY seq LIMIT 1", (rule.index, topics)).fetchone()
    return row is not None and type(row[0]) is int and row[0] < cutoff_ms


def _first_young(db: sqlite3.Connection, topics: str, rule: PruneRule,
                 cutoff_ms: int) -> int | None:
    """The seq of the first event of ``rule`` with a synchronized timestamp at or after the
    cutoff: max_age drops the old ones before it."""
    row = db.execute(f"SELECT seq FROM history_scan WHERE rule = ? AND {IN_TOPICS} AND"
                     f" clock_synced = 1 AND wall_ms >= ? ORDER BY seq LIMIT 1",
                     (rule.index, topics, cutoff_ms)).fetchone()
    return row[0] if row else None


_DROP_CHUNK = 10_000
VACUUM_STEP_SECONDS = 0.05  # how long one shrink step may hold the writer


def _drop(db: sqlite3.Connection, where: str, params: list[Any], count: int | None,
          synced: int, rule: PruneRule | None, reason: str,
          dropped: Counter[tuple[str, int]], topics: Topics) -> list[Gap]:
    """Delete the ``count`` (None: all) oldest rows matching ``where`` (on history_scan),
    synced ones first, in seq order; count them by (realm, rule) in ``dropped``."""
    seqs: list[int] = []
    for synced_part in (f"s.seq <= {int(synced)}", f"s.seq > {int(synced)}"):
        while count is None or len(seqs) < count:
            want = _DROP_CHUNK if count is None else min(_DROP_CHUNK, count - len(seqs))
            victims = fetch_all(db, f"SELECT s.seq, s.topic, s.rule FROM history_scan AS s"
                                 f" WHERE {synced_part} AND {where} ORDER BY s.seq LIMIT ?",
                                 [*params, want])
            doomed = [(seq,) for seq, _, _ in victims]
            db.executemany("DELETE FROM publications WHERE seq = ?", doomed)
            db.executemany("DELETE FROM history_scan WHERE seq = ?", doomed)
            seqs += [seq for seq, _, _ in victims]
            # counted by the realm in memory (the stored name of a topic may be damaged), as
            # StoreState.load counts them
            dropped.update((realm, index) for _, topic, index in victims
                           if (realm := topics.realm_of(topic)) is not None)
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


def used_bytes(db: sqlite3.Connection) -> int:
    (pages, free, size), = fetch_all(
        db, "SELECT * FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()")
    return (pages - free) * size
