"""What the store keeps of its history in memory: the topics and their ids (:class:`Topics`),
the rows per rule and the retained slots not yet written back (:class:`StoreState`)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cairn.gateway.core.patterns import matches
from cairn.gateway.core.publication import Slot, StoredPublication
from cairn.gateway.store.damage import Damage, Unreadable, decoded, describe, why
from cairn.gateway.store.schema import STORED, TOPIC


def _names_from_history(db: sqlite3.Connection, damaged: list[int],
                        taken: set[tuple[str, str]]) -> list[tuple[int, str, str]]:
    """(id, realm, topic) of damaged topic rows, each from its oldest history row that can
    be read (one walk of history_scan, up to the last one named; a name another row holds
    stays with it)."""
    found, wanted = [], set(damaged)
    for topic_id, realm, topic in db.execute(
            "SELECT s.topic, p.realm, p.topic FROM history_scan AS s CROSS JOIN publications"
            " AS p ON p.seq = s.seq WHERE s.topic IN (SELECT value FROM json_each(?))"
            " ORDER BY s.seq", (json.dumps(damaged),)):
        if topic_id in wanted and type(realm) is str and type(topic) is str:
            wanted.discard(topic_id)
            if (realm, topic) not in taken:
                taken.add((realm, topic))
                found.append((topic_id, realm, topic))
            if not wanted:
                break
    return found


class Topics:
    """Every (realm, topic) stored in history, with the small id history_scan names it by.
    Held in memory (hundreds or thousands of topics; the router refuses clients new ones past
    ``max_history_topics``, gateway.core.history_topics): a subscription's pattern is matched
    against these names once per query instead of against every row. Only the writer thread
    adds, after a commit, by replacing the dict, so the event loop never reads one
    half-changed."""

    def __init__(self, rows: Iterable[tuple[int, str, str]] = (), next_id: int = 1) -> None:
        self._ids: dict[tuple[str, str], int] = {(realm, topic): i for i, realm, topic in rows}
        self._realms = {i: realm for (realm, _), i in self._ids.items()}
        self.next_id = max(next_id, max(self._ids.values(), default=0) + 1)

    @classmethod
    def load(cls, db: sqlite3.Connection, damage: Damage) -> Topics:
        """The topics table. A damaged row is left out (its id stays taken); its name is
        taken from a history row of it that can be read, so its history stays reachable."""
        rows, damaged, top = [], [], 0
        for row in db.execute(f"SELECT {TOPIC.select} FROM topics"):
            top = max(top, row[0])  # the id: the rowid, an integer
            fault = TOPIC.fault(row)
            if fault is None:
                rows.append(row)
            else:
                damage.found("topics", f"id {row[0]}", fault)
                damaged.append(row[0])
        if damaged:
            rows += _names_from_history(db, damaged, {(r, t) for _, r, t in rows})
        return cls(rows, top + 1)

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, realm: str, topic: str) -> int | None:
        return self._ids.get((realm, topic))

    def realm_of(self, topic_id: int) -> str | None:
        return self._realms.get(topic_id)

    def add(self, new: dict[tuple[str, str], int]) -> None:
        if new:
            self._ids = {**self._ids, **new}
            self._realms = {**self._realms, **{i: realm for (realm, _), i in new.items()}}
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

    def names(self) -> list[tuple[str, str]]:
        """Every (realm, topic)."""
        return list(self._ids)

    def of_realm(self, realm: str) -> list[int]:
        return [i for (r, _), i in self._ids.items() if r == realm]


@dataclass
class StoreState:
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

    @classmethod
    def load(cls, db: sqlite3.Connection, topics: Topics, damage: Damage) -> StoreState:
        """From the meta value ``state`` and the rows after its seq. A state that cannot be
        read is rebuilt from all the rows (as a store without one is)."""
        state = cls()
        row = db.execute("SELECT value FROM meta WHERE key = 'state'").fetchone()
        if row:
            try:
                state.seq, state.counts = decode_state(row[0])
            except (ValueError, TypeError, KeyError) as e:
                damage.found("meta", "key state", f"{describe(row[0])}: {why(e)}")
                state.seq, state.counts = 0, Counter()
        for topic, rule, n in db.execute(
                "SELECT topic, rule, COUNT(*) FROM history_scan WHERE seq > ?"
                " GROUP BY topic, rule", (state.seq,)):
            realm = topics.realm_of(topic) if type(topic) is int else None
            if realm is not None and type(rule) is int:
                state.counts[(realm, rule)] += n
        for row in db.execute(  # the newest of each slot (audience: its JSON, same key)
                f"SELECT {STORED.select} FROM publications WHERE seq IN (SELECT MAX(seq) FROM"
                f" publications WHERE seq > ? AND retain = 1 GROUP BY realm, topic, audience)"
                f" ORDER BY seq", (state.seq,)):
            try:
                pub = decoded(STORED, row, retained_of)
            except Unreadable as e:  # the slot keeps the retained table's value
                damage.found("publications", f"seq {row[0]}", str(e))
                continue
            state.retained[pub.slot] = pub
        state.top = state.seq
        return state


def retained_of(row: Sequence[Any]) -> StoredPublication:
    """A retained slot from a row of STORED (or RETAINED) columns."""
    return StoredPublication.from_row(row, retain=True)


def decode_state(value: object) -> tuple[int, Counter[tuple[str, int]]]:
    """The meta value ``state`` (see :func:`~.schema._encode_state`); ValueError, TypeError
    or KeyError when it is not one."""
    if type(value) is not str:
        raise TypeError("not text")
    data = json.loads(value)
    seq, counts = data["seq"], data["counts"]
    if type(seq) is not int or not isinstance(counts, list):
        raise TypeError("not a state")
    found: Counter[tuple[str, int]] = Counter()
    for realm, rule, n in counts:
        if type(realm) is not str or type(rule) is not int or type(n) is not int:
            raise TypeError(f"not a count: {[realm, rule, n]!r}"[:80])
        found[(realm, rule)] = n
    return seq, found
