"""Event History: which publications are kept, and ``wamp.subscription.get_events``.

Publications are stored once, in receive order (``seq``), under the first history rule of
the realm that matches their topic. A subscription "has history" when a rule covers its
pattern; its history is every stored publication its pattern matches, filtered by the
caller's eligibility (authid/authrole lists), never reordered by timestamps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from gateway.clock import parse_rfc3339, rfc3339
from gateway.config import HistoryRule
from gateway.core import Session, WampError, brief
from gateway.dealer import MetaResult
from gateway.patterns import matches

if TYPE_CHECKING:
    from gateway.broker import Subscription
    from gateway.router import Realm
    from gateway.store import Store

DEFAULT_PAGE_CAP = 1000
_TIME_ARGS = {"from_time": ">=", "after_time": ">", "before_time": "<", "until_time": "<="}
_PUBLICATION_ARGS = {"from_publication": ">=", "after_publication": ">",
                     "before_publication": "<", "until_publication": "<="}
_KNOWN_ARGS = {"reverse", "limit", "topic", *_TIME_ARGS, *_PUBLICATION_ARGS}
_MAX_ID = 2**53  # WAMP ids are integers in [1, 2**53]


class HistoryRules:
    def __init__(self, rules: tuple[HistoryRule, ...]) -> None:
        self.rules = rules
        self._cache: dict[str, int | None] = {}

    def rule_for(self, topic: str) -> int | None:
        """Index of the rule that stores publications to ``topic``, or None."""
        try:
            return self._cache[topic]
        except KeyError:
            pass
        found = next((i for i, r in enumerate(self.rules) if matches(r.uri, r.match, topic)),
                     None)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[topic] = found
        return found

    def covers(self, uri: str, match: str) -> bool:
        """Does some rule store every publication a subscription (uri, match) can match?"""
        for rule in self.rules:
            if (rule.uri, rule.match) == (uri, match):
                return True
            if match == "exact":
                if matches(rule.uri, rule.match, uri):
                    return True
            elif rule.match == "prefix" and _fixed_start(uri, match).startswith(rule.uri):
                return True
        return False


def _fixed_start(uri: str, match: str) -> str:
    """The text every topic matched by a pattern subscription starts with."""
    if match == "prefix":
        return uri
    fixed = []
    for part in uri.split("."):
        if not part:
            break
        fixed.append(part)
    return ".".join(fixed)


@dataclass
class EventsQuery:
    """Validated ``get_events`` keyword arguments."""

    reverse: bool = False
    limit: int | None = None
    topic: str | None = None
    times: tuple[tuple[str, int], ...] = ()         # (operator, ms)
    publications: tuple[tuple[str, int], ...] = ()  # (argument name, publication id)

    @classmethod
    def parse(cls, kwargs: dict[str, Any]) -> EventsQuery:
        for name in kwargs:
            if name not in _KNOWN_ARGS:
                raise _invalid(name, "is not an argument of get_events (known: "
                                     f"{', '.join(sorted(_KNOWN_ARGS))})")
        reverse = kwargs.get("reverse", False)
        if not isinstance(reverse, bool):
            raise _invalid("reverse", f"must be true or false, got {brief(reverse)}")
        limit = kwargs.get("limit")
        if limit is not None and (not _is_int(limit) or limit <= 0):
            raise _invalid("limit", f"must be a positive integer, got {brief(limit)}")
        topic = kwargs.get("topic")
        if topic is not None and (not isinstance(topic, str) or not topic):
            raise _invalid("topic", f"must be a topic URI, got {brief(topic)}")
        times = []
        for name, op in _TIME_ARGS.items():
            if name in kwargs:
                try:
                    times.append((op, parse_rfc3339(kwargs[name])))
                except (ValueError, TypeError) as e:
                    raise _invalid(name, f"must be an RFC 3339 timestamp: {e}") from None
        publications = []
        for name in _PUBLICATION_ARGS:
            if name in kwargs:
                value = kwargs[name]
                if not _is_int(value) or not 1 <= value <= _MAX_ID:
                    raise _invalid(name, f"must be a publication id (an integer from 1 to "
                                         f"2**53), got {brief(value)}")
                publications.append((name, value))
        return cls(reverse, limit, topic, tuple(times), tuple(publications))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _invalid(name: str, problem: str) -> WampError:
    return WampError("wamp.error.invalid_argument", f"get_events: {name!r} {problem}")


_FEW = 5000


async def _few_rows(store: Store, realm: str, prefix: str) -> bool:
    """Does a prefix match fewer than _FEW stored rows? (a bounded probe, ~0.3 ms)"""
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    rows = await store.query(
        "SELECT COUNT(*) FROM (SELECT 1 FROM publications WHERE realm = ? AND topic >= ? "
        "AND topic < ? LIMIT ?)", (realm, prefix, upper, _FEW))
    return rows[0][0] < _FEW


def _topic_condition(uri: str, match: str, topic: str | None,
                     walk_seq: bool = True) -> tuple[str, list[Any]]:
    """The SQL for "published to a topic this subscription matches". One concrete topic
    (an exact subscription, or the ``topic`` argument) uses the (realm, topic, seq) index;
    a pattern is tested row by row while scanning seq (``+topic`` keeps SQLite from ranging
    over the topic index and then sorting a million rows for a page of 100)."""
    if topic is not None:
        return ("topic = ?", [topic]) if matches(uri, match, topic) else ("0", [])
    if match == "exact":
        return "topic = ?", [uri]
    if match == "prefix":
        if not uri:
            return "1", []
        upper = uri[:-1] + chr(ord(uri[-1]) + 1)
        column = "+topic" if walk_seq else "topic"
        return f"{column} >= ? AND {column} < ?", [uri, upper]
    return "wildcard_match(?, topic)", [uri]


async def get_events(store: Store, realm: Realm, caller: Session, sub: Subscription,
                     query: EventsQuery, page_cap: int) -> MetaResult:
    # A pattern without time bounds is best served by walking seq (the rowid) and testing
    # each row ("+realm" keeps SQLite from choosing an index on realm and sorting instead),
    # unless the pattern matches few rows: then the topic index and a small sort win.
    walk_seq = (query.topic is None and sub.match != "exact") and not query.times
    if walk_seq and sub.match == "prefix" and sub.uri:
        walk_seq = not await _few_rows(store, realm.name, sub.uri)
    where = ["+realm = ?" if walk_seq else "realm = ?"]
    params: list[Any] = [realm.name]
    condition, values = _topic_condition(sub.uri, sub.match, query.topic, walk_seq)
    where.append(condition)
    params += values
    where.append("(audience IS NULL OR eligible(audience, ?, ?))")
    params += [caller.authid, caller.authrole]
    for op, ms in query.times:
        where.append(f"wall_ms {op} ?")
        params.append(ms)
    for name, publication in query.publications:
        seq = await store.seq_of_publication(realm.name, publication)
        if seq is None:
            raise _invalid(name, f"names publication {publication}, which is not in the "
                                 f"stored history")
        where.append(f"seq {_PUBLICATION_ARGS[name]} ?")
        params.append(seq)
    page = min(query.limit or page_cap, page_cap)
    order, beyond = ("DESC", "<") if query.reverse else ("ASC", ">")
    sql = (f"SELECT seq, publication, topic, wall_ms, details, payload FROM publications "
           f"WHERE {' AND '.join(where)} AND seq {beyond} ? ORDER BY seq {order} LIMIT ?")
    # A pattern subscription may match topics the caller's role may not subscribe to:
    # those rows are skipped, and more are read until the page is full.
    check_topic = sub.match != "exact"
    events: list[dict[str, Any]] = []
    last_seq = 2**63 - 1 if query.reverse else 0
    more = False
    while True:
        rows = await store.query(sql, [*params, last_seq, page + 1])
        for row in rows:
            if len(events) == page:
                more = True
                break
            if not check_topic or realm.broker.may_receive(caller, row[2]):
                events.append(_event(sub.id, row))
        if more or len(rows) <= page:
            break
        last_seq = rows[-1][0]
    return MetaResult(args=[events], kwargs={"is_limit_reached": more})


def _event(subscription: int, row: tuple[Any, ...]) -> dict[str, Any]:
    _, publication, topic, wall_ms, details, payload = row
    args, kwargs = msgpack.unpackb(payload, raw=False)
    event = {"timestamp": rfc3339(wall_ms), "subscription": subscription,
             "publication": publication, "details": json.loads(details) if details else {}}
    if args is not None:
        event["args"] = args
    if kwargs is not None:
        event["kwargs"] = kwargs
    return event


def get_events_procedure(realm: Realm, page_cap: int = DEFAULT_PAGE_CAP):
    """The ``wamp.subscription.get_events`` meta procedure for a realm."""

    def procedure(caller: Session, args: list[Any], kwargs: dict[str, Any]):
        if not args or not _is_int(args[0]):
            raise WampError("wamp.error.invalid_argument",
                            "get_events: the first argument must be a subscription id")
        query = EventsQuery.parse(kwargs)
        sub = realm.broker.by_id.get(args[0])
        if sub is None:
            raise WampError("wamp.error.no_such_subscription", f"no subscription {args[0]}")
        if realm.authorizer.allowed(caller.authrole, sub.uri, "subscribe") is None:
            raise WampError("wamp.error.not_authorized",
                            f"session {caller.id} (authrole {caller.authrole!r}) may not "
                            f"subscribe to {sub.uri!r}, so it may not read its history")
        store = realm.store
        if store is None or not realm.history.covers(sub.uri, sub.match):
            raise WampError("wamp.error.invalid_argument",
                            f"get_events: no history is kept for subscription {sub.id} "
                            f"({sub.uri!r}, {sub.match}); add a [[realms.history]] rule")
        return get_events(store, realm, caller, sub, query, page_cap)

    return procedure
