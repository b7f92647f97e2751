"""What every driver shares: its WAMP session to the router, a bounded backlog, and the
rules for when a reading is worth publishing.

A driver never blocks on the router. Readings go into a backlog bounded per device
(drivers.backlog: a device's oldest dropped and counted when its share is full) that a
background task drains in order, each publication ``retain: true`` + ``acknowledge: true``,
as many in flight as a window that follows the router's pace allows (drivers.in_flight), so a
reading leaves the backlog only once the router has stored it. When the router goes away the
task reconnects with backoff and carries on where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgpack
from autobahn.asyncio.rawsocket import WampRawSocketClientFactory
from autobahn.asyncio.wamp import ApplicationSession
from autobahn.asyncio.websocket import WampWebSocketClientFactory
from autobahn.wamp import auth, types
from autobahn.wamp.exception import ApplicationError, TransportLost
from autobahn.wamp.serializer import JsonSerializer, MsgPackSerializer

from cairn.drivers.backlog import Backlog, Publication
from cairn.drivers.in_flight import InFlightWindow

log = logging.getLogger("cairn.driver")

def reading_topic(device_id: str) -> str:
    return f"sensor.{device_id}"


def status_topic(device_id: str) -> str:
    return f"gateway.device.{device_id}.status"


class _Session(ApplicationSession):
    def __init__(self, config: types.ComponentConfig, authid: str | None,
                 secret: str | None) -> None:
        super().__init__(config)
        self._authid, self._secret = authid, secret
        loop = asyncio.get_running_loop()
        self.joined: asyncio.Future = loop.create_future()
        self.gone: asyncio.Future = loop.create_future()

    def onConnect(self) -> None:
        methods = ["ticket", "wampcra"] if self._secret else ["anonymous"]
        self.join(self.config.realm, authmethods=methods, authid=self._authid)

    def onChallenge(self, challenge: types.Challenge) -> str:
        if challenge.method == "ticket":
            return self._secret
        key = self._secret.encode()
        if "salt" in challenge.extra:
            key = auth.derive_key(self._secret, challenge.extra["salt"],
                                  challenge.extra["iterations"], challenge.extra["keylen"])
        return auth.compute_wcs(key, challenge.extra["challenge"]).decode("ascii")

    def onJoin(self, details: types.SessionDetails) -> None:
        if not self.joined.done():
            self.joined.set_result(details)

    def onLeave(self, details: types.CloseDetails) -> None:
        if not self.joined.done():
            self.joined.set_exception(ConnectionRefusedError(f"{details.reason}: "
                                                             f"{details.message}"))
        self.disconnect()  # (autobahn's onLeave would log every clean leave as a warning)

    def onDisconnect(self) -> None:
        if not self.joined.done():
            self.joined.set_exception(ConnectionError("connection closed before WELCOME"))
        if not self.gone.done():
            self.gone.set_result(None)


async def open_session(url: str, realm: str, authid: str | None = None,
                       secret: str | None = None, timeout: float = 10) -> _Session:
    """Connect and join. ``url`` is what the router prints when it starts:
    ``ws://host:port/ws``, ``rawsocket+tcp://host:port`` or ``rawsocket+unix:/path``."""
    loop = asyncio.get_running_loop()
    session = _Session(types.ComponentConfig(realm=realm), authid, secret)
    if url.startswith(("ws://", "wss://")):
        factory = WampWebSocketClientFactory(lambda: session, url=url,
                                             serializers=[JsonSerializer()])
        host, port = factory.host, factory.port
        await loop.create_connection(factory, host, port, ssl=True if factory.isSecure else None)
    elif url.startswith("rawsocket+unix:"):
        factory = WampRawSocketClientFactory(lambda: session, serializer=MsgPackSerializer())
        await loop.create_unix_connection(factory, url.removeprefix("rawsocket+unix:"))
    elif url.startswith("rawsocket+tcp://"):
        host, _, port = url.removeprefix("rawsocket+tcp://").rpartition(":")
        factory = WampRawSocketClientFactory(lambda: session, serializer=MsgPackSerializer())
        await loop.create_connection(factory, host, int(port))
    else:
        raise ValueError(f"unsupported router URL {url!r} (use ws://, rawsocket+tcp:// or "
                         f"rawsocket+unix:)")
    await asyncio.wait_for(session.joined, timeout)
    return session


@dataclass
class LinkStats:
    queued: int = 0
    published: int = 0
    dropped_full: int = 0      # oldest readings dropped because a backlog bound was reached
    dropped_refused: int = 0   # publications the router refused for good
    reconnects: int = 0
    connected: bool = False
    last_error: str | None = None
    # dropped_full by device (MAX_DEVICES_COUNTED of them; the rest under OTHER_DEVICES)
    dropped_by_device: dict[str, int] = field(default_factory=dict)


MAX_DEVICES_COUNTED = 1000  # device names kept in LinkStats.dropped_by_device
OTHER_DEVICES = "(other devices)"
STORAGE_FAILED = "cairn.error.storage_failed"  # the router's store cannot keep up, or write


class RouterLink:
    """A driver's connection to the router, with a backlog bounded per device
    (drivers.backlog) and an in-flight window that follows the router's pace
    (drivers.in_flight)."""

    def __init__(self, url: str, realm: str, *, authid: str | None = None,
                 secret: str | None = None, backlog: int = 1000, backlog_total: int = 10_000,
                 max_backoff: float = 10.0, window: InFlightWindow | None = None) -> None:
        self.url, self.realm, self.authid, self.secret = url, realm, authid, secret
        self.backlog = Backlog(per_device=backlog, total=backlog_total)
        self.max_backoff = max_backoff
        self.window = window or InFlightWindow()
        self.stats = LinkStats()
        self._ready = asyncio.Event()
        self._session: _Session | None = None
        self._logged_drop = -1.0  # when the last drop was logged (monotonic)

    def publish(self, topic: str, kwargs: dict[str, Any], retain: bool = True,
                args: list[Any] | None = None, status: bool = False,
                device: str | None = None) -> None:
        """Queue a publication; never blocks. A reading counts against the backlog of its
        ``device`` (default: its topic): when that is full, that device's oldest reading
        goes. A ``status`` replaces the same topic's status still waiting, and is never
        dropped for room, so the router always ends up with a device's latest status.
        (autobahn cannot carry kwargs named ``topic`` or ``options``: rename them.)"""
        args = list(args or ())
        pub = Publication(topic, kwargs, retain, args, status=status, device=device or topic,
                          size=_wire_size(topic, args, kwargs))
        for dropped in self.backlog.add(pub):
            self._count_drop(dropped)
        self.stats.queued += 1
        self._ready.set()

    def _count_drop(self, pub: Publication) -> None:
        stats = self.stats
        stats.dropped_full += 1
        counts = stats.dropped_by_device
        device = pub.device if pub.device in counts or len(counts) < MAX_DEVICES_COUNTED \
            else OTHER_DEVICES
        counts[device] = dropped = counts.get(device, 0) + 1
        now = time.monotonic()
        # a device's 1st, 10th, 100th and every 1000th drop, a line a second at most
        if (dropped in (1, 10, 100) or dropped % 1000 == 0) and now - self._logged_drop >= 1:
            self._logged_drop = now
            log.warning("backlog full for %s (%d readings a device, %d in all): %d of its "
                        "oldest dropped so far (%d of all devices)", pub.device,
                        self.backlog.per_device, self.backlog.total, dropped, stats.dropped_full)

    async def run(self) -> None:
        """Connect, drain, and reconnect with backoff, forever."""
        backoff = 0.2
        while True:
            try:
                self._session = await open_session(self.url, self.realm, self.authid,
                                                   self.secret)
            except (TimeoutError, OSError, ConnectionError, ValueError) as e:
                self._note_down(f"cannot reach the router at {self.url}: {e}")
            else:
                log.info("connected to %s (realm %s)", self.url, self.realm)
                self.stats.connected = True
                backoff = 0.2
                await self._drain(self._session)
                self.stats.connected = False
                self.stats.reconnects += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self.max_backoff)

    def _note_down(self, error: str) -> None:
        if self.stats.last_error != error:
            log.warning("%s; %d readings waiting", error, len(self.backlog))
        self.stats.last_error = error

    async def _drain(self, session: _Session) -> None:
        """Publish the backlog in order, as many in flight as the window allows; each
        leaves the backlog once the router acknowledged it (stored it durably)."""
        in_flight: deque[Publication] = deque()
        try:
            while not session.gone.done():
                self._ready.clear()
                self._fill(session, in_flight)
                await self._next_event(session, in_flight)
                if not self._take_answers(session, in_flight):
                    break
        finally:
            for item in in_flight:  # not acknowledged: send again after reconnecting
                if item.in_flight is not None:
                    item.in_flight.cancel()
                item.in_flight = None
                self.window.answered(item.size)
            for dropped in self.backlog.put_back(in_flight):
                self._count_drop(dropped)
        self._note_down("lost the router")

    def _fill(self, session: _Session, in_flight: deque[Publication]) -> None:
        while (item := self.backlog.next()) is not None:
            if not self.window.has_room(item.size):
                return
            self.backlog.take()
            self.window.sent(item.size)
            item.in_flight = asyncio.ensure_future(session.publish(
                item.topic, *item.args, **item.kwargs,
                options=types.PublishOptions(retain=item.retain, acknowledge=True)))
            in_flight.append(item)
        self.window.caught_up()

    async def _next_event(self, session: _Session, in_flight: deque[Publication]) -> None:
        """Until the oldest in flight is answered, the session ends, or (while the window
        has room) a new publication is queued."""
        waits = [session.gone]
        if in_flight:
            waits.append(in_flight[0].in_flight)
        ready = None
        if not self.window.held_back:
            ready = asyncio.ensure_future(self._ready.wait())
            waits.append(ready)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if ready is not None:
                ready.cancel()

    def _take_answers(self, session: _Session, in_flight: deque[Publication]) -> bool:
        """Every answer that came, oldest first (a group commit answers many at once);
        False once the session is gone."""
        while in_flight and in_flight[0].in_flight.done():
            if not self._answered(session, in_flight[0]):
                return False
            in_flight.popleft()
        return not session.gone.done()

    def _answered(self, session: _Session, item: Publication) -> bool:
        """The router's answer to ``item``; False when the session ended under it (it is
        sent again after reconnecting)."""
        try:
            item.in_flight.result()
        except ApplicationError as e:
            if session.gone.done() or e.error.startswith("wamp.close."):
                self._note_down(f"lost the router: {e.error}")
                return False
            # Not retried: a later, newer reading must not be overtaken by this one.
            log.error("the router did not take %s: %s %s; dropping it", item.topic,
                      e.error, e.args[0] if e.args else "")
            self.stats.dropped_refused += 1
            self.window.answered(item.size)
            if e.error == STORAGE_FAILED:
                self.window.congested()
        except (TransportLost, ConnectionError) as e:
            self._note_down(f"lost the router: {e}")
            return False
        else:
            self.stats.published += 1
            self.window.acknowledged(item.size)
        item.in_flight = None
        self.backlog.done(item)
        return True

    async def close(self) -> None:
        if self._session is not None and self._session.is_attached():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._session.leave(), 2)


def _wire_size(topic: str, args: list[Any], kwargs: dict[str, Any]) -> int:
    """About the bytes of the PUBLISH (msgpack, as on the Unix socket)."""
    try:
        return len(topic) + len(msgpack.packb([args, kwargs], default=str)) + 16
    except (TypeError, ValueError, OverflowError):  # the serializer will say what is wrong
        return len(topic) + len(repr((args, kwargs)))


@dataclass
class ChangeFilter:
    """Publish a reading when a value moved by more than its deadband since the last
    publication, or when ``heartbeat`` seconds passed without one."""

    deadband: dict[str, float] = field(default_factory=dict)
    default_deadband: float = 0.0
    heartbeat: float = 60.0
    _last: dict[str, float] | None = None
    _last_time: float = 0.0

    def should_publish(self, values: dict[str, float], now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self._last is None or now - self._last_time >= self.heartbeat or \
                set(values) != set(self._last):
            return self._take(values, now)
        for name, value in values.items():
            band = self.deadband.get(name, self.default_deadband)
            if abs(value - self._last[name]) > band + 1e-9:  # 21.6 - 21.5 is not > 0.1
                return self._take(values, now)
        return False

    def _take(self, values: dict[str, float], now: float) -> bool:
        self._last, self._last_time = dict(values), now
        return True


@dataclass
class DeviceStatus:
    """ok / stale / error, published (retained) only when it changes, with the number of
    times it went into error since the driver started (the gateway's health reports it)."""

    device_id: str
    link: RouterLink
    state: str | None = None
    reason: str | None = None
    errors: int = 0

    def set(self, state: str, reason: str | None = None) -> None:
        if (state, reason) == (self.state, self.reason):
            return
        if state != self.state:
            log.info("device %s: %s%s", self.device_id, state, f" ({reason})" if reason else "")
            self.errors += state == "error"
        self.state, self.reason = state, reason
        self.link.publish(status_topic(self.device_id),
                          {"status": state, "reason": reason, "since": time.time(),
                           "errors": self.errors},
                          status=True)


class Device:
    """A sensor as the gateway sees it: readings through a ChangeFilter, status that goes
    stale when readings stop and error when the driver says so."""

    def __init__(self, device_id: str, link: RouterLink, change: ChangeFilter,
                 stale_after: float) -> None:
        self.device_id = device_id
        self.link = link
        self.change = change
        self.stale_after = stale_after
        self.status = DeviceStatus(device_id, link)
        self.last_reading = time.monotonic()

    def reading(self, values: dict[str, float], extra: dict[str, Any] | None = None) -> None:
        self.last_reading = time.monotonic()
        self.status.set("ok")
        if self.change.should_publish(values):
            self.link.publish(reading_topic(self.device_id), {**values, **(extra or {})},
                              device=self.device_id)

    def error(self, reason: str) -> None:
        self.status.set("error", reason)

    def check_stale(self) -> None:
        if self.status.state == "ok" and \
                time.monotonic() - self.last_reading > self.stale_after:
            self.status.set("stale", f"no reading for {self.stale_after:g} s")
