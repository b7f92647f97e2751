"""The store's reading connection (:class:`StoreReader`): history pages, the status summary
and what a restart brings back."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

import aiosqlite

from cairn.base.clock_readings import rfc3339
from cairn.formats.publication_ids import PublicationIds
from cairn.gateway.core.patterns import matches
from cairn.gateway.core.publication import (
    HistoryRead,
    ReadAbandoned,
    ReadTimeout,
    StoredPublication,
    UnknownPublication,
    audience_allows,
    decode_object,
    decode_payload,
)
from cairn.gateway.store.damage import Damage, Shape, Unreadable, decoded
from cairn.gateway.store.schema import (
    IN_TOPICS,
    LEGACY_SEQ_OF_PUBLICATION,
    RETAINED,
    SUBSCRIPTION,
    int_value,
)
from cairn.gateway.store.state import StoreState, Topics, retained_of

T = TypeVar("T")


def _never() -> bool:
    return False


def eligible(audience_json: bytes | str | None, authid: str | None,
             authrole: str | None) -> bool:
    """audience_allows over the stored JSON: registered as an SQL function for history.
    An audience that cannot be decoded lets the row through, to be left out as damaged."""
    try:
        audience = decode_object(audience_json.decode() if isinstance(audience_json, bytes)
                                 else audience_json)
    except ValueError:
        return True
    return audience_allows(audience or None, authid, authrole)


# a row of a history page: what get_events sends of it, the topic and audience to check them
PAGE_ROW = Shape.of("s.seq, p.publication, s.wall_ms, p.details, p.payload, p.topic,"
                    " p.audience", "iiiSbsS")


def _page_row(row: Sequence[Any]) -> tuple[Any, ...]:
    seq, publication, wall_ms, details, payload, _, audience = row
    decode_object(audience)
    return (seq, publication, wall_ms, decode_object(details), *decode_payload(payload))


class StoreReader:
    """The store's reading connection (aiosqlite, query-only): one read at a time, each
    interrupted at its deadline or as soon as nobody waits for it; history pages, the status
    summary and what a restart brings back. It shares the writer's in-memory view of the
    history (the topics, the counts per rule, the retained slots not yet written back)."""

    query_timeout = 60.0  # s: any read on the reader connection is interrupted past it

    def __init__(self, reader: aiosqlite.Connection, state: StoreState, topics: Topics,
                 publication_ids: PublicationIds, legacy_seq: int,
                 damage: Damage | None = None) -> None:
        self._reader = reader
        self.damage = damage or Damage()  # the rows left out, opening the store included
        self._state = state
        self.topics = topics
        self.publication_ids = publication_ids
        self._legacy_sql = (LEGACY_SEQ_OF_PUBLICATION.format(legacy=legacy_seq)
                            if legacy_seq else None)
        self._reading = asyncio.Lock()
        self._read_deadline = math.inf
        self._read_abandoned: Callable[[], bool] = _never

    async def close(self) -> None:
        await self._reader.close()

    async def synced_seq(self) -> int:
        rows = await self.query("SELECT value FROM meta WHERE key = 'synced_seq'", ())
        return int_value("synced_seq", rows[0][0] if rows else None, self.damage) or 0

    async def gaps(self) -> list[tuple[Any, ...]]:
        return await self.query(
            "SELECT realm, rule, first_seq, last_seq, count, reason, wall_ms FROM gaps "
            "ORDER BY id", ())

    async def load_subscriptions(self) -> list[tuple[int, str, str, str, str]]:
        """The kept subscriptions (id, realm, uri, match, created), oldest first. A damaged
        one is left out: the router makes its subscription anew, with a new id."""
        rows = await self.query(f"SELECT {SUBSCRIPTION.select} FROM subscriptions"
                                f" ORDER BY created, id", ())
        return [row for row in rows if self._readable("subscriptions", f"id {row[0]}",
                                                      SUBSCRIPTION, row, tuple) is not None]

    async def load_retained(self) -> list[StoredPublication]:
        """Every retained slot, from the retained table and the stored publications newer
        than it, in receive order. A damaged row is left out: the topic has none until its
        next publication (or the older one history kept, not yet written back)."""
        rows = await self.query(f"SELECT rowid, {RETAINED.select} FROM retained ORDER BY seq",
                                ())
        slots = {}
        for rowid, *row in rows:
            where = f"rowid {rowid}" + (f", topic {row[3]}" if type(row[3]) is str else "")
            pub = self._readable("retained", where, RETAINED, row, retained_of)
            if pub is not None:
                slots[pub.slot] = pub
        for key, pub in self._state.retained.items():
            if key not in slots or pub.seq > slots[key].seq:
                slots[key] = pub
        return sorted(slots.values(), key=lambda p: p.seq)

    def _readable(self, table: str, key: Hashable, shape: Shape, row: Sequence[Any],
                  decode: Callable[[Sequence[Any]], T]) -> T | None:
        """``decode(row)``, or None for a damaged row (counted in :attr:`damage`)."""
        try:
            return decoded(shape, row, decode)
        except Unreadable as e:
            self.damage.found(table, key, str(e))
            return None

    async def query(self, sql: str, params: Iterable[Any], timeout: float | None = None,
                    abandoned: Callable[[], bool] | None = None) -> list[tuple[Any, ...]]:
        """Rows of a read; past ``timeout`` seconds (default :attr:`query_timeout`) SQLite
        interrupts it (ReadTimeout), and as soon as ``abandoned()`` is true (ReadAbandoned:
        nobody waits for the answer any more). One read at a time, so both are its own."""
        async with self._reading:
            self._read_deadline = time.monotonic() + (timeout or self.query_timeout)
            self._read_abandoned = abandoned or _never
            try:
                # fetched whole on the reader's thread: a cursor handed back to this task
                # would keep its read snapshot open (and the WAL from being checkpointed)
                # for as long as a cancelled caller's traceback holds it
                return [tuple(row) for row in
                        await self._reader.execute_fetchall(sql, tuple(params))]
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
        ends = [await self.query(f"SELECT seq, wall_ms FROM history_scan WHERE {IN_TOPICS}"
                                 f" ORDER BY seq {order} LIMIT 1", (topics,))
                if count else [] for order in ("ASC", "DESC")]
        (first, oldest), (last, newest) = [end[0] if end else (None, None) for end in ends]
        oldest, newest = (ms if type(ms) is int else None for ms in (oldest, newest))
        (gaps, dropped), = await self.query(
            "SELECT COUNT(*), COALESCE(SUM(count), 0) FROM gaps WHERE (realm = ? OR realm IS"
            " NULL) AND typeof(count) = 'integer'", (realm,))
        (anchors,), = await self.query(
            "SELECT COUNT(*) FROM anchors WHERE reason = 'step'", ())
        return {"bytes": await self.size_bytes(), "events": count,
                "first_seq": first, "last_seq": last, "synced_seq": await self.synced_seq(),
                "oldest": rfc3339(oldest) if oldest is not None else None,
                "newest": rfc3339(newest) if newest is not None else None,
                "gaps": gaps, "dropped_events": dropped, "clock_steps": anchors}

    async def health_figures(self) -> dict[str, Any]:
        """What the router's health records add to :meth:`summary`: history not yet synced
        (how many rows, the wall clock of the oldest) and the last step of the clock."""
        synced = await self.synced_seq()
        (unsynced, oldest), = await self.query(
            "SELECT COUNT(*), (SELECT wall_ms FROM history_scan WHERE seq > ? ORDER BY seq"
            " LIMIT 1) FROM history_scan WHERE seq > ?", (synced, synced))
        step = await self.query(
            "SELECT wall_ns, boottime_ns, offset_before_ns FROM anchors WHERE reason = 'step'"
            " ORDER BY id DESC LIMIT 1", ())
        last_step = None
        if step:
            wall_ns, boottime_ns, before_ns = step[0]
            last_step = {"at": rfc3339(wall_ns // 1_000_000),
                         "by_s": round((wall_ns - boottime_ns - before_ns) / 1e9, 3)
                         if before_ns is not None else None}
        return {"unsynced_events": unsynced, "oldest_unsynced_ms": oldest,
                "last_clock_step": last_step}

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
        authrole) was eligible to receive, decoded: (seq, publication, wall_ms, details, args,
        kwargs); None in the place of a row that cannot be decoded (counted in
        :attr:`damage`). Walks history_scan in seq order and reads only the rows that match."""
        if not topics:
            return []
        where = [f"s.{IN_TOPICS}" if len(topics) > 1 else "s.topic = ?"]
        params: list[Any] = [json.dumps(topics) if len(topics) > 1 else topics[0]]
        for column, op, value in [*conditions, ("seq", "<" if reverse else ">", beyond)]:
            assert column in ("seq", "wall_ms") and op in ("<", "<=", ">", ">="), (column, op)
            where.append(f"s.{column} {op} ?")
            params.append(value)
        # (as a blob: a function given text that is not UTF-8 fails the whole query)
        where.append("(p.audience IS NULL OR eligible(CAST(p.audience AS BLOB), ?, ?))")
        rows = await self.query(
            f"SELECT {PAGE_ROW.select}"
            f" FROM history_scan AS s CROSS JOIN publications AS p ON p.seq = s.seq"
            f" WHERE {' AND '.join(where)} ORDER BY s.seq {'DESC' if reverse else 'ASC'}"
            f" LIMIT ?", [*params, *caller, limit], timeout, abandoned)
        return [self._readable("publications", f"seq {row[0]}", PAGE_ROW, row, _page_row)
                for row in rows]

    async def size_bytes(self) -> int:
        rows = await self.query("SELECT page_count * page_size FROM pragma_page_count(), "
                                "pragma_page_size()", ())
        return int(rows[0][0]) if rows else 0
