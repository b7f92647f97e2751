"""Bounds on what a client can make the router hold, and how hitting one is reported.

An unattended device on a LAN meets buggy and hostile clients. Every bound is a setting of
``[router.limits]`` (:class:`gateway.config.Limits`); hitting one is counted for
``/metrics`` (``cairn_limit_hits_total{limit}``) and logged at most once per
:attr:`LimitHits.interval`, with how often it was hit since the last line, never once per
event: a flood must not become a flood of log lines on the card.

:class:`Admission` bounds connections: network ones in total, per address and without a
session yet, local ones (Unix socket, loopback) apart, and every connection's time from
connect to WELCOME.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from typing import Any

from gateway.config import Limits

log = logging.getLogger("cairn.limits")


class LimitHits:
    interval = 60.0  # seconds between log lines about one limit

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()  # since start, for /metrics
        self._unreported: Counter[str] = Counter()
        self._logged: dict[str, float] = {}

    def hit(self, limit: str, detail: str) -> None:
        self.counts[limit] += 1
        self._unreported[limit] += 1
        now = time.monotonic()
        if now - self._logged.get(limit, -self.interval) >= self.interval:
            n = self._unreported.pop(limit)
            log.warning("limit %s: %s%s", limit, detail,
                        f" ({n} times in the last {self.interval:g} s)" if n > 1 else "")
            self._logged[limit] = now


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
            self.admission.pending -= not self.local
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
        if self.pending >= limits.max_pending_connections:
            return ("max_pending_connections",
                    f"refused {address}: {self.pending} connections have no session yet")
        return None

    def _expire(self, ticket: Ticket, transport: Any) -> None:
        ticket._deadline = None
        if ticket.pending:
            self.hits.hit("handshake_timeout",
                          f"closed a connection from {ticket.address} without a session "
                          f"after {self.limits.handshake_timeout:g} s")
            transport.abort()

    def release(self, ticket: Ticket) -> None:
        if ticket.local:
            self.local -= 1
            return
        self.network -= 1
        self.by_address[ticket.address] -= 1
        if not self.by_address[ticket.address]:
            del self.by_address[ticket.address]
