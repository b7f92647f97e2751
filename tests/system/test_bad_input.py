"""Bad input gets a clear error and loses nothing.

Whatever a peer sends, the router answers it or aborts that one session with
``wamp.error.protocol_violation`` and a reason, closes the connection, and every other
session keeps publishing, receiving and calling as before. The router never crashes.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
from datetime import UTC, datetime
from typing import Any

import cbor2
import msgpack
import pytest
from autobahn.wamp.types import PublishOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.fuzz import (
    HELLO_MESSAGE,
    PROBE,
    answered_or_aborted,
    mutated_messages,
    random_messages,
    well_formed,
)
from harness.wamp import ABORT, WELCOME
from harness.wamp_client import RawSocketPeer, WsPeer, raw_websocket

PROTOCOL_VIOLATION = "wamp.error.protocol_violation"


@pytest.fixture(autouse=True)
async def no_unhandled_loop_errors():
    """Fail the test if anything in the router raised into the event loop."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    loop.set_exception_handler(previous)
    assert not errors, f"unhandled errors in the event loop: {errors}"


# -- a witness: an autobahn session that must keep working ---------------------------------


class Witness:
    """A joined autobahn session that publishes to itself and calls its own procedure."""

    def __init__(self, session: Any, name: str) -> None:
        self.session = session
        self.topic = f"com.witness.{name}.topic"
        self.procedure = f"com.witness.{name}.echo"
        self.inbox: asyncio.Queue = asyncio.Queue()

    @classmethod
    async def join(cls, client: Any, transport: str, name: str) -> Witness:
        w = cls(await client(transport, "json"), name)
        await w.session.subscribe(lambda *a: w.inbox.put_nowait(a), w.topic)
        await w.session.register(lambda x: ["echo", x], w.procedure)
        return w

    async def check(self, n: int = 3) -> None:
        """Still connected, still publishing, receiving and calling."""
        assert self.session.is_attached(), "the witness session was dropped"
        for i in range(n):
            await self.session.publish(
                self.topic, i, options=PublishOptions(acknowledge=True, exclude_me=False))
        got = [await asyncio.wait_for(self.inbox.get(), 2) for _ in range(n)]
        assert got == [(i,) for i in range(n)]
        assert await asyncio.wait_for(self.session.call(self.procedure, 7), 2) == ["echo", 7]


def _check_abort(msg: list[Any] | None, *words: str) -> str:
    assert msg is not None, "the router closed the connection without an ABORT"
    assert msg[0] == ABORT, f"expected ABORT, got {msg!r:.200}"
    assert msg[2] == PROTOCOL_VIOLATION, msg
    text = msg[1].get("message")
    assert isinstance(text, str) and text.strip(), f"ABORT without a reason: {msg!r}"
    for word in words:
        assert re.search(word, text, re.IGNORECASE), f"{word!r} not in reason {text!r}"
    return text


async def welcomed(peer: Any) -> None:
    """``peer`` says HELLO and the router answers WELCOME."""
    peer.send(HELLO_MESSAGE)
    welcome = await peer.receive()
    assert welcome is not None and welcome[0] == WELCOME, welcome


# -- RawSocket -----------------------------------------------------------------------------


async def raw_open(router: Any, serializer: str = "json", hello: bool = False) -> RawSocketPeer:
    peer = await RawSocketPeer.open(router.rawsocket_port, serializer)
    if hello:
        await welcomed(peer)
    return peer


# -- WebSocket -----------------------------------------------------------------------------


async def ws_open(router: Any, serializer: str = "json", hello: bool = False) -> WsPeer:
    proto, inbox = await raw_websocket(router, f"wamp.2.{serializer}")
    peer = WsPeer(proto, inbox, serializer)
    if hello:
        await welcomed(peer)
    return peer


# -- either ----------------------------------------------------------------------------------


async def expect_abort(peer: RawSocketPeer | WsPeer, *words: str) -> str:
    """The reason of the ABORT ``peer`` receives (:func:`_check_abort`), after which the
    router closes the connection."""
    text = _check_abort(await peer.receive(), *words)
    assert await peer.closed(), "the router did not close the connection after ABORT"
    peer.close()
    return text


# -- the cases -----------------------------------------------------------------------------


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


# (id, send HELLO first?, what to send: bytes are sent as they are, anything else is
#  serialized, words the ABORT reason must contain)
CASES = [
    ("not-json", False, b"[1, \"realm1\", {", [r"decode|json"]),
    ("not-an-array", False, {"hello": "realm1"}, [r"array"]),
    ("a-string", True, "PUBLISH", [r"array"]),
    ("empty-array", False, [], [r"array"]),
    ("unknown-type", False, [999, 1, {}], [r"unknown", r"999"]),
    ("unknown-type-established", True, [999], [r"unknown", r"999"]),
    ("type-not-int", True, ["16", 1, {}, "com.t"], [r"unknown|type"]),
    ("publish-string-request", True, [16, "one", {}, "com.t"], [r"PUBLISH", r"request"]),
    ("publish-float-request", True, [16, 1.5, {}, "com.t"], [r"PUBLISH", r"request"]),
    ("publish-options-list", True, [16, 1, [], "com.t"], [r"PUBLISH", r"options"]),
    ("publish-args-dict", True, [16, 1, {}, "com.t", {"a": 1}], [r"PUBLISH", r"arg"]),
    ("publish-kwargs-list", True, [16, 1, {}, "com.t", [], [1]], [r"PUBLISH", r"kwarg"]),
    ("publish-too-short", True, [16, 1, {}], [r"PUBLISH", r"length|len"]),
    ("subscribe-options-string", True, [32, 1, "exact", "com.t"], [r"SUBSCRIBE", r"options"]),
    ("subscribe-topic-int", True, [32, 1, {}, 42], [r"SUBSCRIBE", r"topic"]),
    ("call-string-request", True, [48, "x", {}, "com.p"], [r"CALL", r"request"]),
    ("hello-realm-int", False, [1, 7, {}], [r"HELLO", r"realm"]),
    ("hello-details-list", False, [1, "realm1", []], [r"HELLO", r"details"]),
    ("publish-topic-empty-component", True, [16, 1, {}, "a..b"], [r"PUBLISH", r"topic"]),
    ("publish-topic-space", True, [16, 1, {}, "com.my topic"], [r"PUBLISH", r"topic"]),
    ("subscribe-topic-empty-component", True, [32, 1, {}, "a..b"],
     [r"SUBSCRIBE", r"topic"]),
    ("subscribe-topic-space", True, [32, 1, {"match": "prefix"}, "a b"],
     [r"SUBSCRIBE", r"topic"]),
    ("subscribe-prefix-empty-component", True, [32, 1, {"match": "prefix"}, "a..b"],
     [r"SUBSCRIBE", r"topic"]),
    ("subscribe-exact-empty-topic", True, [32, 1, {}, ""], [r"SUBSCRIBE", r"topic"]),
    ("register-procedure-hash", True, [64, 1, {}, "com.#p"], [r"REGISTER", r"procedure"]),
    ("call-procedure-space", True, [48, 1, {}, "com. p"], [r"CALL", r"procedure"]),
    ("publish-before-hello", False, [16, 1, {}, "com.t"], [r"HELLO", r"PUBLISH"]),
    ("welcome-before-hello", False, [2, 1, {"roles": {"broker": {}}}], [r"HELLO", r"WELCOME"]),
    ("second-hello", True, HELLO_MESSAGE, [r"HELLO"]),
    ("event-from-client", True, [36, 1, 2, {}], [r"EVENT"]),
    ("result-from-client", True, [50, 1, {}], [r"RESULT"]),
    ("welcome-from-client", True, [2, 1, {"roles": {"broker": {}}}], [r"WELCOME"]),
    ("error-for-a-call", True, [8, 48, 1, {}, "com.err"], [r"ERROR"]),
    ("lone-surrogate", True, b'[16, 1, {"acknowledge": true}, "com.t", ["\\ud800"]]',
     [r"decode", r"surrogate"]),
    ("payload-nested-too-deep", True, [16, 1, {}, "com.t", [_nested(150)]],
     [r"PUBLISH", r"deeper than 100"]),
    ("type-deeply-nested", True, b"[" * 900 + b"]" * 900, [r"unknown"]),
]


# a bad peer's transport: how it opens, and the transport of the witness (the other one)
BAD_PEERS = {"rawsocket": (raw_open, ("websocket", "ws")),
             "websocket": (ws_open, ("rawsocket-tcp", "rs"))}


@pytest.mark.parametrize(("hello", "data", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
@pytest.mark.parametrize("transport", list(BAD_PEERS))
async def test_a_bad_message_aborts_only_that_session(router, client, transport, hello, data,
                                                      words):
    open_peer, witness_on = BAD_PEERS[transport]
    witness = await Witness.join(client, *witness_on)
    peer = await open_peer(router, hello=hello)
    peer.send_bytes(data) if isinstance(data, bytes) else peer.send(data)
    await expect_abort(peer, *words)
    await witness.check()


@pytest.mark.parametrize(("serializer", "data"), [
    ("cbor", cbor2.dumps(10**5000)),
    ("cbor", cbor2.dumps([16, 1, {}, "com.t", [10**5000]])),
    ("msgpack", b"\x91" * 900 + b"\xc0"),
])
async def test_values_too_large_to_show_still_get_an_abort_with_a_reason(
        router, client, serializer, data):
    witness = await Witness.join(client, "websocket", "ws")
    peer = await raw_open(router, serializer, hello=True)
    peer.send_bytes(data)
    await expect_abort(peer, r"array|unknown|range|PUBLISH")
    await witness.check()


async def test_patterns_that_are_valid_for_their_match_policy_are_accepted(router):
    peer = await raw_open(router, hello=True)
    for request, (kind, options, uri) in enumerate([
        (32, {"match": "wildcard"}, "a..b"), (32, {"match": "wildcard"}, ".a."),
        (32, {"match": "prefix"}, "com."), (32, {"match": "prefix"}, "com.x"),
        (32, {}, "com.x"), (64, {"match": "wildcard"}, "com..p"),
        (64, {"match": "prefix"}, "com.p."),
    ], start=1):
        peer.send([kind, request, options, uri])
        reply = await peer.receive()  # SUBSCRIBED or REGISTERED
        assert reply[:2] == [kind + 1, request] and isinstance(reply[2], int), (uri, reply)
    peer.close()


async def test_messages_after_a_bad_one_are_dropped_and_the_abort_still_arrives(router, client):
    """Closing a socket with unread input makes the kernel reset it and throw away what is
    still queued for the peer, the ABORT included; the router must read until the peer closes."""
    received: list[Any] = []
    subscriber = await client("websocket", "json")
    await subscriber.subscribe(lambda *a: received.append(a), "com.after")
    peer = await raw_open(router, hello=True)
    valid = [16, 2, {}, "com.after", ["x" * 1000]]
    peer.send([16, 1, {}, "a..b"])
    for _ in range(2000):  # 2 MB of valid PUBLISHes behind the bad one
        peer.send(valid)
    await expect_abort(peer, r"PUBLISH", r"topic")
    await subscriber.publish("com.after", "ok", options=PublishOptions(acknowledge=True,
                                                                        exclude_me=False))
    for _ in range(100):
        if received:
            break
        await asyncio.sleep(0.01)
    assert received == [("ok",)], "a message sent after the bad one was delivered"


async def test_rawsocket_bytes_that_are_not_msgpack(router, client):
    witness = await Witness.join(client, "websocket", "ws")
    peer = await raw_open(router, "msgpack")
    peer.send_bytes(b"\xc1\x93\x01")  # 0xc1 is never used in MessagePack
    await expect_abort(peer, r"decode|msgpack")
    peer = await raw_open(router, "msgpack", hello=True)
    peer.send_bytes(b"\x94\x10\x01")  # an array of 4 that ends after 2 items
    await expect_abort(peer, r"decode|msgpack")
    await witness.check()


async def test_websocket_bytes_that_are_not_msgpack(router, client):
    witness = await Witness.join(client, "rawsocket-tcp", "rs")
    peer = await ws_open(router, "msgpack")
    peer.send_bytes(b"\xc1\x93\x01")
    await expect_abort(peer, r"decode|msgpack")
    await witness.check()


@pytest.mark.parametrize(("transport", "words"), [
    ("rawsocket", [r"too big|exceeds|maximum"]), ("websocket", [r"exceeds", r"65536"])])
async def test_an_oversized_message_aborts_only_that_session(router, client, transport, words):
    open_peer, witness_on = BAD_PEERS[transport]
    witness = await Witness.join(client, *witness_on)
    peer = await open_peer(router, hello=True)
    peer.send([16, 1, {}, "com.big", ["x" * 100_000]])
    await expect_abort(peer, *words)
    await witness.check()


async def test_websocket_oversized_message_is_not_buffered(router, client):
    """After the ABORT for an oversized message the router drops the rest of it unread into
    memory: a peer announcing a 100 MB frame cannot make the router hold 100 MB."""
    witness = await Witness.join(client, "rawsocket-tcp", "rs")
    peer = await ws_open(router, "msgpack", hello=False)
    peer.send(HELLO_MESSAGE)
    session_id = (await peer.receive())[1]
    server_side = router.node.router.sessions[session_id].link.transport
    transport = peer.proto.transport
    # one masked binary frame of 100 MB (mask key 0), streamed by hand: 8 MB of it
    transport.write(bytes([0x82, 0x80 | 127]) + struct.pack("!Q", 100 * 2**20) + bytes(4))
    chunk = bytes(2**20)
    for _ in range(8):
        if peer.proto.transport is None:
            break
        transport.write(chunk)
        while peer.proto.transport is not None and transport.get_write_buffer_size() > 2**20:
            await asyncio.sleep(0.001)
    text = await expect_abort(peer, r"exceeds", r"65536")
    assert "104857600" in text
    buffered = sum(len(part) for part in server_side.frame_data or ())
    buffered += sum(len(part) for part in server_side.message_data or ())
    assert buffered <= 65536, f"the router buffered {buffered} bytes of an oversized message"
    await witness.check()


UNPORTABLE = [
    ("json-huge-int", "json", b'[16, 1, {}, "com.t", [100000000000000000000000000]]',
     [r"PUBLISH args\[0\]", "64-bit"]),
    ("msgpack-ext-type", "msgpack", msgpack.packb([16, 1, {}, "com.t", [msgpack.ExtType(5, b"x")]]),
     [r"PUBLISH args\[0\]", "ExtType"]),
    ("cbor-datetime", "cbor", cbor2.dumps([16, 1, {}, "com.t", [], {"at": [datetime.now(UTC)]}]),
     [r"PUBLISH kwargs\['at'\]\[0\]", "datetime"]),
    ("cbor-set", "cbor", cbor2.dumps([48, 1, {}, "com.p", [{1, 2}]]), [r"CALL args\[0\]", "set"]),
    ("cbor-int-key", "cbor", cbor2.dumps([48, 1, {}, "com.p", [{1: 2}]]),
     [r"CALL args\[0\]", "key"]),
    ("cbor-undefined", "cbor", cbor2.dumps([70, 1, {}, [cbor2.undefined]]),
     [r"YIELD args\[0\]", "Undefined"]),
    ("json-nan", "json", b'[16, 1, {}, "com.t", [], {"temperature": NaN}]',
     [r"PUBLISH kwargs\['temperature'\]", "nan is not a number JSON can carry"]),
    ("msgpack-infinity", "msgpack", msgpack.packb([16, 1, {}, "com.t", [1.0, float("inf")]]),
     [r"PUBLISH args\[1\]", "inf is not a number JSON can carry"]),
    ("cbor-minus-infinity", "cbor", cbor2.dumps([48, 1, {}, "com.p", [[float("-inf")]]]),
     [r"CALL args\[0\]\[0\]", "-inf is not a number JSON can carry"]),
    ("cbor-unknown-tag", "cbor",
     cbor2.dumps([16, 1, {}, "com.t", [cbor2.CBORTag(4000, bytes(8))]]),
     [r"PUBLISH args\[0\]", "CBORTag"]),
]


@pytest.mark.parametrize(("serializer", "data", "words"), [c[1:] for c in UNPORTABLE],
                         ids=[c[0] for c in UNPORTABLE])
async def test_payload_not_every_serializer_can_carry(router, client, serializer, data, words):
    """Such a PUBLISH used to be acknowledged and then silently not delivered to subscribers
    using another serializer (the router could not re-encode the EVENT for them)."""
    received: list[tuple[str, Any]] = []
    for ser in ("json", "msgpack", "cbor"):
        sub = await client("websocket", ser)
        await sub.subscribe(lambda *a, ser=ser: received.append((ser, a)), "com.t")
    peer = await raw_open(router, serializer, hello=True)
    peer.send_bytes(data)
    await expect_abort(peer, *words)
    publisher = await client("rawsocket-tcp", serializer)
    await publisher.publish("com.t", 1, options=PublishOptions(acknowledge=True))
    for _ in range(100):
        if len(received) == 3:
            break
        await asyncio.sleep(0.01)
    assert sorted(received) == [("cbor", (1,)), ("json", (1,)), ("msgpack", (1,))]


@pytest.mark.parametrize("tag", [64, 68])
async def test_a_cbor_byte_typed_array_arrives_as_bytes_for_every_serializer(router, client, tag):
    """autobahn-js sends a Uint8Array (a Buffer in Node) as a CBOR typed array (RFC 8746 tag
    64): the session used to be aborted ("CBORTag is not a value every WAMP serializer can
    carry"); Crossbar delivers the bytes."""
    data = bytes(range(256)) * 64
    received: list[tuple[str, Any]] = []
    for ser in ("json", "msgpack", "cbor"):
        sub = await client("websocket", ser)
        await sub.subscribe(lambda *a, ser=ser: received.append((ser, a)), "com.t")
    peer = await raw_open(router, "cbor", hello=True)
    peer.send_bytes(cbor2.dumps([16, 1, {"acknowledge": True}, "com.t",
                                 [cbor2.CBORTag(tag, data)]]))
    assert (await peer.receive())[0] == 17  # PUBLISHED
    for _ in range(100):
        if len(received) == 3:
            break
        await asyncio.sleep(0.01)
    assert sorted(received) == [("cbor", (data,)), ("json", (data,)), ("msgpack", (data,))]


@pytest.mark.parametrize("frame_type", [3, 7])
async def test_rawsocket_invalid_frame_type(router, client, frame_type):
    witness = await Witness.join(client, "websocket", "ws")
    peer = await raw_open(router, hello=True)
    peer.send_bytes(json.dumps([16, 1, {}, "com.t"]).encode(), frame_type=frame_type)
    await expect_abort(peer, r"frame type")
    await witness.check()


# -- property: random and mutated messages -------------------------------------------------

async def _fuzz_one(port: int, serializer: str, established: bool,
                    messages: list[list[Any]]) -> str:
    peer = await RawSocketPeer.open(port, serializer)
    try:
        if established:
            await welcomed(peer)
        for message in messages:
            peer.send(message)
        if established:
            peer.send([48, PROBE, {}, "wamp.session.count", []])
        return await answered_or_aborted(peer, messages)
    finally:
        peer.close()


async def test_random_and_mutated_messages_areanswered_or_aborted(router, client):
    """Hypothesis drives a client in a worker thread (a loop of its own per example) while the
    router runs in the test's loop; afterwards a fresh autobahn client must still work."""
    witness = await Witness.join(client, "websocket", "ws")

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(serializer=st.sampled_from(["json", "msgpack", "cbor"]), established=st.booleans(),
           messages=st.lists(random_messages | mutated_messages() | well_formed,
                             min_size=1, max_size=3))
    def fuzz(serializer: str, established: bool, messages: list[list[Any]]) -> None:
        asyncio.run(_fuzz_one(router.rawsocket_port, serializer, established, messages))

    await asyncio.to_thread(fuzz)

    await witness.check()
    fresh = Witness(await client("rawsocket-tcp", "msgpack"), "fresh")
    await fresh.session.subscribe(lambda *a: fresh.inbox.put_nowait(a), fresh.topic)
    await fresh.session.register(lambda x: ["echo", x], fresh.procedure)
    await fresh.check()
    for _ in range(50):  # every fuzzing session is gone: nothing leaked
        if len(router.node.router.sessions) == 2:
            break
        await asyncio.sleep(0.02)
    assert len(router.node.router.sessions) == 2


# -- a subscriber that stops reading -------------------------------------------------------


async def stalled_subscriber(port: int | str, topic: str) -> RawSocketPeer:
    """A RawSocket client with a tiny receive buffer that subscribes, then never reads
    (``port``: a TCP port on loopback, or a Unix socket's path)."""
    loop = asyncio.get_running_loop()
    unix = isinstance(port, str)
    sock = socket.socket(socket.AF_UNIX if unix else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, port if unix else ("127.0.0.1", port))
    # a small StreamReader limit: the client stops reading once 16 kB are buffered
    reader, writer = await asyncio.open_connection(sock=sock, limit=8192)
    writer.write(bytes([0x7F, 0xF1, 0, 0]))
    assert (await asyncio.wait_for(reader.readexactly(4), 5))[0] == 0x7F
    peer = RawSocketPeer(reader, writer, "json")
    peer.send(HELLO_MESSAGE)
    assert (await peer.receive())[0] == WELCOME
    peer.send([32, 1, {}, topic])
    assert (await peer.receive())[0] == 33  # SUBSCRIBED
    return peer


async def test_slow_subscriber_is_disconnected_and_nobody_else_loses_anything(router, client):
    """Publish ~10 kB events until the router cuts off the subscriber that stopped reading
    (once more than send_buffer_limit = 1 MiB waits for it), then 20 more."""
    topic, blob = "com.flood", "x" * 10_000
    publisher = await Witness.join(client, "websocket", "pub")
    healthy = await client("rawsocket-unix", "msgpack")
    received: list[int] = []
    await healthy.subscribe(lambda i, data: received.append(i), topic)
    slow = await stalled_subscriber(router.rawsocket_port, topic)

    published, cut_at = 0, None
    while published < 1500 and (cut_at is None or published < cut_at + 20):
        await asyncio.wait_for(publisher.session.publish(
            topic, published, blob, options=PublishOptions(acknowledge=True)), 5)
        published += 1
        if cut_at is None and router.node.state.slow_consumers:
            cut_at = published
    assert cut_at is not None, f"the stalled subscriber was not cut off after {published} events"
    assert router.node.state.slow_consumers == 1

    for _ in range(200):
        if len(received) == published:
            break
        await asyncio.sleep(0.02)
    assert received == list(range(published)), "the healthy subscriber lost events"
    assert await slow.closed(timeout=5), "the slow subscriber's connection is still open"
    slow.close()
    await publisher.check()


def _masked_frame(opcode: int, payload: bytes) -> bytes:
    """A client WebSocket frame (FIN, mask key 0, so the payload goes as it is)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + b"\0\0\0\0" + payload


async def test_a_websocket_subscriber_closing_with_events_queued_costs_nobody_else_anything(
        router, client):
    """A subscriber that stopped reading says Close while events still wait for it; the next
    publication to it must not take down the publisher's session or its PUBLISHED."""
    topic = "com.closing"
    publisher = await Witness.join(client, "websocket", "pub")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", router.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=8192)
    writer.write(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.write(_masked_frame(1, json.dumps(HELLO_MESSAGE).encode()))
    writer.write(_masked_frame(1, json.dumps([32, 1, {}, topic]).encode()))
    await asyncio.sleep(0.2)  # WELCOME and SUBSCRIBED arrive; from now on nobody reads

    stalled = next(c for c in router.node.state.connections
                   if c.session.id != publisher.session.session_id)
    for i in range(300):  # until events wait in the router, not only in the kernel
        await asyncio.wait_for(publisher.session.publish(
            topic, i, "x" * 20_000, options=PublishOptions(acknowledge=True)), 5)
        if stalled.transport.transport.get_write_buffer_size() > 100_000:
            break
    assert stalled.transport.transport.get_write_buffer_size() > 100_000
    writer.write(_masked_frame(8, struct.pack("!H", 1000)))
    await asyncio.sleep(0.2)

    await asyncio.wait_for(publisher.session.publish(
        topic, "after the close", options=PublishOptions(acknowledge=True)), 5)
    await publisher.check()
    writer.close()
