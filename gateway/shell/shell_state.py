"""What the shell's transports and pages share, in one place (uvicorn's ``ServerState``).

:class:`ShellState` is the state of the running gateway that the transports
(gateway.shell.transport) count into and the pages (gateway.shell.web) read; :class:`Callbacks`
is where a transport hands what arrives on to the core (gateway.shell.server.Node). Handing these
instead of the whole Node keeps each side to what it uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairn.base.clock import SystemClock
from cairn.gateway.core.config import Check, parse
from cairn.gateway.core.limits import LimitHits
from cairn.gateway.shell.admission import Admission
from cairn.gateway.shell.flow_control import WriteBatcher
from cairn.gateway.shell.metrics import MessageCounters

if TYPE_CHECKING:
    from autobahn.wamp import message as m

    from cairn.gateway.core.config import Config
    from cairn.gateway.core.session import Session
    from cairn.gateway.ops.config_history import RunningConfig


@dataclass(eq=False)
class ShellState:
    config: Config
    limit_hits: LimitHits
    admission: Admission
    running: RunningConfig | None = None  # which file, the last good one, why (config_history)
    check: Check = parse  # what a new text of the file must pass (config_admin)
    clock: SystemClock = field(default_factory=SystemClock)  # read for each call into the core
    writes: WriteBatcher = field(default_factory=WriteBatcher)
    counters: MessageCounters = field(default_factory=MessageCounters)
    connections: set[Any] = field(default_factory=set)  # open gateway.shell.transport.Connection
    urls: list[str] = field(default_factory=list)  # where it listens, once it does
    started: float = field(default_factory=time.monotonic)
    slow_consumers: int = 0  # disconnected for not reading what was sent to them
    protocol_violations: int = 0


@dataclass(frozen=True, eq=False)
class Callbacks:
    """The core's entry points, as a transport calls them for a session."""

    receive: Callable[[Session, m.Message, dict | None], None]
    violation: Callable[[Session, str], None]
    lost: Callable[[Session], None]
