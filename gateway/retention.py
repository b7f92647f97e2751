"""Event Retention: the last-known value of every topic, one slot per audience.

A plain retained publish fills the slot every subscriber is eligible for; a publish with
authid/authrole black/white lists fills the slot of that audience. A subscriber asking for
``get_retained`` gets, per matching topic, the most recent slot (by receive order) it is
eligible for, and never one it is not.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.core import Session
from gateway.patterns import matches
from gateway.store import StoredPublication, audience_allows


def session_eligible(pub: StoredPublication, session: Session) -> bool:
    return audience_allows(pub.audience, session.authid, session.authrole)


class Retention:
    def __init__(self) -> None:
        # topic -> audience key -> publication
        self._slots: dict[str, dict[str, StoredPublication]] = {}

    def put(self, pub: StoredPublication) -> None:
        self._slots.setdefault(pub.topic, {})[pub.audience_key] = pub

    def __len__(self) -> int:
        return len(self._slots)

    def _topics(self, uri: str, match: str) -> Iterator[str]:
        if match == "exact":
            if uri in self._slots:
                yield uri
            return
        for topic in self._slots:
            if matches(uri, match, topic):
                yield topic

    def for_subscriber(self, uri: str, match: str, session: Session) -> list[StoredPublication]:
        """Per matching topic, the newest retained publication ``session`` may see,
        in receive order."""
        found = []
        for topic in self._topics(uri, match):
            best = None
            for pub in self._slots[topic].values():
                if (best is None or pub.seq > best.seq) and session_eligible(pub, session):
                    best = pub
            if best is not None:
                found.append(best)
        found.sort(key=lambda p: p.seq)
        return found
