"""Admission: the bounds on connections, kept by the asyncio shell.

Network connections are bounded in total, per address and without a session yet, local
ones (Unix socket, loopback) apart, and every connection's time from connect to WELCOME.
Hitting a bound is counted and logged through :class:`gateway.core.limits.LimitHits`.

The slots for connections without a session ("pending": a handshake or login under way)
are shared out as OpenSSH's ``MaxStartups`` does, so that a few hosts holding half-open
connections cannot keep everyone else out: an address holds at most
``max_pending_per_address`` of them; past half of ``max_pending_connections`` a new one from
an address that already holds one is dropped at random, more often as they fill, and always
past three quarters, so the last quarter is for addresses that hold none. An address whose
half-open connection was cut by the handshake timeout in the last PENALTY seconds gets none
past half, as OpenSSH's ``PerSourcePenalties`` would have it: closing its own half-open
connections does not make it a newcomer again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cairn.gateway.core.config import Limits
from cairn.gateway.core.limits import LimitHits

EARLY_DROP_FROM = 0.5  # of max_pending_connections: from here, addresses holding one may lose
EARLY_DROP_ALL = 0.75  # from here, only addresses holding none get a pending slot
PENALTY = 60.0  # s an address whose half-open connection timed out gets no slot past half
PENALISED_KEPT = 10_000  # addresses remembered at most: a flood of them costs bounded memory


def peer_of(transport: Any) -> tuple[str, bool]:
    """(address, local): the peer's IP address, or "unix"; local for the Unix socket and
    loopback, which only the device itself can reach."""
    peer = transport.get_extra_info("peername")
    if not isinstance(peer, tuple):
        return "unix", True
    try:
        return peer[0], ipaddress.ip_address(peer[0].split("%")[0]).is_loopback
    except ValueError:
        return str(peer[0]), False


def local_caller(transport: Any) -> str:
    """Who is on the other end of a Unix socket connection, as the login throttle tells local
    callers apart: ``unix:uid=987:/system.slice/cairn-sensor@porch.service``, the peer's uid
    (SO_PEERCRED) and the cgroup its process is in, which a process cannot leave by forking
    or reconnecting: each systemd unit is one caller, so one driver's failed logins do not
    lock the others out. ``unix`` when the kernel does not say."""
    sock = transport.get_extra_info("socket")
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (AttributeError, OSError):
        return "unix"
    return f"unix:uid={uid}:{cgroup_of(pid)}"


def cgroup_of(pid: int) -> str:
    """The cgroup systemd put the process in (the ``name=systemd`` hierarchy of a v1 or
    hybrid host, else the unified one), or ``?`` once it has gone."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return "?"
    paths = dict(line.split(":", 2)[1:] for line in lines if line.count(":") >= 2)
    return paths.get("name=systemd") or paths.get("") or "?"


class Ticket:
    """One admitted connection: released when it closes, its deadline cancelled when its
    session is established."""

    __slots__ = ("admission", "address", "local", "pending", "released", "_deadline")

    def __init__(self, admission: Admission, address: str, local: bool) -> None:
        self.admission, self.address, self.local = admission, address, local
        self.pending = True
        self.released = False
        self._deadline: asyncio.TimerHandle | None = None

    def established(self) -> None:
        if self.pending:
            self.pending = False
            if not self.local:
                self.admission.settled(self.address)
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

    def release(self) -> None:
        if not self.released:
            self.established()
            self.released = True
            self.admission.release(self)


class Admission:
    def __init__(self, limits: Limits, hits: LimitHits) -> None:
        self.limits = limits
        self.hits = hits
        self.network = 0
        self.local = 0
        self.pending = 0  # network connections without a session yet
        self.by_address: Counter[str] = Counter()
        self.pending_by_address: Counter[str] = Counter()
        self._penalised: dict[str, float] = {}  # address -> until (monotonic), oldest first

    def admit(self, transport: Any) -> Ticket | None:
        """A ticket for a new connection, or None when a bound refuses it (the caller
        aborts the transport: its file descriptor is not kept a moment longer)."""
        address, local = peer_of(transport)
        refused = self._refusal(address, local)
        if refused is not None:
            limit, detail = refused
            self.hits.hit(limit, detail)
            return None
        ticket = Ticket(self, address, local)
        if local:
            self.local += 1
        else:
            self.network += 1
            self.pending += 1
            self.by_address[address] += 1
            self.pending_by_address[address] += 1
        ticket._deadline = asyncio.get_running_loop().call_later(
            self.limits.handshake_timeout, self._expire, ticket, transport)
        return ticket

    def _refusal(self, address: str, local: bool) -> tuple[str, str] | None:
        limits = self.limits
        if local:
            if self.local >= limits.max_local_connections:
                return ("max_local_connections",
                        f"refused a local connection: {self.local} are open")
            return None
        if self.network >= limits.max_connections:
            return "max_connections", f"refused {address}: {self.network} connections are open"
        if self.by_address[address] >= limits.max_connections_per_address:
            return ("max_connections_per_address",
                    f"refused {address}: it has {self.by_address[address]} connections open")
        return self._pending_refusal(address)

    def _pending_refusal(self, address: str) -> tuple[str, str] | None:
        """Whether ``address`` may have one more connection without a session (see the
        module's docstring)."""
        limits, held = self.limits, self.pending_by_address[address]
        if held >= limits.max_pending_per_address:
            return ("max_pending_per_address",
                    f"refused {address}: it has {held} connections without a session")
        if self.pending >= limits.max_pending_connections:
            return ("max_pending_connections",
                    f"refused {address}: {self.pending} connections have no session yet")
        full = limits.max_pending_connections
        start, end = full * EARLY_DROP_FROM, full * EARLY_DROP_ALL
        if self.pending < start or not (held or self._is_penalised(address)):
            return None
        if held and self.pending < end and \
                random.random() >= (self.pending - start) / (end - start):
            return None
        return ("pending_early_drop",
                f"refused {address}: {self.pending} connections have no session yet, "
                + (f"{held} of them from it" if held else "and its last one timed out"))

    def _is_penalised(self, address: str) -> bool:
        until = self._penalised.get(address)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._penalised[address]
        return False

    def _penalise(self, address: str) -> None:
        self._penalised.pop(address, None)
        self._penalised[address] = time.monotonic() + PENALTY  # (re)inserted last
        if len(self._penalised) > PENALISED_KEPT:
            del self._penalised[next(iter(self._penalised))]

    def settled(self, address: str) -> None:
        """A network connection of ``address`` got its session, or closed without one."""
        self.pending -= 1
        self.pending_by_address[address] -= 1
        if not self.pending_by_address[address]:
            del self.pending_by_address[address]

    def _expire(self, ticket: Ticket, transport: Any) -> None:
        ticket._deadline = None
        if ticket.pending:
            self.hits.hit("handshake_timeout",
                          f"closed a connection from {ticket.address} without a session "
                          f"after {self.limits.handshake_timeout:g} s")
            if not ticket.local:
                self._penalise(ticket.address)
            transport.abort()

    def release(self, ticket: Ticket) -> None:
        if ticket.local:
            self.local -= 1
            return
        self.network -= 1
        self.by_address[ticket.address] -= 1
        if not self.by_address[ticket.address]:
            del self.by_address[ticket.address]
