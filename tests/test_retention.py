"""Event Retention seen from real autobahn-python clients over real sockets, with the real
SQLite store: every MUST of the spec and every decision of DESIGN.md ("Event Retention").

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

from harness.wamp import EVENT, HELLO, PUBLISH, PUBLISHED, SUBSCRIBE, SUBSCRIBED, WELCOME
from tests.conftest import RunningRouter, start_router
from tests.test_broker import SENTINEL, TIMEOUT, Inbox, Received, session_id
from tests.wamp_client import Client, RawSocketPeer, connect

# WAMP message codes for the raw-protocol tests

SENTINEL_TOPIC = "test.sentinel"
HELLO_ROLES = {"publisher": {}, "subscriber": {}, "caller": {}}

ADMIN_SECRET = "admin-ticket"  # the user "root" authenticates with this ticket and is admin

CONFIG = """
[router]
listen = "127.0.0.1:0"
rawsocket = ["127.0.0.1:0"]
data_dir = "{data_dir}"

[[realms]]
name = "realm1"
anonymous_role = "user"

  [[realms.roles]]
  name = "user"
  permissions = [
    {{ uri = "", match = "prefix", allow = ["publish", "subscribe", "call"] }},
    {{ uri = "ctl.", match = "prefix", allow = ["subscribe"] }},
    {{ uri = "private.", match = "prefix", allow = ["publish"] }},
  ]

  [[realms.roles]]
  name = "admin"
  permissions = [
    {{ uri = "", match = "prefix", allow = ["publish", "subscribe", "call"] }},
  ]

  [[realms.users]]
  authid = "root"
  role = "admin"
  secret = "{admin_secret}"
"""


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
        """An autobahn session: ``authid="root"`` authenticates by ticket and joins as admin;
        any other authid (or none) joins anonymously as user."""
        auth: dict[str, Any] = {"authid": authid}
        if authid == "root":
            auth.update(authmethods=["ticket"], secret=ADMIN_SECRET)
        session = await connect(self.running, "websocket", "json", **auth)
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
    router = await Cairn(CONFIG.format(data_dir=tmp_path / "data",
                                       admin_secret=ADMIN_SECRET)).start()
    yield router
    await router.close()


# -- helpers -------------------------------------------------------------------------------


async def acked(session: Client, topic: str, *args: Any, kw: dict[str, Any] | None = None,
                **options: Any) -> int:
    """Publish ``args`` and keyword arguments ``kw`` with acknowledge=True and the given
    options; return the publication id."""
    publication = await asyncio.wait_for(session.publish(
        topic, *args, options=PublishOptions(acknowledge=True, **options), **(kw or {})),
        TIMEOUT)
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


# -- the spec: options and their defaults --------------------------------------------------


async def test_a_publish_without_the_retain_option_is_not_retained(cairn):
    peer, _ = await cairn.raw()
    peer.send([PUBLISH, 1, {"acknowledge": True}, "temp.room", [21.5]])
    assert (await peer.receive(TIMEOUT))[:2] == [PUBLISHED, 1]
    assert await retained_args(await cairn.connect(), "temp.room") == []


async def test_a_publish_with_retain_false_is_not_retained(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", 21.5, retain=False)
    assert await retained_args(await cairn.connect(), "temp.room") == []


async def test_a_subscribe_without_the_get_retained_option_gets_no_retained_event(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", 21.5, retain=True)
    peer, _ = await cairn.raw()
    peer.send([SUBSCRIBE, 1, {}, "temp.room"])
    subscribed = await peer.receive(TIMEOUT)
    assert subscribed[:2] == [SUBSCRIBED, 1]
    pub.publish("temp.room", SENTINEL)
    event = await peer.receive(TIMEOUT)
    assert event[0] == EVENT and event[4] == [SENTINEL]


async def test_a_subscribe_with_get_retained_false_gets_no_retained_event(cairn):
    pub, sub = await cairn.connect(), await cairn.connect()
    await acked(pub, "temp.room", 21.5, retain=True)
    inbox = await subscribe(sub, "temp.room", get_retained=False)
    pub.publish("temp.room", SENTINEL)
    assert await inbox.args_before_sentinel() == []


# -- the spec: the retained event ----------------------------------------------------------


async def test_a_later_subscriber_with_get_retained_receives_the_retained_event(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", 21.5, kw={"unit": "C"}, retain=True)
    got = await retained_events(await cairn.connect(), "temp.room")
    assert [(r.args, r.kwargs) for r in got] == [((21.5,), {"unit": "C"})]


async def test_the_retained_event_has_details_retained_true(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", 21.5, retain=True)
    (event,) = await retained_events(await cairn.connect(), "temp.room")
    assert event.details.retained is True


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


async def test_a_subscriber_receives_the_most_recent_retained_event(cairn):
    pub = await cairn.connect()
    for value in (20.0, 21.0, 22.0):
        await acked(pub, "temp.room", value, retain=True)
    assert await retained_args(await cairn.connect(), "temp.room") == [(22.0,)]


async def test_a_later_publish_without_retain_does_not_replace_the_retained_event(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "important", retain=True)
    await acked(pub, "temp.room", "noise")
    assert await retained_args(await cairn.connect(), "temp.room") == [("important",)]


async def test_a_topic_without_a_retained_publish_gives_no_retained_event(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.other", 1, retain=True)
    assert await retained_args(await cairn.connect(), "temp.room") == []


AUDIENCES = {
    "eligible_authid": ({"eligible_authid": ["alice"]}, {"alice"}),
    "exclude_authid": ({"exclude_authid": ["bob"]}, {"alice", "root"}),
    "eligible_authrole": ({"eligible_authrole": ["admin"]}, {"root"}),
    "exclude_authrole": ({"exclude_authrole": ["user"]}, {"root"}),
    "eligible_authid_and_authrole": (
        {"eligible_authid": ["alice", "root"], "eligible_authrole": ["user"]}, {"alice"}),
}


@pytest.mark.parametrize("options, receivers", list(AUDIENCES.values()), ids=list(AUDIENCES))
async def test_a_subscriber_never_receives_a_retained_event_it_is_not_eligible_for(
        cairn, options, receivers):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "limited", retain=True, **options)
    subscribers = {name: await cairn.connect(authid=name) for name in ("alice", "bob", "root")}
    inboxes = {name: await subscribe(s, "temp.room") for name, s in subscribers.items()}
    pub.publish("temp.room", SENTINEL)
    got = {name: await inbox.args_before_sentinel() for name, inbox in inboxes.items()}
    assert got == {name: [("limited",)] if name in receivers else [] for name in subscribers}


async def test_a_subscriber_gets_the_most_recent_retained_event_it_would_have_received(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "for everyone", retain=True)
    await acked(pub, "temp.room", "not for bob", retain=True, exclude_authid=["bob"])
    alice, bob = await cairn.connect(authid="alice"), await cairn.connect(authid="bob")
    assert await retained_args(alice, "temp.room") == [("not for bob",)]
    assert await retained_args(bob, "temp.room") == [("for everyone",)]


async def test_welcome_announces_event_retention(cairn):
    _, welcome = await cairn.raw()
    assert welcome[2]["roles"]["broker"]["features"]["event_retention"] is True


# -- DESIGN: one slot per topic per audience -----------------------------------------------


@pytest.mark.parametrize("order", ["plain-then-admin", "admin-then-plain"])
async def test_one_slot_per_audience_each_subscriber_gets_the_newest_it_may_see(cairn, order):
    pub = await cairn.connect()
    publishes = [("plain", {}), ("admins only", {"eligible_authrole": ["admin"]})]
    if order == "admin-then-plain":
        publishes.reverse()
    for value, options in publishes:
        await acked(pub, "temp.room", value, retain=True, **options)
    admin, user = await cairn.connect(authid="root"), await cairn.connect(authid="alice")
    assert await retained_args(admin, "temp.room") == [(publishes[-1][0],)]
    assert await retained_args(user, "temp.room") == [("plain",)]


async def test_a_retained_publish_replaces_only_the_slot_of_its_own_audience(cairn):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "plain", retain=True)
    await acked(pub, "temp.room", "admins 1", retain=True, eligible_authrole=["admin"])
    await acked(pub, "temp.room", "admins 2", retain=True, eligible_authrole=["admin"])
    admin, user = await cairn.connect(authid="root"), await cairn.connect(authid="alice")
    assert await retained_args(admin, "temp.room") == [("admins 2",)]
    assert await retained_args(user, "temp.room") == [("plain",)]


@pytest.mark.parametrize("list_option", ["exclude", "eligible", "empty-eligible"])
async def test_a_publication_with_a_session_id_list_is_not_retained(cairn, list_option):
    pub, other = await cairn.connect(), await cairn.connect()
    await acked(pub, "temp.room", "kept", retain=True)
    options = {"exclude": {"exclude": [session_id(other)]},
               "eligible": {"eligible": [session_id(other)]},
               "empty-eligible": {"eligible": []}}[list_option]
    await acked(pub, "temp.room", "with session ids", retain=True, **options)
    assert await retained_args(await cairn.connect(), "temp.room") == [("kept",)]
    assert await retained_args(other, "temp.room") == [("kept",)]


@pytest.mark.parametrize("exclude_me", [None, True, False])
async def test_exclude_me_does_not_affect_retention(cairn, exclude_me):
    pub = await cairn.connect()
    await acked(pub, "temp.room", "mine", retain=True, exclude_me=exclude_me)
    assert await retained_args(pub, "temp.room") == [("mine",)]
    assert await retained_args(await cairn.connect(), "temp.room") == [("mine",)]


async def test_a_prefix_subscription_gets_the_retained_event_of_every_matching_topic(cairn):
    pub = await cairn.connect()
    await acked(pub, "sensor.a", "a1", retain=True)
    await acked(pub, "sensor.b.temp", "b", retain=True)
    await acked(pub, "sensorium", "prefix of the string", retain=True)
    await acked(pub, "other.a", "no match", retain=True)
    await acked(pub, "sensor.a", "a2", retain=True)
    await acked(pub, "sensor.c", "not retained")
    got = await retained_events(await cairn.connect(), "sensor", "prefix")
    # per topic the newest, in receive order, each naming its topic
    assert [(r.details.topic, r.args) for r in got] == [
        ("sensor.b.temp", ("b",)), ("sensorium", ("prefix of the string",)),
        ("sensor.a", ("a2",))]
    assert all(r.details.retained for r in got)


async def test_a_wildcard_subscription_gets_the_retained_event_of_every_matching_topic(cairn):
    pub = await cairn.connect()
    await acked(pub, "sensor.kitchen.temp", 21, retain=True)
    await acked(pub, "sensor.attic.temp", 15, retain=True)
    await acked(pub, "sensor.kitchen.humidity", 40, retain=True)
    await acked(pub, "sensor.kitchen.extra.temp", 0, retain=True)
    got = await retained_events(await cairn.connect(), "sensor..temp", "wildcard")
    assert [(r.details.topic, r.args) for r in got] == [
        ("sensor.kitchen.temp", (21,)), ("sensor.attic.temp", (15,))]
    assert all(r.details.retained for r in got)


async def test_a_pattern_subscription_gets_no_retained_event_of_a_topic_its_role_may_not_read(
        cairn):
    admin = await cairn.connect(authid="root")
    await acked(admin, "private.key", "hunter2", retain=True)  # users may not read private.
    await acked(admin, "priv.ok", "fine", retain=True)
    user = await cairn.connect(authid="alice")
    got = await retained_events(user, "priv", "prefix")
    assert [(r.details.topic, r.args) for r in got] == [("priv.ok", ("fine",))]
    got = await retained_events(admin, "priv", "prefix")
    assert [r.details.topic for r in got] == ["private.key", "priv.ok"]


async def test_retained_events_come_after_subscribed_and_before_any_live_event(cairn):
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


async def test_the_retained_event_keeps_the_original_publication_id(cairn):
    pub, live = await cairn.connect(), await cairn.connect()
    live_inbox = await subscribe(live, "temp.room")
    publication = await acked(pub, "temp.room", 21.5, retain=True)
    assert (await live_inbox.next()).details.publication == publication
    (event,) = await retained_events(await cairn.connect(), "temp.room")
    assert event.details.publication == publication


async def test_an_acknowledged_retained_publish_is_stored_before_published(cairn):
    pub = await cairn.connect()
    publication = await acked(pub, "temp.room", 21.5, retain=True)
    rows = await cairn.node.store.reader.query("SELECT topic, publication FROM retained", ())
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
    store = cairn.node.store
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


async def test_an_unauthorized_publish_never_becomes_the_retained_event(cairn):
    admin, user = await cairn.connect(authid="root"), await cairn.connect(authid="alice")
    await acked(admin, "ctl.heater", "on", retain=True)
    with pytest.raises(ApplicationError) as raised:  # users may watch ctl. but not command
        await acked(user, "ctl.heater", "off", retain=True)
    assert raised.value.error == "wamp.error.not_authorized"
    user.publish("ctl.heater", "off, unacknowledged", options=PublishOptions(retain=True))
    with pytest.raises(ApplicationError):
        await acked(user, "wamp.session.on_join", "forged", retain=True)
    assert await retained_args(user, "ctl.heater") == [("on",)]
    assert await retained_args(await cairn.connect(authid="root"), "ctl.heater") == [("on",)]
    assert await retained_args(admin, "wamp.session.on_join") == []


async def test_a_retained_event_for_admins_never_reaches_a_user_session(cairn):
    """DESIGN names this one: eligible_authrole=["admin"] must reach no "user" session, live
    or retained, through any kind of subscription, before or after a restart."""
    patterns = [("ops.secret", "exact"), ("ops", "prefix"), ("ops.", "wildcard")]
    user, admin = await cairn.connect(authid="alice"), await cairn.connect(authid="root")
    user_live = Inbox()
    for topic, match in patterns:
        await subscribe(user, topic, match, inbox=user_live)
    admin_live = await subscribe(admin, "ops.secret")
    publisher = await cairn.connect()
    await acked(publisher, "ops.secret", "admins only", retain=True, eligible_authrole=["admin"])
    assert (await admin_live.next()).args == ("admins only",)
    publisher.publish("ops.secret", SENTINEL)
    assert await user_live.before_sentinel() == []

    for restarted in (False, True):
        if restarted:
            await cairn.restart()
        for topic, match in patterns:
            user = await cairn.connect(authid="alice")
            assert await retained_args(user, topic, match) == [], (restarted, topic)
            admin = await cairn.connect(authid="root")
            assert await retained_args(admin, topic, match) == [("admins only",)]
