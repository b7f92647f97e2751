"""Event Retention: the last-known value of every topic, one slot per audience.

A plain retained publish fills the slot every subscriber is eligible for; a publish with
authid/authrole black/white lists fills the slot of that audience. A subscriber asking for
``get_retained`` gets, per matching topic, the most recent slot (by receive order) it is
eligible for, and never one it is not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from autobahn.wamp import message as m

from cairn.gateway.config import Limits
from cairn.gateway.core import Session
from cairn.gateway.patterns import matches
from cairn.gateway.publication import StoredPublication, audience_allows


def session_eligible(pub: StoredPublication, session: Session) -> bool:
    return audience_allows(pub.audience, session.authid, session.authrole)


class RetainedEvent:
    """The EVENT carrying a retained publication, serialized from pieces cached on the
    publication: the publication id, details and payload are encoded once per serializer and
    pattern-ness, and each subscriber costs two small integers and a join. A dashboard asking
    for 10,000 retained topics would otherwise pay for 10,000 autobahn Event objects."""

    MESSAGE_TYPE = m.Event.MESSAGE_TYPE
    __slots__ = ("subscription", "body", "cache")

    def __init__(self, subscription: int, pub: StoredPublication, pattern: bool) -> None:
        self.subscription = subscription
        self.cache = pub.events.setdefault(pattern, {})
        self.body = self.cache.get("body")
        if self.body is None:
            details: dict[str, Any] = {"retained": True}
            if pattern:
                details["topic"] = pub.topic
            for key in ("publisher", "publisher_authid", "publisher_authrole"):
                if pub.details.get(key) is not None:
                    details[key] = pub.details[key]
            body: list[Any] = [pub.publication, details]
            if pub.kwargs:
                body += [pub.args or [], pub.kwargs]
            elif pub.args:
                body.append(pub.args)
            self.body = self.cache["body"] = body

    def serialize(self, serializer: Any) -> bytes:
        """Called by autobahn's transport serializer with its object serializer."""
        name = serializer.NAME
        key = (name, self.subscription)
        whole = self.cache.get(key)  # the same subscription again: the bytes as they were
        if whole is not None:
            return whole
        tail = self.cache.get(name)
        if tail is None:
            tail = self.cache[name] = [serializer.serialize(part) for part in self.body]
        parts = [serializer.serialize(self.MESSAGE_TYPE), serializer.serialize(self.subscription),
                 *tail]
        if name == "json":
            whole = b"[" + b",".join(parts) + b"]"
        elif name == "msgpack":
            whole = bytes([0x90 | len(parts)]) + b"".join(parts)  # fixarray
        elif name == "cbor":
            whole = bytes([0x80 | len(parts)]) + b"".join(parts)  # array of len(parts)
        else:
            return serializer.serialize([self.MESSAGE_TYPE, self.subscription, *self.body])
        if len(self.cache) > 16:  # a handful of subscriptions share most retained events
            for stale in [k for k in self.cache if isinstance(k, tuple)]:
                del self.cache[stale]
        self.cache[key] = whole
        return whole


class Retention:
    """The retained slots of a realm, bounded in number, per topic and in payload bytes
    (``max_retained``, ``max_retained_per_topic``, ``max_retained_bytes``): a new slot
    beyond a bound is refused; a slot that exists can always take a newer publication."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        # topic -> audience key -> publication
        self._slots: dict[str, dict[str, StoredPublication]] = {}
        self.count = 0
        self.bytes = 0

    def holds(self, pub: StoredPublication) -> bool:
        """Is ``pub``'s slot (topic and audience) taken?"""
        return pub.audience_key in self._slots.get(pub.topic, {})

    def put(self, pub: StoredPublication) -> str | None:
        """Make ``pub`` its slot's retained publication; or the bound that refuses it (the
        limit's name and why)."""
        audiences = self._slots.get(pub.topic)
        old = audiences.get(pub.audience_key) if audiences else None
        grows = pub.size - (old.size if old is not None else 0)
        limits = self.limits
        if old is None:
            if self.count >= limits.max_retained:
                return f"max_retained: {self.count} retained slots exist"
            if audiences and len(audiences) >= limits.max_retained_per_topic:
                return (f"max_retained_per_topic: {pub.topic!r} has {len(audiences)} "
                        f"retained audiences")
        if grows > 0 and self.bytes + grows > limits.max_retained_bytes:
            return f"max_retained_bytes: retained payloads hold {self.bytes} bytes"
        if audiences is None:
            audiences = self._slots[pub.topic] = {}
        audiences[pub.audience_key] = pub
        self.count += old is None
        self.bytes += grows
        return None

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

    def newest(self, uri: str, match: str) -> list[StoredPublication]:
        """Per topic matching (uri, match), its newest retained publication whatever its
        audience: what the router itself reports on (gateway.health)."""
        return [max(self._slots[t].values(), key=lambda p: p.seq)
                for t in self._topics(uri, match)]

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

