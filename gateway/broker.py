"""The broker: what happens on SUBSCRIBE, UNSUBSCRIBE and PUBLISH.

PUBLISH: authorize -> pick the matching subscriptions -> filter receivers by the
publication's black/white lists -> EVENT to each receiver -> PUBLISHED if asked.
One EVENT object is built per subscription and shared by its subscribers, so autobahn
serializes it once per serializer however many subscribers there are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from autobahn.wamp import message as m

from gateway.core import Outbox, Session, WampError, global_id
from gateway.patterns import PatternMap

if TYPE_CHECKING:
    from gateway.router import Realm


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(eq=False)
class Subscription:
    id: int
    uri: str
    match: str
    created: str = field(default_factory=utc_now)
    subscribers: dict[Session, None] = field(default_factory=dict)  # an ordered set

    def details(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "uri": self.uri, "match": self.match}


_LIST_OPTIONS = ("exclude", "eligible", "exclude_authid", "eligible_authid",
                 "exclude_authrole", "eligible_authrole")


def _audience_filter(publish: m.Publish):
    """A predicate for sessions eligible under the publication's black/white lists, or None
    when the publication has no lists (the fast path)."""
    if not any(getattr(publish, name) for name in _LIST_OPTIONS):
        return None
    exclude = set(publish.exclude or ())
    eligible = set(publish.eligible) if publish.eligible is not None else None
    exclude_authid = set(publish.exclude_authid or ())
    eligible_authid = set(publish.eligible_authid) if publish.eligible_authid is not None else None
    exclude_authrole = set(publish.exclude_authrole or ())
    eligible_authrole = (
        set(publish.eligible_authrole) if publish.eligible_authrole is not None else None
    )

    def eligible_session(s: Session) -> bool:
        return not (
            s.id in exclude
            or s.authid in exclude_authid
            or s.authrole in exclude_authrole
            or (eligible is not None and s.id not in eligible)
            or (eligible_authid is not None and s.authid not in eligible_authid)
            or (eligible_authrole is not None and s.authrole not in eligible_authrole)
        )

    return eligible_session


class Broker:
    def __init__(self, realm: Realm) -> None:
        self.realm = realm
        self.subscriptions = PatternMap[Subscription]()
        self.by_id: dict[int, Subscription] = {}

    # -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------------

    def subscribe(self, session: Session, msg: m.Subscribe, out: Outbox) -> None:
        match = msg.match or "exact"
        self.realm.authorizer.require(session, msg.topic, "subscribe")
        sub = self.subscriptions.get(msg.topic, match)
        created = sub is None
        if sub is None:
            sub = Subscription(global_id(), msg.topic, match)
            self.subscriptions.add(msg.topic, match, sub)
            self.by_id[sub.id] = sub
        already = session in sub.subscribers
        sub.subscribers[session] = None
        out.send(session, m.Subscribed(msg.request, sub.id))
        if created:
            self.realm.meta_event("wamp.subscription.on_create", [session.id, sub.details()], out)
        if not already:
            self.realm.meta_event("wamp.subscription.on_subscribe", [session.id, sub.id], out)

    def unsubscribe(self, session: Session, msg: m.Unsubscribe, out: Outbox) -> None:
        sub = self.by_id.get(msg.subscription)
        if sub is None or session not in sub.subscribers:
            raise WampError("wamp.error.no_such_subscription",
                            f"session {session.id} has no subscription {msg.subscription}")
        self._remove_subscriber(session, sub, out)
        out.send(session, m.Unsubscribed(msg.request))

    def _remove_subscriber(self, session: Session, sub: Subscription, out: Outbox) -> None:
        del sub.subscribers[session]
        self.realm.meta_event("wamp.subscription.on_unsubscribe", [session.id, sub.id], out)
        if not sub.subscribers:
            self.subscriptions.remove(sub.uri, sub.match)
            del self.by_id[sub.id]
            self.realm.meta_event("wamp.subscription.on_delete", [session.id, sub.id], out)

    def session_left(self, session: Session, out: Outbox) -> None:
        for sub in [s for s in self.by_id.values() if session in s.subscribers]:
            self._remove_subscriber(session, sub, out)

    # -- PUBLISH -------------------------------------------------------------------------

    def publish(self, session: Session, msg: m.Publish, out: Outbox,
                disclose_me: bool = False) -> None:
        if msg.topic.startswith("wamp."):
            raise WampError("wamp.error.not_authorized",
                            f"topics under 'wamp.' are reserved for the router: {msg.topic!r}")
        rule = self.realm.authorizer.require(session, msg.topic, "publish")
        disclose = rule.disclose or disclose_me
        publication = global_id()
        self.dispatch(msg, publication, out, publisher=session, disclose=disclose)
        if msg.acknowledge:
            out.send(session, m.Published(msg.request, publication))

    def dispatch(self, msg: m.Publish, publication: int, out: Outbox,
                 publisher: Session | None = None, disclose: bool = False) -> None:
        """Send EVENTs for a publication to every eligible subscriber."""
        subscriptions = self.subscriptions.match(msg.topic)
        if not subscriptions:
            return
        eligible = _audience_filter(msg)
        skip = publisher if (publisher is not None and msg.exclude_me is not False) else None
        who = {}
        if disclose and publisher is not None:
            who = {"publisher": publisher.id, "publisher_authid": publisher.authid,
                   "publisher_authrole": publisher.authrole}
        for sub in subscriptions:
            event = m.Event(
                sub.id, publication, args=msg.args, kwargs=msg.kwargs, payload=msg.payload,
                topic=msg.topic if sub.match != "exact" else None,
                enc_algo=msg.enc_algo, enc_key=msg.enc_key, enc_serializer=msg.enc_serializer,
                **who,
            )
            for receiver in sub.subscribers:
                if receiver is skip or (eligible is not None and not eligible(receiver)):
                    continue
                out.send(receiver, event)

    def publish_internal(self, topic: str, args: list[Any], out: Outbox) -> None:
        """A publication from the router itself (meta events)."""
        if self.subscriptions.match(topic):
            self.dispatch(m.Publish(0, topic, args=args), global_id(), out)
