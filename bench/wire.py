"""Lean WAMP-over-the-wire pieces for the benchmarks.

Everything here speaks WebSocket or RawSocket framing by hand, so the load generator costs
a few microseconds per message instead of the tens that a full autobahn session costs:

- :class:`Publisher`: a blocking-socket publisher that writes pre-serialized PUBLISH frames
  (only the request id, sequence number and send timestamp change between messages);
- :class:`SubscriberSession`: an asyncio subscriber that counts EVENTs, checks their sequence
  numbers and computes publish->event latency from the timestamp in the event args;
- :class:`FakeBroker`: a trivial fan-out "router" (HELLO->WELCOME, SUBSCRIBE->SUBSCRIBED,
  PUBLISH->EVENT to every subscriber) used as the generator check: the same clients against
  a server that does almost nothing show how fast the client side can go.

Event args are ``[seq, send_ns]`` where ``send_ns`` is ``time.perf_counter_ns()`` in the
publisher (CLOCK_MONOTONIC, so comparable across processes on the same host).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import socket
import struct
import time
from array import array
from typing import Any

import msgpack

from harness.wamp import (
    ABORT,
    ERROR,
    EVENT,
    GOODBYE,
    HELLO,
    PUBLISH,
    PUBLISHED,
    SUBSCRIBE,
    SUBSCRIBED,
    WELCOME,
)

TOPIC = "bench.pubsub"
RAWSOCKET_SERIALIZER_IDS = {"json": 1, "msgpack": 2}
WS_SUBPROTOCOLS = {"json": "wamp.2.json", "msgpack": "wamp.2.msgpack"}
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"



class Codec:
    def __init__(self, name: str) -> None:
        self.name = name
        if name == "json":
            self.loads = json.loads
            self.dumps = lambda obj: json.dumps(obj, separators=(",", ":")).encode()
            self.ws_opcode = 1  # text
        elif name == "msgpack":
            self.loads = lambda data: msgpack.unpackb(data, raw=False)
            self.dumps = msgpack.packb
            self.ws_opcode = 2  # binary
        else:
            raise ValueError(name)


# -- framing -------------------------------------------------------------------------------


def xor_mask(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if not n:
        return data
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def ws_frame(payload: bytes, opcode: int, mask: bytes | None = None) -> bytes:
    """One final WebSocket frame; clients must pass a 4-byte ``mask``, servers must not."""
    n = len(payload)
    bit = 0x80 if mask else 0
    if n < 126:
        head = bytes((0x80 | opcode, bit | n))
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, bit | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, bit | 127, n)
    if mask:
        return head + mask + xor_mask(payload, mask)
    return head + payload


def split_ws(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Complete frames at the start of ``buf`` as (opcode, payload), and the remainder."""
    out = []
    pos, n = 0, len(buf)
    while n - pos >= 2:
        b0, b1 = buf[pos], buf[pos + 1]
        length, head = b1 & 0x7F, 2
        if length == 126:
            if n - pos < 4:
                break
            length, head = (buf[pos + 2] << 8) | buf[pos + 3], 4
        elif length == 127:
            if n - pos < 10:
                break
            length, head = int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
        mask = None
        if b1 & 0x80:
            if n - pos < head + 4:
                break
            mask = buf[pos + head:pos + head + 4]
            head += 4
        end = pos + head + length
        if end > n:
            break
        if not b0 & 0x80:
            raise ConnectionError("fragmented WebSocket messages are not supported here")
        payload = buf[pos + head:end]
        out.append((b0 & 0x0F, xor_mask(payload, mask) if mask else payload))
        pos = end
    return out, buf[pos:]


def rs_frame(payload: bytes, frame_type: int = 0) -> bytes:
    return struct.pack("!L", len(payload) | (frame_type << 24)) + payload


def split_rs(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Complete RawSocket frames at the start of ``buf`` as (type, payload), and the rest."""
    out = []
    pos, n = 0, len(buf)
    while n - pos >= 4:
        end = pos + 4 + ((buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3])
        if end > n:
            break
        out.append((buf[pos] & 0x07, buf[pos + 4:end]))
        pos = end
    return out, buf[pos:]


def ws_upgrade_request(port: int, serializer: str) -> tuple[bytes, str]:
    key = base64.b64encode(os.urandom(16)).decode()
    request = (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\n"
               f"Sec-WebSocket-Protocol: {WS_SUBPROTOCOLS[serializer]}\r\n\r\n")
    return request.encode(), key


def ws_accept(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()


def rs_handshake(serializer: str) -> bytes:
    return bytes((0x7F, 0xF0 | RAWSOCKET_SERIALIZER_IDS[serializer], 0, 0))


def check_rs_reply(reply: bytes, serializer: str) -> None:
    if len(reply) != 4 or reply[0] != 0x7F or reply[1] & 0x0F != \
            RAWSOCKET_SERIALIZER_IDS[serializer]:
        raise ConnectionError(f"RawSocket handshake refused: {reply!r}")


def _hello(role: str) -> list[Any]:
    return [HELLO, "realm1", {"roles": {role: {}}}]


# -- the publisher ---------------------------------------------------------------------------


class Publisher:
    """A blocking-socket WAMP publisher that writes pre-serialized PUBLISH frames.

    ``frame(seq, ts)`` fills a template with the request id, sequence number and timestamp
    and frames it (with a per-connection WebSocket mask); the caller batches frames and
    hands them to ``send``. The router never writes to a publisher that asks for no
    acknowledgement, so nothing needs reading except during ``publish_ack``.
    """

    def __init__(self, transport: str, serializer: str, port: int, topic: str = TOPIC) -> None:
        self.transport, self.codec = transport, Codec(serializer)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self._inbox: list[list[Any]] = []
        self.mask = os.urandom(4)
        if transport == "websocket":
            request, _ = ws_upgrade_request(port, serializer)
            self.sock.sendall(request)
            while b"\r\n\r\n" not in self.buf:
                self._recv()
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                raise ConnectionError(f"WebSocket upgrade refused: {head[:80]!r}")
        else:
            self.sock.sendall(rs_handshake(serializer))
            while len(self.buf) < 4:
                self._recv()
            check_rs_reply(self.buf[:4], serializer)
            self.buf = self.buf[4:]
        self._send_msg(_hello("publisher"))
        welcome = self._read_msg()
        if welcome[0] != WELCOME:
            raise ConnectionError(f"expected WELCOME, got {welcome!r:.200}")
        self.session_id = welcome[1]
        if serializer == "json":
            t = json.dumps(topic).encode()
            self._plain = b"[16,%d,{},TOPIC,[%d,%d]]".replace(b"TOPIC", t)
            self._acked = b'[16,%d,{"acknowledge":true},TOPIC,[%d,%d]]'.replace(b"TOPIC", t)
            self._fill = self._fill_json
        else:
            t = msgpack.packb(topic)
            # fixarray(5), 16, uint64 request, {} or {acknowledge: true}, topic,
            # fixarray(2) [uint64 seq, uint64 ts]
            self._msgpack_parts = (
                (b"\x95\x10\xcf", b"\x80" + t + b"\x92\xcf"),
                (b"\x95\x10\xcf", msgpack.packb({"acknowledge": True}) + t + b"\x92\xcf"),
            )
            self._fill = self._fill_msgpack
        self._ws = transport == "websocket"
        self._opcode = self.codec.ws_opcode

    def _fill_json(self, seq: int, ts: int, ack: bool) -> bytes:
        return (self._acked if ack else self._plain) % (seq + 1, seq, ts)

    def _fill_msgpack(self, seq: int, ts: int, ack: bool) -> bytes:
        head, mid = self._msgpack_parts[ack]
        return b"".join((head, (seq + 1).to_bytes(8, "big"), mid, seq.to_bytes(8, "big"),
                         b"\xcf", ts.to_bytes(8, "big")))

    def frame(self, seq: int, ts: int, ack: bool = False) -> bytes:
        payload = self._fill(seq, ts, ack)
        if self._ws:
            return ws_frame(payload, self._opcode, self.mask)
        return rs_frame(payload)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def publish_ack(self, seq: int, ts: int, timeout: float = 30) -> float:
        """Publish with acknowledge=true and block until PUBLISHED; returns the round trip
        in seconds (it also proves the router has handled everything sent before)."""
        t0 = time.perf_counter()
        self.send(self.frame(seq, ts, ack=True))
        self.sock.settimeout(timeout)
        while True:
            msg = self._read_msg()
            if msg[0] == PUBLISHED and msg[1] == seq + 1:
                return time.perf_counter() - t0
            if msg[0] in (ERROR, ABORT, GOODBYE):
                raise ConnectionError(f"router answered {msg!r:.200}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send_msg([GOODBYE, {}, "wamp.close.normal"])
        self.sock.close()

    # -- blocking read helpers (handshake and acks only) --

    def _recv(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("router closed the connection")
        self.buf += data

    def _send_msg(self, msg: list[Any]) -> None:
        payload = self.codec.dumps(msg)
        if self.transport == "websocket":
            self.sock.sendall(ws_frame(payload, self.codec.ws_opcode, self.mask))
        else:
            self.sock.sendall(rs_frame(payload))

    def _read_msg(self) -> list[Any]:
        while not self._inbox:
            if self.transport == "websocket":
                frames, self.buf = split_ws(self.buf)
                for opcode, payload in frames:
                    if opcode == 9:
                        self.sock.sendall(ws_frame(payload, 10, self.mask))
                    elif opcode == 8:
                        raise ConnectionError("router closed the WebSocket")
                    elif opcode in (1, 2):
                        self._inbox.append(self.codec.loads(payload))
            else:
                frames, self.buf = split_rs(self.buf)
                for kind, payload in frames:
                    if kind == 1:
                        self.sock.sendall(rs_frame(payload, 2))
                    elif kind == 0:
                        self._inbox.append(self.codec.loads(payload))
            if not self._inbox:
                self._recv()
        return self._inbox.pop(0)


# -- the subscriber ----------------------------------------------------------------------------


class SubscriberSession(asyncio.Protocol):
    """One subscriber session on its own connection.

    Per phase it counts EVENTs, counts sequence gaps (an event whose seq is not the previous
    one + 1, or a first event that is not seq 0), and in latency phases records
    ``receive_ns - send_ns`` for every event. ``receive_ns`` is taken once per socket read,
    when the event loop hands this connection its bytes.
    """

    def __init__(self, transport: str, serializer: str, port: int, index: int,
                 counts: Any, lasts: Any, topic: str = TOPIC) -> None:
        self.kind, self.codec, self.port = transport, Codec(serializer), port
        self.index, self.counts, self.lasts, self.topic = index, counts, lasts, topic
        loop = asyncio.get_running_loop()
        self.subscribed: asyncio.Future = loop.create_future()
        self.closed: asyncio.Future = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.state = "handshake"
        self.mask = os.urandom(4)
        self.reset(latency=False)

    def reset(self, latency: bool) -> None:
        self.count = 0
        self.next_seq = 0
        self.gaps = 0
        self.latencies: array | None = array("q") if latency else None
        self.counts[self.index] = 0
        self.lasts[self.index] = 0

    # -- asyncio --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.kind == "websocket":
            request, self._ws_key = ws_upgrade_request(self.port, self.codec.name)
            self.transport.write(request)
        else:
            self.transport.write(rs_handshake(self.codec.name))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(ConnectionError(f"connection lost: {exc}"))
        if not self.closed.done():
            self.closed.set_result(exc)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        buf = self.buf + data if self.buf else data
        if self.state == "handshake":
            buf = self._handshake(buf)
            if buf is None:
                return
        if self.kind == "websocket":
            frames, self.buf = split_ws(buf)
            payloads = []
            for opcode, payload in frames:
                if opcode == 1 or opcode == 2:
                    payloads.append(payload)
                elif opcode == 9:
                    self.transport.write(ws_frame(payload, 10, self.mask))
                elif opcode == 8:
                    self.transport.close()
        else:
            frames, self.buf = split_rs(buf)
            payloads = []
            for kind, payload in frames:
                if kind == 0:
                    payloads.append(payload)
                elif kind == 1:
                    self.transport.write(rs_frame(payload, 2))
        if not payloads:
            return
        event_args = self._event_args
        latencies = self.latencies
        next_seq, gaps, count = self.next_seq, self.gaps, self.count
        for payload in payloads:
            args = event_args(payload)
            if args is None:
                self._control(self.codec.loads(payload))
                continue
            seq, ts = args
            if seq != next_seq:
                gaps += 1
            next_seq = seq + 1
            count += 1
            if latencies is not None:
                latencies.append(now - ts)
        if count != self.count:
            self.next_seq, self.gaps, self.count = next_seq, gaps, count
            self.counts[self.index] = count
            self.lasts[self.index] = now

    def _event_args(self, payload: bytes) -> list[int] | tuple[int, int] | None:
        """[seq, send_ns] of an EVENT, None for any other message."""
        if self.codec.name == "json":
            # fast path for [36,sub,pub,{...},[seq,ts]]: json.loads costs 4x this and would
            # make the clients the bottleneck at a few 100,000 events/s
            if payload.startswith(b"[36,") and payload.endswith(b"]]"):
                with contextlib.suppress(ValueError):
                    seq, ts = payload[payload.rfind(b"[") + 1:-2].split(b",")
                    return int(seq), int(ts)
            msg = json.loads(payload)
        else:
            msg = msgpack.unpackb(payload, raw=False)
        return msg[4] if msg[0] == EVENT else None

    # -- session setup --

    def _handshake(self, buf: bytes) -> bytes | None:
        if self.kind == "websocket":
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if not sep:
                self.buf = buf
                return None
            if not head.startswith(b"HTTP/1.1 101") or \
                    ws_accept(self._ws_key).encode() not in head:
                self._fail(f"WebSocket upgrade refused: {head[:80]!r}")
                return None
        else:
            if len(buf) < 4:
                self.buf = buf
                return None
            check_rs_reply(buf[:4], self.codec.name)
            rest = buf[4:]
        self.state = "hello"
        self._send(_hello("subscriber"))
        return rest

    def _control(self, msg: list[Any]) -> None:
        if msg[0] == WELCOME and self.state == "hello":
            self.state = "subscribing"
            self._send([SUBSCRIBE, 1, {}, self.topic])
        elif msg[0] == SUBSCRIBED and self.state == "subscribing":
            self.state = "subscribed"
            self.subscribed.set_result(msg[2])
        elif msg[0] in (ABORT, GOODBYE, ERROR):
            self._fail(f"router said {msg!r:.200}")

    def _fail(self, reason: str) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(ConnectionError(reason))
        if self.transport is not None:
            self.transport.close()

    def _send(self, msg: list[Any]) -> None:
        payload = self.codec.dumps(msg)
        if self.kind == "websocket":
            self.transport.write(ws_frame(payload, self.codec.ws_opcode, self.mask))
        else:
            self.transport.write(rs_frame(payload))

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._send([GOODBYE, {}, "wamp.close.normal"])
            self.transport.close()


# -- the generator check: a trivial fan-out server -----------------------------------------------


class FakeBroker:
    """Just enough of a broker for the benchmark clients: one topic, no checks.

    ``batched=True``: the events for a socket read's worth of PUBLISHes are framed once and
    written to each subscriber in one write, so the server costs next to nothing and the
    clients' ceiling shows. ``batched=False``: one write per event per subscriber, the way
    the router writes, so the clients pay the same wake-ups and syscalls as against it.
    """

    def __init__(self, batched: bool = True) -> None:
        self.subscribers: list[_FakeConn] = []
        self.next_id = 1
        self.batched = batched

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id


class _FakeConn(asyncio.Protocol):
    def __init__(self, broker: FakeBroker, transport_kind: str) -> None:
        self.broker, self.kind = broker, transport_kind
        self.buf = b""
        self.state = "handshake"
        self.codec: Codec | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.broker.subscribers:
            self.broker.subscribers.remove(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if self.state == "handshake":
            buf = self._handshake(buf)
            if buf is None:
                return
        if self.kind == "websocket":
            frames, self.buf = split_ws(buf)
            payloads = [p for op, p in frames if op in (1, 2)]
            if any(op == 8 for op, _ in frames):
                self.transport.close()
        else:
            frames, self.buf = split_rs(buf)
            payloads = [p for k, p in frames if k == 0]
        loads, dumps = self.codec.loads, self.codec.dumps
        events = []
        for payload in payloads:
            msg = loads(payload)
            kind = msg[0]
            if kind == PUBLISH:
                pub_id = self.broker.new_id()
                events.append(dumps([EVENT, 1, pub_id, {}, msg[4]]))
                if msg[2].get("acknowledge"):
                    self._send([PUBLISHED, msg[1], pub_id])
            elif kind == HELLO:
                self._send([WELCOME, self.broker.new_id(), {"roles": {"broker": {}}}])
            elif kind == SUBSCRIBE:
                self.broker.subscribers.append(self)
                self._send([SUBSCRIBED, msg[1], 1])
            elif kind == GOODBYE:
                self._send([GOODBYE, {}, "wamp.close.goodbye_and_out"])
                self.transport.close()
        if events and self.broker.batched:
            framed: dict[tuple[str, str], bytes] = {}
            for sub in self.broker.subscribers:
                key = (sub.kind, sub.codec.name)
                data = framed.get(key)
                if data is None:
                    data = framed[key] = sub.frame_all(events)
                sub.transport.write(data)
        elif events:
            for event in events:
                framed = {}
                for sub in self.broker.subscribers:
                    key = (sub.kind, sub.codec.name)
                    data = framed.get(key)
                    if data is None:
                        data = framed[key] = sub.frame_all([event])
                    sub.transport.write(data)

    def frame_all(self, payloads: list[bytes]) -> bytes:
        if self.kind == "websocket":
            opcode = self.codec.ws_opcode
            return b"".join([ws_frame(p, opcode) for p in payloads])
        return b"".join([rs_frame(p) for p in payloads])

    def _handshake(self, buf: bytes) -> bytes | None:
        if self.kind == "websocket":
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if not sep:
                self.buf = buf
                return None
            headers = {}
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            proto = headers.get("sec-websocket-protocol", "")
            self.codec = Codec("msgpack" if "msgpack" in proto else "json")
            self.transport.write(
                (f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\n"
                 f"Sec-WebSocket-Accept: {ws_accept(headers['sec-websocket-key'])}\r\n"
                 f"Sec-WebSocket-Protocol: {proto}\r\n\r\n").encode())
        else:
            if len(buf) < 4:
                self.buf = buf
                return None
            ser_id = buf[1] & 0x0F
            self.codec = Codec("msgpack" if ser_id == 2 else "json")
            self.transport.write(bytes((0x7F, 0xF0 | ser_id, 0, 0)))
            rest = buf[4:]
        self.state = "open"
        return rest

    def _send(self, msg: list[Any]) -> None:
        payload = self.codec.dumps(msg)
        if self.kind == "websocket":
            self.transport.write(ws_frame(payload, self.codec.ws_opcode))
        else:
            self.transport.write(rs_frame(payload))


async def serve_fake_broker(ws_port: int, rs_port: int, stop: asyncio.Event,
                            batched: bool = True) -> None:
    loop = asyncio.get_running_loop()
    broker = FakeBroker(batched)
    servers = [
        await loop.create_server(lambda: _FakeConn(broker, "websocket"), "127.0.0.1", ws_port),
        await loop.create_server(lambda: _FakeConn(broker, "rawsocket"), "127.0.0.1", rs_port),
    ]
    await stop.wait()
    for server in servers:
        server.close()
