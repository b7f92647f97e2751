"""Session lifecycle: HELLO -> WELCOME (or ABORT), GOODBYE both ways, protocol violations
around the opening handshake, and GOODBYE to everyone when the router stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp import message
from autobahn.wamp.role import RoleBrokerFeatures, RoleDealerFeatures

from cairn.gateway.core import router as gateway_router
from harness.wamp_client import RawSocketPeer, connect
from tests.conftest import RunningRouter, router_config, start_router

HELLO_ROLES = {"publisher": {}, "subscriber": {}, "caller": {}, "callee": {}}

# What the router implements, so what WELCOME must announce: nothing more, nothing less.
BROKER_FEATURES = {
    "publisher_identification", "pattern_based_subscription", "session_meta_api",
    "subscription_meta_api", "subscriber_blackwhite_listing", "publisher_exclusion",
    "payload_transparency", "event_retention", "event_history",
}
DEALER_FEATURES = {
    "caller_identification", "pattern_based_registration", "session_meta_api",
    "registration_meta_api", "shared_registration", "call_timeout", "call_canceling",
    "progressive_call_results", "payload_transparency",
}


@pytest.fixture
async def peers() -> AsyncIterator[Callable[..., Awaitable[RawSocketPeer]]]:
    """Opens raw RawSocket peers to a router's port; all are closed at teardown."""
    opened: list[RawSocketPeer] = []

    async def open_peer(router: Any, serializer: str = "json") -> RawSocketPeer:
        peer = await RawSocketPeer.open(router.rawsocket_port, serializer)
        opened.append(peer)
        return peer

    yield open_peer
    for peer in opened:
        peer.close()


async def hello(peer: RawSocketPeer, realm: str = "realm1", **details: Any) -> list[Any]:
    """Send HELLO; return the router's answer."""
    peer.send([1, realm, {"roles": HELLO_ROLES, **details}])
    return await peer.receive()


async def joined(peer: RawSocketPeer, **details: Any) -> int:
    """Send HELLO, expect WELCOME; return the session id."""
    welcome = await hello(peer, **details)
    assert welcome[0] == message.Welcome.MESSAGE_TYPE, welcome
    return welcome[1]


def assert_abort(msg: list[Any] | None, reason: str, text_contains: str = "") -> None:
    assert msg is not None, "the router closed the connection without ABORT"
    assert msg[0] == message.Abort.MESSAGE_TYPE, msg
    assert msg[2] == reason, msg
    assert isinstance(msg[1].get("message"), str) and text_contains in msg[1]["message"], msg


# -- HELLO -> WELCOME ----------------------------------------------------------------------


async def test_welcome_announces_broker_and_dealer_with_exactly_the_implemented_features(
        router, peers):
    welcome = await hello(await peers(router))
    assert welcome[0] == message.Welcome.MESSAGE_TYPE
    assert welcome[2]["roles"] == {
        "broker": {"features": {f: True for f in BROKER_FEATURES}},
        "dealer": {"features": {f: True for f in DEALER_FEATURES}},
    }
    # autobahn reads them back as the router's role features
    roles = message.Welcome.parse(welcome).roles
    assert isinstance(roles["broker"], RoleBrokerFeatures)
    assert isinstance(roles["dealer"], RoleDealerFeatures)
    assert {k for k, v in vars(roles["broker"]).items() if v} == BROKER_FEATURES
    assert {k for k, v in vars(roles["dealer"]).items() if v} == DEALER_FEATURES


async def test_welcome_details_reach_autobahn_session_details(client):
    session = await client("rawsocket-tcp", "cbor")
    details = session.welcome_details
    assert details.realm == "realm1"
    assert details.session == session.session_id
    assert details.authid.startswith("anonymous-")  # the router names anonymous sessions
    assert details.authrole == "anonymous"
    assert details.authmethod == "anonymous"
    assert details.authprovider == "static"


async def test_session_ids_are_distinct_and_in_the_global_id_range(client, router, peers):
    sessions = [await client(t, s) for t, s in [("websocket", "json"), ("websocket", "msgpack"),
                                                 ("rawsocket-tcp", "cbor"),
                                                 ("rawsocket-unix", "json")]]
    ids = [s.session_id for s in sessions]
    for _ in range(4):
        ids.append(await joined(await peers(router)))
    assert len(set(ids)) == len(ids)
    assert all(isinstance(i, int) and 1 <= i <= 2**53 for i in ids), ids


async def test_a_session_id_already_in_use_is_never_given_out_again(client, monkeypatch):
    real_global_id = gateway_router.global_id
    draws = iter([4711, 4711, 4711, 4712])  # the second session draws 4711 twice
    monkeypatch.setattr(gateway_router, "global_id", lambda: next(draws, 0) or real_global_id())
    first = await client()
    second = await client()
    assert (first.session_id, second.session_id) == (4711, 4712)


# -- ABORT before WELCOME ------------------------------------------------------------------


async def test_hello_for_an_unknown_realm_is_aborted_with_no_such_realm(router, peers):
    peer = await peers(router)
    assert_abort(await hello(peer, realm="com.nowhere"), "wamp.error.no_such_realm",
                 "com.nowhere")
    assert await peer.closed()
    # and an autobahn client sees its join refused with that reason
    with pytest.raises(ConnectionRefusedError, match="wamp.error.no_such_realm"):
        await connect(router, realm="com.nowhere")


async def test_a_message_other_than_hello_before_welcome_is_a_protocol_violation(router,
                                                                                 peers):
    for first in ([32, 1, {}, "com.topic"],             # SUBSCRIBE
                  [48, 1, {}, "com.proc"],              # CALL
                  [16, 1, {}, "com.topic"],             # PUBLISH
                  [6, {}, "wamp.close.close_realm"],    # GOODBYE
                  [5, "secret", {}]):                   # AUTHENTICATE, unasked for
        peer = await peers(router)
        peer.send(first)
        assert_abort(await peer.receive(), "wamp.error.protocol_violation", "HELLO")
        assert await peer.closed()


# -- after WELCOME -------------------------------------------------------------------------


async def test_a_second_hello_is_aborted_with_protocol_violation(client, router, peers):
    observer = await client()
    peer = await peers(router)
    session_id = await joined(peer)
    assert_abort(await hello(peer), "wamp.error.protocol_violation", "HELLO")
    assert await peer.closed()
    assert session_id not in await observer.call("wamp.session.list")
    assert await observer.call("wamp.session.count") == 1  # the observer is unaffected


async def test_goodbye_is_answered_with_goodbye_and_out_then_the_connection_closes(
        client, router, peers):
    peer = await peers(router)
    await joined(peer)
    peer.send([6, {"message": "bye"}, "wamp.close.close_realm"])
    answer = await peer.receive()
    assert answer[0] == message.Goodbye.MESSAGE_TYPE, answer
    assert answer[2] == "wamp.close.goodbye_and_out"
    assert await peer.closed()
    # and autobahn's leave() ends in onLeave with the router's reason
    session = await client()
    session.leave()
    details = await asyncio.wait_for(session.left, 2)
    assert details.reason == "wamp.close.goodbye_and_out"
    await asyncio.wait_for(session.disconnected, 2)


async def test_a_session_that_said_goodbye_is_gone_from_session_list(client):
    observer, leaver = await client(), await client("rawsocket-unix", "msgpack")
    leaver_id = leaver.session_id
    assert leaver_id in await observer.call("wamp.session.list")
    leaver.leave()
    await asyncio.wait_for(leaver.left, 2)
    assert await observer.call("wamp.session.list") == [observer.session_id]


# -- the router stops ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def own_router(tmp_path: Path) -> AsyncIterator[RunningRouter]:
    """A router of the test's own, which the test stops itself (or this does, if the test
    fails first)."""
    path = tmp_path / "own.sock"
    node = await start_router(router_config(path, tmp_path / "data"))
    try:
        yield RunningRouter(node, str(path))
    except BaseException:
        await node.stop()
        raise


async def test_stopping_the_router_says_goodbye_system_shutdown_to_every_client(tmp_path):
    async with own_router(tmp_path) as router:
        clients = [await connect(router, t, s)
                   for t, s in [("websocket", "json"), ("websocket", "cbor"),
                                ("rawsocket-tcp", "msgpack"), ("rawsocket-unix", "json")]]
        clients.append(await connect(router, realm="realm2"))
        await router.node.stop()
        for c in clients:
            details = await asyncio.wait_for(c.left, 2)
            assert details.reason == "wamp.close.system_shutdown"
            await asyncio.wait_for(c.disconnected, 2)
        assert router.node.router.sessions == {}


async def test_stopping_the_router_sends_goodbye_then_closes_the_connection(tmp_path, peers):
    async with own_router(tmp_path) as router:
        peer = await peers(router)
        await joined(peer)
        stopping = asyncio.ensure_future(router.node.stop())
        goodbye = await peer.receive()
        assert goodbye[0] == message.Goodbye.MESSAGE_TYPE, goodbye
        assert goodbye[2] == "wamp.close.system_shutdown"
        assert goodbye[1].get("message")
        peer.send([6, {}, "wamp.close.goodbye_and_out"])  # the client's answer, as WAMP asks
        assert await peer.closed()
        await stopping


async def test_a_connection_open_when_the_router_stops_cannot_join_afterwards(tmp_path,
                                                                                 peers):
    async with own_router(tmp_path) as router:
        peer = await peers(router)  # connected, no HELLO yet
        await router.node.stop()
        assert_abort(await hello(peer), "wamp.close.system_shutdown")
        assert await peer.closed()
        assert router.node.router.sessions == {}


async def test_stopping_the_router_closes_connections_that_have_not_joined(tmp_path, peers):
    async with own_router(tmp_path) as router:
        peer = await peers(router)  # connected, no HELLO yet
        await router.node.stop()
        assert await peer.closed(timeout=0.5)
