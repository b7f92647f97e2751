"""The transport layer's own pieces: unmasking what WebSocket clients send, and the
WebSocket fast path for whole frames, which must behave exactly as autobahn's parser."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import struct
from typing import Any

from autobahn.asyncio.rawsocket import WampRawSocketServerProtocol
from autobahn.asyncio.websocket import WampWebSocketServerProtocol
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn.gateway.shell.flow_control import WriteBatcher
from cairn.gateway.shell.transport import (
    AUTOBAHN_FACTORY_INTERNALS,
    AUTOBAHN_RAWSOCKET_INTERNALS,
    AUTOBAHN_WEBSOCKET_INTERNALS,
    WebSocketFactory,
    WebSocketProtocol,
    serializers,
)
from harness.wamp_client import connect

# -- the WebSocket fast path: whole frames the router parses itself ---------------------------

LIMIT = 200  # the message size limit of the protocols under test


class Wire(asyncio.Transport):
    """A transport that keeps what the protocol writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    abort = close

    def get_write_buffer_size(self) -> int:
        return 0


class Recording(WebSocketProtocol):
    """The router's WebSocket protocol without the WAMP session: keeps the messages."""

    def onOpen(self) -> None:
        self.messages: list[tuple[bytes, bool]] = []
        self._session = None

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.append((payload, isBinary))
        if payload == b"bye":  # as the router closes after an ABORT or a GOODBYE
            self.sendClose(1000)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        pass


class AutobahnOnly(Recording):
    """The same, every byte through autobahn's own frame parser."""

    def take(self, data: bytes) -> bytes:
        return self._receive_in_slices(data)


def client_frame(opcode: int, payload: bytes, mask: bytes, fin: bool = True, rsv: int = 0,
                 masked: bool = True, length_code: int | None = None) -> bytes:
    """A frame as a client sends it (RFC 6455, 5.2); ``length_code`` forces 126 or 127."""
    n = len(payload)
    code = length_code or (n if n < 126 else 126 if n < 1 << 16 else 127)
    extended = {126: struct.pack("!H", n), 127: struct.pack("!Q", n)}.get(code, b"")
    head = bytes(((0x80 if fin else 0) | rsv << 4 | opcode, (0x80 if masked else 0) | code))
    return head + extended + (mask + masked_bytes(payload, mask) if masked else payload)


def masked_bytes(data: bytes, mask: bytes) -> bytes:
    return bytes(byte ^ mask[i % 4] for i, byte in enumerate(data))


text = st.text(max_size=LIMIT + 20).map(str.encode)
masks = st.binary(min_size=4, max_size=4)
frames = st.one_of(
    st.builds(lambda p, k: client_frame(1, p, k), text, masks),
    st.builds(lambda p, k: client_frame(2, p, k), st.binary(max_size=LIMIT + 20), masks),
    st.builds(lambda p, k: client_frame(2, p, k),
              st.binary(min_size=LIMIT - 2, max_size=LIMIT + 2), masks),
    st.builds(lambda k: client_frame(1, b"bye", k), masks),
    st.builds(lambda p, k: client_frame(1, p, k), st.binary(min_size=1, max_size=20), masks),
    st.builds(lambda p, k: client_frame(1, p[:len(p) // 2], k, fin=False)
              + client_frame(0, p[len(p) // 2:], k), text, masks),
    st.builds(lambda p, k: client_frame(9, p, k), st.binary(max_size=125), masks),
    st.builds(lambda p, k: client_frame(10, p, k), st.binary(max_size=125), masks),
    st.builds(lambda p, k: client_frame(1, p, k, masked=False), text, masks),
    st.builds(lambda p, k, r: client_frame(1, p, k, rsv=r), text, masks,
              st.integers(min_value=1, max_value=7)),
    st.builds(lambda p, k, o: client_frame(o, p, k), text, masks,
              st.sampled_from([3, 7, 11, 15])),
    st.builds(lambda p, k, c: client_frame(2, p, k, length_code=c), st.binary(max_size=125),
              masks, st.sampled_from([126, 127])),
    st.builds(lambda k: client_frame(8, struct.pack("!H", 1000), k), masks),
)


def run_protocol(protocol_class: type, chunks: list[bytes]) -> tuple[Any, ...]:
    """Opens a WebSocket with ``protocol_class``, feeds it ``chunks``; what came out."""

    async def scenario() -> tuple[Any, ...]:
        factory = WebSocketFactory(lambda: None, url="ws://127.0.0.1:8080/ws",
                                   serializers=serializers())
        factory.protocol = protocol_class
        factory.writes = WriteBatcher()
        factory.setProtocolOptions(maxMessagePayloadSize=LIMIT, maxFramePayloadSize=LIMIT)
        protocol, wire = factory(), Wire()
        protocol.connection_made(wire)
        protocol.data_received(
            b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n")
        for _ in range(3):
            await asyncio.sleep(0)  # autobahn answers the handshake a loop pass later
        assert protocol.state == protocol.STATE_OPEN
        handshake = len(wire.written)
        for chunk in chunks:
            if wire.closed:
                break
            protocol.data_received(chunk)
        return (protocol.messages, b"".join(wire.written[handshake:]), protocol.state,
                wire.closed)

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(scenario())
    finally:
        for call in list(getattr(loop, "_scheduled", [])):
            call.cancel()  # autobahn's close-handshake timers
        loop.close()


@settings(max_examples=300, deadline=None)
@given(stream=st.lists(frames, min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=5))
def test_the_websocket_fast_path_receives_exactly_what_autobahn_would(stream, cuts):
    data = b"".join(stream)
    bounds = [0, *sorted(min(cut, len(data)) for cut in cuts), len(data)]
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    assert run_protocol(Recording, chunks) == run_protocol(AutobahnOnly, chunks)


def parsed_by_autobahn(chunks: list[bytes]) -> tuple[list, list[bytes]]:
    """The messages ``chunks`` delivered, and what autobahn's own parser was given."""
    calls: list[bytes] = []
    original = Recording._receive_in_slices
    Recording._receive_in_slices = lambda self, data: calls.append(data) or original(self, data)
    try:
        messages, *_ = run_protocol(Recording, chunks)
    finally:
        Recording._receive_in_slices = original
    return messages, calls


PUBLISH_FRAME = client_frame(1, b'[16,1,{},"a.b"]', b"\x01\x02\x03\x04")


def test_a_whole_frame_reaches_the_session_without_autobahns_parser():
    messages, calls = parsed_by_autobahn([PUBLISH_FRAME, PUBLISH_FRAME])
    assert messages == [(b'[16,1,{},"a.b"]', False)] * 2
    assert [data[:4] for data in calls] == [b"GET "]  # the opening handshake only


def test_a_frame_cut_by_the_end_of_a_read_reaches_the_session_without_autobahns_parser():
    stream = PUBLISH_FRAME * 3
    chunks = [stream[:1], stream[1:9], stream[9:30], stream[30:]]
    messages, calls = parsed_by_autobahn(chunks)
    assert messages == [(b'[16,1,{},"a.b"]', False)] * 3
    assert [data[:4] for data in calls] == [b"GET "]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53)
    # text that starts with NUL is binary to WAMP's JSON: no serializer sends it as text
    | st.text(max_size=20).filter(lambda text: not text.startswith("\x00"))
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES)
def test_json_with_binary_values_decodes_exactly_as_autobahns_decoder(value):
    """Binary in JSON (NUL + base64 strings) is decoded by the C parser and one walk, not by
    autobahn's pure-Python scanner (a 1 MB message stalled the loop 0.44 s)."""
    from autobahn.wamp.serializer import JsonObjectSerializer

    ours = serializers()[0]._serializer
    payload = ours.serialize([16, 1, {}, "com.t", [value]])
    assert ours.unserialize(payload) == JsonObjectSerializer().unserialize(payload)


# -- what the transport borrows from autobahn ---------------------------------------------


def autobahn_lacks(protocol: Any, base: type, names: tuple[str, ...]) -> list[str]:
    """The ``names`` that autobahn's class ``base`` neither has nor assigns (on the live
    ``protocol`` or in its source: some are set only once a fragmented message begins). An
    override of ours does not count: it would no longer be called."""
    source = "".join(inspect.getsource(c) for c in base.__mro__ if c.__module__.startswith(
        "autobahn"))
    return [f"{base.__name__}.{name}" for name in names
            if not hasattr(base, name) and name not in vars(protocol)
            and f"self.{name} =" not in source]


async def test_the_autobahn_internals_the_transport_relies_on_still_exist(router):
    for transport in ("websocket", "rawsocket-tcp"):
        await connect(router, transport, "json")
    missing = []
    for link in router.node.state.connections:
        protocol = link.transport
        if isinstance(protocol, WebSocketProtocol):
            missing += autobahn_lacks(protocol, WampWebSocketServerProtocol,
                                      AUTOBAHN_WEBSOCKET_INTERNALS)
        else:
            missing += autobahn_lacks(protocol, WampRawSocketServerProtocol,
                                      AUTOBAHN_RAWSOCKET_INTERNALS)
        missing += autobahn_lacks(protocol.factory, type(protocol.factory).__mro__[1],
                                  AUTOBAHN_FACTORY_INTERNALS)
    assert len(router.node.state.connections) == 2
    assert not missing, f"autobahn no longer has {sorted(set(missing))}: gateway/transport.py " \
                        f"relies on them"
