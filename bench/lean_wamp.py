"""A lean WAMP client for the benchmarks: RawSocket over TCP, msgpack, one call or
subscription at a time, no autobahn in the measured path."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import msgpack

from bench.wire import check_rs_reply, rs_frame, rs_handshake, split_rs
from harness.wamp import (
    ABORT,
    CALL,
    ERROR,
    EVENT,
    GOODBYE,
    HELLO,
    PUBLISH,
    PUBLISHED,
    RESULT,
    SUBSCRIBE,
    SUBSCRIBED,
    UNSUBSCRIBE,
    UNSUBSCRIBED,
    WELCOME,
)

# -- a lean WAMP client (RawSocket over TCP, msgpack) ------------------------------------------


class WampError(Exception):
    pass


class WampClient(asyncio.Protocol):
    """Just enough of a WAMP client: PUBLISH (with or without acknowledgement), CALL,
    SUBSCRIBE/UNSUBSCRIBE. Replies resolve futures with the receive time
    (``perf_counter_ns`` taken when the socket read was handed to us), so latencies do not
    include waking the awaiting coroutine. ``raw_event`` (if set) gets every EVENT frame
    undecoded, for counting thousands of them cheaply."""

    def __init__(self, realm: str) -> None:
        self.realm = realm
        loop = asyncio.get_running_loop()
        self.welcome: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.handshaken = False
        self.pending: dict[int, asyncio.Future] = {}
        self.next_request = 0
        self.raw_event: Callable[[bytes, int], None] | None = None
        self.rx_bytes = 0  # what the router sent us: its socket share of wchar

    @classmethod
    async def connect(cls, port: int, realm: str = "realm1") -> WampClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(realm), "127.0.0.1", port)
        await asyncio.wait_for(client.welcome, 10)
        return client

    # asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(rs_handshake("msgpack"))

    def connection_lost(self, exc: Exception | None) -> None:
        error = ConnectionError(f"router closed the connection ({exc})")
        if not self.welcome.done():
            self.welcome.set_exception(error)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(error)
        self.pending.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.rx_bytes += len(data)
        buf = self.buf + data if self.buf else data
        if not self.handshaken:
            if len(buf) < 4:
                self.buf = buf
                return
            check_rs_reply(buf[:4], "msgpack")
            self.handshaken = True
            buf = buf[4:]
            self._send([HELLO, self.realm, {"roles": {"publisher": {}, "subscriber": {},
                                                      "caller": {}}}])
        frames, self.buf = split_rs(buf)
        raw_event = self.raw_event
        for kind, payload in frames:
            if kind == 1:  # ping
                self.transport.write(rs_frame(payload, 2))
            elif kind == 0:
                if raw_event is not None and payload[1] == EVENT and payload[0] & 0xF0 == 0x90:
                    raw_event(payload, now)
                else:
                    self._dispatch(msgpack.unpackb(payload, raw=False), now)

    def _dispatch(self, msg: list[Any], now: int) -> None:
        kind = msg[0]
        if kind in (PUBLISHED, SUBSCRIBED, UNSUBSCRIBED, RESULT):
            fut = self.pending.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result((msg, now))
        elif kind == ERROR:
            fut = self.pending.pop(msg[2], None)
            if fut is not None and not fut.done():
                fut.set_exception(WampError(f"{msg[4]}: {msg[5:] if len(msg) > 5 else ''}"))
        elif kind == WELCOME:
            self.welcome.set_result(msg[1])
        elif kind in (ABORT, GOODBYE):
            if not self.welcome.done():
                self.welcome.set_exception(WampError(f"router said {msg!r:.300}"))
            if kind == GOODBYE:
                self._send([GOODBYE, {}, "wamp.close.goodbye_and_out"])
            self.transport.close()

    def _send(self, msg: list[Any]) -> None:
        self.transport.write(rs_frame(msgpack.packb(msg)))

    def _request(self, msg_without_id: list[Any], expect: bool = True) -> asyncio.Future | None:
        self.next_request += 1
        request = self.next_request
        fut = None
        if expect:
            fut = asyncio.get_running_loop().create_future()
            self.pending[request] = fut
        self._send([msg_without_id[0], request, *msg_without_id[1:]])
        return fut

    # WAMP

    def publish(self, topic: str, kwargs: dict[str, Any], acknowledge: bool = False,
                retain: bool = False) -> asyncio.Future | None:
        options: dict[str, Any] = {}
        if acknowledge:
            options["acknowledge"] = True
        if retain:
            options["retain"] = True
        return self._request([PUBLISH, options, topic, [], kwargs], expect=acknowledge)

    async def call(self, procedure: str, args: list[Any], kwargs: dict[str, Any] | None = None,
                   timeout: float = 60) -> tuple[list[Any], dict[str, Any], int]:
        """(args, kwargs, receive time ns) of the RESULT."""
        fut = self._request([CALL, {}, procedure, args, kwargs or {}])
        msg, now = await asyncio.wait_for(fut, timeout)
        return (msg[3] if len(msg) > 3 else []), (msg[4] if len(msg) > 4 else {}), now

    def subscribe(self, topic: str, options: dict[str, Any]) -> asyncio.Future:
        return self._request([SUBSCRIBE, options, topic])

    async def unsubscribe(self, subscription: int) -> None:
        await asyncio.wait_for(self._request([UNSUBSCRIBE, subscription]), 30)

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(Exception):
                self._send([GOODBYE, {}, "wamp.close.normal"])
                await asyncio.wait_for(asyncio.shield(self.closed), 2)
            self.transport.close()
