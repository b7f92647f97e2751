"""The broker (WAMP pub/sub) seen from real autobahn-python clients over real sockets.

Each test proves one behaviour and is named after it. Asserting that an event does NOT
arrive never sleeps: the test publishes a sentinel event afterwards and checks that the
sentinel is the first thing the session sees (the router keeps the order of messages it
sends to one session).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import EventDetails, PublishOptions, SubscribeOptions

from harness.config import permission, realm, role, router_table
from harness.wamp import (
    EVENT,
    HELLO,
    PUBLISH,
    PUBLISHED,
    SUBSCRIBE,
    SUBSCRIBED,
    WELCOME,
)
from harness.wamp_client import SERIALIZERS, TRANSPORTS, Client, RawSocketPeer
from tests.conftest import RunningRouter, sessions_on, start_router

TIMEOUT = 30  # s: a guard against a hang, never a negative wait (2 s failed on a loaded CI)
SENTINEL = "--sentinel--"

# WAMP message codes for the raw-protocol tests


@dataclass
class Received:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    details: EventDetails


class Inbox:
    """Collects the events of one or more subscriptions, in arrival order."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Received] = asyncio.Queue()

    def handler(self, *args: Any, details: EventDetails, **kwargs: Any) -> None:
        self.queue.put_nowait(Received(args, kwargs, details))

    async def next(self) -> Received:
        return await asyncio.wait_for(self.queue.get(), TIMEOUT)

    async def before_sentinel(self) -> list[Received]:
        """Every event up to (not including) the next sentinel event."""
        got = []
        while (item := await self.next()).args != (SENTINEL,):
            got.append(item)
        return got

    async def args_before_sentinel(self) -> list[tuple[Any, ...]]:
        return [item.args for item in await self.before_sentinel()]


async def listen(session: Client, topic: str, match: str = "exact",
                 inbox: Inbox | None = None) -> Inbox:
    inbox = inbox or Inbox()
    await session.subscribe(inbox.handler, topic,
                            options=SubscribeOptions(match=match, details_arg="details"))
    return inbox


def session_id(session: Client) -> int:
    return session.welcome_details.session


def authid(session: Client) -> str:
    return session.welcome_details.authid


async def acked(session: Client, topic: str, *args: Any, **options: Any) -> int:
    """Publish with acknowledge=True and return the publication id."""
    publication = await asyncio.wait_for(
        session.publish(topic, *args, options=PublishOptions(acknowledge=True, **options)),
        TIMEOUT)
    return publication.id


@pytest.fixture
async def raw(router):
    """A factory of raw RawSocket/JSON peers joined to realm1: returns (peer, welcome)."""
    peers: list[RawSocketPeer] = []

    async def make(realm: str = "realm1") -> tuple[RawSocketPeer, list[Any]]:
        peer = await RawSocketPeer.open(router.rawsocket_port, "json")
        peers.append(peer)
        peer.send([HELLO, realm, {"roles": {"publisher": {}, "subscriber": {}}}])
        welcome = await peer.receive(TIMEOUT)
        assert welcome is not None and welcome[0] == WELCOME, welcome
        return peer, welcome

    yield make
    for peer in peers:
        peer.close()


PUB_SUB = ("publish", "subscribe")


def policy_config(data_dir: Path) -> str:
    """A "disclosing" realm whose roles disclose publishers under ``disclosed.``, and a
    "restricted" one allowed only under ``app.`` (and only to publish under ``app.secret.``)."""
    disclosing = realm("disclosing", role("device", permission("", PUB_SUB),
                                          permission("disclosed.", PUB_SUB, disclose=True)),
                       anonymous_role="device")
    restricted = realm("restricted", role("sensor", permission("app.", PUB_SUB),
                                          permission("app.secret.", ["publish"])),
                       anonymous_role="sensor")
    return router_table(data_dir, rawsocket=["127.0.0.1:0"]) + disclosing + restricted


@pytest.fixture
async def policy_client(tmp_path):
    """Like ``client``, on a router whose roles disclose publishers ("disclosing" realm) or
    are allowed only under ``app.`` ("restricted" realm): ``await policy_client(realm)``."""
    node = await start_router(policy_config(tmp_path / "policy-data"))
    running = RunningRouter(node, str(tmp_path / "no-unix-listener.sock"))
    async with sessions_on(running) as join:

        async def make(realm: str, **kwargs: Any) -> Client:
            return await join(realm=realm, **kwargs)

        yield make
    await node.stop()


# -- subscriptions: matching, identity, unsubscribe are tested on the core in memory
# (tests/core/test_core.py); here, what only the wire shows ----------------------------------------


async def test_exact_subscription_events_carry_no_topic(client, raw):
    peer, _ = await raw()
    peer.send([SUBSCRIBE, 1, {}, "com.exact"])
    subscribed = await peer.receive(TIMEOUT)
    assert subscribed[:2] == [SUBSCRIBED, 1]
    pub = await client()
    pub.publish("com.exact", "x")
    event = await peer.receive(TIMEOUT)
    assert event[0] == EVENT and event[1] == subscribed[2]
    assert "topic" not in event[3]
    assert event[4] == ["x"]


async def test_pattern_subscription_events_carry_the_concrete_topic(client):
    sub, pub = await client(), await client()
    prefix = await listen(sub, "com.app", match="prefix")
    wildcard = await listen(sub, "com..pie", match="wildcard")
    pub.publish("com.apple.pie", 1)
    # autobahn falls back to the subscription's pattern when EVENT has no topic, so getting
    # the concrete topic proves the router sent it
    assert (await prefix.next()).details.topic == "com.apple.pie"
    assert (await wildcard.next()).details.topic == "com.apple.pie"


# -- publisher exclusion and black/white lists: tests/core/test_core.py (in memory); here, that the
# options arrive from every transport and serializer ------------------------------------------


@pytest.mark.parametrize("serializer", list(SERIALIZERS))
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_black_and_white_lists_arrive_from_every_transport_and_serializer(
        client, transport, serializer):
    a = await client(transport, serializer)
    b = await client(transport, serializer)
    pub = await client(transport, serializer)
    inbox_a, inbox_b, own = await listen(a, "com.bw"), await listen(b, "com.bw"), \
        await listen(pub, "com.bw")
    lists = [PublishOptions(exclude=[session_id(a)]), PublishOptions(eligible=[session_id(a)]),
             PublishOptions(exclude_authid=[authid(a)]),
             PublishOptions(eligible_authid=[authid(a)]),
             PublishOptions(exclude_authrole=["anonymous"]),
             PublishOptions(eligible_authrole=["anonymous"], exclude_me=False)]
    for n, options in enumerate(lists):
        pub.publish("com.bw", n, options=options)
    pub.publish("com.bw", SENTINEL, options=PublishOptions(exclude_me=False))
    assert await inbox_a.args_before_sentinel() == [(1,), (3,), (5,)]
    assert await inbox_b.args_before_sentinel() == [(0,), (2,), (5,)]
    assert await own.args_before_sentinel() == [(5,)]


# -- acknowledge ------------------------------------------------------------------------


async def test_acknowledged_publish_returns_the_publication_id_of_the_event(client):
    sub, pub = await client(), await client()
    inbox = await listen(sub, "com.ack")
    publication = await acked(pub, "com.ack", "x")
    assert isinstance(publication, int) and 1 <= publication <= 2**53
    assert (await inbox.next()).details.publication == publication


async def test_acknowledged_publish_without_subscribers_is_still_acknowledged(client):
    pub = await client()
    assert 1 <= await acked(pub, "com.nobody.listens", "x") <= 2**53


async def test_every_publication_gets_its_own_id(client):
    pub = await client()
    ids = [await acked(pub, "com.ids", i) for i in range(5)]
    assert len(set(ids)) == 5


# -- publisher identification -----------------------------------------------------------


async def test_a_disclosing_permission_makes_events_carry_the_publisher(policy_client):
    sub = await policy_client("disclosing")
    pub = await policy_client("disclosing")
    inbox = await listen(sub, "disclosed.reading")
    pub.publish("disclosed.reading", 42)
    details = (await inbox.next()).details
    assert details.publisher == session_id(pub)
    assert details.publisher_authid == authid(pub)
    assert details.publisher_authrole == "device"


async def test_events_do_not_carry_the_publisher_without_disclosure(policy_client):
    sub = await policy_client("disclosing")
    pub = await policy_client("disclosing")
    inbox = await listen(sub, "plain.reading")
    pub.publish("plain.reading", 42)
    details = (await inbox.next()).details
    assert details.publisher is None
    assert details.publisher_authid is None
    assert details.publisher_authrole is None


async def test_disclose_me_makes_that_event_carry_the_publisher(client, raw):
    sub = await client()
    inbox = await listen(sub, "com.who")
    peer, welcome = await raw()
    peer.send([PUBLISH, 1, {"disclose_me": True}, "com.who", ["disclosed"]])
    peer.send([PUBLISH, 2, {}, "com.who", [SENTINEL]])
    disclosed = await inbox.next()
    assert disclosed.args == ("disclosed",)
    assert disclosed.details.publisher == welcome[1]
    assert disclosed.details.publisher_authid == welcome[2]["authid"]
    assert disclosed.details.publisher_authrole == "anonymous"
    undisclosed = await inbox.next()
    assert undisclosed.args == (SENTINEL,)
    assert undisclosed.details.publisher is None


async def test_disclose_me_with_acknowledge_is_acknowledged(client, raw):
    sub = await client()
    inbox = await listen(sub, "com.who")
    peer, _ = await raw()
    peer.send([PUBLISH, 5, {"disclose_me": True, "acknowledge": True}, "com.who", []])
    reply = await peer.receive(TIMEOUT)
    assert reply[:2] == [PUBLISHED, 5]
    assert (await inbox.next()).details.publication == reply[2]


# -- authorization ----------------------------------------------------------------------


async def test_publishing_to_a_wamp_topic_is_not_authorized(client):
    pub = await client()
    with pytest.raises(ApplicationError) as raised:
        await acked(pub, "wamp.session.on_join", {"session": 1})
    assert raised.value.error == "wamp.error.not_authorized"


async def test_a_refused_publication_reaches_no_subscriber(client):
    sub, pub = await client(), await client()
    inbox = await listen(sub, "wamp.session.on_join")
    with pytest.raises(ApplicationError):
        await acked(pub, "wamp.session.on_join", "forged")
    await listen(sub, "com.sentinel", inbox=inbox)
    pub.publish("com.sentinel", SENTINEL)
    assert await inbox.args_before_sentinel() == []


async def test_a_refused_publication_without_acknowledge_gets_no_error(client):
    # WAMP sends ERROR for PUBLISH only when acknowledge is set; autobahn treats an ERROR
    # for a request it is not waiting for as a protocol error and drops the connection
    pub = await client()
    inbox = await listen(pub, "com.after")
    pub.publish("wamp.forged", "x")
    pub.publish("com.after", SENTINEL, options=PublishOptions(exclude_me=False))
    assert await inbox.args_before_sentinel() == []
    assert pub.is_attached()


async def test_publishing_without_permission_is_not_authorized(policy_client):
    pub = await policy_client("restricted")
    with pytest.raises(ApplicationError) as raised:
        await acked(pub, "other.topic", 1)
    assert raised.value.error == "wamp.error.not_authorized"


async def test_subscribing_without_permission_is_not_authorized(policy_client):
    sub = await policy_client("restricted")
    with pytest.raises(ApplicationError) as raised:
        await asyncio.wait_for(sub.subscribe(lambda *args: None, "other.topic"), TIMEOUT)
    assert raised.value.error == "wamp.error.not_authorized"


async def test_publishing_and_subscribing_with_permission_is_allowed(policy_client):
    sub, pub = await policy_client("restricted"), await policy_client("restricted")
    inbox = await listen(sub, "app.reading")
    publication = await acked(pub, "app.reading", 1)
    assert (await inbox.next()).details.publication == publication


async def test_a_pattern_subscription_gets_no_event_its_role_may_not_subscribe_to(
        policy_client):
    sub, pub = await policy_client("restricted"), await policy_client("restricted")
    with pytest.raises(ApplicationError):
        await asyncio.wait_for(sub.subscribe(lambda *args: None, "app.secret.key"), TIMEOUT)
    inbox = await listen(sub, "app.", match="prefix")
    pub.publish("app.secret.key", "hunter2")
    pub.publish("app.public", SENTINEL)
    assert await inbox.args_before_sentinel() == []


# -- payloads, transports, fan-out ------------------------------------------------------

PAYLOAD_ARGS = [
    0, 1, -1, 2**31, 2**53, -(2**53), 2**63 - 1, -(2**63), 2**64 - 1,
    3.141592653589793, -0.5, 1e300, 2.5e-300,
    "", "ünïcødé ✓ 中文 🎉", "nul \u0000 inside, \"quotes\", \\ and\nnewline",
    None, True, False,
    [], [1, [2, [3, ["deep"]]]],
    {"nested": {"deeper": {"list": [1, "two", 3.5, None]}}},
]
PAYLOAD_KWARGS = {
    "ключ": "значение",
    "emoji🎉": "🎉",
    "big": 2**62 + 1,
    "negative": -(2**40),
    "float": 1.5e-10,
    "empty": {},
    "nested": {"a": {"b": {"c": [None, True, False, 0.25]}}},
}


def typed(value: Any) -> Any:
    """``value`` with the type of every leaf, so 1 and 1.0 and True compare unequal."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("serializer", list(SERIALIZERS))
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_transport_and_serializer_delivers_args_and_kwargs_unchanged(
        client, transport, serializer):
    sub = await client(transport, serializer)
    pub = await client(transport, serializer)
    inbox = await listen(sub, "com.payload")
    pub.publish("com.payload", *PAYLOAD_ARGS, **PAYLOAD_KWARGS)
    event = await inbox.next()
    assert typed(event.args) == typed(PAYLOAD_ARGS)
    assert typed(event.kwargs) == typed(PAYLOAD_KWARGS)


@pytest.mark.parametrize(("publisher", "subscriber"),
                         [("json", "msgpack"), ("msgpack", "json"), ("json", "json")])
async def test_binary_values_arrive_as_bytes_whatever_the_serializers(
        client, publisher, subscriber):
    sub = await client("websocket", subscriber)
    pub = await client("websocket", publisher)
    inbox = await listen(sub, "com.binary")
    pub.publish("com.binary", b"\x00\xffraw", "text", blob=b"\x01\x02")
    event = await inbox.next()
    assert typed(event.args) == typed([b"\x00\xffraw", "text"])
    assert typed(event.kwargs) == typed({"blob": b"\x01\x02"})


async def test_one_publication_reaches_each_of_50_subscribers_exactly_once(client):
    kinds = [(t, s) for t in TRANSPORTS for s in SERIALIZERS]
    subscribers = await asyncio.gather(*(client(*kinds[i % len(kinds)]) for i in range(50)))
    inboxes = await asyncio.gather(*(listen(s, "com.fanout") for s in subscribers))
    pub = await client()
    publication = await acked(pub, "com.fanout", "hello")
    pub.publish("com.fanout", SENTINEL)
    for inbox in inboxes:
        got = await inbox.before_sentinel()
        assert [(r.args, r.details.publication) for r in got] == [(("hello",), publication)]
