"""The WAMP meta API (wamp.session.*, wamp.subscription.*, wamp.registration.* procedures and
meta events), exercised with real autobahn-python clients against a real router."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import RegisterOptions, SubscribeOptions

from tests.wamp_client import Client, RawSocketPeer

# -- helpers -------------------------------------------------------------------------------


async def call_error(session: Client, procedure: str, *args: Any) -> ApplicationError:
    """Call ``procedure`` expecting a WAMP ERROR; return it."""
    with pytest.raises(ApplicationError) as info:
        await asyncio.wait_for(session.call(procedure, *args), 2)
    return info.value


async def left(session: Client) -> None:
    """Leave with GOODBYE and wait until the router has answered (so it has detached us)."""
    session.leave()
    await asyncio.wait_for(session.left, 2)


class MetaWatch:
    """Records the meta events one session receives, in order, as (topic, args)."""

    def __init__(self, session: Client) -> None:
        self.session = session
        self.log: list[tuple[str, list[Any]]] = []
        self._changed = asyncio.Event()

    async def subscribe(self, *topics: str) -> MetaWatch:
        for topic in topics:
            await self.session.subscribe(
                lambda *args, _topic=topic: self._record(_topic, list(args)), topic)
        return self

    def _record(self, topic: str, args: list[Any]) -> None:
        self.log.append((topic, args))
        self._changed.set()

    async def wait_for(self, topic: str, where: Callable[[list[Any]], bool]) -> list[Any]:
        """The arguments of the first event on ``topic`` satisfying ``where``."""

        async def find() -> list[Any]:
            while True:
                for t, args in self.log:
                    if t == topic and where(args):
                        return args
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(find(), 2)

    def about(self, item_id: int) -> list[tuple[str, list[Any]]]:
        """The events whose arguments mention ``item_id`` (a session, subscription or
        registration id), in the order received."""
        return [(t, a) for t, a in self.log if item_id in _ids(a)]


def _ids(args: list[Any]) -> set[int]:
    ids = set()
    for a in args:
        if isinstance(a, int):
            ids.add(a)
        elif isinstance(a, dict):
            ids.update(v for k, v in a.items() if k in ("session", "id"))
    return ids


def _created_recently(created: str) -> bool:
    when = datetime.fromisoformat(created.replace("Z", "+00:00"))
    return created.endswith("Z") and abs(datetime.now(UTC) - when) < timedelta(seconds=30)


SUBSCRIPTION_EVENTS = ("wamp.subscription.on_create", "wamp.subscription.on_subscribe",
                       "wamp.subscription.on_unsubscribe", "wamp.subscription.on_delete")
REGISTRATION_EVENTS = ("wamp.registration.on_create", "wamp.registration.on_register",
                       "wamp.registration.on_unregister", "wamp.registration.on_delete")


# -- wamp.session.* ------------------------------------------------------------------------


async def test_session_count_counts_the_sessions_of_the_realm(client):
    a, b, c = await client(), await client("rawsocket-tcp"), await client("rawsocket-unix")
    assert await a.call("wamp.session.count") == 3
    await left(c)
    assert await b.call("wamp.session.count") == 2


async def test_session_list_returns_the_ids_of_all_sessions_of_the_realm(client):
    sessions = [await client(), await client("rawsocket-tcp", "msgpack"), await client()]
    ids = await sessions[0].call("wamp.session.list")
    assert sorted(ids) == sorted(s.session_id for s in sessions)


async def test_session_list_and_count_filter_by_authroles(client):
    a, b = await client(), await client()
    everyone = sorted([a.session_id, b.session_id])
    assert sorted(await a.call("wamp.session.list", ["anonymous"])) == everyone
    assert sorted(await a.call("wamp.session.list", ["admin", "anonymous"])) == everyone
    assert sorted(await a.call("wamp.session.list", None)) == everyone
    assert await a.call("wamp.session.list", ["admin"]) == []
    assert await a.call("wamp.session.list", []) == []
    assert await a.call("wamp.session.count", ["anonymous"]) == 2
    assert await a.call("wamp.session.count", ["admin"]) == 0


async def test_session_get_returns_the_session_details(client):
    caller = await client("websocket", "cbor")
    other = await client("rawsocket-tcp", "msgpack", authid="sensor-7")
    details = await caller.call("wamp.session.get", other.session_id)
    assert details["session"] == other.session_id
    assert details["authid"] == "sensor-7"
    assert details["authrole"] == "anonymous"
    assert details["authmethod"] == "anonymous"
    assert details["transport"]["type"] == "rawsocket"
    assert details["transport"]["serializer"] == "msgpack"
    assert details["transport"]["peer"].startswith("tcp4:127.0.0.1:")
    mine = await caller.call("wamp.session.get", caller.session_id)
    assert mine["session"] == caller.session_id
    assert mine["authid"] == caller.welcome_details.authid
    assert mine["transport"]["type"] == "websocket"
    assert mine["transport"]["serializer"] == "cbor"


async def test_session_get_of_an_unknown_or_departed_session_is_no_such_session(client):
    me, gone = await client(), await client()
    gone_id = gone.session_id
    await left(gone)
    for unknown in (gone_id, 4242):
        error = await call_error(me, "wamp.session.get", unknown)
        assert error.error == "wamp.error.no_such_session", unknown


# -- wamp.subscription.* -------------------------------------------------------------------


async def test_subscription_lookup_finds_the_id_by_uri_and_match_policy_or_none(client):
    me = await client()
    exact = await me.subscribe(lambda *a: None, "com.lookup.a")
    prefix = await me.subscribe(lambda *a: None, "com.lookup", SubscribeOptions(match="prefix"))
    wild = await me.subscribe(lambda *a: None, "com..a", SubscribeOptions(match="wildcard"))
    lookup = "wamp.subscription.lookup"
    assert await me.call(lookup, "com.lookup.a") == exact.id
    assert await me.call(lookup, "com.lookup.a", {"match": "exact"}) == exact.id
    assert await me.call(lookup, "com.lookup", {"match": "prefix"}) == prefix.id
    assert await me.call(lookup, "com..a", {"match": "wildcard"}) == wild.id
    assert await me.call(lookup, "com.lookup") is None  # the default policy is exact
    assert await me.call(lookup, "com.lookup", {"match": "wildcard"}) is None
    assert await me.call(lookup, "com.nothing", {"match": "prefix"}) is None


async def test_subscription_match_returns_every_subscription_matching_a_topic_or_none(client):
    me = await client()
    exact = await me.subscribe(lambda *a: None, "com.m.temp")
    prefix = await me.subscribe(lambda *a: None, "com.m", SubscribeOptions(match="prefix"))
    wild = await me.subscribe(lambda *a: None, "com..temp", SubscribeOptions(match="wildcard"))
    await me.subscribe(lambda *a: None, "com.m.other")
    ids = await me.call("wamp.subscription.match", "com.m.temp")
    assert sorted(ids) == sorted([exact.id, prefix.id, wild.id])
    assert await me.call("wamp.subscription.match", "org.other") is None


async def test_subscription_get_returns_id_created_uri_and_match(client):
    me = await client()
    sub = await me.subscribe(lambda *a: None, "com.g", SubscribeOptions(match="prefix"))
    details = await me.call("wamp.subscription.get", sub.id)
    assert {k: details[k] for k in ("id", "uri", "match")} == {
        "id": sub.id, "uri": "com.g", "match": "prefix"}
    assert _created_recently(details["created"]), details["created"]


async def test_subscription_list_groups_subscription_ids_by_match_policy(client):
    me = await client()
    empty = {"exact": [], "prefix": [], "wildcard": []}
    assert await me.call("wamp.subscription.list") == empty
    e1 = await me.subscribe(lambda *a: None, "com.l.one")
    e2 = await me.subscribe(lambda *a: None, "com.l.two")
    p = await me.subscribe(lambda *a: None, "com.l", SubscribeOptions(match="prefix"))
    w = await me.subscribe(lambda *a: None, "com..one", SubscribeOptions(match="wildcard"))
    listed = await me.call("wamp.subscription.list")
    assert set(listed) == {"exact", "prefix", "wildcard"}
    assert sorted(listed["exact"]) == sorted([e1.id, e2.id])
    assert listed["prefix"] == [p.id]
    assert listed["wildcard"] == [w.id]


async def test_subscription_list_and_count_subscribers_follow_subscribe_and_unsubscribe(
        client):
    a, b, c = await client(), await client(), await client()
    sub_a = await a.subscribe(lambda *x: None, "com.shared")
    sub_b = await b.subscribe(lambda *x: None, "com.shared")
    sub_id = sub_a.id
    assert sub_b.id == sub_id  # one subscription, two subscribers
    subscribers = await c.call("wamp.subscription.list_subscribers", sub_id)
    assert sorted(subscribers) == sorted([a.session_id, b.session_id])
    assert await c.call("wamp.subscription.count_subscribers", sub_id) == 2
    await sub_b.unsubscribe()
    assert await c.call("wamp.subscription.list_subscribers", sub_id) == [a.session_id]
    assert await c.call("wamp.subscription.count_subscribers", sub_id) == 1
    await sub_a.unsubscribe()  # the last one: the subscription is deleted
    assert await c.call("wamp.subscription.lookup", "com.shared") is None
    error = await call_error(c, "wamp.subscription.count_subscribers", sub_id)
    assert error.error == "wamp.error.no_such_subscription"


# -- wamp.registration.* -------------------------------------------------------------------


async def test_registration_lookup_finds_the_id_by_uri_and_match_policy_or_none(client):
    me = await client()
    exact = await me.register(lambda: 1, "com.reg.a")
    prefix = await me.register(lambda: 2, "com.reg", RegisterOptions(match="prefix"))
    wild = await me.register(lambda: 3, "com..a", RegisterOptions(match="wildcard"))
    assert await me.call("wamp.registration.lookup", "com.reg.a") == exact.id
    assert await me.call("wamp.registration.lookup", "com.reg", {"match": "prefix"}) == prefix.id
    assert await me.call("wamp.registration.lookup", "com..a", {"match": "wildcard"}) == wild.id
    assert await me.call("wamp.registration.lookup", "com.reg") is None  # default: exact
    assert await me.call("wamp.registration.lookup", "com.none", {"match": "prefix"}) is None


async def test_registration_match_returns_the_most_specific_registration_or_none(client):
    me = await client()
    exact = await me.register(lambda: 1, "com.rm.a.b")
    short = await me.register(lambda: 2, "com.rm", RegisterOptions(match="prefix"))
    long = await me.register(lambda: 3, "com.rm.a", RegisterOptions(match="prefix"))
    wild = await me.register(lambda: 4, "org..b", RegisterOptions(match="wildcard"))
    assert await me.call("wamp.registration.match", "com.rm.a.b") == exact.id
    assert await me.call("wamp.registration.match", "com.rm.a.c") == long.id
    assert await me.call("wamp.registration.match", "com.rm.x") == short.id
    assert await me.call("wamp.registration.match", "org.x.b") == wild.id
    assert await me.call("wamp.registration.match", "net.none") is None


async def test_registration_get_returns_id_created_uri_match_and_invoke(client):
    me = await client()
    reg = await me.register(lambda: 1, "com.rg",
                            RegisterOptions(match="prefix", invoke="roundrobin"))
    details = await me.call("wamp.registration.get", reg.id)
    assert {k: details[k] for k in ("id", "uri", "match", "invoke")} == {
        "id": reg.id, "uri": "com.rg", "match": "prefix", "invoke": "roundrobin"}
    assert _created_recently(details["created"]), details["created"]


async def test_registration_list_groups_registration_ids_by_match_policy(client):
    me = await client()
    e = await me.register(lambda: 1, "com.rl.one")
    p1 = await me.register(lambda: 2, "com.rl", RegisterOptions(match="prefix"))
    p2 = await me.register(lambda: 3, "org.rl", RegisterOptions(match="prefix"))
    listed = await me.call("wamp.registration.list")
    assert listed["exact"] == [e.id]
    assert sorted(listed["prefix"]) == sorted([p1.id, p2.id])
    assert listed["wildcard"] == []


async def test_registration_list_and_count_callees_follow_register_and_unregister(client):
    a, b, c = await client(), await client(), await client()
    options = RegisterOptions(invoke="roundrobin")
    reg_a = await a.register(lambda: "a", "com.shared.proc", options)
    reg_b = await b.register(lambda: "b", "com.shared.proc", options)
    reg_id = reg_a.id
    assert reg_b.id == reg_id  # one shared registration, two callees
    callees = await c.call("wamp.registration.list_callees", reg_id)
    assert sorted(callees) == sorted([a.session_id, b.session_id])
    assert await c.call("wamp.registration.count_callees", reg_id) == 2
    await reg_a.unregister()
    assert await c.call("wamp.registration.list_callees", reg_id) == [b.session_id]
    assert await c.call("wamp.registration.count_callees", reg_id) == 1
    await left(b)  # the last callee leaves: the registration is deleted
    assert await c.call("wamp.registration.lookup", "com.shared.proc") is None
    error = await call_error(c, "wamp.registration.count_callees", reg_id)
    assert error.error == "wamp.error.no_such_registration"


async def test_unknown_subscription_and_registration_ids_are_no_such_subscription_or_registration(
        client):
    me = await client()
    sub = await me.subscribe(lambda *a: None, "com.known")
    reg = await me.register(lambda: 1, "com.known")
    for procedure in ("wamp.subscription.get", "wamp.subscription.list_subscribers",
                      "wamp.subscription.count_subscribers"):
        error = await call_error(me, procedure, reg.id)  # a registration's id is not one
        assert error.error == "wamp.error.no_such_subscription", procedure
    for procedure in ("wamp.registration.get", "wamp.registration.list_callees",
                      "wamp.registration.count_callees"):
        error = await call_error(me, procedure, sub.id)
        assert error.error == "wamp.error.no_such_registration", procedure


# -- meta events: sessions -----------------------------------------------------------------


async def test_on_join_carries_the_details_of_the_new_session(client):
    watcher = await client()
    watch = await MetaWatch(watcher).subscribe("wamp.session.on_join")
    newcomer = await client("rawsocket-unix", "cbor", authid="gauge-1")
    args = await watch.wait_for("wamp.session.on_join",
                                lambda a: a[0]["session"] == newcomer.session_id)
    assert len(args) == 1
    details = args[0]
    assert details["authid"] == "gauge-1"
    assert details["authrole"] == "anonymous"
    assert details["authmethod"] == "anonymous"
    assert details["transport"]["type"] == "rawsocket"
    assert details["transport"]["serializer"] == "cbor"
    assert details == await watcher.call("wamp.session.get", newcomer.session_id)


async def test_on_leave_carries_session_id_authid_and_authrole_after_goodbye(client):
    watch = await MetaWatch(await client()).subscribe("wamp.session.on_leave")
    leaver = await client(authid="leaver")
    leaver_id = leaver.session_id
    await left(leaver)
    args = await watch.wait_for("wamp.session.on_leave", lambda a: a[0] == leaver_id)
    assert args == [leaver_id, "leaver", "anonymous"]


async def test_on_leave_is_published_when_the_transport_drops_without_goodbye(client, router):
    watch = await MetaWatch(await client()).subscribe("wamp.session.on_leave")
    peer = await RawSocketPeer.open(router.rawsocket_port)
    peer.send([1, "realm1", {"roles": {"subscriber": {}}, "authid": "dropper"}])
    welcome = await peer.receive()
    assert welcome[0] == 2
    peer.close()
    args = await watch.wait_for("wamp.session.on_leave", lambda a: a[0] == welcome[1])
    assert args == [welcome[1], "dropper", "anonymous"]


# -- meta events: subscriptions ------------------------------------------------------------


async def test_subscribe_publishes_on_create_for_the_first_and_on_subscribe_for_each(client):
    watch = await MetaWatch(await client()).subscribe(*SUBSCRIPTION_EVENTS)
    first, second = await client(), await client()
    sub = await first.subscribe(lambda *a: None, "com.ev", SubscribeOptions(match="prefix"))
    await second.subscribe(lambda *a: None, "com.ev", SubscribeOptions(match="prefix"))
    await watch.wait_for("wamp.subscription.on_subscribe", lambda a: a[0] == second.session_id)
    events = watch.about(sub.id)
    assert [t for t, _ in events] == ["wamp.subscription.on_create",
                                      "wamp.subscription.on_subscribe",
                                      "wamp.subscription.on_subscribe"]
    create_args = events[0][1]
    assert create_args[0] == first.session_id
    details = create_args[1]
    assert {k: details[k] for k in ("id", "uri", "match")} == {
        "id": sub.id, "uri": "com.ev", "match": "prefix"}
    assert _created_recently(details["created"])
    assert events[1][1] == [first.session_id, sub.id]
    assert events[2][1] == [second.session_id, sub.id]


async def test_unsubscribe_publishes_on_unsubscribe_and_on_delete_after_the_last(client):
    a, b = await client(), await client()
    sub_a = await a.subscribe(lambda *x: None, "com.ev3")
    sub_b = await b.subscribe(lambda *x: None, "com.ev3")
    sub_id = sub_a.id
    watch = await MetaWatch(await client()).subscribe(*SUBSCRIPTION_EVENTS)
    await sub_b.unsubscribe()
    await sub_a.unsubscribe()
    await watch.wait_for("wamp.subscription.on_delete", lambda a: a[1] == sub_id)
    assert watch.about(sub_id) == [
        ("wamp.subscription.on_unsubscribe", [b.session_id, sub_id]),
        ("wamp.subscription.on_unsubscribe", [a.session_id, sub_id]),
        ("wamp.subscription.on_delete", [a.session_id, sub_id]),
    ]


async def test_subscriptions_of_a_leaving_session_are_unsubscribed_and_deleted(client):
    watch = await MetaWatch(await client()).subscribe(*SUBSCRIPTION_EVENTS,
                                                      "wamp.session.on_leave")
    leaver = await client()
    leaver_id = leaver.session_id
    sub = await leaver.subscribe(lambda *a: None, "com.ev4")
    sub_id = sub.id
    await left(leaver)
    await watch.wait_for("wamp.session.on_leave", lambda a: a[0] == leaver_id)
    assert [(t, a) for t, a in watch.about(leaver_id) if t != "wamp.subscription.on_create"] == [
        ("wamp.subscription.on_subscribe", [leaver_id, sub_id]),
        ("wamp.subscription.on_unsubscribe", [leaver_id, sub_id]),
        ("wamp.subscription.on_delete", [leaver_id, sub_id]),
        ("wamp.session.on_leave", [leaver_id, leaver.welcome_details.authid, "anonymous"]),
    ]


# -- meta events: registrations ------------------------------------------------------------


async def test_register_publishes_on_create_for_the_first_and_on_register_for_each(client):
    watch = await MetaWatch(await client()).subscribe(*REGISTRATION_EVENTS)
    first, second = await client(), await client()
    options = RegisterOptions(invoke="roundrobin")
    reg = await first.register(lambda: 1, "com.rev", options)
    await second.register(lambda: 2, "com.rev", options)
    await watch.wait_for("wamp.registration.on_register", lambda a: a[0] == second.session_id)
    events = watch.about(reg.id)
    assert [t for t, _ in events] == ["wamp.registration.on_create",
                                      "wamp.registration.on_register",
                                      "wamp.registration.on_register"]
    create_args = events[0][1]
    assert create_args[0] == first.session_id
    details = create_args[1]
    assert {k: details[k] for k in ("id", "uri", "match", "invoke")} == {
        "id": reg.id, "uri": "com.rev", "match": "exact", "invoke": "roundrobin"}
    assert _created_recently(details["created"])
    assert events[1][1] == [first.session_id, reg.id]
    assert events[2][1] == [second.session_id, reg.id]


async def test_unregister_publishes_on_unregister_and_on_delete_after_the_last(client):
    a, b = await client(), await client()
    options = RegisterOptions(invoke="random")
    reg_a = await a.register(lambda: 1, "com.rev3", options)
    reg_b = await b.register(lambda: 2, "com.rev3", options)
    reg_id = reg_a.id
    watch = await MetaWatch(await client()).subscribe(*REGISTRATION_EVENTS)
    await reg_b.unregister()
    await reg_a.unregister()
    await watch.wait_for("wamp.registration.on_delete", lambda a: a[1] == reg_id)
    assert watch.about(reg_id) == [
        ("wamp.registration.on_unregister", [b.session_id, reg_id]),
        ("wamp.registration.on_unregister", [a.session_id, reg_id]),
        ("wamp.registration.on_delete", [a.session_id, reg_id]),
    ]


async def test_registrations_of_a_leaving_session_are_unregistered_and_deleted(client):
    watch = await MetaWatch(await client()).subscribe(*REGISTRATION_EVENTS,
                                                      "wamp.session.on_leave")
    leaver = await client()
    leaver_id = leaver.session_id
    reg = await leaver.register(lambda: 1, "com.rev4")
    reg_id = reg.id
    await left(leaver)
    await watch.wait_for("wamp.session.on_leave", lambda a: a[0] == leaver_id)
    assert [(t, a) for t, a in watch.about(leaver_id) if t != "wamp.registration.on_create"] == [
        ("wamp.registration.on_register", [leaver_id, reg_id]),
        ("wamp.registration.on_unregister", [leaver_id, reg_id]),
        ("wamp.registration.on_delete", [leaver_id, reg_id]),
        ("wamp.session.on_leave", [leaver_id, leaver.welcome_details.authid, "anonymous"]),
    ]


async def test_meta_events_reach_pattern_based_subscriptions(client):
    watcher = await client()
    got: asyncio.Future = asyncio.get_running_loop().create_future()

    def on_event(*args: Any, details: Any) -> None:
        if not got.done():
            got.set_result((details.topic, list(args)))

    await watcher.subscribe(on_event, "wamp.session.",
                            SubscribeOptions(match="prefix", details_arg="details"))
    newcomer = await client()
    topic, args = await asyncio.wait_for(got, 2)
    assert topic == "wamp.session.on_join"
    assert args[0]["session"] == newcomer.session_id


# -- bad arguments -------------------------------------------------------------------------

ID_PROCEDURES = ["wamp.session.get",
                 "wamp.subscription.get", "wamp.subscription.list_subscribers",
                 "wamp.subscription.count_subscribers",
                 "wamp.registration.get", "wamp.registration.list_callees",
                 "wamp.registration.count_callees"]


async def test_a_string_where_an_id_is_expected_is_invalid_argument(client):
    me = await client()
    for procedure in ID_PROCEDURES:
        error = await call_error(me, procedure, str(me.session_id))
        assert error.error == "wamp.error.invalid_argument", procedure
    assert await me.call("wamp.session.count") == 1  # the caller's session is still fine


async def test_a_missing_or_non_integer_id_is_invalid_argument(client):
    me = await client()
    for procedure in ID_PROCEDURES:
        assert (await call_error(me, procedure)).error == "wamp.error.invalid_argument"
        for bad in (True, 1.5, None, [me.session_id], {"id": me.session_id}):
            error = await call_error(me, procedure, bad)
            assert error.error == "wamp.error.invalid_argument", (procedure, bad)


async def test_an_authroles_filter_that_is_not_a_list_of_strings_is_invalid_argument(client):
    me = await client()
    for procedure in ("wamp.session.list", "wamp.session.count"):
        for roles in ("anonymous", {"role": "anonymous"}, 7,
                      [{"role": "anonymous"}], [["anonymous"]], [1], ["anonymous", None]):
            error = await call_error(me, procedure, roles)
            assert error.error == "wamp.error.invalid_argument", (procedure, roles)
    assert await me.call("wamp.session.count") == 1  # the caller's session is still fine


async def test_a_uri_that_is_not_a_string_or_bad_lookup_options_are_invalid_argument(client):
    me = await client()
    for procedure in ("wamp.subscription.lookup", "wamp.subscription.match",
                      "wamp.registration.lookup", "wamp.registration.match"):
        for bad in (12, None, ["com.x"]):
            error = await call_error(me, procedure, bad)
            assert error.error == "wamp.error.invalid_argument", (procedure, bad)
    for procedure in ("wamp.subscription.lookup", "wamp.registration.lookup"):
        for options in ({"match": "regex"}, {"match": ["prefix"]}, "prefix", ["prefix"]):
            error = await call_error(me, procedure, "com.x", options)
            assert error.error == "wamp.error.invalid_argument", (procedure, options)


# -- realms are separate -------------------------------------------------------------------


async def test_sessions_of_another_realm_are_invisible_to_the_session_meta_api(client):
    one = await client(realm="realm1")
    two_a, two_b = await client(realm="realm2"), await client(realm="realm2")
    assert await one.call("wamp.session.count") == 1
    assert await one.call("wamp.session.list") == [one.session_id]
    error = await call_error(one, "wamp.session.get", two_a.session_id)
    assert error.error == "wamp.error.no_such_session"
    assert sorted(await two_a.call("wamp.session.list")) == sorted(
        [two_a.session_id, two_b.session_id])


async def test_subscriptions_and_registrations_of_another_realm_are_not_visible(client):
    one, two = await client(realm="realm1"), await client(realm="realm2")
    sub = await two.subscribe(lambda *a: None, "com.realm.topic")
    reg = await two.register(lambda: 1, "com.realm.proc")
    assert await one.call("wamp.subscription.lookup", "com.realm.topic") is None
    assert await one.call("wamp.subscription.match", "com.realm.topic") is None
    assert await one.call("wamp.subscription.list") == {"exact": [], "prefix": [],
                                                         "wildcard": []}
    assert (await call_error(one, "wamp.subscription.get", sub.id)).error == \
        "wamp.error.no_such_subscription"
    assert await one.call("wamp.registration.lookup", "com.realm.proc") is None
    assert await one.call("wamp.registration.match", "com.realm.proc") is None
    assert await one.call("wamp.registration.list") == {"exact": [], "prefix": [],
                                                         "wildcard": []}
    assert (await call_error(one, "wamp.registration.get", reg.id)).error == \
        "wamp.error.no_such_registration"


async def test_meta_events_of_another_realm_are_not_delivered(client):
    watch = await MetaWatch(await client(realm="realm1")).subscribe("wamp.session.on_join")
    two = await client(realm="realm2")
    one = await client(realm="realm1")
    await watch.wait_for("wamp.session.on_join", lambda a: a[0]["session"] == one.session_id)
    assert watch.about(two.session_id) == []
