"""Event Retention: the last-known value of every topic, one slot per audience.

A plain retained publish fills the slot every subscriber is eligible for; a publish with
authid/authrole black/white lists fills the slot of that audience. A subscriber asking for
``get_retained`` gets, per matching topic, the most recent slot (by receive order) it is
eligible for, and never one it is not.

What the slots may hold, so that no client can turn them against the others
(``[router.limits]`` and ``[[realms.retention]]``):

- one retained payload is at most its retention rule's ``max_payload`` (topics under no
  rule: ``max_retained_payload``); a larger one is refused at publish;
- one session holds at most ``max_retained_per_session`` slots (a configured user: across
  its sessions), and as large a share of ``max_retained_bytes`` (a quarter by default), so
  one client cannot take the realm's slots;
- the realm holds at most ``max_retained`` slots, ``max_retained_per_topic`` audiences per
  topic and ``max_retained_bytes`` of payloads. When a new slot finds the realm full, slots
  of a lower standing than its own make room, lowest first and least recently published
  first; when there are none, it is refused:

  =========  ===================================================================
  standing   whose slot
  =========  ===================================================================
  0          anyone's on a topic no retention rule covers, but a driver's: goes first
  1          anyone's on a rule's topic (a sensor's), or a driver's elsewhere
  2          a driver's on a rule's topic: never evicted
  =========  ===================================================================

  The router's own records (its health, one slot per realm, on a topic no client may
  publish to) are outside these bounds and their counts, and never evicted.

  A driver is a configured user (an authid of ``[[realms.users]]`` with its role, which
  anonymous sessions cannot claim), or a session that came over a Unix socket (the
  device's own services: the socket is the router's user's and group's). What the store
  keeps tells only the first apart: a Unix-socket driver's slot restored after a restart
  has standing 1 until the driver publishes it again. A slot that exists always takes a
  newer publication.

What the router holds for a slot is its packed payload (``max_retained_bytes`` counts
those) and a small record; no decoded copy. A retained EVENT is encoded when it is sent;
the encoded parts of the retained ones are kept in a cache of at most
``max_retained_bytes // 16`` bytes (:class:`EncodedCache`), so dashboards that subscribe one
after the other share them; they go with their slot's publication.

A subscriber's retained events are a :class:`RetainedStream`: a cursor over the slots in
receive order, which the shell asks for the next event whenever the subscriber's connection
has room (gateway.shell.transport), so a subscription that matches many large retained values is
paced by the subscriber's reading, not pushed into its send buffer at once.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
from autobahn.wamp import message as m

from cairn.base.clock_readings import Reading, age_s, rfc3339
from cairn.formats import health
from cairn.gateway.core.config import HEALTH_TOPIC, Limits, RealmConfig
from cairn.gateway.core.patterns import FirstMatch, matches
from cairn.gateway.core.publication import StoredPublication, audience_allows
from cairn.gateway.core.session import Session, WampError

if TYPE_CHECKING:
    from cairn.gateway.core.auth import Authorizer

DRIVER = 2  # the standing of a driver's slot on a rule's topic: never evicted
OWN = 3  # the router's own slot: outside the bounds
# whom the router's own publications name as their publisher (formats.health)
OWN_AUTHID, OWN_AUTHROLE = health.OWN_AUTHID, health.OWN_AUTHROLE


def session_eligible(pub: StoredPublication, session: Session) -> bool:
    return audience_allows(pub.audience, session.authid, session.authrole)


class EncodedCache:
    """The encoded parts of retained EVENTs (publication id, details and payload, per
    serializer and pattern-ness), least recently used first out, at most ``limit`` bytes in
    all, each entry counted with what Python holds for it besides its bytes; a part larger
    than an eighth of that is not kept. A publication's parts go when its slot is replaced or
    removed (:meth:`forget`): dashboards coming and going while readings change would
    otherwise fill it with parts no one can ask for again."""

    ENTRY = 280  # bytes an entry costs besides its encoded bytes: key, value, int, node
    _KINDS = [(name, pattern) for name in ("json", "msgpack", "cbor") for pattern in (False, True)]

    def __init__(self, limit: int, retained: Callable[[int], bool] = lambda seq: True) -> None:
        self.limit = limit
        self._retained = retained  # whether a seq is still retained: parts of others go
        self.bytes = 0
        self._parts: OrderedDict[tuple[int, str, bool], tuple[int, bytes]] = OrderedDict()

    def get(self, key: tuple[int, str, bool]) -> tuple[int, bytes] | None:
        found = self._parts.get(key)
        if found is not None:
            self._parts.move_to_end(key)
        return found

    def put(self, key: tuple[int, str, bool], value: tuple[int, bytes]) -> None:
        size = len(value[1]) + self.ENTRY
        if size > self.limit // 8 or key in self._parts or not self._retained(key[0]):
            return  # (a stream still sending a publication replaced since)
        self._parts[key] = value
        self.bytes += size
        while self.bytes > self.limit:
            _, (_, dropped) = self._parts.popitem(last=False)
            self.bytes -= len(dropped) + self.ENTRY

    def forget(self, seq: int) -> None:
        """The publication ``seq`` is no longer retained."""
        if self._parts:
            for name, pattern in self._KINDS:
                found = self._parts.pop((seq, name, pattern), None)
                if found is not None:
                    self.bytes -= len(found[1]) + self.ENTRY


class RetainedEvent:
    """The EVENT carrying a retained publication. Its publication id, details and payload
    are encoded once per serializer while they stay in the cache; each subscriber then
    costs two small integers and a join."""

    MESSAGE_TYPE = m.Event.MESSAGE_TYPE
    __slots__ = ("subscription", "pub", "pattern", "cache")

    def __init__(self, subscription: int, pub: StoredPublication, pattern: bool,
                 cache: EncodedCache | None = None) -> None:
        self.subscription = subscription
        self.pub = pub
        self.pattern = pattern
        self.cache = cache

    @property
    def body(self) -> list[Any]:
        """[publication, details, args?, kwargs?], decoded from the packed payload."""
        pub = self.pub
        details: dict[str, Any] = {"retained": True}
        if self.pattern:
            details["topic"] = pub.topic
        for key in ("publisher", "publisher_authid", "publisher_authrole"):
            if pub.details.get(key) is not None:
                details[key] = pub.details[key]
        args, kwargs = msgpack.unpackb(pub.payload(), raw=False)
        body: list[Any] = [pub.publication, details]
        if kwargs:
            body += [args or [], kwargs]
        elif args:
            body.append(args)
        return body

    def serialize(self, serializer: Any) -> bytes:
        """Called by the transport with its object serializer."""
        name = serializer.NAME
        if name not in ("json", "msgpack", "cbor"):
            return serializer.serialize([self.MESSAGE_TYPE, self.subscription, *self.body])
        key = (self.pub.seq, name, self.pattern)
        cached = self.cache.get(key) if self.cache is not None else None
        if cached is None:
            parts = [serializer.serialize(part) for part in self.body]
            cached = (len(parts) + 2, (b"," if name == "json" else b"").join(parts))
            if self.cache is not None:
                self.cache.put(key, cached)
        count, tail = cached
        head = serializer.serialize(self.MESSAGE_TYPE), serializer.serialize(self.subscription)
        if name == "json":
            return b"[" + head[0] + b"," + head[1] + b"," + tail + b"]"
        array = 0x90 if name == "msgpack" else 0x80  # fixarray / CBOR array of count items
        return bytes([array | count]) + head[0] + head[1] + tail


class RetainedStream:
    """The retained events one SUBSCRIBE asked for, made one at a time: ``next()`` gives
    the next one (None when there are no more), in receive order, of the slots published
    before the SUBSCRIBE (a slot published again since then reaches the subscriber as a
    live event, after this stream). The router holds a cursor, not the events: the shell
    asks for each as the subscriber's connection has room for it (gateway.shell.transport)."""

    __slots__ = ("retention", "session", "subscription", "uri", "match", "subscribers",
                 "marker", "visible", "after", "before")

    def __init__(self, retention: Retention, session: Session, subscription: int, uri: str,
                 match: str, subscribers: dict[Session, Any],
                 visible: Callable[[str], bool] | None) -> None:
        self.retention = retention
        self.session = session
        self.subscription, self.uri, self.match = subscription, uri, match
        # the stream ends when the session leaves the subscription (its marker goes)
        self.subscribers, self.marker = subscribers, subscribers.get(session)
        self.visible = visible  # a pattern's topics: those the subscriber may receive
        self.after = 0  # the seq up to which the slots have been looked at
        self.before = retention.next_seq  # slots published from here on come live

    def next(self) -> RetainedEvent | None:
        if self.session.closed or self.subscribers.get(self.session, self) is not self.marker:
            return None
        pub = self.retention.next_retained(self)
        if pub is None:
            return None
        return RetainedEvent(self.subscription, pub, self.match != "exact",
                             self.retention.cache)

    def drain(self) -> list[RetainedEvent]:
        """Every event at once (a peer in memory, which reads as fast as it is written)."""
        events = []
        while (event := self.next()) is not None:
            events.append(event)
        return events


@dataclass(eq=False, slots=True)
class _Slot:
    pub: StoredPublication  # packed payload only (args and kwargs: None)
    size: int  # of its packed payload
    owner: Hashable  # whose share it counts in
    standing: int


def over_unix_socket(session: Session) -> bool:
    """Did ``session`` come over the Unix socket (the device's own services)?"""
    return str(session.transport.get("peer") or "").startswith("unix:")


class Retention:
    """The retained slots of a realm within their bounds (see the module's docstring)."""

    def __init__(self, limits: Limits | None = None, config: RealmConfig | None = None,
                 next_seq: Callable[[], int] | None = None) -> None:
        self.limits = limits = limits or Limits()
        config = config or RealmConfig("")
        self.rules = config.retention
        self.rule_for = FirstMatch([(r.uri, r.match) for r in self.rules])
        self._users = {u.authid: u.role for u in config.users}
        self._next_seq = next_seq or (lambda: 1 << 62)
        self._by_seq: dict[int, _Slot] = {}
        self.cache = EncodedCache(max(limits.max_retained_bytes // 16, 1),
                                  self._by_seq.__contains__)
        self._slots: dict[str, dict[str, _Slot]] = {}  # topic -> audience key -> slot
        # standings 0 and 1, least recently published first: who makes room
        self._evictable: tuple[dict[_Slot, None], ...] = ({}, {})
        self._evictable_bytes = [0, 0]
        self._held: Counter[Hashable] = Counter()  # slots per owner
        self._held_bytes: Counter[Hashable] = Counter()  # their payload bytes
        # an owner's share of the bytes: as its share of the slots
        self.share_bytes = limits.max_retained_bytes * min(
            limits.max_retained_per_session, limits.max_retained) // limits.max_retained
        self._seqs: list[int] = []  # every seq of _by_seq, ascending, and some gone since
        self.count = 0
        self.bytes = 0

    @property
    def next_seq(self) -> int:
        return self._next_seq()

    def __len__(self) -> int:
        return len(self._slots)

    def holds(self, pub: StoredPublication) -> bool:
        """Is ``pub``'s slot (topic and audience) taken?"""
        return pub.audience_key in self._slots.get(pub.topic, {})

    def _configured(self, pub: StoredPublication) -> bool:
        """Published by a configured user (its authid with its role)?"""
        return self.configured(pub.authid, pub.authrole)

    def configured(self, authid: str | None, authrole: str | None) -> bool:
        return authid is not None and self._users.get(authid) == authrole

    def _driver(self, pub: StoredPublication, session: Session | None) -> bool:
        """Published by a configured user, or by ``session`` over a Unix socket?"""
        return self._configured(pub) or (session is not None and over_unix_socket(session))

    def is_driver(self, session: Session) -> bool:
        """Is ``session`` a driver's: a configured user's, or one over the Unix socket?"""
        return self.configured(session.authid, session.authrole) or over_unix_socket(session)

    def standing(self, pub: StoredPublication, session: Session | None = None) -> int:
        """0, 1 or 2 (DRIVER): see the module's docstring. ``session``: its publisher, when
        it is the one publishing it now."""
        return (self.rule_for(pub.topic) is not None) + self._driver(pub, session)

    # -- publishing ------------------------------------------------------------------------

    def put(self, pub: StoredPublication, session: Session | None = None,
            evict: bool = True) -> tuple[str | None, list[StoredPublication]]:
        """Make ``pub`` (published by ``session``; None: restored from the store, which no
        session's share bounds) its slot's retained publication. Returns the bound that
        refused it (the limit's name, ": ", why), or None; and the slots that made room for
        it (gone: forget them in the store), which only a new slot of ``evict`` may take."""
        if pub.topic == HEALTH_TOPIC:  # the broker refuses clients there: the router's own,
            self._put_own(pub)           # also when restored from the store (no publisher)
            return None, []
        size = pub.size
        limits = self.limits
        rule = self.rule_for(pub.topic)
        limit = rule is not None and self.rules[rule].max_payload or limits.max_retained_payload
        if size > limit:
            where = "router.limits.max_retained_payload" if rule is None or \
                self.rules[rule].max_payload is None else \
                f"max_payload of the retention rule {self.rules[rule].uri!r}"
            return (f"max_retained_payload: its payload is {size} bytes, over the {limit} "
                    f"bytes a retained payload on {pub.topic!r} may have ({where})"), []
        audiences = self._slots.get(pub.topic)
        old = audiences.get(pub.audience_key) if audiences else None
        standing = (rule is not None) + self._driver(pub, session)
        if self._configured(pub):
            owner: Hashable = ("user", pub.authid)  # across its sessions
        else:
            owner = ("session", session.id) if session is not None else ("stored", pub.authid)
        if old is None:
            if session is not None and self._held[owner] >= limits.max_retained_per_session:
                return (f"max_retained_per_session: {pub.authid!r} holds "
                        f"{self._held[owner]} retained slots"), []
            if audiences and len(audiences) >= limits.max_retained_per_topic:
                return (f"max_retained_per_topic: {pub.topic!r} has {len(audiences)} "
                        f"retained audiences"), []
        grows = size - (old.size if old is not None else 0)
        adds = size if old is None or old.owner != owner else grows  # to the owner's bytes
        if session is not None and adds > 0 and self.share_bytes < limits.max_retained_bytes \
                and self._held_bytes[owner] + adds > self.share_bytes:
            return (f"max_retained_per_session: {pub.authid!r} holds "
                    f"{self._held_bytes[owner]} bytes of retained payloads (its share: "
                    f"{self.share_bytes})"), []
        slots_short = old is None and self.count >= limits.max_retained
        bytes_short = max(0, self.bytes + grows - limits.max_retained_bytes)
        evicted: list[StoredPublication] = []
        if slots_short or bytes_short:
            victims = self._victims(standing, slots_short, bytes_short, old) if evict else None
            if victims is None:
                if slots_short:
                    return f"max_retained: {self.count} retained slots exist", []
                return f"max_retained_bytes: retained payloads hold {self.bytes} bytes", []
            for victim in victims:
                self._remove(victim)
                evicted.append(victim.pub)
        if old is not None and (old.owner, old.standing) == (owner, standing):
            self._replace(old, _packed_only(pub), size)  # the usual case: a sensor's reading
            return None, evicted
        if old is not None:
            self._remove(old)
        self._add(_Slot(_packed_only(pub), size, owner, standing))
        return None, evicted

    def _put_own(self, pub: StoredPublication) -> None:
        size = pub.size  # packs the payload, before _packed_only drops the arguments
        old = self._slots.get(pub.topic, {}).get(pub.audience_key)
        if old is not None:
            self._replace(old, _packed_only(pub), size)
        else:
            self._add(_Slot(_packed_only(pub), size, OWN_AUTHID, OWN))

    def _victims(self, standing: int, slots_short: bool, bytes_short: int,
                 keep: _Slot | None) -> list[_Slot] | None:
        """The slots that go for a new one of ``standing``: of lower standings, the lowest
        and least recently published first; None when they would not make room."""
        ranks = range(standing)
        available = sum(self._evictable_bytes[r] for r in ranks)
        if keep is not None and keep.standing in ranks:
            available -= keep.size
        if available < bytes_short:
            return None
        victims: list[_Slot] = []
        freed = 0
        for rank in ranks:
            for slot in self._evictable[rank]:
                if slot is keep:
                    continue
                if freed >= bytes_short and (victims or not slots_short):
                    return victims
                victims.append(slot)
                freed += slot.size
        return victims if freed >= bytes_short and (victims or not slots_short) else None

    def _add(self, slot: _Slot) -> None:
        pub = slot.pub
        self._slots.setdefault(pub.topic, {})[pub.audience_key] = slot
        if slot.standing < DRIVER:
            self._evictable[slot.standing][slot] = None
            self._evictable_bytes[slot.standing] += slot.size
        self._held[slot.owner] += 1
        self._held_bytes[slot.owner] += slot.size
        self._index(slot)
        if slot.standing != OWN:
            self.count += 1
            self.bytes += slot.size

    def _replace(self, slot: _Slot, pub: StoredPublication, size: int) -> None:
        """A newer publication in the same slot, by the same owner."""
        self._unindex(slot)
        grows = size - slot.size
        slot.pub, slot.size = pub, size
        self._held_bytes[slot.owner] += grows
        if slot.standing < DRIVER:
            evictable = self._evictable[slot.standing]
            del evictable[slot]
            evictable[slot] = None  # now the most recently published
            self._evictable_bytes[slot.standing] += grows
        self._index(slot)
        if slot.standing != OWN:
            self.bytes += grows

    def _remove(self, slot: _Slot) -> None:
        pub = slot.pub
        audiences = self._slots[pub.topic]
        del audiences[pub.audience_key]
        if not audiences:
            del self._slots[pub.topic]
        if slot.standing < DRIVER:
            del self._evictable[slot.standing][slot]
            self._evictable_bytes[slot.standing] -= slot.size
        self._held[slot.owner] -= 1
        self._held_bytes[slot.owner] -= slot.size
        if not self._held[slot.owner]:
            del self._held[slot.owner], self._held_bytes[slot.owner]
        self._unindex(slot)
        if slot.standing != OWN:
            self.count -= 1
            self.bytes -= slot.size

    def _index(self, slot: _Slot) -> None:
        seq = slot.pub.seq
        self._by_seq[seq] = slot
        if self._seqs and seq < self._seqs[-1]:
            insort(self._seqs, seq)  # restored after newer ones (a store opened late)
        else:
            self._seqs.append(seq)

    def _unindex(self, slot: _Slot) -> None:
        del self._by_seq[slot.pub.seq]  # its seq stays in _seqs until they are compacted
        self.cache.forget(slot.pub.seq)
        if len(self._seqs) > 1024 and len(self._seqs) > 2 * len(self._by_seq):
            self._seqs = [seq for seq in self._seqs if seq in self._by_seq]

    # -- delivering ------------------------------------------------------------------------

    def newest_for(self, topic: str, session: Session) -> StoredPublication | None:
        """The retained publication of ``topic`` that ``session`` gets (None: none)."""
        best = None
        for slot in self._slots.get(topic, {}).values():
            pub = slot.pub
            if (best is None or pub.seq > best.seq) and session_eligible(pub, session):
                best = pub
        return best

    def next_retained(self, stream: RetainedStream) -> StoredPublication | None:
        """The next retained publication of ``stream`` (advancing its cursor), or None."""
        session, before = stream.session, stream.before
        if stream.match == "exact":
            best = self.newest_for(stream.uri, session)
            if best is None or not stream.after < best.seq < before:
                return None
            stream.after = best.seq
            return best
        uri, match, visible = stream.uri, stream.match, stream.visible
        seqs, by_seq = self._seqs, self._by_seq
        i = bisect_right(seqs, stream.after)
        while i < len(seqs):
            seq = seqs[i]
            i += 1
            if seq >= before:
                break
            slot = by_seq.get(seq)
            if slot is None:
                continue
            stream.after = seq
            topic = slot.pub.topic
            if not matches(uri, match, topic) or (visible is not None and not visible(topic)):
                continue
            if self.newest_for(topic, session) is slot.pub:
                return slot.pub
        stream.after = before
        return None

    def newest(self, uri: str, match: str) -> list[StoredPublication]:
        """Per topic matching (uri, match), its newest retained publication whatever its
        audience, with its arguments: what the router itself reports on (its health)."""
        found = []
        for topic, audiences in self._slots.items():
            if matches(uri, match, topic):
                slim = max((slot.pub for slot in audiences.values()), key=lambda p: p.seq)
                full = object.__new__(StoredPublication)
                full.__dict__.update(slim.__dict__)
                full.args, full.kwargs = msgpack.unpackb(slim.payload(), raw=False)
                found.append(full)
        return found


def received_procedure(retention: Retention, authorizer: Authorizer):
    """``cairn.retained.received(topic)``: when the retained event the caller gets for
    ``topic`` was received, for a display of its age (a retained EVENT carries no time).
    ``age_s`` is by CLOCK_BOOTTIME, right whatever the wall clock did, and None when the
    event is from an earlier boot; then only ``timestamp`` (the wall clock, ``synchronized``
    or not at the time) tells. None when there is no retained event."""

    def procedure(caller: Session, args: list[Any], kwargs: dict[str, Any], now: Reading):
        if not args or not isinstance(args[0], str):
            raise WampError("wamp.error.invalid_argument",
                            "cairn.retained.received: the first argument must be a topic")
        topic = args[0]
        if authorizer.allowed(caller.authrole, topic, "subscribe") is None:
            raise WampError("wamp.error.not_authorized",
                            f"session {caller.id} (authrole {caller.authrole!r}) may not "
                            f"subscribe to {topic!r}")
        pub = retention.newest_for(topic, caller)
        if pub is None:
            return None
        return {"publication": pub.publication, "timestamp": rfc3339(pub.wall_ms),
                "synchronized": pub.clock_synced,
                "age_s": age_s(pub.boot_id, pub.boottime_ns, now)}

    return procedure


def _packed_only(pub: StoredPublication) -> StoredPublication:
    """``pub`` as a slot keeps it: its packed payload without the decoded arguments."""
    slim = object.__new__(StoredPublication)
    slim.__dict__.update(pub.__dict__)
    slim.args = slim.kwargs = None
    return slim
