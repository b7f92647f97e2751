"""Event History: which publications are kept, and ``wamp.subscription.get_events``.

Publications are stored once, in receive order (``seq``), under the first history rule of
the realm that matches their topic. A subscription "has history" when a rule covers its
pattern; its history is every stored publication its pattern matches, filtered by the
caller's eligibility (authid/authrole lists), never reordered by timestamps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cairn.base.clock_readings import Reading, parse_rfc3339, rfc3339
from cairn.gateway.core.dealer import MetaResult, Query
from cairn.gateway.core.publication import (
    HistoryRead,
    ReadAbandoned,
    ReadTimeout,
    StorageError,
    UnknownPublication,
)
from cairn.gateway.core.session import Session, WampError, brief, limit_reached

if TYPE_CHECKING:
    from cairn.gateway.core.auth import Authorizer
    from cairn.gateway.core.broker import Broker, Subscription
    from cairn.gateway.core.config import Limits
    from cairn.gateway.core.history_rules import HistoryRules
    from cairn.gateway.core.limits import LimitHits


class Realm(Protocol):
    """What get_events needs of its realm (gateway.core.router.Realm)."""

    name: str
    broker: Broker
    authorizer: Authorizer
    history: HistoryRules
    limits: Limits
    hits: LimitHits


DEFAULT_PAGE_CAP = 1000
_TIME_ARGS = {"from_time": ">=", "after_time": ">", "before_time": "<", "until_time": "<="}
_PUBLICATION_ARGS = {"from_publication": ">=", "after_publication": ">",
                     "before_publication": "<", "until_publication": "<="}
_KNOWN_ARGS = {"reverse", "limit", "topic", *_TIME_ARGS, *_PUBLICATION_ARGS}
_MAX_ID = 2**53  # WAMP ids are integers in [1, 2**53]


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


def history_query(realm: Realm, caller: Session, sub: Subscription, query: EventsQuery,
                  page_cap: int) -> Query:
    """The read of a get_events page, and how its rows become the result."""
    page = min(query.limit or page_cap, page_cap)
    timeout = realm.limits.get_events_timeout
    read = HistoryRead(
        realm.name, sub.uri, sub.match, query.topic,
        functools.partial(realm.broker.may_receive, caller), query.times,
        tuple((name, _PUBLICATION_ARGS[name], id_) for name, id_ in query.publications),
        (caller.authid, caller.authrole), query.reverse, page + 1, timeout,
        lambda: caller.closed)

    def result(rows: list[tuple[Any, ...]] | Exception) -> MetaResult:
        if isinstance(rows, UnknownPublication):
            raise _invalid(rows.argument, f"names publication {rows.publication}, which is "
                                          f"not in the stored history")
        if isinstance(rows, ReadTimeout):
            raise limit_reached(realm.hits, "get_events_timeout",
                                f"get_events on {sub.uri!r} ran past {timeout:g} s: narrow it "
                                f"with topic, time or publication bounds")
        if isinstance(rows, ReadAbandoned):  # the caller left: nobody gets the answer
            raise WampError("wamp.error.canceled", "get_events: the caller left")
        if isinstance(rows, StorageError):
            raise WampError("cairn.error.storage_failed",
                            f"get_events: the history could not be read: {rows}")
        if isinstance(rows, Exception):
            raise rows
        # a row the store could not decode is None: the page goes out without it
        events = [_event(sub.id, row) for row in rows[:page] if row is not None]
        return MetaResult(args=[events], kwargs={"is_limit_reached": len(rows) > page})

    return Query(read, result)


def _event(subscription: int, row: tuple[Any, ...]) -> dict[str, Any]:
    _, publication, wall_ms, details, args, kwargs = row
    event = {"timestamp": rfc3339(wall_ms), "subscription": subscription,
             "publication": publication, "details": details}
    if args is not None:
        event["args"] = args
    if kwargs is not None:
        event["kwargs"] = kwargs
    return event


def get_events_procedure(realm: Realm, page_cap: int = DEFAULT_PAGE_CAP):
    """The ``wamp.subscription.get_events`` meta procedure for a realm."""

    def procedure(caller: Session, args: list[Any], kwargs: dict[str, Any], now: Reading):
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
        if not realm.history.covers(sub.uri, sub.match):
            raise WampError("wamp.error.invalid_argument",
                            f"get_events: no history is kept for subscription {sub.id} "
                            f"({sub.uri!r}, {sub.match}); add a [[realms.history]] rule")
        return history_query(realm, caller, sub, query, page_cap)

    return procedure
