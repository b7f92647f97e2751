"""Transports: they move bytes between sockets and the protocol core, nothing more.

- WAMP over WebSocket (autobahn's asyncio WebSocket server) behind the HTTP front
  (gateway.shell.http_front) that also serves plain HTTP routes on the same port;
- WAMP over RawSocket (autobahn's asyncio RawSocket server) on TCP and Unix sockets.

Both decode frames into autobahn messages with the codec of gateway.core.wire, so a malformed
frame, an unknown message type or an oversized message aborts that one session with
``wamp.error.protocol_violation`` and a reason, as WAMP asks, instead of just dropping the
connection.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any

from autobahn.asyncio.rawsocket import WampRawSocketServerFactory, WampRawSocketServerProtocol
from autobahn.asyncio.websocket import WampWebSocketServerFactory, WampWebSocketServerProtocol
from autobahn.wamp import message as m
from autobahn.wamp.exception import ProtocolError

from cairn.gateway.core.messages import encode
from cairn.gateway.core.retention import RetainedStream
from cairn.gateway.core.session import Session
from cairn.gateway.core.wire import CborWire, JsonWire, MsgPackWire, decode
from cairn.gateway.shell.admission import Admission, Ticket, local_caller
from cairn.gateway.shell.flow_control import FairShare, Pacer, ReadBudget, WriteBatcher

if TYPE_CHECKING:
    from cairn.gateway.shell.shell_state import Callbacks, ShellState

log = logging.getLogger("cairn.transport")

# Members of autobahn's server protocols outside its public API that this module overrides
# or reads. tests/system/test_transport.py checks each on live connections, so a release that
# renames one fails there, naming it, instead of silently bypassing an override (autobahn
# is pinned below its next major version in pyproject.toml).
AUTOBAHN_WEBSOCKET_INTERNALS = (
    "_dataReceived", "_cancelAutoPingTimeoutCall", "_max_message_size_exceeded",
    "_perMessageCompress", "_session", "_serializer", "autoPingRestartOnAnyTraffic",
    "autoPingTimeoutCall", "current_frame", "data", "inside_message", "message_data",
    "message_is_binary", "failedByMe")
AUTOBAHN_RAWSOCKET_INTERNALS = (
    "_on_connection_lost", "_session", "_serializer", "max_length_send", "prefix_format",
    "_handshake_done", "_buffer", "max_length")
AUTOBAHN_FACTORY_INTERNALS = ("_serializers",)


def serializers() -> list[Any]:
    # here, not in gateway.core.wire: autobahn's serializers need txaio's framework chosen, which
    # importing autobahn.asyncio (above) does
    return [JsonWire(), MsgPackWire(), CborWire()]


def _unmask(mask: bytes, data: bytes) -> bytes:
    """``data`` XOR the 4-byte ``mask`` repeated: one XOR of big integers, cheap at any size."""
    n = len(data)
    key = mask * ((n >> 2) + 1)
    return (int.from_bytes(data, "little")
            ^ int.from_bytes(key[:n], "little")).to_bytes(n, "little")


class Connection:
    """One transport's link to the core; autobahn calls it as the 'session' of the transport."""

    def __init__(self, state: ShellState, callbacks: Callbacks, kind: str) -> None:
        self.state = state
        self.callbacks = callbacks
        self.kind = kind
        self.transport: Any = None  # the autobahn protocol instance
        self.session = Session(link=self)
        self._open = False
        self._sent = state.counters.sent
        self._ticket: Ticket | None = None  # until the session is established
        self._pacer: Pacer | None = None  # once open: retained streams, what waits behind
        self._waiting: Any = ()  # once open: its pacer's deque (empty: nothing is paced)
        self._share = FairShare()
        self._budget: ReadBudget | None = None  # once open, when a hard cap is configured
        self._owed_messages = self._owed_bytes = 0  # read in this turn, not charged to it yet
        self._paused: set[str] = set()  # why it is not read (flow_control.Readable)
        self._resume: asyncio.TimerHandle | None = None  # when its read budget is back
        # what it sent beyond its share of a turn, and the call that reads on in the next one
        self._later: bytes | None = None
        self._turn: asyncio.Handle | None = None
        self._held = False  # whether its transport is paused

    # autobahn's ITransportHandler
    def onOpen(self, transport: Any) -> None:
        self.transport = transport
        self._ticket = transport._ticket
        self._open = True
        self.state.connections.add(self)
        details = transport.transport_details
        unix = not isinstance(transport.transport.get_extra_info("peername"), tuple)
        self.session.transport = {
            "type": self.kind,
            "peer": local_caller(transport.transport) if unix else
            details.peer if details else None,
            "serializer": transport._serializer.SERIALIZER_ID,
        }
        limit = self.state.config.router.send_buffer_limit
        # resume_writing() each time the buffer is empty again: the Pacer's cue to go on
        transport.transport.set_write_buffer_limits(high=0)
        corked = transport.transport = self.state.writes.cork(
            transport.transport, limit, self._overflowed, self.drained)
        self._pacer = Pacer(corked.unsent, self._encode, self._write_payload, limit,
                            self._overflowed)
        self._waiting = self._pacer.waiting
        # The object serializer is shared by all sessions, and a message caches its bytes per
        # serializer: an EVENT is encoded once for all its subscribers. (This skips autobahn's
        # per-session statistics wrapper; /metrics counts messages.)
        self._serializer = transport._serializer.objects
        self._binary = self._serializer.BINARY
        limits = self.state.config.router.limits
        if limits.max_messages_per_second or limits.max_bytes_per_second:
            self._budget = ReadBudget(limits.max_messages_per_second,
                                      limits.max_bytes_per_second,
                                      asyncio.get_running_loop().time())

    def onClose(self, was_clean: bool) -> None:
        self._open = False
        for call in (self._resume, self._turn):
            if call is not None:
                call.cancel()
        self._later = None
        self.state.connections.discard(self)
        self.callbacks.lost(self.session)

    def onMessage(self, msg: m.Message) -> None:  # not used: our protocols call receive()
        self.callbacks.receive(self.session, msg, None)

    # called by our protocol subclasses
    def read(self, data: bytes) -> None:
        """What the socket brought: as much as its share of this turn allows is handled
        now, the rest in its next turns (flow_control.FairShare)."""
        if self._later is not None or self._paused:  # (TLS may hand over more once paused)
            self.later((self._later or b"") + data)
            return
        self._share.turn()
        self._take(data)

    def may_read(self) -> bool:
        """Whether the protocol may hand over one more message in this turn."""
        return not self._open or self._share.left and not self._paused

    def later(self, rest: bytes) -> None:
        """``rest`` (and what the socket brings after it) waits for the connection's next
        turn, the socket not read meanwhile."""
        if not self._open:
            return
        self._later = rest
        self._hold()
        if not self._paused and self._turn is None:
            self._turn = asyncio.get_running_loop().call_soon(self._next_turn)

    def _take(self, data: bytes) -> None:
        rest = self.transport.take(data)
        if self._budget is not None:
            self._charge_budget()
        if rest or not self._share.left:  # in debt: it sits out turns until it is not
            self.later(rest)

    def _charge_budget(self) -> None:
        """What the turn read, charged to the read budget once (per message, the charge cost
        a seventh of the router's time for a lone client): over it, the connection is not
        read until the budget is back, the turn's share at most read beyond it first, and
        paid off in that wait (a token bucket in debt)."""
        over = self._budget.spend(self._owed_messages, self._owed_bytes,
                                  asyncio.get_running_loop().time())
        self._owed_messages = self._owed_bytes = 0
        if over is not None and self._open:
            self._wait_for_budget(*over)

    def _next_turn(self) -> None:
        self._turn = None
        if self._paused or self._later is None:
            return  # (resume_reading calls it again)
        self._share.turn()
        if not self._share.left and self._open:  # still paying off a large message
            self._turn = asyncio.get_running_loop().call_soon(self._next_turn)
            return
        data, self._later = self._later, None
        self.state.writes.read(self._take, data)
        self._hold()

    def _hold(self) -> None:
        """Pauses or resumes reading the socket: paused while any reason or a rest waits."""
        held = bool(self._paused) or self._later is not None
        transport = self.transport.transport
        if held != self._held and transport is not None:
            self._held = held
            if held:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def receive(self, payload: bytes) -> None:
        if not self._open:
            return
        try:
            messages = decode(self.transport._serializer, payload)
        except ProtocolError as e:
            self.violation(str(e))
            return
        for msg, extra in messages:  # (Node.receive charges what they queue in the store)
            self.callbacks.receive(self.session, msg, extra)
        self._share.spend(len(messages), len(payload))
        if self._budget is not None:  # (charged when the turn is over: _charge_budget)
            self._owed_messages += len(messages)
            self._owed_bytes += len(payload)
        if self._ticket is not None and self.session.established:
            self._ticket.established()  # the handshake deadline no longer applies
            self._ticket = None

    def violation(self, reason: str) -> None:
        self.callbacks.violation(self.session, reason)

    def _wait_for_budget(self, limit: str, seconds: float) -> None:
        """Not read for ``seconds``: it sent more than its read budget allows."""
        if "rate" not in self._paused:
            self.state.limit_hits.hit(limit, f"session {self.session.id} is not read for "
                                             f"{seconds:.2f} s")
            self.pause_reading("rate")
        if self._resume is not None:  # a read already in the socket's buffer added to it
            self._resume.cancel()
        self._resume = asyncio.get_running_loop().call_later(
            seconds, self.resume_reading, "rate")

    def pause_reading(self, reason: str) -> None:
        if self._open:
            self._paused.add(reason)
            self._hold()

    def resume_reading(self, reason: str) -> None:
        if self._open and reason in self._paused:
            self._paused.discard(reason)
            if self._later is not None:
                self.later(self._later)  # what waits goes first, in a turn of its own
            else:
                self._hold()

    def send(self, msg: m.Message | RetainedStream) -> None:
        """Write ``msg``; a retained stream's events as the peer reads them, and what comes
        after them behind them (gateway.shell.flow_control.Pacer)."""
        if not self._open:
            return
        if self._waiting or type(msg) is RetainedStream:
            self._pace(msg)
            return
        # the hot path (every EVENT to every subscriber): _encode and _write_payload, inline
        self._sent[msg.MESSAGE_TYPE] += 1
        try:
            payload = encode(msg, self._serializer)
        except Exception as e:
            log.error("session %s: cannot serialize %s: %s", self.session.id,
                      type(msg).__name__, e)
            return
        try:
            self.transport.send_payload(payload, self._binary)
        except Exception:  # costs this session, never the sender of what is being delivered
            log.exception("session %s: cannot send; closing its transport", self.session.id)
            self.abort()

    def _pace(self, msg: m.Message | RetainedStream) -> None:
        if type(msg) is RetainedStream:
            self._pacer.stream(msg)
        else:
            payload = self._encode(msg)
            if payload is not None:
                self._pacer.queue(payload)

    def drained(self) -> None:
        """The peer may take more: its writes were flushed, or its transport's buffer
        went down (resume_writing)."""
        if self._open and self._waiting:
            self._pacer.pump()

    def _encode(self, msg: m.Message) -> bytes | None:
        self._sent[msg.MESSAGE_TYPE] += 1
        try:
            return encode(msg, self._serializer)
        except Exception as e:
            log.error("session %s: cannot serialize %s: %s", self.session.id,
                      type(msg).__name__, e)
            return None

    def _write_payload(self, payload: bytes) -> None:
        if not self._open:
            return
        try:
            self.transport.send_payload(payload, self._binary)
        except Exception:  # costs this session, never the sender of what is being delivered
            log.exception("session %s: cannot send; closing its transport", self.session.id)
            self.abort()

    def _overflowed(self, buffered: int) -> None:
        if self._open:
            log.warning("session %s: disconnecting slow consumer (%d bytes unsent, limit %d)",
                        self.session.id, buffered, self.state.config.router.send_buffer_limit)
            self.state.slow_consumers += 1
            self.abort()

    def close(self) -> None:
        if self._open:
            if self._waiting:
                self._pacer.finish()
            self._open = False
            self.transport.close_transport()
            self._read_to_the_end()

    def _read_to_the_end(self) -> None:
        """Closing: the socket is read again, what waited for a turn first, so that the
        closing handshake gets through (and the messages are dropped: may_read())."""
        self._paused.clear()
        if self._later is not None and self._turn is None:
            self._turn = asyncio.get_running_loop().call_soon(self._next_turn)
        elif self._later is None:
            self._hold()

    def abort(self) -> None:
        self._open = False
        self._later = None
        if self._turn is not None:
            self._turn.cancel()
        if self._waiting:
            self._pacer.clear()
        if self.transport.transport is not None:
            self.transport.transport.abort()
        self.callbacks.lost(self.session)


_LINGER = 2.0  # seconds a closing RawSocket waits for its peer to close
_WEBSOCKET_SLICE = 4096


_TEXT, _BINARY = 0x81, 0x82  # first octet of an unfragmented text/binary frame, no RSV bits


class TakesTurns:
    """What both protocols share: the bytes of each read go to the session, which hands
    back to ``take`` (the protocol's parser) what its share of the turn allows
    (Connection.read); before there is a session (the handshakes), all goes at once."""

    _session: Connection | None

    def _read(self, data: bytes) -> None:
        session = getattr(self, "_session", None)
        if session is not None:
            session.read(data)
        elif (rest := self.take(data)) and self._session is not None:
            self._session.later(rest)  # the session opened in this read and took its share

    def _may_read(self) -> bool:
        session = getattr(self, "_session", None)
        return session is None or session.may_read()

    def take(self, data: bytes) -> bytes:
        """Hands over the messages of ``data`` while the session may read; the rest."""
        raise NotImplementedError


class WebSocketProtocol(TakesTurns, WampWebSocketServerProtocol):
    _ticket: Ticket | None = None  # handed over by the HttpFront that read the upgrade
    _partial = b""  # the start of a frame the fast path waits to see whole

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ticket is not None:
            self._ticket.release()
        super().connection_lost(exc)

    def resume_writing(self) -> None:  # the transport's buffer is empty again
        if getattr(self, "_session", None) is not None:
            self._session.drained()

    def data_received(self, data: bytes) -> None:
        # Parsed right away, not queued for the next loop pass as autobahn's asyncio adapter
        # does: one pass less between a PUBLISH and its EVENTs. (An exception here makes
        # asyncio log it and close the connection, as the adapter would.)
        self.factory.writes.read(self._read, data)

    def take(self, data: bytes) -> bytes:
        if (self.state == self.STATE_OPEN and self.current_frame is None and not self.data
                and not self.inside_message and self._perMessageCompress is None):
            if self._partial:
                data, self._partial = self._partial + data, b""
            data = self._receive_whole_frames(data)
            if data and not self._may_read():
                return data  # the rest waits for the next turn
            if self._frame_pending(data):  # its rest comes with the next read
                self._partial, data = data, b""
        elif self._partial:  # closing meanwhile: autobahn's parser takes it from here
            data, self._partial = self._partial + data, b""
        return self._receive_in_slices(data) if data else b""

    def _receive_whole_frames(self, data: bytes) -> bytes:
        """Delivers the frames WAMP clients send all the time (whole, unfragmented, masked
        text or binary frames within the size limit, valid UTF-8 if text) without autobahn's
        general frame parser, which costs more than the router's whole handling of a
        PUBLISH. Returns the data from the first frame that is anything else (control,
        fragmented, partial, invalid), which autobahn's parser then takes as before."""
        end, pos = len(data), 0
        limit, session = self.maxMessagePayloadSize, getattr(self, "_session", None)
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
            if self.state != self.STATE_OPEN or (session is not None and not session.may_read()):
                break  # closed, or its turn is over (TakesTurns._may_read, inline)
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

    def _receive_in_slices(self, data: bytes) -> bytes:
        # autobahn's frame parser copies the rest of its buffer after each frame, which is
        # quadratic in the size of a read: a router that falls behind reads up to 256 KiB.
        for start in range(0, len(data), _WEBSOCKET_SLICE):
            if self.transport is None:  # closed by what came before
                return b""
            if not self._may_read():
                return data[start:]
            self._dataReceived(data[start:start + _WEBSOCKET_SLICE])
        return b""

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


_DATA, _PING, _PONG = 0, 1, 2  # RawSocket frame types


class RawSocketProtocol(TakesTurns, WampRawSocketServerProtocol):
    _closing = False
    _ticket: Ticket | None = None
    _pending = b""  # the start of a frame whose rest comes with a later read

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

    def resume_writing(self) -> None:  # the transport's buffer is empty again
        if getattr(self, "_session", None) is not None:
            self._session.drained()

    def data_received(self, data: bytes) -> None:
        if not self._closing:  # what a peer sends after our ABORT or GOODBYE is dropped
            self.factory.writes.read(self._read, data)

    def take(self, data: bytes) -> bytes:
        if not self._handshake_done:  # autobahn's handshake: its 4 bytes, not one more
            need = 4 - len(self._buffer)
            super().data_received(data[:need])
            if not self._handshake_done:
                return b""
            data = data[need:]
        return self._receive_frames(self._pending + data if self._pending else data)

    def _receive_frames(self, data: bytes) -> bytes:
        """The frames of ``data`` as autobahn's parser delivers them, while the session may
        read (autobahn's reads every frame of its buffer at once); the rest once it may not."""
        self._pending, pos, end = b"", 0, len(data)
        session, limit = getattr(self, "_session", None), self.factory.max_message_size
        if session is None:  # its session could not be made: the transport is aborted
            return b""
        while end - pos >= 4:
            if self._closing:
                return b""
            if not session.may_read():
                return data[pos:]
            kind, length = data[pos] & 0x07, int.from_bytes(data[pos + 1:pos + 4], "big")
            if kind > _PONG:
                self.protocol_error("Invalid frame type")
                return b""
            if length > self.max_length:
                self.protocol_error("Frame too big")
                return b""
            stop = pos + 4 + length
            if stop > end:
                break
            payload, pos = data[pos + 4:stop], stop
            if kind == _DATA and length <= limit:
                session.receive(payload)  # (stringReceived, inline)
            elif kind == _DATA:
                self.stringReceived(payload)
            elif kind == _PING:
                self.ping(payload)
            else:
                self.pong(payload)
        self._pending = data[pos:]
        return b""

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


def websocket_factory(state: ShellState, callbacks: Callbacks,
                      url: str) -> WampWebSocketServerFactory:
    factory = WebSocketFactory(lambda: Connection(state, callbacks, "websocket"), url=url,
                               serializers=serializers())
    factory.protocol = WebSocketProtocol
    factory.writes = state.writes
    limit = state.config.router.max_message_size
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


def rawsocket_factory(state: ShellState, callbacks: Callbacks) -> WampRawSocketServerFactory:
    factory = RawSocketFactory(lambda: Connection(state, callbacks, "rawsocket"),
                               serializers=serializers())
    factory.protocol = RawSocketProtocol
    factory.writes = state.writes
    factory.admission = state.admission
    limit = state.config.router.max_message_size
    factory.max_message_size = limit
    factory.setProtocolOptions(maxMessagePayloadSize=min(max(limit, 512), 2**24))
    return factory
