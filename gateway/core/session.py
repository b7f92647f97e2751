"""Building blocks of the I/O-free protocol core: sessions, the outbox and WAMP errors.

The broker, dealer and router never touch a socket, the event loop, the store or a clock.
They take a parsed message and an :class:`Outbox` holding the time of the call (``now``,
read by the shell), and write what should happen next into the outbox: messages to
send, sessions to close, timers to start, coroutines to run, and what to write to the store
or read from it (:class:`Persist`, :class:`Read` and the other effects below). The asyncio
shell (:mod:`gateway.shell.server`) carries those out, the store's effects first.
"""

from __future__ import annotations

import enum
import random
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autobahn.wamp.message import Message

from cairn.formats.publication_ids import PublicationIds
from cairn.gateway.core.publication import StoredPublication

if TYPE_CHECKING:
    from cairn.base.clock_readings import Anchor, Reading


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


class SessionState(enum.Enum):
    """Where a session is in its life. It moves only as TRANSITIONS allow, and in each
    state the router expects one kind of message (see gateway.core.router)."""

    OPENING = "opening"          # the transport is open: HELLO expected
    CHALLENGED = "challenged"    # CHALLENGE sent: AUTHENTICATE expected
    ESTABLISHED = "established"  # WELCOME sent: the session's messages
    CLOSED = "closed"            # GOODBYE, ABORT or the transport gone: nothing more


TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.OPENING: frozenset({SessionState.CHALLENGED, SessionState.ESTABLISHED,
                                     SessionState.CLOSED}),
    SessionState.CHALLENGED: frozenset({SessionState.ESTABLISHED, SessionState.CLOSED}),
    SessionState.ESTABLISHED: frozenset({SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class IllegalTransition(Exception):
    """A bug in the router: it moved a session where TRANSITIONS does not lead."""


@dataclass(eq=False)
class Session:
    """A WAMP session as the core sees it. ``link`` belongs to the transport shell."""

    link: Any = None
    transport: dict[str, Any] = field(default_factory=dict)
    id: int = 0
    # its gateway.core.router.Realm once HELLO named one (not imported: router imports this module)
    realm: Any = None
    authid: str | None = None
    authrole: str | None = None
    authmethod: str | None = None
    authprovider: str | None = None
    authextra: dict[str, Any] = field(default_factory=dict)
    roles: dict[str, Any] = field(default_factory=dict)
    state: SessionState = SessionState.OPENING
    # mirrors of ``state`` that to() keeps, read on every message sent: attributes, not
    # properties (a property costs a call per EVENT)
    established: bool = False
    closed: bool = False
    # what the authenticator keeps between HELLO and AUTHENTICATE (state CHALLENGED)
    pending_auth: Any = None
    subscriptions: int = 0  # held now, bounded by router.limits
    registrations: int = 0

    def to(self, state: SessionState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"session {self.id}: {self.state.value} -> {state.value}")
        self.state = state
        self.established = state is SessionState.ESTABLISHED
        self.closed = state is SessionState.CLOSED

    def supports(self, role: str, feature: str) -> bool:
        features = self.roles.get(role)
        return bool(features is not None and getattr(features, feature, False))

    def details(self) -> dict[str, Any]:
        """The session as the meta API describes it: a copy, which the caller may keep."""
        return {
            "session": self.id,
            "authid": self.authid,
            "authrole": self.authrole,
            "authmethod": self.authmethod,
            "authprovider": self.authprovider,
            "authextra": dict(self.authextra),
            "transport": dict(self.transport),
        }

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.authid}/{self.authrole}>"


class Sequence:
    """Receive order: the seq of each stored publication and its publication id. Seeded
    from the store when it opens (ids are then a keyed function of seq, see
    :mod:`formats.publication_ids`); without a store, seqs count from 1 with random ids."""

    def __init__(self, next_seq: int = 1, ids: PublicationIds | None = None) -> None:
        self.next_seq = next_seq
        self.ids = ids

    def resume(self, next_seq: int, ids: PublicationIds) -> None:
        """Continue after what the store holds (never reusing a seq handed out already)."""
        self.next_seq = max(self.next_seq, next_seq)
        self.ids = ids

    def assign(self) -> tuple[int, int]:
        seq = self.next_seq
        self.next_seq += 1
        return seq, self.ids.of_seq(seq) if self.ids is not None else publication_id()


Timer = Callable[["Outbox"], None]
Task = Callable[["Outbox"], Awaitable[None]]
Stored = Callable[[Exception | None, "Outbox"], None]  # None: durable; else why not
Answer = Callable[[Any, "Outbox"], None]  # the rows read, or the exception the read raised


# -- effects on the store, carried out by the shell in the order they were written ---------


@dataclass(eq=False)
class Persist:
    """Store a publication (history row and/or retained slot) within ``within`` seconds
    (0: at once; None: the store's default), then ``then(error, outbox)``."""

    pub: StoredPublication
    within: float | None = None
    then: Stored | None = None


@dataclass(eq=False)
class KeepSubscription:
    """A subscription with history: kept across restarts under the same id."""

    id: int
    realm: str
    uri: str
    match: str
    created: str


@dataclass(eq=False)
class ForgetSubscription:
    id: int


@dataclass(eq=False)
class ForgetRetained:
    """A retained slot the bounds no longer hold."""

    pub: StoredPublication


@dataclass(eq=False)
class ClockStep:
    """The wall clock jumped (or was first seen synchronized): its anchor, which holds for
    the seqs after ``after_seq``."""

    anchor: Anchor
    after_seq: int


@dataclass(eq=False)
class Read:
    """Read from the store (``request``: a request type the store module serves, such as
    :class:`gateway.core.history.HistoryRead`), then ``answer(rows or exception, outbox)``."""

    request: Any
    answer: Answer


Effect = Persist | KeepSubscription | ForgetSubscription | ForgetRetained | ClockStep | Read


class Outbox:
    """One call into the core: its time (:attr:`now`, from the shell's clock) and what the
    core wants done, in order. The shell drains it after the call."""

    __slots__ = ("_clock", "_now", "messages", "closes", "timers", "tasks", "effects")

    def __init__(self, clock: Callable[[], Reading]) -> None:
        self._clock: Callable[[], Reading] = clock
        self._now: Reading | None = None
        self.messages: list[tuple[Session, Message]] = []
        # what most calls have none of: one shared empty tuple until the first is added
        self.closes: list[Session] | tuple[()] = ()
        self.timers: list[tuple[float, Timer]] | tuple[()] = ()
        self.tasks: list[Task] | tuple[()] = ()
        self.effects: list[Effect] | tuple[()] = ()

    @property
    def now(self) -> Reading:
        """The time of the call: the shell's clock read when the core first asks (most
        calls never do: reading it for every message cost 3-7 % of pub/sub throughput)."""
        if self._now is None:
            self._now = self._clock()
        return self._now

    def send(self, session: Session, message: Message) -> None:
        if not session.closed:
            self.messages.append((session, message))

    def close(self, session: Session) -> None:
        """Close the session's transport once the messages queued before are sent."""
        if not self.closes:
            self.closes = []
        self.closes.append(session)

    def later(self, delay: float, callback: Timer) -> None:
        if not self.timers:
            self.timers = []
        self.timers.append((delay, callback))

    def spawn(self, task: Task) -> None:
        if not self.tasks:
            self.tasks = []
        self.tasks.append(task)

    def store(self, effect: Effect) -> None:
        if not self.effects:
            self.effects = []
        self.effects.append(effect)
