"""Building blocks of the I/O-free protocol core: sessions, the outbox and WAMP errors.

The broker, dealer and router never touch a socket or the event loop. They take a parsed
message and write what should happen next into an :class:`Outbox`: messages to send,
sessions to close, timers to start, coroutines to run. The asyncio shell
(:mod:`gateway.server`) carries those out.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autobahn.wamp.message import Message

if TYPE_CHECKING:
    from gateway.router import Realm


def global_id() -> int:
    """A random id from WAMP's global scope [1, 2**53]."""
    return secrets.randbits(53) or 1


_publication_ids = random.Random(secrets.randbits(128))


def publication_id() -> int:
    """A publication id, random in [1, 2**53] like global_id() but from a generator seeded
    once by the OS: one system call per publication shows on the hot path, and unlike session
    ids, publication ids guard nothing."""
    return _publication_ids.getrandbits(53) or 1


def brief(value: Any, width: int = 60) -> str:
    """The start of repr(value), for error messages about untrusted values: repr() raises
    on integers of more than 4,300 digits and on very deeply nested lists."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__} too large to show>"
    return text[:width]


class WampError(Exception):
    """An error to return to the peer as a WAMP ERROR (or ABORT before WELCOME)."""

    def __init__(self, uri: str, message: str | None = None, **kwargs: Any) -> None:
        super().__init__(message or uri)
        self.uri = uri
        self.message = message
        self.kwargs = kwargs

    @property
    def args_list(self) -> list[Any] | None:
        return [self.message] if self.message else None


LIMIT_REACHED = "cairn.error.limit_reached"


def limit_reached(hits: Any, limit: str, detail: str) -> WampError:
    """The error for a request refused by a bound of ``[router.limits]``, the hit counted."""
    hits.hit(limit, detail)
    return WampError(LIMIT_REACHED, f"{detail} (router.limits.{limit})")


class ProtocolViolation(Exception):
    """The peer broke the protocol: its session is aborted with wamp.error.protocol_violation."""


@dataclass(eq=False)
class Session:
    """A WAMP session as the core sees it. ``link`` belongs to the transport shell."""

    link: Any = None
    transport: dict[str, Any] = field(default_factory=dict)
    id: int = 0
    realm: Realm | None = None
    authid: str | None = None
    authrole: str | None = None
    authmethod: str | None = None
    authprovider: str | None = None
    authextra: dict[str, Any] = field(default_factory=dict)
    roles: dict[str, Any] = field(default_factory=dict)
    established: bool = False
    closed: bool = False
    # state the authenticator keeps between HELLO and AUTHENTICATE
    pending_auth: Any = None
    subscriptions: int = 0  # held now, bounded by router.limits
    registrations: int = 0

    def supports(self, role: str, feature: str) -> bool:
        features = self.roles.get(role)
        return bool(features is not None and getattr(features, feature, False))

    def details(self) -> dict[str, Any]:
        """The session as the meta API describes it."""
        return {
            "session": self.id,
            "authid": self.authid,
            "authrole": self.authrole,
            "authmethod": self.authmethod,
            "authprovider": self.authprovider,
            "authextra": self.authextra,
            "transport": self.transport,
        }

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.authid}/{self.authrole}>"


Timer = Callable[["Outbox"], None]
Task = Callable[["Outbox"], Awaitable[None]]
Resolved = Callable[[asyncio.Future, "Outbox"], None]


class Outbox:
    """What the core wants done, in order. The shell drains it after each call."""

    __slots__ = ("messages", "closes", "timers", "tasks", "waits")

    def __init__(self) -> None:
        self.messages: list[tuple[Session, Message]] = []
        self.closes: list[Session] = []
        self.timers: list[tuple[float, Timer]] = []
        self.tasks: list[Task] = []
        self.waits: list[tuple[asyncio.Future, Resolved]] = []

    def send(self, session: Session, message: Message) -> None:
        if not session.closed:
            self.messages.append((session, message))

    def close(self, session: Session) -> None:
        """Close the session's transport once the messages queued before are sent."""
        self.closes.append(session)

    def later(self, delay: float, callback: Timer) -> None:
        self.timers.append((delay, callback))

    def spawn(self, task: Task) -> None:
        self.tasks.append(task)

    def when_done(self, future: asyncio.Future, callback: Resolved) -> None:
        """``callback(future, outbox)`` once the future is done (cheaper than a task)."""
        self.waits.append((future, callback))
