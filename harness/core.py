"""The protocol core in memory: Cairn's router without sockets, an event loop or a store,
driven one message at a time and inspected after each (as h11's tests drive its state
machine with a pair of connections). The store's effects are carried out in memory:
publications are durable the moment the core asks, unless a test holds them back."""

from __future__ import annotations

import itertools
import time
import tomllib
from dataclasses import dataclass, field
from typing import Any

from autobahn.wamp import message as m
from autobahn.wamp import role

from cairn.base.clock import SystemClock
from cairn.formats.publication_ids import PublicationIds, new_key
from cairn.gateway.core import config as cfg
from cairn.gateway.core.limits import LimitHits
from cairn.gateway.core.publication import Restored
from cairn.gateway.core.retention import RetainedStream
from cairn.gateway.core.router import Router
from cairn.gateway.core.session import Effect, Outbox, Persist, Read, Session, Timer

CLIENT_ROLES = {"publisher": role.RolePublisherFeatures(), "subscriber":
                role.RoleSubscriberFeatures(), "caller": role.RoleCallerFeatures(),
                "callee": role.RoleCalleeFeatures(call_canceling=True,
                                                  progressive_call_results=True)}


@dataclass(eq=False)
class Peer:
    """A client's end: what it sends goes through the core, what it receives piles up."""

    core: CoreRouter
    session: Session
    inbox: list[Any] = field(default_factory=list)
    closed: bool = False

    def send(self, msg: m.Message, **extra: Any) -> list[Any]:
        """Deliver ``msg``; what this peer received because of it (and of what followed)."""
        start = len(self.inbox)
        out = self.core.outbox()
        self.core.router.receive(self.session, msg, out, extra or None)
        self.core.flush(out)
        return self.inbox[start:]

    def close(self) -> None:
        self.closed = True

    def drop(self) -> None:
        """The transport goes away without GOODBYE (the shell tells the core it is lost)."""
        out = self.core.outbox()
        self.core.router.lost(self.session, out)
        self.core.flush(out)
        self.close()


class CoreRouter:
    """A router built from TOML text, with the store's state it would restore."""

    def __init__(self, toml: str, hold_writes: bool = False) -> None:
        self.clock = SystemClock()  # as the shell reads it, for each call
        out = self.outbox()
        self.router = Router(cfg.parse(tomllib.loads(toml), "harness.toml"),
                             Restored(1, PublicationIds(new_key())), out,
                             LimitHits(time.monotonic))
        self.hold_writes = hold_writes  # True: Persist waits for complete_writes()
        self.effects: list[Effect] = []  # every effect on the store, in order
        self.held: list[Persist] = []
        self.reads: list[Read] = []
        self.timers: list[tuple[float, Timer]] = []
        self.peers: list[Peer] = []  # every session connected, in order
        self.requests = itertools.count(1000)  # request ids for tests that need fresh ones
        self.flush(out)

    def connect(self, realm: str = "realm1", roles: dict[str, Any] | None = None,
                **hello: Any) -> Peer:
        """A session that sent HELLO (anonymous unless ``hello`` says otherwise) with the
        roles autobahn announces, or ``roles``."""
        peer = Peer(self, Session(transport={"type": "memory", "peer": "memory"}))
        peer.session.link = peer
        self.peers.append(peer)
        peer.send(m.Hello(realm, roles or CLIENT_ROLES, **hello))
        return peer

    def outbox(self) -> Outbox:
        """The outbox of one call into the core, made now."""
        return Outbox(self.clock.now)

    def flush(self, out: Outbox) -> None:
        for effect in out.effects:
            self.effects.append(effect)
            if isinstance(effect, Persist) and effect.then is not None:
                self.held.append(effect)
            elif isinstance(effect, Read):
                self.reads.append(effect)
        for session, msg in out.messages:
            if isinstance(msg, RetainedStream):  # a peer in memory reads as fast as it comes
                session.link.inbox.extend(msg.drain())
            else:
                session.link.inbox.append(msg)
        for session in out.closes:
            session.link.close()
        self.timers += out.timers
        if not self.hold_writes:
            self.complete_writes()

    def complete_writes(self, error: Exception | None = None) -> None:
        """The store commits (or fails, with ``error``) every write held back."""
        held, self.held = self.held, []
        for persist in held:
            out = self.outbox()
            persist.then(error, out)
            self.flush(out)

    def fire_timers(self) -> None:
        """Time passes: every timer the core started fires, the shortest first."""
        timers, self.timers = sorted(self.timers, key=lambda timer: timer[0]), []
        for _, timer in timers:
            out = self.outbox()
            timer(out)
            self.flush(out)

    def answer_read(self, outcome: Any) -> None:
        """The store answers the oldest read with ``outcome`` (rows or an exception)."""
        read = self.reads.pop(0)
        out = self.outbox()
        read.answer(outcome, out)
        self.flush(out)

    def effects_of(self, kind: type) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]


def of_type(messages: list[Any], kind: type) -> list[Any]:
    return [msg for msg in messages if isinstance(msg, kind)]


def call(peer: Peer, procedure: str, *args: Any, **kwargs: Any) -> m.Result | m.Error:
    """CALL ``procedure`` with ``args`` and ``kwargs`` from ``peer``: its RESULT or ERROR."""
    request = next(peer.core.requests)
    [answer] = [msg for msg in peer.send(m.Call(request, procedure, args=list(args) or None,
                                                kwargs=kwargs or None))
                if isinstance(msg, m.Result | m.Error) and msg.request == request]
    return answer

