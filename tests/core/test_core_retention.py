"""Event Retention on the core in memory (harness.core): every MUST of the spec and every
decision of DESIGN.md ("Event Retention") that the router decides by itself, message by
message. A session's SUBSCRIBE with get_retained is answered by SUBSCRIBED and the retained
events in one go, so "no retained event" needs no live sentinel and no wait.

What only the wire, the store or a restart shows (the retained EVENT encoded for each
transport and serializer, its order against live events while publishers stream, the
retained slots on disk and across restarts) is in test_retention.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from autobahn.wamp import message as m
from autobahn.wamp.serializer import JsonObjectSerializer

from cairn.formats.publication_ids import PublicationIds, new_key
from cairn.gateway.core.publication import Restored, StoredPublication
from cairn.gateway.core.retention import RetainedEvent, RetainedStream, Retention
from cairn.gateway.core.session import ForgetRetained, Persist
from harness.config import permission, realm, retention_rule, role, router_table, user
from harness.core import CoreRouter, Peer, of_type
from tests.system.test_retention import REALM, login_of

CONFIG = router_table("unused") + REALM

SENTINEL = "sentinel"


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
def core() -> CoreRouter:
    """A router whose anonymous sessions are "user"s; ``connect(core, "root")`` is admin."""
    return CoreRouter(CONFIG)


def connect(core: CoreRouter, authid: str | None = None) -> Peer:
    """``authid="root"`` joins as admin, one of test_retention.NAMED as user (both by
    ticket); without an authid, an anonymous user."""
    login = login_of(authid)
    secret = login.pop("secret", None)
    peer = core.connect(**login)
    if secret is not None:
        peer.send(m.Authenticate(secret))
    assert peer.session.authrole == ("admin" if authid == "root" else "user")
    return peer


def publish(peer: Peer, topic: str, *args: Any, kw: dict[str, Any] | None = None,
            **options: Any) -> m.Published | m.Error:
    """Publish with acknowledge=True and the given options: PUBLISHED or ERROR."""
    request = next(peer.core.requests)
    [answer] = [msg for msg in peer.send(m.Publish(request, topic, args=list(args) or None,
                                                   kwargs=kw, acknowledge=True, **options))
                if isinstance(msg, m.Published | m.Error) and msg.request == request]
    return answer


def acked(peer: Peer, topic: str, *args: Any, kw: dict[str, Any] | None = None,
          **options: Any) -> int:
    """Publish, acknowledged; the publication id."""
    answer = publish(peer, topic, *args, kw=kw, **options)
    assert isinstance(answer, m.Published), answer
    return answer.publication


@dataclass
class Received:
    """An EVENT as its subscriber sees it, live (m.Event) or retained (RetainedEvent)."""

    subscription: int
    publication: int
    topic: str | None
    retained: bool
    args: list[Any]
    kwargs: dict[str, Any]


def received(msg: Any) -> Received:
    if isinstance(msg, RetainedEvent):
        publication, details, *payload = msg.body
        args, kwargs = (payload + [[], {}][len(payload):])[:2]
        return Received(msg.subscription, publication, details.get("topic"),
                        bool(details.get("retained")), args, kwargs)
    return Received(msg.subscription, msg.publication, msg.topic, bool(msg.retained),
                    msg.args or [], msg.kwargs or {})


def events(messages: list[Any]) -> list[Received]:
    return [received(msg) for msg in messages if msg.MESSAGE_TYPE == m.Event.MESSAGE_TYPE]


def subscribe(peer: Peer, topic: str, match: str = "exact",
              get_retained: bool | None = True) -> list[Any]:
    """SUBSCRIBE; what the session received in answer (SUBSCRIBED first)."""
    answer = peer.send(m.Subscribe(next(peer.core.requests), topic, match=match,
                                   get_retained=get_retained))
    assert isinstance(answer[0], m.Subscribed), answer
    return answer


def retained_events(peer: Peer, topic: str, match: str = "exact") -> list[Received]:
    """Subscribe with get_retained: the events that come with SUBSCRIBED."""
    return events(subscribe(peer, topic, match))


def retained_args(peer: Peer, topic: str, match: str = "exact") -> list[list[Any]]:
    return [r.args for r in retained_events(peer, topic, match)]


def live_args(peer: Peer) -> list[list[Any]]:
    return [r.args for r in events(peer.inbox)]


# -- the spec: options and their defaults --------------------------------------------------


def test_a_publish_without_the_retain_option_is_not_retained(core):
    acked(connect(core), "temp.room", 21.5)
    assert retained_args(connect(core), "temp.room") == []


def test_a_publish_with_retain_false_is_not_retained(core):
    acked(connect(core), "temp.room", 21.5, retain=False)
    assert retained_args(connect(core), "temp.room") == []


def test_a_subscribe_without_the_get_retained_option_gets_no_retained_event(core):
    pub = connect(core)
    acked(pub, "temp.room", 21.5, retain=True)
    sub = connect(core)
    assert [type(msg) for msg in subscribe(sub, "temp.room", get_retained=None)] == \
        [m.Subscribed]
    acked(pub, "temp.room", SENTINEL)
    assert live_args(sub) == [[SENTINEL]]


def test_a_subscribe_with_get_retained_false_gets_no_retained_event(core):
    pub, sub = connect(core), connect(core)
    acked(pub, "temp.room", 21.5, retain=True)
    assert [type(msg) for msg in subscribe(sub, "temp.room", get_retained=False)] == \
        [m.Subscribed]
    acked(pub, "temp.room", SENTINEL)
    assert live_args(sub) == [[SENTINEL]]


# -- the spec: the retained event ----------------------------------------------------------


def test_a_later_subscriber_with_get_retained_receives_the_retained_event(core):
    acked(connect(core), "temp.room", 21.5, kw={"unit": "C"}, retain=True)
    got = retained_events(connect(core), "temp.room")
    assert [(r.args, r.kwargs) for r in got] == [([21.5], {"unit": "C"})]


def test_the_retained_event_has_details_retained_true(core):
    acked(connect(core), "temp.room", 21.5, retain=True)
    (event,) = retained_events(connect(core), "temp.room")
    assert event.retained is True


def test_the_retained_event_is_marked_retained_and_live_events_are_not(core):
    pub = connect(core)
    acked(pub, "temp.room", 21.5, retain=True)
    sub = connect(core)
    subscribed, retained = subscribe(sub, "temp.room")
    assert retained.MESSAGE_TYPE == m.Event.MESSAGE_TYPE
    assert retained.subscription == subscribed.subscription
    assert retained.body[1] == {"retained": True}  # an exact subscription: no topic
    assert retained.body[2] == [21.5]
    pub.send(m.Publish(next(core.requests), "temp.room", args=[22.0], retain=True))
    [live] = of_type(sub.inbox, m.Event)
    assert live.args == [22.0] and not live.retained


def test_a_subscriber_receives_the_most_recent_retained_event(core):
    pub = connect(core)
    for value in (20.0, 21.0, 22.0):
        acked(pub, "temp.room", value, retain=True)
    assert retained_args(connect(core), "temp.room") == [[22.0]]


def test_a_later_publish_without_retain_does_not_replace_the_retained_event(core):
    pub = connect(core)
    acked(pub, "temp.room", "important", retain=True)
    acked(pub, "temp.room", "noise")
    assert retained_args(connect(core), "temp.room") == [["important"]]


def test_a_topic_without_a_retained_publish_gives_no_retained_event(core):
    acked(connect(core), "temp.other", 1, retain=True)
    assert retained_args(connect(core), "temp.room") == []


AUDIENCES = {
    "eligible_authid": ({"eligible_authid": ["alice"]}, {"alice"}),
    "exclude_authid": ({"exclude_authid": ["bob"]}, {"alice", "root"}),
    "eligible_authrole": ({"eligible_authrole": ["admin"]}, {"root"}),
    "exclude_authrole": ({"exclude_authrole": ["user"]}, {"root"}),
    "eligible_authid_and_authrole": (
        {"eligible_authid": ["alice", "root"], "eligible_authrole": ["user"]}, {"alice"}),
}


@pytest.mark.parametrize("options, receivers", list(AUDIENCES.values()), ids=list(AUDIENCES))
def test_a_subscriber_never_receives_a_retained_event_it_is_not_eligible_for(
        core, options, receivers):
    acked(connect(core), "temp.room", "limited", retain=True, **options)
    got = {name: retained_args(connect(core, authid=name), "temp.room")
           for name in ("alice", "bob", "root")}
    assert got == {name: [["limited"]] if name in receivers else [] for name in got}


def test_a_subscriber_gets_the_most_recent_retained_event_it_would_have_received(core):
    pub = connect(core)
    acked(pub, "temp.room", "for everyone", retain=True)
    acked(pub, "temp.room", "not for bob", retain=True, exclude_authid=["bob"])
    alice, bob = connect(core, authid="alice"), connect(core, authid="bob")
    assert retained_args(alice, "temp.room") == [["not for bob"]]
    assert retained_args(bob, "temp.room") == [["for everyone"]]


def test_welcome_announces_event_retention(core):
    [welcome] = of_type(connect(core).inbox, m.Welcome)
    assert welcome.marshal()[2]["roles"]["broker"]["features"]["event_retention"] is True


# -- DESIGN: one slot per topic per audience -----------------------------------------------


@pytest.mark.parametrize("order", ["plain-then-admin", "admin-then-plain"])
def test_one_slot_per_audience_each_subscriber_gets_the_newest_it_may_see(core, order):
    pub = connect(core)
    publishes = [("plain", {}), ("admins only", {"eligible_authrole": ["admin"]})]
    if order == "admin-then-plain":
        publishes.reverse()
    for value, options in publishes:
        acked(pub, "temp.room", value, retain=True, **options)
    admin, user = connect(core, authid="root"), connect(core, authid="alice")
    assert retained_args(admin, "temp.room") == [[publishes[-1][0]]]
    assert retained_args(user, "temp.room") == [["plain"]]


def test_a_retained_publish_replaces_only_the_slot_of_its_own_audience(core):
    pub = connect(core)
    acked(pub, "temp.room", "plain", retain=True)
    acked(pub, "temp.room", "admins 1", retain=True, eligible_authrole=["admin"])
    acked(pub, "temp.room", "admins 2", retain=True, eligible_authrole=["admin"])
    admin, user = connect(core, authid="root"), connect(core, authid="alice")
    assert retained_args(admin, "temp.room") == [["admins 2"]]
    assert retained_args(user, "temp.room") == [["plain"]]


@pytest.mark.parametrize("list_option", ["exclude", "eligible", "empty-eligible"])
def test_a_publication_with_a_session_id_list_is_not_retained(core, list_option):
    pub, other = connect(core), connect(core)
    acked(pub, "temp.room", "kept", retain=True)
    options = {"exclude": {"exclude": [other.session.id]},
               "eligible": {"eligible": [other.session.id]},
               "empty-eligible": {"eligible": []}}[list_option]
    acked(pub, "temp.room", "with session ids", retain=True, **options)
    assert retained_args(connect(core), "temp.room") == [["kept"]]
    assert retained_args(other, "temp.room") == [["kept"]]


@pytest.mark.parametrize("exclude_me", [None, True, False])
def test_exclude_me_does_not_affect_retention(core, exclude_me):
    pub = connect(core)
    acked(pub, "temp.room", "mine", retain=True, exclude_me=exclude_me)
    assert retained_args(pub, "temp.room") == [["mine"]]
    assert retained_args(connect(core), "temp.room") == [["mine"]]


def test_a_prefix_subscription_gets_the_retained_event_of_every_matching_topic(core):
    pub = connect(core)
    acked(pub, "sensor.a", "a1", retain=True)
    acked(pub, "sensor.b.temp", "b", retain=True)
    acked(pub, "sensorium", "prefix of the string", retain=True)
    acked(pub, "other.a", "no match", retain=True)
    acked(pub, "sensor.a", "a2", retain=True)
    acked(pub, "sensor.c", "not retained")
    got = retained_events(connect(core), "sensor", "prefix")
    # per topic the newest, in receive order, each naming its topic
    assert [(r.topic, r.args) for r in got] == [
        ("sensor.b.temp", ["b"]), ("sensorium", ["prefix of the string"]),
        ("sensor.a", ["a2"])]
    assert all(r.retained for r in got)


def test_a_wildcard_subscription_gets_the_retained_event_of_every_matching_topic(core):
    pub = connect(core)
    acked(pub, "sensor.kitchen.temp", 21, retain=True)
    acked(pub, "sensor.attic.temp", 15, retain=True)
    acked(pub, "sensor.kitchen.humidity", 40, retain=True)
    acked(pub, "sensor.kitchen.extra.temp", 0, retain=True)
    got = retained_events(connect(core), "sensor..temp", "wildcard")
    assert [(r.topic, r.args) for r in got] == [
        ("sensor.kitchen.temp", [21]), ("sensor.attic.temp", [15])]
    assert all(r.retained for r in got)


def test_a_pattern_subscription_gets_no_retained_event_of_a_topic_its_role_may_not_read(core):
    admin = connect(core, authid="root")
    acked(admin, "private.key", "hunter2", retain=True)  # users may not read private.
    acked(admin, "priv.ok", "fine", retain=True)
    user = connect(core, authid="alice")
    got = retained_events(user, "priv", "prefix")
    assert [(r.topic, r.args) for r in got] == [("priv.ok", ["fine"])]
    got = retained_events(admin, "priv", "prefix")
    assert [r.topic for r in got] == ["private.key", "priv.ok"]


def test_retained_events_come_after_subscribed_and_before_any_live_event(core):
    pub = connect(core)
    acked(pub, "order.b", "b", retain=True)
    acked(pub, "order.c", "c", retain=True)
    acked(pub, "order.a", 0, retain=True)
    sub = connect(core)
    subscribe(sub, "order.", "prefix")
    acked(pub, "order.a", 1, retain=True)
    answer = sub.inbox[1:]  # after WELCOME
    assert isinstance(answer[0], m.Subscribed)
    got = events(answer[1:])
    assert [(r.retained, r.topic, r.args) for r in got] == [
        (True, "order.b", ["b"]), (True, "order.c", ["c"]), (True, "order.a", [0]),
        (False, "order.a", [1])]


def test_the_retained_event_keeps_the_original_publication_id(core):
    pub, live = connect(core), connect(core)
    subscribe(live, "temp.room")
    publication = acked(pub, "temp.room", 21.5, retain=True)
    assert [r.publication for r in events(live.inbox)] == [publication]
    (event,) = retained_events(connect(core), "temp.room")
    assert event.publication == publication


def test_an_unauthorized_publish_never_becomes_the_retained_event(core):
    admin, user = connect(core, authid="root"), connect(core, authid="alice")
    acked(admin, "ctl.heater", "on", retain=True)
    refused = publish(user, "ctl.heater", "off", retain=True)  # users may watch ctl. only
    assert isinstance(refused, m.Error) and refused.error == "wamp.error.not_authorized"
    assert user.send(m.Publish(next(core.requests), "ctl.heater",
                               args=["off, unacknowledged"], retain=True)) == []
    assert isinstance(publish(user, "wamp.session.on_join", "forged", retain=True), m.Error)
    assert retained_args(user, "ctl.heater") == [["on"]]
    assert retained_args(connect(core, authid="root"), "ctl.heater") == [["on"]]
    assert retained_args(admin, "wamp.session.on_join") == []


def test_a_retained_event_for_admins_never_reaches_a_user_session(core):
    """DESIGN names this one: eligible_authrole=["admin"] must reach no "user" session, live
    or retained, through any kind of subscription (after a restart: test_retention.py)."""
    patterns = [("ops.secret", "exact"), ("ops", "prefix"), ("ops.", "wildcard")]
    user, admin = connect(core, authid="alice"), connect(core, authid="root")
    for topic, match in patterns:
        subscribe(user, topic, match)
    subscribe(admin, "ops.secret")
    publisher = connect(core)
    acked(publisher, "ops.secret", "admins only", retain=True, eligible_authrole=["admin"])
    assert live_args(admin) == [["admins only"]]
    acked(publisher, "ops.secret", SENTINEL)
    assert live_args(user) == [[SENTINEL]] * 3  # one per subscription, and nothing before
    for topic, match in patterns:
        assert retained_args(connect(core, authid="alice"), topic, match) == [], topic
        assert retained_args(connect(core, authid="root"), topic, match) == [["admins only"]]


# -- what the retained slots may hold (issue 31; replayed on sockets in test_retained_bounds) --

DRIVER_SECRET = "driver-ticket"
BOUNDED = router_table("unused", extra=(
    "[router.limits]\nmax_retained = 6\nmax_retained_per_session = 4\n"
    "max_retained_payload = 100\n")) + realm(
    "realm1", role("user", permission("", ("publish", "subscribe", "call"))),
    user("driver", "user", secret=DRIVER_SECRET),
    retention_rule("sensor", max_payload=1000), retention_rule("gateway.device"),
    anonymous_role="user")


@pytest.fixture
def bounded() -> CoreRouter:
    """max_retained 6, 4 per session; payloads: 1000 bytes on sensor*, 100 elsewhere."""
    return CoreRouter(BOUNDED)


def driver(core: CoreRouter) -> Peer:
    peer = core.connect(authmethods=["ticket"], authid="driver")
    peer.send(m.Authenticate(DRIVER_SECRET))
    return peer


def on_unix_socket(peer: Peer) -> Peer:
    peer.session.transport["peer"] = "unix:"
    return peer


def refusal(answer: m.Published | m.Error) -> str:
    assert isinstance(answer, m.Error) and answer.error == "cairn.error.limit_reached", answer
    return answer.args[0]


def retained_topics(core: CoreRouter) -> list[str]:
    return [r.topic for r in retained_events(core.connect(), "", "prefix") if r.retained]


def test_a_retained_payload_over_its_rules_bound_is_delivered_but_not_retained(bounded):
    publisher, live = bounded.connect(), bounded.connect()
    subscribe(live, "sensor.a", get_retained=False)
    why = refusal(publish(publisher, "sensor.a", "x" * 1000, retain=True))
    assert why.startswith("publication ") and "was delivered but not retained: " \
        "max_retained_payload: its payload is 1006 bytes, over the 1000 bytes a retained " \
        "payload on 'sensor.a' may have (max_payload of the retention rule 'sensor')" in why
    assert live_args(live) == [["x" * 1000]]
    acked(publisher, "sensor.a", "x" * 900, retain=True)  # the rule's bound
    assert "over the 100 bytes a retained payload on 'other' may have " \
        "(router.limits.max_retained_payload)" in \
        refusal(publish(publisher, "other", "x" * 200, retain=True))
    assert retained_topics(bounded) == ["sensor.a"]


def test_a_session_holds_its_share_of_the_slots_and_a_user_across_its_sessions(bounded):
    anonymous = bounded.connect()
    for i in range(4):
        acked(anonymous, f"junk.{i}", i, retain=True)
    assert "max_retained_per_session: " in refusal(publish(anonymous, "junk.4", 4, retain=True))
    acked(anonymous, "junk.0", "newer", retain=True)  # a slot it holds takes a newer one
    acked(bounded.connect(), "junk.4", 4, retain=True)  # another session has its own share
    first, second = driver(bounded), driver(bounded)
    for i in range(2):
        acked(first, f"sensor.d{i}", i, retain=True)
        acked(second, f"sensor.e{i}", i, retain=True)
    assert "max_retained_per_session: 'driver' holds 4" in \
        refusal(publish(second, "sensor.e2", 2, retain=True))


def test_when_full_slots_of_lower_standing_make_room_oldest_first(bounded):
    """Standing 0: anyone's on a topic no rule covers; 1: anonymous on a sensor topic;
    2: a driver's (a configured user, or a session on the Unix socket) on a sensor topic."""
    junk, other = bounded.connect(), bounded.connect()
    acked(junk, "junk.a", 1, retain=True)
    acked(other, "junk.b", 1, retain=True)
    acked(junk, "junk.c", 1, retain=True)
    acked(junk, "junk.a", 2, retain=True)  # published again: now the newest junk
    sensor = bounded.connect()
    acked(sensor, "sensor.s0", 1, retain=True)
    acked(sensor, "sensor.s1", 1, retain=True)
    assert retained_topics(bounded) == ["junk.b", "junk.c", "junk.a", "sensor.s0", "sensor.s1"]
    acked(sensor, "sensor.s2", 1, retain=True)  # 6: full
    assert "max_retained: 6 retained slots exist" in refusal(
        publish(bounded.connect(), "junk.d", 1, retain=True))  # none of lower standing

    acked(sensor, "sensor.s3", 1, retain=True)  # anonymous sensor: junk goes, oldest first
    assert retained_topics(bounded)[:2] == ["junk.c", "junk.a"]
    forgotten = [e.pub.topic for e in bounded.effects_of(ForgetRetained)]
    assert forgotten == ["junk.b"]
    local = on_unix_socket(bounded.connect())
    acked(local, "sensor.u0", 1, retain=True)
    acked(local, "sensor.u1", 1, retain=True)
    acked(driver(bounded), "sensor.d0", 1, retain=True)  # junk gone: then the sensors'
    assert retained_topics(bounded) == ["sensor.s1", "sensor.s2", "sensor.s3", "sensor.u0",
                                        "sensor.u1", "sensor.d0"]
    acked(on_unix_socket(bounded.connect()), "sensor.u2", 1, retain=True)
    acked(driver(bounded), "gateway.device.d0.status", "ok", retain=True)
    acked(driver(bounded), "sensor.d1", 1, retain=True)
    assert "max_retained: " in refusal(publish(driver(bounded), "sensor.d2", 1, retain=True))
    assert retained_topics(bounded) == ["sensor.u0", "sensor.u1", "sensor.d0", "sensor.u2",
                                        "gateway.device.d0.status", "sensor.d1"]
    assert [e.pub.topic for e in bounded.effects_of(ForgetRetained)] == [
        "junk.b", "junk.c", "junk.a", "sensor.s0", "sensor.s1", "sensor.s2", "sensor.s3"]


def test_a_restart_keeps_the_drivers_slots_first(bounded):
    """Restored into lower bounds, a configured driver's slots are kept before the others,
    however old; then the newest."""
    acked(driver(bounded), "sensor.d0", 1, retain=True)
    anonymous = bounded.connect()
    for i in range(4):
        acked(anonymous, f"sensor.a{i}", i, retain=True)
    acked(bounded.connect(), "junk.0", 1, retain=True)
    stored = [e.pub for e in bounded.effects_of(Persist)]
    lowered = CoreRouter(BOUNDED.replace("max_retained = 6", "max_retained = 3"))
    out = lowered.outbox()
    lowered.router.resume(Restored(stored[-1].seq + 1, PublicationIds(new_key()),
                                   retained=stored), out)
    lowered.flush(out)
    assert retained_topics(lowered) == ["sensor.d0", "sensor.a2", "sensor.a3"]
    assert sorted(e.pub.topic for e in lowered.effects_of(ForgetRetained)) == \
        ["junk.0", "sensor.a0", "sensor.a1"]


def test_a_retained_stream_ends_with_its_subscription_and_skips_what_came_live(bounded):
    """The retained events are made one at a time as the connection has room: a slot
    published again meanwhile comes as the live event only, and a stream of a
    subscription its session left gives nothing more."""
    publisher, subscriber = bounded.connect(), bounded.connect()
    for i in range(3):
        acked(publisher, f"sensor.{i}", i, retain=True)
    out = bounded.outbox()
    bounded.router.receive(subscriber.session, m.Subscribe(1, "sensor.", match="prefix",
                                                           get_retained=True), out)
    [(_, subscribed), (_, stream)] = out.messages
    assert isinstance(subscribed, m.Subscribed) and isinstance(stream, RetainedStream)
    assert received(stream.next()).args == [0]
    acked(publisher, "sensor.1", "newer", retain=True)
    assert received(stream.next()).args == [2]
    assert stream.next() is None
    assert live_args(subscriber) == [["newer"]]

    out = bounded.outbox()
    bounded.router.receive(subscriber.session, m.Subscribe(2, "sensor.", match="prefix",
                                                           get_retained=True), out)
    stream = out.messages[-1][1]
    assert received(stream.next()).args == [0]
    subscriber.send(m.Unsubscribe(3, subscribed.subscription))
    assert stream.next() is None


def test_a_sessions_share_of_the_retained_bytes_is_its_share_of_the_slots():
    """max_retained 4, 2 per session: half of max_retained_bytes (400) each."""
    core = CoreRouter(BOUNDED.replace("max_retained = 6", "max_retained = 4\n"
                                      "max_retained_bytes = 400").replace(
        "max_retained_per_session = 4", "max_retained_per_session = 2"))
    session = core.connect()
    acked(session, "sensor.a", "x" * 150, retain=True)
    assert "max_retained_per_session: " in (why := refusal(
        publish(session, "sensor.b", "x" * 100, retain=True)))
    assert "bytes of retained payloads (its share: 200)" in why
    assert "its share" in refusal(publish(session, "sensor.a", "x" * 250, retain=True))
    acked(session, "sensor.a", "x" * 20, retain=True)  # smaller: room for another
    acked(session, "sensor.b", "x" * 100, retain=True)
    acked(core.connect(), "sensor.c", "x" * 150, retain=True)  # another session's share


def test_a_replaced_retained_publications_encoded_parts_leave_the_cache():
    """Dashboards coming and going while the readings changed filled the cache with the
    encoded parts of publications nobody could ask for again (the soak's router grew by
    0.7 MiB a minute, up to four times the cache's bound in real memory)."""
    retention, json = Retention(), JsonObjectSerializer()

    def retained(seq: int) -> RetainedEvent:
        pub = StoredPublication(seq, 1000 + seq, "realm1", "sensor.a", [seq], None, 0, "b", 0,
                                True, retain=True)
        assert retention.put(pub) == (None, [])
        return RetainedEvent(1, pub, pattern=False, cache=retention.cache)

    first = retained(1)
    first.serialize(json)
    assert retention.cache.bytes > retention.cache.ENTRY  # its parts, and what they cost
    second = retained(2)
    assert retention.cache.bytes == 0  # the first one's parts went with it
    second.serialize(json)
    held = retention.cache.bytes
    first.serialize(json)  # a stream still sending the replaced one: not kept again
    assert retention.cache.bytes == held
