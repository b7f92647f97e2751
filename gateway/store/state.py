"""What the store keeps of its history in memory: the topics and their ids (:class:`Topics`),
the rows per rule and the retained slots not yet written back (:class:`_State`)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cairn.gateway.patterns import matches
from cairn.gateway.publication import Slot, StoredPublication
from cairn.gateway.store.schema import _STORED_ROW


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
