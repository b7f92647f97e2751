"""Transports: they move bytes between sockets and the protocol core, nothing more.

- WAMP over WebSocket (autobahn's asyncio WebSocket server) behind a small HTTP front that
  also serves plain HTTP routes (the dashboard, later /metrics) on the same port;
- WAMP over RawSocket (autobahn's asyncio RawSocket server) on TCP and Unix sockets.

Both decode frames into autobahn messages here, so a malformed frame, an unknown message
type or an oversized message aborts that one session with ``wamp.error.protocol_violation``
and a reason, as WAMP asks, instead of just dropping the connection.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import cbor2
from autobahn.asyncio.rawsocket import WampRawSocketServerFactory, WampRawSocketServerProtocol
from autobahn.asyncio.websocket import WampWebSocketServerFactory, WampWebSocketServerProtocol
from autobahn.wamp import message as m
from autobahn.wamp.exception import ProtocolError
from autobahn.wamp.message import check_or_raise_uri
from autobahn.wamp.serializer import (
    CBORObjectSerializer,
    CBORSerializer,
    JsonObjectSerializer,
    JsonSerializer,
    MsgPackObjectSerializer,
    MsgPackSerializer,
    Serializer,
)

from cairn.gateway.admission import Admission, Ticket, peer_of
from cairn.gateway.core import Session, brief
from cairn.gateway.flow_control import WriteBatcher
from cairn.gateway.origins import BrowserGuard

if TYPE_CHECKING:
    from cairn.gateway.config import Config
    from cairn.gateway.flow_control import StoreBackpressure
    from cairn.gateway.metrics import MessageCounters


class Pump(Protocol):
    """What the transport needs of the shell that runs the core (gateway.server.Node):
    where to hand what arrives, and the shared state of connections."""

    config: Config
    admission: Admission
    backpressure: StoreBackpressure
    writes: WriteBatcher
    counters: MessageCounters
    connections: set[Any]
    slow_consumers: int

    def receive(self, session: Session, msg: m.Message, extra: dict | None = None) -> None: ...

    def violation(self, session: Session, reason: str) -> None: ...

    def lost(self, session: Session) -> None: ...

log = logging.getLogger("cairn.transport")

# Members of autobahn's server protocols outside its public API that this module overrides
# or reads. tests/test_transport.py checks each on live connections, so a release that
# renames one fails there, naming it, instead of silently bypassing an override (autobahn
# is pinned below its next major version in pyproject.toml).
AUTOBAHN_WEBSOCKET_INTERNALS = (
    "_dataReceived", "_cancelAutoPingTimeoutCall", "_max_message_size_exceeded",
    "_perMessageCompress", "_session", "_serializer", "autoPingRestartOnAnyTraffic",
    "autoPingTimeoutCall", "current_frame", "data", "inside_message", "message_data",
    "message_is_binary", "failedByMe")
AUTOBAHN_RAWSOCKET_INTERNALS = (
    "_on_connection_lost", "_session", "_serializer", "max_length_send", "prefix_format")
AUTOBAHN_FACTORY_INTERNALS = ("_serializers",)

# Options autobahn's parser drops but WAMP clients still send (autobahn-js, wampy).
_PASS_THROUGH_OPTIONS = {m.Publish: ("disclose_me",), m.Call: ("disclose_me",)}


def serializers() -> list[Any]:
    return [JsonWire(), MsgPackWire(), CborWire()]


def _encode_binary(value: Any) -> str:
    if isinstance(value, bytes):  # WAMP's JSON form of binary: NUL + base64
        return "\x00" + base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} cannot be serialized to JSON")


def _binary_strings(message: Any) -> Any:
    """``message`` with every string that starts with NUL (WAMP's JSON form of binary: NUL
    + base64) turned into bytes; a walk without recursion, however deep the message."""
    root = [message]
    stack: list[list | dict] = [root]
    while stack:
        node = stack.pop()
        for key, value in (node.items() if type(node) is dict else enumerate(node)):
            if type(value) is str:
                if value.startswith("\x00"):
                    node[key] = base64.b64decode(value[1:], validate=True)
            elif type(value) is list or type(value) is dict:
                stack.append(value)
    return root[0]


class JsonObjects(JsonObjectSerializer):
    """autobahn's JSON object serializer, the same wire format, with the standard library's
    C code on the common path: autobahn's decoder runs the pure-Python scanner on every
    message (to turn "\\u0000"-prefixed strings into bytes) and its encoder is rebuilt for
    every message."""

    _encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                default=_encode_binary)

    def serialize(self, obj: Any) -> bytes:
        return self._encoder.encode(obj).encode("utf-8")

    def unserialize(self, payload: bytes) -> list[Any]:
        messages = [json.loads(payload.decode("utf-8"))]
        if b"\\u0000" in payload:  # may hold binary values (autobahn's decoder for them
            messages = [_binary_strings(messages[0])]  # is pure Python: 0.4 s per MB)
        if b"\\ud" in payload or b"\\uD" in payload:
            # "\\ud800" alone is valid JSON but no Unicode text: no other serializer, and
            # not the store, could carry it. Encoding it again finds it.
            self.serialize(messages)
        return messages


# RFC 8746 typed arrays of bytes (uint8, uint8 clamped): how autobahn-js's CBOR encoder sends
# a Uint8Array or Buffer. They are byte strings to every other serializer.
_BYTE_ARRAY_TAGS = (64, 68)


def _byte_arrays(tag: cbor2.CBORTag, immutable: bool) -> Any:
    if tag.tag in _BYTE_ARRAY_TAGS and type(tag.value) is bytes:
        return tag.value
    return tag  # any other tag stays what it is, and is refused by _unportable


class CborObjects(CBORObjectSerializer):
    """autobahn's CBOR object serializer, reading byte typed arrays as bytes."""

    def unserialize(self, payload: bytes) -> list[Any]:
        return [cbor2.loads(payload, tag_hook=_byte_arrays)]


class JsonWire(JsonSerializer):
    """WAMP's JSON serializer (autobahn's ids and MIME type) over :class:`JsonObjects`."""

    def __init__(self) -> None:
        self.objects = JsonObjects()
        Serializer.__init__(self, self.objects)


class MsgPackWire(MsgPackSerializer):
    def __init__(self) -> None:
        self.objects = MsgPackObjectSerializer()
        Serializer.__init__(self, self.objects)


class CborWire(CBORSerializer):
    """WAMP's CBOR serializer over :class:`CborObjects`."""

    def __init__(self) -> None:
        self.objects = CborObjects()
        Serializer.__init__(self, self.objects)


def decode(serializer: Any, payload: bytes) -> list[tuple[m.Message, dict[str, Any]]]:
    """Parse one transport frame into WAMP messages, each with the options autobahn's parser
    drops (``disclose_me``), raising ProtocolError with a reason."""
    try:
        raw_messages = serializer.objects.unserialize(payload)
    except Exception as e:
        raise ProtocolError(f"cannot decode {serializer.SERIALIZER_ID}: {e}") from e
    messages = []
    for raw in raw_messages:
        if not isinstance(raw, list) or not raw:
            raise ProtocolError(f"a WAMP message must be a non-empty array, got {brief(raw)}")
        kind = raw[0]
        cls = serializer.MESSAGE_TYPE_MAP.get(kind) if isinstance(kind, int) else None
        if cls is None:
            raise ProtocolError(f"unknown WAMP message type {brief(kind, 20)}")
        try:
            msg = cls.parse(raw)
            if cls is m.Subscribe:  # autobahn allows empty components whatever the policy
                _check_pattern(msg.topic, msg.match, "'topic' in SUBSCRIBE")
            if cls in _WITH_PAYLOAD:
                for name in ("args", "kwargs"):
                    problem = _unportable(getattr(msg, name))
                    if problem is not None:
                        raise ProtocolError(f"{cls.__name__.upper()} {name}{problem}")
        except ProtocolError:
            raise
        except Exception as e:  # autobahn's parsers assume well-formed input in places
            raise ProtocolError(f"malformed {cls.__name__.upper()}: {e}") from e
        extra = {}
        for name in _PASS_THROUGH_OPTIONS.get(cls, ()):
            value = _options(cls, raw).get(name)
            if value is not None and not isinstance(value, bool):
                raise ProtocolError(f"option {name!r} in {cls.__name__.upper()} must be a bool")
            if value:
                extra[name] = value
        messages.append((msg, extra))
    return messages


def _unmask(mask: bytes, data: bytes) -> bytes:
    """``data`` XOR the 4-byte ``mask`` repeated: one XOR of big integers, cheap at any size."""
    n = len(data)
    key = mask * ((n >> 2) + 1)
    return (int.from_bytes(data, "little")
            ^ int.from_bytes(key[:n], "little")).to_bytes(n, "little")


def _check_pattern(uri: str, match: str | None, what: str) -> None:
    # as autobahn checks REGISTER: empty components only in wildcard patterns, and an empty
    # last component only in prefixes
    check_or_raise_uri(uri, what, allow_empty_components=match == "wildcard",
                       allow_last_empty=match == "prefix")


_WITH_PAYLOAD = (m.Publish, m.Call, m.Yield, m.Error)


_MAX_DEPTH = 100  # deeper payloads cannot be read back by every client (cbor2 stops at 400)


def _unportable(value: Any, depth: int = 0) -> str | None:
    """Where and why ``value`` cannot be carried by every serializer, or None if it can: what
    a CBOR peer sends must reach JSON and MessagePack peers too, not be dropped on the way."""
    kind = type(value)
    if value is None or kind is str or kind is bytes or kind is bool:
        return None
    if kind is float:  # NaN and the infinities: JSON has no word for them
        return None if value - value == 0 else f": {value} is not a number JSON can carry"
    if kind is int:
        return None if -(2**63) <= value < 2**64 else ": integer out of the 64-bit range"
    if depth == _MAX_DEPTH and (kind is list or kind is dict):
        return f": nested deeper than {_MAX_DEPTH} levels"
    if kind is list:
        for i, item in enumerate(value):
            problem = _unportable(item, depth + 1)
            if problem is not None:
                return f"[{i}]{problem}"
        return None
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f": map key {brief(key, 40)} is not a string"
            problem = _unportable(item, depth + 1)
            if problem is not None:
                return f"[{brief(key, 40)}]{problem}"
        return None
    return f": {kind.__name__} is not a value every WAMP serializer can carry"


def _options(cls: type, raw: list[Any]) -> dict[str, Any]:
    # PUBLISH and CALL are [TYPE, Request|id, Options|dict, ...]
    return raw[2] if len(raw) > 2 and isinstance(raw[2], dict) else {}


class Connection:
    """One transport's link to the core; autobahn calls it as the 'session' of the transport."""

    def __init__(self, node: Pump, kind: str) -> None:
        self.node = node
        self.kind = kind
        self.transport: Any = None  # the autobahn protocol instance
        self.session = Session(link=self)
        self._open = False
        self._sent = node.counters.sent
        self._ticket: Ticket | None = None  # until the session is established

    # autobahn's ITransportHandler
    def onOpen(self, transport: Any) -> None:
        self.transport = transport
        self._ticket = transport._ticket
        self._open = True
        self.node.connections.add(self)
        details = transport.transport_details
        self.session.transport = {
            "type": self.kind,
            "peer": details.peer if details else None,
            "serializer": transport._serializer.SERIALIZER_ID,
        }
        transport.transport = self.node.writes.cork(
            transport.transport, self.node.config.router.send_buffer_limit, self._overflowed)
        # The object serializer is shared by all sessions, and a message caches its bytes per
        # serializer: an EVENT is encoded once for all its subscribers. (This skips autobahn's
        # per-session statistics wrapper; /metrics counts messages.)
        self._serializer = transport._serializer.objects
        self._binary = self._serializer.BINARY

    def onClose(self, was_clean: bool) -> None:
        self._open = False
        self.node.connections.discard(self)
        self.node.lost(self.session)

    def onMessage(self, msg: m.Message) -> None:  # not used: our protocols call receive()
        self.node.receive(self.session, msg)

    # called by our protocol subclasses
    def receive(self, payload: bytes) -> None:
        if not self._open:
            return
        try:
            messages = decode(self.transport._serializer, payload)
        except ProtocolError as e:
            self.violation(str(e))
            return
        store = self.node.backpressure.store
        queued = store.queued_bytes
        for msg, extra in messages:
            self.node.receive(self.session, msg, extra)
        if store.queued_bytes > queued:  # (commits end in callbacks)
            self.node.backpressure.added(self, store.queued_bytes - queued)
        if self._ticket is not None and self.session.established:
            self._ticket.established()  # the handshake deadline no longer applies
            self._ticket = None

    def violation(self, reason: str) -> None:
        self.node.violation(self.session, reason)

    def pause_reading(self) -> None:
        if self._open:
            self.transport.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._open:
            self.transport.transport.resume_reading()

    def send(self, msg: m.Message) -> None:
        if not self._open:
            return
        self._sent[msg.MESSAGE_TYPE] += 1
        try:
            payload = msg.serialize(self._serializer)
        except Exception as e:
            log.error("session %s: cannot serialize %s: %s", self.session.id,
                      type(msg).__name__, e)
            return
        try:
            self.transport.send_payload(payload, self._binary)
        except Exception:  # costs this session, never the sender of what is being delivered
            log.exception("session %s: cannot send; closing its transport", self.session.id)
            self.abort()

    def _overflowed(self, buffered: int) -> None:
        if self._open:
            log.warning("session %s: disconnecting slow consumer (%d bytes unsent, limit %d)",
                        self.session.id, buffered, self.node.config.router.send_buffer_limit)
            self.node.slow_consumers += 1
            self.abort()

    def close(self) -> None:
        if self._open:
            self._open = False
            self.transport.close_transport()

    def abort(self) -> None:
        self._open = False
        if self.transport.transport is not None:
            self.transport.transport.abort()
        self.node.lost(self.session)


_LINGER = 2.0  # seconds a closing RawSocket waits for its peer to close
_WEBSOCKET_SLICE = 4096


_TEXT, _BINARY = 0x81, 0x82  # first octet of an unfragmented text/binary frame, no RSV bits


class WebSocketProtocol(WampWebSocketServerProtocol):
    _ticket: Ticket | None = None  # handed over by the HttpFront that read the upgrade
    _partial = b""  # the start of a frame the fast path waits to see whole

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ticket is not None:
            self._ticket.release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Parsed right away, not queued for the next loop pass as autobahn's asyncio adapter
        # does: one pass less between a PUBLISH and its EVENTs. (An exception here makes
        # asyncio log it and close the connection, as the adapter would.)
        self.factory.writes.read(self._receive, data)

    def _receive(self, data: bytes) -> None:
        if (self.state == self.STATE_OPEN and self.current_frame is None and not self.data
                and not self.inside_message and self._perMessageCompress is None):
            if self._partial:
                data, self._partial = self._partial + data, b""
            data = self._receive_whole_frames(data)
            if self._frame_pending(data):  # its rest comes with the next read
                self._partial, data = data, b""
        elif self._partial:  # closing meanwhile: autobahn's parser takes it from here
            data, self._partial = self._partial + data, b""
        if data:
            self._receive_in_slices(data)

    def _receive_whole_frames(self, data: bytes) -> bytes:
        """Delivers the frames WAMP clients send all the time (whole, unfragmented, masked
        text or binary frames within the size limit, valid UTF-8 if text) without autobahn's
        general frame parser, which costs more than the router's whole handling of a
        PUBLISH. Returns the data from the first frame that is anything else (control,
        fragmented, partial, invalid), which autobahn's parser then takes as before."""
        end, pos = len(data), 0
        limit = self.maxMessagePayloadSize
        while end - pos >= 6:
            first, second = data[pos], data[pos + 1]
            if (first != _TEXT and first != _BINARY) or second < 0x80:  # not masked
                break
            length, head = second & 0x7F, pos + 6
            if length == 126:
                if end - pos < 8:
                    break
                length, head = (data[pos + 2] << 8) | data[pos + 3], pos + 8
                if length < 126:  # not the shortest encoding: autobahn refuses it
                    break
            elif length == 127:
                break
            stop = head + length
            if stop > end or 0 < limit < length:
                break
            payload = _unmask(data[head - 4:head], data[head:stop])
            if first == _TEXT:
                try:
                    payload.decode("utf-8")
                except UnicodeDecodeError:
                    break  # autobahn fails the connection with 1007
            pos = stop
            if self.autoPingTimeoutCall and self.autoPingRestartOnAnyTraffic:
                self._cancelAutoPingTimeoutCall()  # data counts as a sign of life, as in autobahn
            self.onMessage(payload, first == _BINARY)
            if self.state != self.STATE_OPEN:  # the message closed the connection
                break
        return data[pos:]

    def _frame_pending(self, data: bytes) -> bool:
        """Whether ``data`` is the start of a frame the fast path takes once it is whole: a
        masked text or binary frame within the size limit, cut by the end of a read."""
        if not data or (data[0] != _TEXT and data[0] != _BINARY):
            return False
        if len(data) < 2:
            return True
        length = data[1] & 0x7F
        if data[1] < 0x80 or length == 127:
            return False
        if length == 126:
            if len(data) < 4:
                return True
            length = (data[2] << 8) | data[3]
            if length < 126:
                return False
        limit = self.maxMessagePayloadSize
        head = 8 if (data[1] & 0x7F) == 126 else 6
        return not 0 < limit < length and len(data) < head + length

    def _receive_in_slices(self, data: bytes) -> None:
        # autobahn's frame parser copies the rest of its buffer after each frame, which is
        # quadratic in the size of a read: a router that falls behind reads up to 256 KiB.
        for start in range(0, len(data), _WEBSOCKET_SLICE):
            if self.transport is None:  # closed by what came before
                return
            self._dataReceived(data[start:start + _WEBSOCKET_SLICE])

    def onMessageEnd(self) -> None:
        # Without autobahn's "message" observer event, which costs a future, a loop-time
        # lookup and an extra loop pass per message before the EVENTs are flushed.
        if not self.failedByMe:
            self.onMessage(b"".join(self.message_data), self.message_is_binary)
        self.message_data = None

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self._session.receive(payload)

    def send_payload(self, payload: bytes, is_binary: bool) -> None:
        if self.state != self.STATE_OPEN:
            return  # the peer is closing the WebSocket: nothing more can reach it
        if self._perMessageCompress is None:
            self.transport.write(self.factory.frame(payload, is_binary))
        else:
            self.sendMessage(payload, is_binary)

    def close_transport(self) -> None:
        self.sendClose(1000)

    def _max_message_size_exceeded(self, msg_size: int, max_msg_size: int, reason: str) -> None:
        if self._session is not None:
            self._session.violation(
                f"message of {msg_size} bytes exceeds the maximum of {max_msg_size} bytes")
            self.failedByMe = True  # autobahn then drops the rest of the message unbuffered
        else:
            super()._max_message_size_exceeded(msg_size, max_msg_size, reason)


_PONG = 2  # RawSocket frame type


class RawSocketProtocol(WampRawSocketServerProtocol):
    _closing = False
    _ticket: Ticket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._ticket = self.factory.admission.admit(transport)
        if self._ticket is None:  # refused: its file descriptor goes at once
            self._closing = True
            transport.abort()

    def _on_connection_lost(self, exc: Exception | None) -> None:
        if self._ticket is not None:
            self._ticket.release()
        if getattr(self, "_session", None) is not None:  # no session: closed before handshake
            super()._on_connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._closing:  # what a peer sends after our ABORT or GOODBYE is dropped
            self.factory.writes.read(super().data_received, data)

    def supports_serializer(self, ser_id: int) -> bool:
        # autobahn's own "aborts" a transport not yet open, which raises TransportLost out
        # of data_received (a traceback per such client); False makes it answer with the
        # handshake error "serializer unsupported" and then protocol_error closes
        return ser_id in self.factory._serializers and super().supports_serializer(ser_id)

    def ping(self, payload: bytes) -> None:
        """RawSocket PING: answered with a PONG that carries the same payload."""
        if not self._closing and self.transport is not None:
            self.transport.write(struct.pack("!L", _PONG << 24 | len(payload)) + payload)

    def pong(self, payload: bytes) -> None:
        pass  # the router sends no PINGs; an unasked PONG is allowed and means nothing

    def stringReceived(self, payload: bytes) -> None:
        limit = self.factory.max_message_size
        if len(payload) > limit:
            self._session.violation(
                f"message of {len(payload)} bytes exceeds the maximum of {limit} bytes")
            return
        self._session.receive(payload)

    def protocol_error(self, msg: str) -> None:
        session = getattr(self, "_session", None)
        if session is not None:
            session.violation(f"RawSocket: {msg}")
        elif self.transport is not None:
            log.warning("RawSocket handshake from %s failed: %s", self.peer, msg)
            self.transport.close()

    def send_payload(self, payload: bytes, is_binary: bool) -> None:
        if len(payload) > self.max_length_send:
            self.sendString(payload)  # autobahn refuses it with the reason
        else:
            self.transport.write(self.factory.frame(payload))

    def close_transport(self) -> None:
        # Half-close and keep reading until the peer closes too: closing a socket that has
        # unread input (the rest of an oversized frame, pipelined messages) makes the kernel
        # send RST and throw away the ABORT still queued for the peer.
        if self.transport is None or self._closing:
            return
        self._closing = True
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        try:
            self.transport.write_eof()
        except OSError:  # the peer is already gone (reset)
            self.transport.abort()
            return
        asyncio.get_running_loop().call_later(_LINGER, self.transport.abort)


class WebSocketFactory(WampWebSocketServerFactory):
    writes: WriteBatcher
    _framed: tuple[bytes, bytes] | None = None

    def frame(self, payload: bytes, is_binary: bool) -> bytes:
        """The (unmasked, unfragmented) WebSocket frame of a payload, framed once for all
        the subscribers an EVENT goes to one after the other (a message caches its payload
        per serializer, so it is the same bytes object for each of them)."""
        framed = self._framed
        if framed is None or framed[0] is not payload:
            n = len(payload)
            first = _BINARY if is_binary else _TEXT
            if n < 126:
                head = bytes((first, n))
            elif n < 1 << 16:
                head = struct.pack("!BBH", first, 126, n)
            else:
                head = struct.pack("!BBQ", first, 127, n)
            framed = self._framed = (payload, head + payload)
        return framed[1]


def websocket_factory(node: Pump, url: str) -> WampWebSocketServerFactory:
    factory = WebSocketFactory(lambda: Connection(node, "websocket"), url=url,
                               serializers=serializers())
    factory.protocol = WebSocketProtocol
    factory.writes = node.writes
    limit = node.config.router.max_message_size
    factory.setProtocolOptions(maxMessagePayloadSize=limit, maxFramePayloadSize=limit,
                               autoPingInterval=30, autoPingTimeout=20)
    return factory


class RawSocketFactory(WampRawSocketServerFactory):
    writes: WriteBatcher
    admission: Admission
    _framed: tuple[bytes, bytes] | None = None

    def frame(self, payload: bytes) -> bytes:
        """Length prefix + payload, built once for all the subscribers an EVENT goes to one
        after the other (see WebSocketFactory.frame)."""
        framed = self._framed
        if framed is None or framed[0] is not payload:
            prefix = struct.pack(RawSocketProtocol.prefix_format, len(payload))
            framed = self._framed = (payload, prefix + payload)
        return framed[1]


def rawsocket_factory(node: Pump) -> WampRawSocketServerFactory:
    factory = RawSocketFactory(lambda: Connection(node, "rawsocket"), serializers=serializers())
    factory.protocol = RawSocketProtocol
    factory.writes = node.writes
    factory.admission = node.admission
    limit = node.config.router.max_message_size
    factory.max_message_size = limit
    factory.setProtocolOptions(maxMessagePayloadSize=min(max(limit, 512), 2**24))
    return factory


# -- the HTTP front on the main port -------------------------------------------------------

# (method, path, headers, local: from the device itself) -> (status, content type, body)
HttpHandler = Callable[[str, str, dict[str, str], bool], Awaitable[tuple[int, str, bytes]]]
_MAX_HEAD = 16 * 1024


class HttpFront(asyncio.Protocol):
    """Reads one HTTP request head; hands WebSocket upgrades on /ws to autobahn, and answers
    everything else through ``handler(method, path, headers, local)`` (HttpHandler)."""

    def __init__(self, ws_factory: WampWebSocketServerFactory, handler: HttpHandler,
                 admission: Admission, guard: BrowserGuard) -> None:
        self.ws_factory = ws_factory
        self.handler = handler
        self.admission = admission
        self.guard = guard
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.ticket: Ticket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ticket = self.admission.admit(transport)
        if self.ticket is None:  # refused: its file descriptor goes at once
            transport.abort()
            return
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or end > _MAX_HEAD:
            if len(self.buffer) > _MAX_HEAD:
                self._reply(431, "text/plain", b"request header too large\n")
            return
        try:
            method, path, headers = _parse_head(self.buffer[:end].decode("latin-1"))
        except ValueError as e:
            self._reply(400, "text/plain", f"bad request: {e}\n".encode())
            return
        upgrade = path.split("?")[0] == "/ws" and \
            headers.get("upgrade", "").lower() == "websocket"
        if self._refused(headers, upgrade):
            return
        self.transport.pause_reading()
        if upgrade:
            ws = self.ws_factory()
            ws._ticket, self.ticket = self.ticket, None
            ws.connection_made(self.transport)
            self.transport.set_protocol(ws)
            self.transport.resume_reading()
            ws.data_received(self.buffer)
            return
        asyncio.ensure_future(self._serve(method, path, headers))

    def _refused(self, headers: dict[str, str], upgrade: bool) -> bool:
        """Answer 403 to a browser that is not on this gateway's page (gateway.origins)."""
        host = headers.get("host")
        why = self.guard.host_refused(host)
        limit = "allowed_hosts"
        if why is None and upgrade:
            why, limit = self.guard.origin_refused(headers.get("origin"), host), "allowed_origins"
        if why is None:
            return False
        self.admission.hits.hit(limit, why)
        self._reply(403, "text/plain", f"forbidden: {why}\n".encode())
        return True

    async def _serve(self, method: str, path: str, headers: dict[str, str]) -> None:
        try:
            local = self.transport is not None and peer_of(self.transport)[1]
            status, content_type, body = await self.handler(method, path, headers, local)
        except Exception:
            log.exception("HTTP %s %s failed", method, path)
            status, content_type, body = 500, "text/plain", b"internal error\n"
        self._reply(status, content_type, body, head_only=method == "HEAD")

    def _reply(self, status: int, content_type: str, body: bytes, head_only: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        reason = _REASONS.get(status, "")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nCache-Control: no-cache\r\n"
                f"Connection: close\r\n\r\n")
        self.transport.write(head.encode("latin-1") + (b"" if head_only else body))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.ticket is not None:
            self.ticket.release()


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 426: "Upgrade Required",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


def _parse_head(head: str) -> tuple[str, str, dict[str, str]]:
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("malformed request line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers
