"""The router: session lifecycle and dispatch of every message a client may send.

``Router.receive(session, message, outbox)`` is the single entry point of the protocol
core; it never does I/O. A message that is invalid in the session's state aborts that
session with ``wamp.error.protocol_violation`` and leaves everyone else untouched.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from autobahn.wamp import message as m
from autobahn.wamp import role

from cairn.base.clock_readings import StepDetector
from cairn.gateway.core.auth import AUTH_FAILED, Authenticator, Authorizer, AuthThrottle, login_peer
from cairn.gateway.core.broker import Broker
from cairn.gateway.core.config import HEALTH_TOPIC, Config, HistoryRule, Limits, RealmConfig
from cairn.gateway.core.dealer import Dealer, MetaProcedure
from cairn.gateway.core.history import get_events_procedure
from cairn.gateway.core.history_rules import HistoryRules
from cairn.gateway.core.limits import LimitHits
from cairn.gateway.core.meta import meta_procedures
from cairn.gateway.core.publication import Restored
from cairn.gateway.core.retention import Retention, received_procedure
from cairn.gateway.core.session import (
    ForgetRetained,
    ForgetSubscription,
    KeepSubscription,
    Outbox,
    ProtocolViolation,
    Sequence,
    Session,
    SessionState,
    WampError,
    global_id,
)

log = logging.getLogger("cairn.router")

ProcedureFactory = Callable[["Realm"], MetaProcedure]  # a realm's own meta procedure

BROKER_FEATURES = role.RoleBrokerFeatures(
    publisher_identification=True,
    pattern_based_subscription=True,
    session_meta_api=True,
    subscription_meta_api=True,
    subscriber_blackwhite_listing=True,
    publisher_exclusion=True,
    payload_transparency=True,
    event_retention=True,
    event_history=True,
)
DEALER_FEATURES = role.RoleDealerFeatures(
    caller_identification=True,
    pattern_based_registration=True,
    session_meta_api=True,
    registration_meta_api=True,
    shared_registration=True,
    call_timeout=True,
    call_canceling=True,
    progressive_call_results=True,
    payload_transparency=True,
)


class Realm:
    def __init__(self, config: RealmConfig, sequence: Sequence, clock: StepDetector,
                 page_cap: int, limits: Limits, hits: LimitHits,
                 procedures: Mapping[str, ProcedureFactory] | None = None,
                 decoy_key: bytes | None = None,
                 history: tuple[HistoryRule, ...] | None = None) -> None:
        self.config = config
        self.name = config.name
        self.sequence, self.clock, self.limits, self.hits = sequence, clock, limits, hits
        self.sessions: dict[int, Session] = {}
        self.decoy_key = decoy_key or secrets.token_bytes(32)  # the same across reloads
        self.authenticator = Authenticator(config, decoy_key)
        self.authorizer = Authorizer(config)
        self.history = HistoryRules(config.history if history is None else history)
        self.retention = Retention(self.limits, config, lambda: self.sequence.next_seq)
        self.broker = Broker(self.name, self.authorizer, self.history, self.retention,
                             self.clock, self.sequence, self.limits, self.hits)
        self.dealer = Dealer(self.authorizer, self.limits, self.hits,
                             meta_event=self.broker.publish_internal)
        self.dealer.meta_procedures.update(meta_procedures(self))
        self.dealer.meta_procedures["wamp.subscription.get_events"] = \
            get_events_procedure(self, page_cap)
        self.dealer.meta_procedures["cairn.retained.received"] = received_procedure(
            self.retention, self.authorizer)
        for uri, make in (procedures or {}).items():
            self.dealer.meta_procedures[uri] = make(self)
        # what handles each message a client may send once established (one lookup a message)
        self.handlers: dict[type, Callable[..., None]] = {
            m.Publish: self.broker.publish, m.Subscribe: self.broker.subscribe,
            m.Unsubscribe: self.broker.unsubscribe, m.Call: self.dealer.call,
            m.Cancel: self.dealer.cancel, m.Register: self.dealer.register,
            m.Unregister: self.dealer.unregister, m.Yield: self.dealer.yield_,
            m.Error: self._invocation_error,
        }

    def _invocation_error(self, session: Session, msg: m.Error, out: Outbox) -> None:
        if msg.request_type != m.Invocation.MESSAGE_TYPE:
            raise ProtocolViolation(
                f"ERROR for request type {msg.request_type}: clients may only answer "
                f"INVOCATIONs")
        self.dealer.invocation_error(session, msg, out)

    def restore(self, restored: Restored, out: Outbox) -> None:
        """Bring back what the store kept: subscriptions with history (same ids as before the
        restart) and retained events; then pre-create the subscriptions of history rules.
        What this realm made while the store could not open stands, and is stored now."""
        stored = set()
        for sub_id, realm, uri, match, created in restored.subscriptions:
            if realm != self.name:
                continue
            live = self.broker.subscriptions.get(uri, match)
            if live is None:
                self.broker.create_subscription(uri, match, out, sub_id, created)
            elif live.id != sub_id:  # clients know the live one's id by now
                out.store(ForgetSubscription(sub_id))
                continue
            stored.add(sub_id)
        for sub in self.broker.by_id.values():
            if sub.kept and sub.id not in stored:
                out.store(KeepSubscription(sub.id, self.name, sub.uri, sub.match, sub.created))
        self.broker.history_topics.restore(t for r, t in restored.history_topics if r == self.name)
        ours = [pub for pub in restored.retained if pub.realm == self.name]
        # drivers' slots first, then newest first: the others go if the bounds were lowered
        standing = self.retention.standing
        for pub in sorted(ours, key=lambda p: (standing(p), p.seq), reverse=True):
            if self.retention.holds(pub):  # newer: published while the store could not open
                continue
            if self.retention.put(pub, evict=False)[0] is not None:
                out.store(ForgetRetained(pub))
        self.create_rule_subscriptions(out)

    def create_rule_subscriptions(self, out: Outbox) -> None:
        """Each history rule's own subscription exists from the start, so its id is stable."""
        for rule in self.history.rules:
            if self.broker.subscriptions.get(rule.uri, rule.match) is None:
                self.broker.create_subscription(rule.uri, rule.match, out)

    def meta_event(self, topic: str, args: list[Any], out: Outbox) -> None:
        self.broker.publish_internal(topic, args, out)

    def join(self, session: Session, out: Outbox) -> None:
        self.sessions[session.id] = session
        self.meta_event("wamp.session.on_join", [session.details()], out)

    def leave(self, session: Session, out: Outbox) -> None:
        if self.sessions.pop(session.id, None) is None:
            return
        self.broker.session_left(session, out)
        self.dealer.session_left(session, out)
        self.meta_event("wamp.session.on_leave", [session.id, session.authid, session.authrole],
                        out)


class Router:
    """Built from the configuration and what the store kept (``restored``); the effects of
    bringing that back (bounds lowered, history rules added) are written to ``out``.
    ``procedures``: more meta procedures, made per realm (the shell's own); ``decoy_key``:
    see :class:`~gateway.core.auth.Authenticator`."""

    def __init__(self, config: Config, restored: Restored, out: Outbox, hits: LimitHits,
                 procedures: Mapping[str, ProcedureFactory] | None = None,
                 decoy_key: bytes | None = None) -> None:
        self.config = config
        self.clock = StepDetector()
        self.hits = hits
        # one receive order for all realms, as in the store
        self.sequence = Sequence(restored.next_seq, restored.ids)
        self.realms = {rc.name: Realm(rc, self.sequence, self.clock,
                                      config.router.history_page_cap, config.router.limits,
                                      self.hits, procedures, decoy_key,
                                      config.history_rules(rc))
                       for rc in config.realms}
        self.sessions: dict[int, Session] = {}
        self.stopping = False  # after shutdown(): no new sessions
        self.throttle = AuthThrottle()
        for realm in self.realms.values():
            realm.restore(restored, out)

    def resume(self, restored: Restored, out: Outbox) -> None:
        """The store opened late (it could not when the router started): continue after
        its receive order and bring back what it kept."""
        self.sequence.resume(restored.next_seq, restored.ids)
        for realm in self.realms.values():
            realm.restore(restored, out)

    def publish_health(self, record: dict[str, Any], out: Outbox) -> None:
        """The gateway's health record (gateway.shell.health), in the first realm: its history
        keeps it (Config.history_rules) and sync ships it with the data."""
        next(iter(self.realms.values())).broker.publish_own(HEALTH_TOPIC, record, out)

    # -- the entry points ----------------------------------------------------------------

    def receive(self, session: Session, msg: m.Message, out: Outbox,
                extra: dict[str, Any] | None = None) -> None:
        """``extra`` holds options autobahn's parser drops: ``disclose_me`` on PUBLISH/CALL."""
        try:
            if session.state is SessionState.ESTABLISHED:
                self._established(session, msg, out, extra or {})
            elif session.state is SessionState.OPENING:
                self._hello(session, msg, out)
            elif session.state is SessionState.CHALLENGED:
                self._authenticate(session, msg, out)
        except ProtocolViolation as e:
            self.abort(session, "wamp.error.protocol_violation", str(e), out)

    def lost(self, session: Session, out: Outbox) -> None:
        """The transport went away (or was closed by us)."""
        if session.closed:
            return
        session.to(SessionState.CLOSED)
        self._detach(session, out)

    def abort(self, session: Session, reason: str, text: str, out: Outbox) -> None:
        if session.closed:
            return
        log.warning("session %s aborted: %s: %s (peer %s)", session.id or "-", reason, text,
                    session.transport.get("peer"))
        out.send(session, m.Abort(reason, text))
        out.close(session)
        session.to(SessionState.CLOSED)
        self._detach(session, out)

    def reload(self, config: Config, out: Outbox) -> None:
        """New users, roles and permissions for the running realms (SIGHUP). Realms and
        history rules change only with a restart. Sessions whose role is gone are closed."""
        for rc in config.realms:
            realm = self.realms.get(rc.name)
            if realm is None:
                log.warning("reload: new realm %r needs a restart", rc.name)
                continue
            realm.config = rc
            realm.authenticator = Authenticator(rc, realm.decoy_key)
            realm.authorizer.update(rc)  # the broker's and dealer's too; a fresh cache
            realm.broker.revoke_unauthorized(out)
            realm.dealer.revoke_unauthorized(out)
            roles = {r.name for r in rc.roles}
            for session in list(realm.sessions.values()):
                if session.authrole not in roles:
                    log.info("reload: closing session %s: role %r was removed", session.id,
                             session.authrole)
                    out.send(session, m.Goodbye("wamp.close.killed",
                                                f"role {session.authrole!r} was removed"))
                    out.close(session)
                    session.to(SessionState.CLOSED)
                    self._detach(session, out)
        self.config = config

    def shutdown(self, out: Outbox) -> None:
        """Say GOODBYE to every session (SIGTERM); a HELLO coming later is refused. The
        transports stay open a moment for the clients' GOODBYE replies (the shell closes
        them)."""
        self.stopping = True
        for session in list(self.sessions.values()):
            out.send(session, m.Goodbye("wamp.close.system_shutdown", "the router is stopping"))
            session.to(SessionState.CLOSED)
            self._detach(session, out)

    # -- before WELCOME ------------------------------------------------------------------

    def _hello(self, session: Session, msg: m.Message, out: Outbox) -> None:
        if not isinstance(msg, m.Hello):
            raise ProtocolViolation(f"expected HELLO, got {type(msg).__name__.upper()}")
        if self.stopping:
            self.abort(session, "wamp.close.system_shutdown", "the router is stopping", out)
            return
        realm = self.realms.get(msg.realm)
        if realm is None:
            self.abort(session, "wamp.error.no_such_realm",
                       f"no realm {msg.realm!r} on this router", out)
            return
        session.id = global_id()
        while session.id in self.sessions:
            session.id = global_id()
        session.realm = realm
        session.roles = msg.roles or {}
        try:
            challenge = realm.authenticator.hello(session, msg, out.now)
        except WampError as e:
            self.abort(session, e.uri, e.message or e.uri, out)
            return
        if challenge is None:  # anonymous: nothing to guess, never throttled
            self._welcome(session, realm, out)
        elif not self._throttled(session, out):
            session.to(SessionState.CHALLENGED)
            out.send(session, challenge)

    def _authenticate(self, session: Session, msg: m.Message, out: Outbox) -> None:
        if not isinstance(msg, m.Authenticate):
            raise ProtocolViolation(f"expected AUTHENTICATE, got {type(msg).__name__.upper()}")
        realm = session.realm
        assert realm is not None
        authid = session.pending_auth.authid
        if self._throttled(session, out):  # challenges opened before the limit: no more guesses
            return
        try:
            realm.authenticator.authenticate(session, msg)
        except WampError as e:
            if e.uri == AUTH_FAILED:
                self.throttle.failed(login_peer(session.transport.get("peer")), authid,
                                     out.now.monotonic_s)
            self.abort(session, e.uri, e.message or e.uri, out)
            return
        self._welcome(session, realm, out)

    def _throttled(self, session: Session, out: Outbox) -> bool:
        """Abort the login (its challenge not counted as unanswered) if too many failed."""
        peer = login_peer(session.transport.get("peer"))
        wait = self.throttle.refused_for(peer, session.pending_auth.authid, out.now.monotonic_s)
        if wait:
            session.pending_auth = None
            self.abort(session, AUTH_FAILED, f"too many failed logins from {peer.address}; "
                                             f"try again in {wait:.0f} s", out)
        return bool(wait)

    def _unanswered(self, session: Session, out: Outbox) -> None:
        """A session closed while its challenge was open counts as a failed login: else
        asking for challenges (which users exist? salted?) would go unthrottled."""
        if session.pending_auth is not None:
            self.throttle.failed(login_peer(session.transport.get("peer")),
                                 session.pending_auth.authid, out.now.monotonic_s)
            session.pending_auth = None

    def _welcome(self, session: Session, realm: Realm, out: Outbox) -> None:
        session.to(SessionState.ESTABLISHED)
        self.sessions[session.id] = session
        out.send(session, m.Welcome(
            session.id,
            {"broker": BROKER_FEATURES, "dealer": DEALER_FEATURES},
            realm=realm.name,
            authid=session.authid,
            authrole=session.authrole,
            authmethod=session.authmethod,
            authprovider=session.authprovider,
        ))
        realm.join(session, out)
        log.info("session %s joined realm %s as %s/%s (%s, peer %s)", session.id, realm.name,
                 session.authid, session.authrole, session.authmethod,
                 session.transport.get("peer"))

    # -- after WELCOME -------------------------------------------------------------------

    def _established(self, session: Session, msg: m.Message, out: Outbox,
                     extra: dict[str, Any]) -> None:
        realm = session.realm
        assert realm is not None
        handler = realm.handlers.get(type(msg))
        if handler is None:
            if isinstance(msg, m.Goodbye):
                out.send(session, m.Goodbye("wamp.close.goodbye_and_out"))
                out.close(session)
                session.to(SessionState.CLOSED)
                self._detach(session, out)
                return
            raise ProtocolViolation(
                f"{type(msg).__name__.upper()} is not a message a client may send "
                f"in an established session")
        try:
            if extra:
                handler(session, msg, out, **extra)
            else:
                handler(session, msg, out)
        except WampError as e:
            request_type = msg.MESSAGE_TYPE
            out.send(session, m.Error(request_type, msg.request, e.uri,
                                      args=e.args_list, kwargs=e.kwargs or None))

    def _detach(self, session: Session, out: Outbox) -> None:
        self._unanswered(session, out)
        if session.id in self.sessions and self.sessions[session.id] is session:
            del self.sessions[session.id]
            if session.realm is not None:
                session.realm.leave(session, out)
                log.info("session %s left realm %s", session.id, session.realm.name)
