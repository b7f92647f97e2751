"""Event Retention seen from real autobahn-python clients over real sockets, with the real
SQLite store: what only the wire, the shell, the store or a restart shows. The retention
rules themselves (every MUST of the spec and decision of DESIGN.md, "Event Retention") are
tested on the core in memory, in test_core_retention.py.

Each test proves one behaviour and is named after it. Asserting that a retained event does
NOT arrive never sleeps: after subscribing, the test publishes a live sentinel event and
checks what the session saw before it (the router sends SUBSCRIBED, then the retained
events, then live events, in that order, to one session).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from harness.config import named_users, permission, realm, role, router_table, ticket_of, user
from harness.wamp import EVENT, HELLO, SUBSCRIBE, SUBSCRIBED, WELCOME
from harness.wamp_client import Client, RawSocketPeer, connect
from tests.conftest import RunningRouter, start_router
from tests.system.test_broker import SENTINEL, TIMEOUT, Inbox, Received

# WAMP message codes for the raw-protocol tests

SENTINEL_TOPIC = "test.sentinel"
HELLO_ROLES = {"publisher": {}, "subscriber": {}, "caller": {}}

ADMIN_SECRET = "admin-ticket"  # the user "root" authenticates with this ticket and is admin

# users and admins: the realm of the retention tests, on sockets and in memory
USER_ACTIONS = ("publish", "subscribe", "call")
ADMIN = role("admin", permission("", USER_ACTIONS)) + user("root", "admin", secret=ADMIN_SECRET)
USER = role("user", permission("", USER_ACTIONS), permission("ctl.", ["subscribe"]),
            permission("private.", ["publish"]))
NAMED = ("alice", "bob", "meter-1")  # users whose sessions log in to have these authids
REALM = realm("realm1", USER, named_users("user", *NAMED), ADMIN, anonymous_role="user")


def login_of(authid: str | None) -> dict[str, Any]:
    """HELLO's arguments for a session of ``authid``: "root" (admin) and the NAMED users log
    in by ticket; None joins anonymously (the router names it)."""
    if authid is None:
        return {}
    return {"authid": authid, "authmethods": ["ticket"],
            "secret": ADMIN_SECRET if authid == "root" else ticket_of(authid)}



# -- the router under test: several roles in one realm, restartable on the same data ------


class Cairn:
    """One in-process router on a data directory that outlives restarts."""

    def __init__(self, config: str) -> None:
        self.config = config
        self.node: Any = None
        self.running: RunningRouter | None = None
        self.sessions: list[Client] = []
        self.peers: list[RawSocketPeer] = []

    async def start(self) -> Cairn:
        self.node = await start_router(self.config)
        self.running = RunningRouter(self.node, "no-unix-listener")
        return self

    async def stop(self) -> None:
        for peer in self.peers:
            peer.close()
        self.peers.clear()
        if self.node is not None:
            await self.node.stop()
            self.node = None

    async def restart(self) -> None:
        """Stop the router (its sessions get GOODBYE) and start a new one on the same data."""
        await self.stop()
        await self.start()

    async def close(self) -> None:
        for session in self.sessions:
            with contextlib.suppress(Exception):
                if session.is_attached():
                    await asyncio.wait_for(session.leave(), 2)
        await self.stop()

    async def connect(self, authid: str | None = None) -> Client:
        """An autobahn session: ``authid="root"`` joins as admin, one of NAMED as user (both
        by ticket); without an authid, an anonymous user."""
        session = await connect(self.running, "websocket", "json", **login_of(authid))
        self.sessions.append(session)
        assert session.welcome_details.authrole == ("admin" if authid == "root" else "user")
        return session

    async def raw(self) -> tuple[RawSocketPeer, list[Any]]:
        """A raw RawSocket/JSON peer joined anonymously to realm1: returns (peer, WELCOME)."""
        peer = await RawSocketPeer.open(self.node.rawsocket_ports[0], "json")
        self.peers.append(peer)
        peer.send([HELLO, "realm1", {"roles": HELLO_ROLES}])
        welcome = await peer.receive(TIMEOUT)
        assert welcome is not None and welcome[0] == WELCOME, welcome
        return peer, welcome


@pytest.fixture
async def cairn(tmp_path):
    """A router whose anonymous sessions are "user"s; ``cairn.connect("root")`` is admin."""
    router = await Cairn(router_table(tmp_path / "data", rawsocket=["127.0.0.1:0"]) + REALM).start()
    yield router
    await router.close()


# -- helpers -------------------------------------------------------------------------------


async def acked(session: Client, topic: str, *args: Any, kw: dict[str, Any] | None = None,
                timeout: float = TIMEOUT, **options: Any) -> int:
    """Publish ``args`` and keyword arguments ``kw`` with acknowledge=True and the given
    options; return the publication id."""
    publication = await asyncio.wait_for(session.publish(
        topic, *args, options=PublishOptions(acknowledge=True, **options), **(kw or {})),
        timeout)
    return publication.id


async def subscribe(session: Client, topic: str, match: str = "exact",
                    get_retained: bool | None = True, inbox: Inbox | None = None) -> Inbox:
    inbox = inbox or Inbox()
    await asyncio.wait_for(session.subscribe(inbox.handler, topic, options=SubscribeOptions(
        match=match, get_retained=get_retained, details_arg="details")), TIMEOUT)
    return inbox


async def retained_events(session: Client, topic: str, match: str = "exact") -> list[Received]:
    """Subscribe with get_retained and return what arrives before a live sentinel event
    (published on a topic of its own, which no pattern of these tests matches)."""
    inbox = await subscribe(session, topic, match)
    await subscribe(session, SENTINEL_TOPIC, get_retained=False, inbox=inbox)
    session.publish(SENTINEL_TOPIC, SENTINEL, options=PublishOptions(exclude_me=False))
    return await inbox.before_sentinel()


async def retained_args(session: Client, topic: str, match: str = "exact") -> list[tuple]:
    return [r.args for r in await retained_events(session, topic, match)]


async def receive_until(peer: RawSocketPeer, count: int) -> list[list[Any]]:
    return [await peer.receive(TIMEOUT) for _ in range(count)]


# -- the wire: the retained EVENT as each transport and serializer carries it -------------

TRANSPORTS = ("websocket", "rawsocket-tcp", "rawsocket-unix")
SERIALIZERS = ("json", "msgpack", "cbor")


async def test_a_retained_event_arrives_through_autobahn_in_each_transport_and_serializer(
        client):
    """SubscribeOptions(get_retained=True) in every transport x serializer: the retained
    EVENT (encoded by RetainedEvent, its bytes cached per serializer and pattern-ness) gives
    autobahn the payload, the publication id and details.retained, and details.topic to a
    pattern subscription; with and without keyword arguments."""
    pub = await client()
    room = await acked(pub, "wire.room", 21.5, kw={"unit": "C"}, retain=True)
    plain = await acked(pub, "wire.plain", "only args", retain=True)
    for transport in TRANSPORTS:
        for serializer in SERIALIZERS:
            where = (transport, serializer)
            session = await client(transport, serializer)
            (exact,) = await retained_events(session, "wire.room")
            assert (exact.args, exact.kwargs, exact.details.publication,
                    exact.details.retained) == ((21.5,), {"unit": "C"}, room, True), where
            got = await retained_events(session, "wire.", "prefix")
            assert [(r.details.topic, r.args, r.kwargs, r.details.publication,
                     r.details.retained) for r in got] == [
                ("wire.room", (21.5,), {"unit": "C"}, room, True),
                ("wire.plain", ("only args",), {}, plain, True)], where


async def test_the_retained_event_is_marked_retained_on_the_wire_and_live_events_are_not(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", 21.5, retain=True)
    peer, _ = await cairn.raw()
    peer.send([SUBSCRIBE, 1, {"get_retained": True}, "temp.room"])
    subscribed, retained = await receive_until(peer, 2)
    assert subscribed[:2] == [SUBSCRIBED, 1]
    assert retained[0] == EVENT and retained[1] == subscribed[2]
    assert retained[3] == {"retained": True}  # an exact subscription: no topic
    assert retained[4] == [21.5]
    pub.publish("temp.room", 22.0, options=PublishOptions(retain=True))
    live = await peer.receive(TIMEOUT)
    assert live[0] == EVENT and live[4] == [22.0]
    assert not live[3].get("retained")



# -- the shell: retained and live events in order while publishers stream ----------------


async def test_retained_events_come_between_subscribed_and_gapless_live_events_while_publishing(
        cairn):
    """Publishers stream retained publications while raw peers subscribe: each peer sees
    SUBSCRIBED, then the retained events, then live events, and the newest retained value
    plus the live values form a gapless sequence (nothing older, nothing skipped)."""
    pub = await cairn.connect()
    await acked(pub, "order.b", "b", retain=True)
    await acked(pub, "order.c", "c", retain=True)
    await acked(pub, "order.a", 0, retain=True)
    sent = 0
    streaming = True

    async def stream() -> None:
        nonlocal sent
        while streaming:
            sent += 1
            pub.publish("order.a", sent, options=PublishOptions(retain=True))
            await asyncio.sleep(0)

    task = asyncio.create_task(stream())
    try:
        for _ in range(3):
            started = sent
            while sent < started + 30:
                await asyncio.sleep(0.001)
            peer, _ = await cairn.raw()
            peer.send([SUBSCRIBE, 1, {"get_retained": True, "match": "prefix"}, "order."])
            assert (await peer.receive(TIMEOUT))[:2] == [SUBSCRIBED, 1]
            events = [await peer.receive(TIMEOUT) for _ in range(23)]
            assert all(e[0] == EVENT for e in events)
            flags = [bool(e[3].get("retained")) for e in events]
            assert flags == [True] * 3 + [False] * 20, flags
            assert [e[3]["topic"] for e in events[:2]] == ["order.b", "order.c"]
            newest_retained = events[2][4][0]
            assert newest_retained >= started
            assert [e[4][0] for e in events[3:]] == list(
                range(newest_retained + 1, newest_retained + 21))
    finally:
        streaming = False
        await task


# -- the store and restarts ----------------------------------------------------------------


async def test_an_acknowledged_retained_publish_is_stored_before_published(cairn):
    pub = await cairn.connect()
    publication = await acked(pub, "temp.room", 21.5, retain=True)
    rows = await cairn.node.stores.store.reader.query("SELECT topic, publication FROM retained", ())
    assert rows == [("temp.room", publication)]


async def test_retained_events_survive_a_restart(cairn):
    pub = await cairn.connect()
    plain = await acked(pub, "temp.room", 21.5, kw={"unit": "C"}, retain=True)
    await acked(pub, "temp.room", "noise")
    admins = await acked(pub, "temp.room", "admins", retain=True, eligible_authrole=["admin"])
    other = await acked(pub, "temp.x", [1, {"deep": [None, True]}], retain=True)
    await cairn.restart()

    user, admin = await cairn.connect(authid="alice"), await cairn.connect(authid="root")
    (event,) = await retained_events(user, "temp.room")
    assert (event.args, event.kwargs, event.details.publication, event.details.retained) == (
        (21.5,), {"unit": "C"}, plain, True)
    (event,) = await retained_events(admin, "temp.room")
    assert (event.args, event.details.publication) == (("admins",), admins)
    got = await retained_events(user, "temp", "prefix")
    assert [(r.details.topic, r.args, r.details.publication) for r in got] == [
        ("temp.room", (21.5,), plain), ("temp.x", ([1, {"deep": [None, True]}],), other)]


async def test_retained_values_published_after_a_restart_replace_those_from_before(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "before", retain=True)
    await cairn.restart()
    pub = await cairn.connect()
    await acked(pub, "temp.room", "after", retain=True)
    assert await retained_args(await cairn.connect(), "temp.room") == [("after",)]
    await cairn.restart()
    assert await retained_args(await cairn.connect(), "temp.room") == [("after",)]


async def test_a_retained_value_served_before_a_restart_is_not_replaced_by_an_older_one(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "old", retain=True)
    store = cairn.node.stores.store
    commit = store._commit_locked

    async def fail_once(batch: Any) -> None:
        store._commit_locked = commit
        raise sqlite3.OperationalError("disk I/O error")

    store._commit_locked = fail_once  # the next commit fails, later ones succeed
    with pytest.raises(ApplicationError) as raised:
        await acked(pub, "temp.room", "new", retain=True)
    assert raised.value.error == "cairn.error.storage_failed"
    served = await retained_args(await cairn.connect(), "temp.room")
    await acked(pub, "temp.other", "the store writes again", retain=True)
    await cairn.restart()
    assert await retained_args(await cairn.connect(), "temp.room") == served


async def test_a_retained_event_for_admins_never_reaches_a_user_session_after_a_restart(
        cairn):
    """DESIGN names this one: eligible_authrole=["admin"] must reach no "user" session, live
    or retained, through any kind of subscription, before or after a restart. Before it (live
    and retained) on the core in memory, in test_core_retention.py; here what the store
    brings back."""
    patterns = [("ops.secret", "exact"), ("ops", "prefix"), ("ops.", "wildcard")]
    publisher = await cairn.connect()
    await acked(publisher, "ops.secret", "admins only", retain=True, eligible_authrole=["admin"])
    await cairn.restart()
    for topic, match in patterns:
        user = await cairn.connect(authid="alice")
        assert await retained_args(user, topic, match) == [], topic
        admin = await cairn.connect(authid="root")
        assert await retained_args(admin, topic, match) == [("admins only",)]
