"""Real WAMP clients for the tests: autobahn-python sessions over WebSocket and RawSocket
(TCP and Unix), with any serializer, plus raw-frame clients for feeding the router garbage."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import msgpack
from autobahn.asyncio.rawsocket import WampRawSocketClientFactory
from autobahn.asyncio.wamp import ApplicationSession
from autobahn.asyncio.websocket import WampWebSocketClientFactory, WebSocketClientFactory
from autobahn.asyncio.websocket import WebSocketClientProtocol as _WSClientProtocol
from autobahn.wamp import auth, types
from autobahn.wamp.serializer import CBORSerializer, JsonSerializer, MsgPackSerializer

SERIALIZERS = {"json": JsonSerializer, "msgpack": MsgPackSerializer, "cbor": CBORSerializer}
TRANSPORTS = ("websocket", "rawsocket-tcp", "rawsocket-unix")


class Client(ApplicationSession):
    """An autobahn session whose join/leave can be awaited."""

    def __init__(self, config: types.ComponentConfig, authmethods: list[str] | None = None,
                 authid: str | None = None, secret: str | None = None,
                 cryptosign_key: Any = None, authextra: dict | None = None) -> None:
        super().__init__(config)
        self._secret = secret
        self._cryptosign_key = cryptosign_key
        self._authextra = authextra
        loop = asyncio.get_running_loop()
        self.joined: asyncio.Future = loop.create_future()
        self.left: asyncio.Future = loop.create_future()
        self.disconnected: asyncio.Future = loop.create_future()
        self._authmethods = authmethods
        self._authid = authid
        self.welcome_details: types.SessionDetails | None = None

    def onConnect(self) -> None:
        authextra = self._authextra
        if self._cryptosign_key is not None and authextra is None:
            authextra = {"pubkey": self._cryptosign_key.public_key()}
        self.join(self.config.realm, authmethods=self._authmethods, authid=self._authid,
                  authextra=authextra)

    def onChallenge(self, challenge: types.Challenge) -> Any:
        """Answer as autobahn's own clients do (ticket, wampcra with or without salt,
        cryptosign)."""
        if challenge.method == "ticket":
            return self._secret
        if challenge.method == "wampcra":
            key = self._secret.encode()
            if "salt" in challenge.extra:
                key = auth.derive_key(self._secret, challenge.extra["salt"],
                                      challenge.extra["iterations"], challenge.extra["keylen"])
            return auth.compute_wcs(key, challenge.extra["challenge"]).decode("ascii")
        if challenge.method == "cryptosign":
            return self._cryptosign_key.sign_challenge(challenge)
        raise ValueError(f"unexpected challenge {challenge.method}")

    def onJoin(self, details: types.SessionDetails) -> None:
        self.welcome_details = details
        if not self.joined.done():
            self.joined.set_result(details)

    def onLeave(self, details: types.CloseDetails) -> None:
        if not self.left.done():
            self.left.set_result(details)
        if not self.joined.done():
            refused = ConnectionRefusedError(f"{details.reason}: {details.message}")
            self.joined.set_exception(refused)
        super().onLeave(details)

    def onDisconnect(self) -> None:
        if not self.disconnected.done():
            self.disconnected.set_result(True)
        if not self.joined.done():
            self.joined.set_exception(ConnectionError("transport closed before WELCOME"))


# s: how long a join may take before the test fails: a guard against a hang, never a wait for
# something to happen (a refusal comes at once). 5 s failed through an SSH tunnel into a QEMU
# device on a loaded machine, in the WebSocket handshake and in the join.
JOIN_TIMEOUT = 60.0


async def connect(router: Any, transport: str = "websocket", serializer: str = "json",
                  realm: str = "realm1", local_addr: tuple[str, int] | None = None,
                  host: str = "127.0.0.1", **kwargs: Any) -> Client:
    """Open a transport to ``router`` (the RunningRouter of conftest) on ``host`` and join
    ``realm``. ``local_addr`` binds the client's TCP socket, e.g. ``("127.0.0.2", 0)`` to come
    from another loopback address."""
    loop = asyncio.get_running_loop()
    session = Client(types.ComponentConfig(realm=realm), **kwargs)
    ser = SERIALIZERS[serializer]()
    if transport == "websocket":
        factory = WampWebSocketClientFactory(lambda: session, url=router.ws_url,
                                             serializers=[ser])
        factory.setProtocolOptions(openHandshakeTimeout=JOIN_TIMEOUT)
        await loop.create_connection(factory, host, router.port, local_addr=local_addr)
    elif transport == "rawsocket-tcp":
        factory = WampRawSocketClientFactory(lambda: session, serializer=ser)
        await loop.create_connection(factory, host, router.rawsocket_port,
                                     local_addr=local_addr)
    elif transport == "rawsocket-unix":
        factory = WampRawSocketClientFactory(lambda: session, serializer=ser)
        await loop.create_unix_connection(factory, router.unix_path)
    else:
        raise ValueError(transport)
    await asyncio.wait_for(session.joined, JOIN_TIMEOUT)
    return session


class RawSocketPeer:
    """Speaks RawSocket framing by hand, so a test can send any bytes as a WAMP message."""

    SERIALIZER_IDS = {"json": 1, "msgpack": 2, "cbor": 3}

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 serializer: str) -> None:
        self.reader, self.writer = reader, writer
        self.serializer = SERIALIZERS[serializer]()

    @classmethod
    async def open(cls, port: int, serializer: str = "json") -> RawSocketPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(bytes([0x7F, 0xF0 | cls.SERIALIZER_IDS[serializer], 0, 0]))
        reply = await asyncio.wait_for(reader.readexactly(4), 5)
        assert reply[0] == 0x7F and reply[1] & 0x0F == cls.SERIALIZER_IDS[serializer], reply
        return cls(reader, writer, serializer)

    def send_bytes(self, payload: bytes, frame_type: int = 0) -> None:
        self.writer.write(struct.pack("!L", len(payload) | (frame_type << 24)) + payload)

    def send(self, raw_message: list[Any]) -> None:
        self.send_bytes(self.serializer._serializer.serialize(raw_message))

    async def receive(self, timeout: float = 5) -> list[Any] | None:
        """The next WAMP message as a raw list, or None when the router closed the socket."""
        try:
            header = await asyncio.wait_for(self.reader.readexactly(4), timeout)
            length = struct.unpack("!L", header)[0] & 0xFFFFFF
            payload = await asyncio.wait_for(self.reader.readexactly(length), timeout)
        except asyncio.IncompleteReadError:
            return None
        return self.serializer._serializer.unserialize(payload)[0]

    async def closed(self, timeout: float = 5) -> bool:
        """True once the router has closed the connection (reading hits end of stream)."""
        try:
            await asyncio.wait_for(self.reader.read(), timeout)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.writer.close()


class _RawWebSocket(_WSClientProtocol):
    def onOpen(self) -> None:
        self.factory.opened.set_result(self)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.factory.inbox.put_nowait(payload)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        self.factory.inbox.put_nowait(None)
        if not self.factory.opened.done():
            self.factory.opened.set_exception(ConnectionError(reason))


async def raw_websocket(router: Any, subprotocol: str = "wamp.2.json"):
    """A WebSocket client that sends whatever text/binary frames the test wants.
    Returns (protocol, inbox queue of received payloads; None marks the close)."""
    loop = asyncio.get_running_loop()
    factory = WebSocketClientFactory(router.ws_url, protocols=[subprotocol])
    factory.protocol = _RawWebSocket
    factory.opened = loop.create_future()
    factory.inbox = asyncio.Queue()
    await loop.create_connection(factory, "127.0.0.1", router.port)
    proto = await asyncio.wait_for(factory.opened, 5)
    return proto, factory.inbox


# -- a raw WebSocket peer: WAMP messages as the test writes them --------------------------


class WsPeer:
    def __init__(self, proto: Any, inbox: asyncio.Queue, serializer: str) -> None:
        self.proto, self.inbox, self.serializer = proto, inbox, serializer

    def send_bytes(self, payload: bytes) -> None:
        self.proto.sendMessage(payload, isBinary=self.serializer != "json")

    def send(self, raw_message: list[Any]) -> None:
        self.send_bytes(_encode(self.serializer, raw_message))

    async def receive(self, timeout: float = 5) -> list[Any] | None:
        payload = await asyncio.wait_for(self.inbox.get(), timeout)
        if payload is None:
            return None
        return _decode(self.serializer, payload)

    async def closed(self, timeout: float = 5) -> bool:
        try:
            while await asyncio.wait_for(self.inbox.get(), timeout) is not None:
                pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.proto.sendClose(1000)


def _encode(serializer: str, raw_message: Any) -> bytes:
    if serializer == "json":
        return json.dumps(raw_message).encode()
    return msgpack.packb(raw_message)


def _decode(serializer: str, payload: bytes) -> Any:
    return json.loads(payload) if serializer == "json" else msgpack.unpackb(payload)


async def retained_values(session: Any, prefix: str = "sensor") -> dict[str, Any]:
    """The retained value of each topic under ``prefix``, as a subscriber with get_retained
    receives them."""
    got: dict[str, int] = {}

    def on_event(value, details=None):
        if details.retained:
            got[details.topic] = value

    await session.subscribe(on_event, prefix, options=types.SubscribeOptions(
        match="prefix", get_retained=True, details_arg="details"))
    # retained events precede anything live on the same session: a round trip settles them
    await session.call("wamp.session.count")
    return got


async def all_history(session: Any, sub_id: int, **filters: Any) -> list[dict[str, Any]]:
    """Every event ``wamp.subscription.get_events`` has for ``sub_id`` (and ``filters``, such
    as ``topic``), oldest first, page after page."""
    events: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"limit": 1000, **filters}
    while True:
        result = await session.call("wamp.subscription.get_events", sub_id, **kwargs)
        events += result.results[0]
        if not result.kwresults["is_limit_reached"]:
            return events
        kwargs["after_publication"] = result.results[0][-1]["publication"]
