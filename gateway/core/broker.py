"""The broker: what happens on SUBSCRIBE, UNSUBSCRIBE and PUBLISH.

PUBLISH: authorize -> assign seq, update retention and ask the shell to persist it (history
rule or ``retain``) -> pick the matching subscriptions -> filter receivers by the
publication's black/white lists -> EVENT to each receiver -> PUBLISHED if asked (once the
store has committed it, when it is stored).
One EVENT object is built per subscription and shared by its subscribers, so autobahn
serializes it once per serializer however many subscribers there are.

SUBSCRIBE with ``get_retained``: SUBSCRIBED, then the retained events as one
:class:`~gateway.core.retention.RetainedStream` in the same outbox: the shell sends them as the
subscriber reads, and what the session is sent after them waits behind them, so no live
event can come between them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from autobahn.wamp import message as m

from cairn.base.clock_readings import StepDetector, rfc3339
from cairn.gateway.core import messages
from cairn.gateway.core.auth import Authorizer, login_peer
from cairn.gateway.core.config import HEALTH_TOPIC, Limits
from cairn.gateway.core.history_rules import HistoryRules
from cairn.gateway.core.history_topics import HistoryTopics
from cairn.gateway.core.limits import LimitHits
from cairn.gateway.core.patterns import PatternMap
from cairn.gateway.core.publication import StoredPublication
from cairn.gateway.core.retention import OWN_AUTHID, OWN_AUTHROLE, RetainedStream, Retention
from cairn.gateway.core.session import (
    LIMIT_REACHED,
    ClockStep,
    ForgetRetained,
    ForgetSubscription,
    KeepSubscription,
    Outbox,
    Persist,
    Sequence,
    Session,
    WampError,
    global_id,
    limit_reached,
    publication_id,
)


@dataclass(eq=False)
class Subscription:
    id: int
    uri: str
    match: str
    created: str  # RFC 3339
    # an ordered set; each subscriber's value marks its subscribing (RetainedStream)
    subscribers: dict[Session, object] = field(default_factory=dict)
    kept: bool = False  # has history: kept, its id stable, without subscribers (persisted)

    def details(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "uri": self.uri, "match": self.match}


# who the router's own publications are from, in history (clients cannot publish there)

# the black/white lists that survive a restart (authid/authrole; session ids do not)
_AUDIENCE_OPTIONS = ("exclude_authid", "eligible_authid", "exclude_authrole", "eligible_authrole")


def _audience_filter(publish: m.Publish):
    """A predicate for sessions eligible under the publication's black/white lists, or None
    when the publication has no lists (the fast path). An empty eligible list admits nobody."""
    if not messages.addressed(publish):
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


RESTORED = ("restored",)  # the maker of a kept subscription made before the start


def maker_of(session: Session) -> Hashable:
    """Whose share a kept subscription counts in: a user who logged in, across its
    sessions; anyone else by address (reconnecting gives no new share)."""
    if session.authmethod not in (None, "anonymous"):
        return ("user", session.authid)
    return ("address", login_peer(session.transport.get("peer")).address)


class Broker:
    """One realm's broker. What it works with is given to it, nothing more: the realm's
    name, who may do what, which topics keep history, the retained slots, the clock and the
    receive order, and the limits (with their hit counter)."""

    def __init__(self, realm: str, authorizer: Authorizer, history: HistoryRules,
                 retention: Retention, clock: StepDetector, sequence: Sequence,
                 limits: Limits, hits: LimitHits) -> None:
        self.realm = realm
        self.authorizer, self.history, self.retention = authorizer, history, retention
        self.clock, self.sequence, self.limits, self.hits = clock, sequence, limits, hits
        self.subscriptions = PatternMap[Subscription]()
        self.by_id: dict[int, Subscription] = {}
        # kept subscriptions that are no history rule's own, oldest first: bounded, and
        # shared out by who made them (a user, else an address; RESTORED: made before the
        # start, its maker not known)
        self._kept: dict[int, Subscription] = {}
        self._makers: dict[int, Hashable] = {}
        self._made: Counter[Hashable] = Counter()
        self._own = Session(authid=OWN_AUTHID, authrole=OWN_AUTHROLE)  # the router, publishing
        self.history_topics = HistoryTopics(limits)

    # -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------------------

    def subscribe(self, session: Session, msg: m.Subscribe, out: Outbox) -> None:
        match = msg.match or "exact"
        self.authorizer.require(session, msg.topic, "subscribe")
        sub = self.subscriptions.get(msg.topic, match)
        already = sub is not None and session in sub.subscribers
        if not already and session.subscriptions >= self.limits.max_subscriptions_per_session:
            raise limit_reached(self.hits, "max_subscriptions_per_session",
                                f"session {session.id} holds {session.subscriptions} "
                                f"subscriptions")
        created = sub is None
        if sub is None:
            sub = self.create_subscription(msg.topic, match, out, maker=maker_of(session))
        if not already:
            session.subscriptions += 1
            sub.subscribers[session] = object()
        out.send(session, m.Subscribed(msg.request, sub.id))
        if msg.get_retained:
            visible = None if match == "exact" else \
                (lambda topic: self.may_receive(session, topic))
            out.send(session, RetainedStream(self.retention, session, sub.id, sub.uri, match,
                                             sub.subscribers, visible))
        if created:
            self.publish_internal("wamp.subscription.on_create", [session.id, sub.details()], out)
        if not already:
            self.publish_internal("wamp.subscription.on_subscribe", [session.id, sub.id], out)

    def create_subscription(self, uri: str, match: str, out: Outbox, sub_id: int | None = None,
                            created: str | None = None,
                            maker: Hashable = RESTORED) -> Subscription:
        """A new subscription (``created``: restored from the store). One with history is
        kept without subscribers, with an id that is stable across restarts: a history
        rule's own always, others as :meth:`_room_to_keep` finds room."""
        if sub_id is None:
            sub_id = global_id()
            while sub_id in self.by_id:
                sub_id = global_id()
        sub = Subscription(sub_id, uri, match, created or rfc3339(out.now.wall_ms))
        rule = self.history.is_rule(uri, match)
        sub.kept = self.history.covers(uri, match) and (rule or self._room_to_keep(maker, out))
        if sub.kept and not rule:
            self._kept[sub.id] = sub
            self._makers[sub.id] = maker
            self._made[maker] += 1
        if sub.kept and created is None:
            out.store(KeepSubscription(sub.id, self.realm, uri, match, sub.created))
        self.subscriptions.add(uri, match, sub)
        self.by_id[sub.id] = sub
        return sub

    def _room_to_keep(self, maker: Hashable, out: Outbox) -> bool:
        """Room for one more kept subscription that is no rule's, made by ``maker``. A maker
        at its share (``max_history_subscriptions_per_client``; those made before the start
        have none, only the realm's bound) makes room among its own;
        else, in a full realm, the maker holding the most does (subscriptions made before
        the start count as one maker's). Room is made by forgetting the oldest one without
        subscribers (its id then names nothing; subscribing again to its topic gives a new
        one). One client churning through topics once forgot everyone's, a dashboard's
        included; now it forgets its own."""
        made, limits = self._made, self.limits
        if maker != RESTORED and made[maker] >= limits.max_history_subscriptions_per_client:
            idle = self._oldest_idle(maker)
        elif len(self._kept) < limits.max_history_subscriptions:
            return True
        else:  # the oldest idle one of the maker holding the most (this one, if it does)
            idle = None
            for whose in sorted(made, key=made.__getitem__, reverse=True):
                if made[whose] < made[maker] or idle is not None:
                    break
                idle = self._oldest_idle(whose)
        if idle is None:
            self.hits.hit("max_history_subscriptions",
                          f"{made[maker]} subscriptions with history made by {maker} are "
                          f"held ({len(self._kept)} in all): a new one is not kept beyond "
                          f"its subscribers")
            return False
        self._forget(idle, out)
        return True

    def _oldest_idle(self, maker: Hashable) -> Subscription | None:
        return next((s for s in self._kept.values()
                     if not s.subscribers and self._makers[s.id] == maker), None)

    def _forget(self, sub: Subscription, out: Outbox) -> None:
        self.subscriptions.remove(sub.uri, sub.match)
        del self.by_id[sub.id]
        if self._kept.pop(sub.id, None) is not None:
            maker = self._makers.pop(sub.id)
            self._made[maker] -= 1
            if not self._made[maker]:
                del self._made[maker]
            out.store(ForgetSubscription(sub.id))

    def unsubscribe(self, session: Session, msg: m.Unsubscribe, out: Outbox) -> None:
        sub = self.by_id.get(msg.subscription)
        if sub is None or session not in sub.subscribers:
            raise WampError("wamp.error.no_such_subscription",
                            f"session {session.id} has no subscription {msg.subscription}")
        self._remove_subscriber(session, sub, out)
        out.send(session, m.Unsubscribed(msg.request))

    def _remove_subscriber(self, session: Session, sub: Subscription, out: Outbox) -> None:
        del sub.subscribers[session]
        session.subscriptions -= 1
        self.publish_internal("wamp.subscription.on_unsubscribe", [session.id, sub.id], out)
        if not sub.subscribers and not sub.kept:
            self._forget(sub, out)
            self.publish_internal("wamp.subscription.on_delete", [session.id, sub.id], out)

    def revoke_unauthorized(self, out: Outbox) -> None:
        """After a reload: drop subscribers whose role may no longer subscribe."""
        allowed = self.authorizer.allowed
        for sub in list(self.by_id.values()):
            for session in [s for s in sub.subscribers
                            if allowed(s.authrole, sub.uri, "subscribe") is None]:
                self._remove_subscriber(session, sub, out)

    def session_left(self, session: Session, out: Outbox) -> None:
        for sub in [s for s in self.by_id.values() if session in s.subscribers]:
            self._remove_subscriber(session, sub, out)

    # -- PUBLISH -------------------------------------------------------------------------

    def publish(self, session: Session, msg: m.Publish, out: Outbox,
                disclose_me: bool = False) -> None:
        topic, acknowledge = msg.topic, msg.acknowledge
        try:
            if topic.startswith("wamp.") or topic == HEALTH_TOPIC:
                raise WampError("wamp.error.not_authorized",
                                f"{topic!r} is reserved for the router: only it publishes "
                                f"there")
            rule = self.authorizer.require(session, topic, "publish")
        except WampError:
            if acknowledge:
                raise
            return  # WAMP answers a refused PUBLISH with ERROR only when acknowledge is set
        disclose = rule.disclose or disclose_me
        pub, refused = self._record(session, msg, disclose, out)
        publication = pub.publication if pub is not None else publication_id()
        self.dispatch(msg, publication, out, publisher=session, disclose=disclose)
        if pub is not None and (pub.history_rule is not None or pub.retain):
            then = (self._acknowledge(session, msg.request, publication)
                    if acknowledge and not refused else None)
            out.store(Persist(pub, self._commit_within(pub.history_rule, bool(acknowledge)),
                              then))
        if not acknowledge:
            return
        if refused:
            out.send(session, m.Error(m.Publish.MESSAGE_TYPE, msg.request, LIMIT_REACHED,
                                      args=[f"publication {publication} was delivered but "
                                            f"{' and '.join(refused)}"]))
        elif pub is None:
            out.send(session, m.Published(msg.request, publication))

    @staticmethod
    def _acknowledge(session: Session, request: int, publication: int):
        """PUBLISHED once the publication is durable, or why it could not be stored."""

        def stored(error: Exception | None, out: Outbox) -> None:
            if error is None:
                out.send(session, m.Published(request, publication))
            else:
                out.send(session, m.Error(m.Publish.MESSAGE_TYPE, request,
                                          "cairn.error.storage_failed",
                                          args=[f"publication {publication} was delivered "
                                                f"live but could not be stored: {error}"]))

        return stored

    def _record(self, session: Session, msg: m.Publish, disclose: bool,
                out: Outbox) -> tuple[StoredPublication | None, list[str]]:
        """The publication as history and/or retention record it, its seq assigned and its
        retained slot updated (None when neither keeps it), and what bounds refused it
        ("not retained: " or "not stored in history: ", the limit's name, ": ", why).
        Publications addressed by session ids are never stored: session ids do not survive
        a restart."""
        if messages.addressed(msg) and (msg.exclude or msg.eligible is not None):
            return None, []
        refused = []
        rule = self.history.rule_for(msg.topic)
        if rule is not None and (why := self._new_history_topic(session, msg.topic)):
            refused.append(f"not stored in history: {why}")
            rule = None
        if rule is None and not msg.retain:
            return None, refused
        reading = out.now
        anchor = self.clock.observe(reading)
        if anchor is not None:
            out.store(ClockStep(anchor, self.sequence.next_seq - 1))
        audience = {name: list(getattr(msg, name)) for name in _AUDIENCE_OPTIONS
                    if getattr(msg, name) is not None} or None
        details: dict[str, Any] = {"topic": msg.topic}
        if disclose:
            details.update(publisher=session.id, publisher_authid=session.authid,
                           publisher_authrole=session.authrole)
        seq, publication = self.sequence.assign()
        pub = StoredPublication(
            seq=seq, publication=publication, realm=self.realm, topic=msg.topic,
            args=msg.args, kwargs=msg.kwargs, wall_ms=reading.wall_ms,
            boot_id=reading.boot_id, boottime_ns=reading.boottime_ns,
            clock_synced=reading.synced, authid=session.authid, authrole=session.authrole,
            audience=audience, details=details, history_rule=rule, retain=bool(msg.retain))
        if msg.retain:
            not_retained, evicted = self.retention.put(pub, session)
            if not_retained is not None:
                limit, _, why = not_retained.partition(": ")
                self.hits.hit(limit, f"{msg.topic!r} not retained: {why}")
                pub.retain = False
                refused.append(f"not retained: {not_retained}")
            for gone in evicted:
                out.store(ForgetRetained(gone))
                self.hits.hit("retained_evicted", f"the retained slot of {gone.topic!r} made "
                                                  f"room for {msg.topic!r}")
        return pub, refused

    def _new_history_topic(self, session: Session, topic: str) -> str | None:
        """Why ``session`` may not add ``topic`` to the realm's history topics (None: it may,
        or has it already): see gateway.core.history_topics."""
        if session is self._own or topic in self.history_topics:
            return None  # the usual case, checked before who publishes is worked out
        driver = self.retention.is_driver(session)
        refused = self.history_topics.admit(topic, None if driver else maker_of(session),
                                            driver)
        if refused is not None:
            limit, _, why = refused.partition(": ")
            self.hits.hit(limit, f"{topic!r} not stored in history: {why}")
        return refused

    def _commit_within(self, rule: int | None, acknowledge: bool) -> float | None:
        """How long the publication may wait for its group commit: its history rule's
        commit window; without one, none when the publisher waits for PUBLISHED, and the
        store's default otherwise."""
        window = self.history.rules[rule].commit_window if rule is not None else 0.0
        return window if window or acknowledge else None

    def dispatch(self, msg: m.Publish, publication: int, out: Outbox,
                 publisher: Session | None = None, disclose: bool = False) -> None:
        """Send EVENTs for a publication to every eligible subscriber."""
        topic = msg.topic
        subscriptions = self.subscriptions.match(topic)
        if not subscriptions:
            return
        eligible = _audience_filter(msg)
        skip = publisher if (publisher is not None and msg.exclude_me is not False) else None
        by = by_authid = by_authrole = None  # who published, if disclosed
        if disclose and publisher is not None:
            by, by_authid, by_authrole = publisher.id, publisher.authid, publisher.authrole
        args, kwargs, payload = msg.args, msg.kwargs, msg.payload
        for sub in subscriptions:
            # A pattern subscription was authorized on its pattern; each concrete topic must
            # be one its subscriber's role may subscribe to as well.
            pattern = sub.match != "exact"
            if payload is None:
                event = messages.event(sub.id, publication, args, kwargs,
                                       topic if pattern else None, by, by_authid, by_authrole)
            else:
                event = m.Event(sub.id, publication, payload=payload,
                                topic=topic if pattern else None, enc_algo=msg.enc_algo,
                                enc_key=msg.enc_key, enc_serializer=msg.enc_serializer,
                                publisher=by, publisher_authid=by_authid,
                                publisher_authrole=by_authrole)
            for receiver in sub.subscribers:
                if receiver is skip or (eligible is not None and not eligible(receiver)):
                    continue
                if pattern and not self.may_receive(receiver, topic):
                    continue
                out.send(receiver, event)

    def may_receive(self, session: Session, topic: str) -> bool:
        return self.authorizer.allowed(session.authrole, topic, "subscribe") is not None

    def publish_own(self, topic: str, kwargs: dict[str, Any], out: Outbox) -> None:
        """A publication of the router itself (its health records): retained, stored by the
        realm's history rules and delivered like a client's, as ``OWN_AUTHID``."""
        msg = m.Publish(0, topic, kwargs=kwargs, retain=True)
        pub, _ = self._record(self._own, msg, False, out)
        self.dispatch(msg, pub.publication if pub is not None else publication_id(), out)
        if pub is not None and (pub.history_rule is not None or pub.retain):
            out.store(Persist(pub, self._commit_within(pub.history_rule, False)))

    def publish_internal(self, topic: str, args: list[Any], out: Outbox) -> None:
        """A publication from the router itself (meta events)."""
        if self.subscriptions.match(topic):
            self.dispatch(m.Publish(0, topic, args=args), publication_id(), out)
