"""The WAMP meta API procedures: ``wamp.session.*``, ``wamp.subscription.*``,
``wamp.registration.*``. The meta events are published by the broker and dealer themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from cairn.gateway.core.dealer import MetaProcedure
from cairn.gateway.core.session import Session, WampError

if TYPE_CHECKING:
    from cairn.base.clock_readings import Reading
    from cairn.gateway.core.broker import Broker
    from cairn.gateway.core.dealer import Dealer


class Realm(Protocol):
    """What the meta procedures read of their realm (gateway.core.router.Realm)."""

    sessions: dict[int, Session]
    broker: Broker
    dealer: Dealer


def _int_arg(args: list[Any], index: int, name: str) -> int:
    if len(args) <= index:
        raise WampError("wamp.error.invalid_argument", f"missing argument {name!r}")
    value = args[index]
    if not isinstance(value, int) or isinstance(value, bool):
        raise WampError("wamp.error.invalid_argument",
                        f"argument {name!r} must be an integer, got {value!r}")
    return value


def _str_arg(args: list[Any], index: int, name: str) -> str:
    if len(args) <= index or not isinstance(args[index], str):
        raise WampError("wamp.error.invalid_argument", f"argument {name!r} must be a URI string")
    return args[index]


def _match_option(args: list[Any], index: int) -> str:
    options = args[index] if len(args) > index else {}
    if not isinstance(options, dict):
        raise WampError("wamp.error.invalid_argument", "options must be a dictionary")
    match = options.get("match", "exact")
    if match not in ("exact", "prefix", "wildcard"):
        raise WampError("wamp.error.invalid_argument", f"unknown match policy {match!r}")
    return match


def session_procedures(realm: Realm) -> dict[str, MetaProcedure]:
    def roles_filter(args: list[Any]) -> set[str] | None:
        if not args or args[0] is None:
            return None
        if not isinstance(args[0], list) or not all(isinstance(r, str) for r in args[0]):
            raise WampError("wamp.error.invalid_argument",
                            "filter_authroles must be a list of strings")
        return set(args[0])

    def count(caller: Session, args: list[Any], kwargs: dict[str, Any], now: Reading) -> int:
        roles = roles_filter(args)
        return sum(1 for s in realm.sessions.values() if roles is None or s.authrole in roles)

    def list_(caller: Session, args: list[Any], kwargs: dict[str, Any], now: Reading) -> list[int]:
        roles = roles_filter(args)
        return [s.id for s in realm.sessions.values() if roles is None or s.authrole in roles]

    def get(caller: Session, args: list[Any], kwargs: dict[str, Any],
            now: Reading) -> dict[str, Any]:
        session_id = _int_arg(args, 0, "session")
        session = realm.sessions.get(session_id)
        if session is None:
            raise WampError("wamp.error.no_such_session", f"no session {session_id}")
        return session.details()

    return {"wamp.session.count": count, "wamp.session.list": list_, "wamp.session.get": get}


def _pattern_procedures(noun: str, table: Any, members: str) -> dict[str, MetaProcedure]:
    """lookup/match/get/list/list_<members>/count_<members> over a broker's subscriptions or a
    dealer's registrations (both keep ``.by_id`` and a PatternMap)."""
    member_attr = "subscribers" if noun == "subscription" else "callees"

    def find(args: list[Any]) -> Any:
        item_id = _int_arg(args, 0, noun)
        item = table().by_id.get(item_id)
        if item is None:
            raise WampError(f"wamp.error.no_such_{noun}", f"no {noun} {item_id}")
        return item

    def lookup(caller: Session, args: list[Any], kwargs: dict[str, Any],
               now: Reading) -> int | None:
        uri = _str_arg(args, 0, "uri")
        item = table().patterns.get(uri, _match_option(args, 1))
        return item.id if item else None

    def match(caller: Session, args: list[Any], kwargs: dict[str, Any], now: Reading) -> Any:
        uri = _str_arg(args, 0, "uri")
        if noun == "subscription":
            ids = [s.id for s in table().patterns.match(uri)]
            return ids or None
        best = table().patterns.best(uri)
        return best.id if best else None

    def get(caller: Session, args: list[Any], kwargs: dict[str, Any],
            now: Reading) -> dict[str, Any]:
        return find(args).details()

    def list_(caller: Session, args: list[Any], kwargs: dict[str, Any],
              now: Reading) -> dict[str, list[int]]:
        return {p: [item.id for _, item in table().patterns.items(p)]
                for p in ("exact", "prefix", "wildcard")}

    def list_members(caller: Session, args: list[Any], kwargs: dict[str, Any],
                     now: Reading) -> list[int]:
        return [s.id for s in getattr(find(args), member_attr)]

    def count_members(caller: Session, args: list[Any], kwargs: dict[str, Any],
                      now: Reading) -> int:
        return len(getattr(find(args), member_attr))

    return {
        f"wamp.{noun}.lookup": lookup,
        f"wamp.{noun}.match": match,
        f"wamp.{noun}.get": get,
        f"wamp.{noun}.list": list_,
        f"wamp.{noun}.list_{members}": list_members,
        f"wamp.{noun}.count_{members}": count_members,
    }


class _Patterns:
    """Adapts broker/dealer to the (by_id, patterns) shape the generic procedures use."""

    def __init__(self, by_id: dict[int, Any], patterns: Any) -> None:
        self.by_id, self.patterns = by_id, patterns


def meta_procedures(realm: Realm) -> dict[str, MetaProcedure]:
    procedures = session_procedures(realm)
    procedures.update(_pattern_procedures(
        "subscription",
        lambda: _Patterns(realm.broker.by_id, realm.broker.subscriptions), "subscribers"))
    procedures.update(_pattern_procedures(
        "registration",
        lambda: _Patterns(realm.dealer.by_id, realm.dealer.registrations), "callees"))
    return procedures
