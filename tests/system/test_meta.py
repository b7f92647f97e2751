"""The WAMP meta API over real sockets, with real autobahn-python clients: what only the wire
shows. Each transport and serializer as wamp.session.get and wamp.session.on_join describe it
(the answer and the event arriving encoded in each), and a transport that drops without
GOODBYE. The procedures and meta events themselves are tested on the core in memory, in
test_core_meta.py."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.wamp_client import RawSocketPeer

TRANSPORTS = ("websocket", "rawsocket-tcp", "rawsocket-unix")
SERIALIZERS = ("json", "msgpack", "cbor")


class OnJoin:
    """The wamp.session.on_join events one session receives, by session id."""

    def __init__(self) -> None:
        self.details: dict[int, dict[str, Any]] = {}
        self._changed = asyncio.Event()

    def __call__(self, details: dict[str, Any]) -> None:
        self.details[details["session"]] = details
        self._changed.set()

    async def of(self, session_id: int) -> dict[str, Any]:
        async def find() -> dict[str, Any]:
            while session_id not in self.details:
                self._changed.clear()
                await self._changed.wait()
            return self.details[session_id]

        return await asyncio.wait_for(find(), 2)


async def test_session_get_and_on_join_describe_each_transport_and_serializer(client):
    watcher = await client()
    joined = OnJoin()
    await watcher.subscribe(joined, "wamp.session.on_join")
    for transport in TRANSPORTS:
        for serializer in SERIALIZERS:
            where = (transport, serializer)
            session = await client(transport, serializer)
            mine = await session.call("wamp.session.get", session.session_id)
            assert mine["session"] == session.session_id, where
            assert mine["authid"] == session.welcome_details.authid, where
            assert mine["transport"]["type"] == transport.partition("-")[0], where
            assert mine["transport"]["serializer"] == serializer, where
            if transport != "rawsocket-unix":
                assert mine["transport"]["peer"].startswith("tcp4:127.0.0.1:"), where
            assert await joined.of(session.session_id) == mine, where
            assert await watcher.call("wamp.session.get", session.session_id) == mine, where


async def test_on_leave_is_published_when_the_transport_drops_without_goodbye(client, router):
    watcher = await client()
    left: asyncio.Future = asyncio.get_running_loop().create_future()
    await watcher.subscribe(lambda *args: left.done() or left.set_result(list(args)),
                            "wamp.session.on_leave")
    peer = await RawSocketPeer.open(router.rawsocket_port)
    peer.send([1, "realm1", {"roles": {"subscriber": {}}}])
    welcome = await peer.receive()
    assert welcome[0] == 2
    peer.close()
    assert await asyncio.wait_for(left, 2) == [welcome[1], welcome[2]["authid"], "anonymous"]
