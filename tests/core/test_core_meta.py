"""The WAMP meta API on the core in memory (harness.core): the wamp.session.*,
wamp.subscription.* and wamp.registration.* procedures and the meta events, message by
message, with nothing to wait for. What only the wire shows (each transport and serializer
as the meta API describes it, a transport that drops) is in test_meta.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from autobahn.wamp import message as m

from harness.config import open_realm, router_table
from harness.core import CoreRouter, Peer, call, of_type

CONFIG = router_table("unused") + open_realm("realm1") + open_realm("realm2")


# -- helpers -------------------------------------------------------------------------------


def value(peer: Peer, procedure: str, *args: Any) -> Any:
    """The value a meta procedure returns (its RESULT's first argument)."""
    result = call(peer, procedure, *args)
    assert isinstance(result, m.Result), (procedure, args, result)
    return result.args[0]


def error(peer: Peer, procedure: str, *args: Any) -> str:
    """The error URI a meta procedure answers with."""
    answer = call(peer, procedure, *args)
    assert isinstance(answer, m.Error), (procedure, args, answer)
    return answer.error


def subscribe(peer: Peer, topic: str, match: str | None = None) -> int:
    [ack] = of_type(peer.send(m.Subscribe(next(peer.core.requests), topic, match=match)),
                    m.Subscribed)
    return ack.subscription


def unsubscribe(peer: Peer, subscription: int) -> None:
    [ack] = peer.send(m.Unsubscribe(next(peer.core.requests), subscription))
    assert isinstance(ack, m.Unsubscribed), ack


def register(peer: Peer, procedure: str, match: str | None = None,
             invoke: str | None = None) -> int:
    [ack] = of_type(peer.send(m.Register(next(peer.core.requests), procedure, match=match,
                                         invoke=invoke)), m.Registered)
    return ack.registration


def unregister(peer: Peer, registration: int) -> None:
    [ack] = peer.send(m.Unregister(next(peer.core.requests), registration))
    assert isinstance(ack, m.Unregistered), ack


def leave(peer: Peer) -> None:
    [goodbye] = peer.send(m.Goodbye())
    assert isinstance(goodbye, m.Goodbye)


def welcome_of(peer: Peer) -> m.Welcome:
    [welcome] = of_type(peer.inbox, m.Welcome)
    return welcome


class MetaWatch:
    """A session subscribed to meta topics: the events it received, in order, as
    (topic, args)."""

    def __init__(self, peer: Peer, *topics: str) -> None:
        self.peer = peer
        self.topics = {subscribe(peer, topic): topic for topic in topics}

    @property
    def log(self) -> list[tuple[str, list[Any]]]:
        return [(self.topics[e.subscription], e.args) for e in of_type(self.peer.inbox, m.Event)
                if e.subscription in self.topics]

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


def test_session_count_counts_the_sessions_of_the_realm():
    core = CoreRouter(CONFIG)
    a, b, c = core.connect(), core.connect(), core.connect()
    assert value(a, "wamp.session.count") == 3
    leave(c)
    assert value(b, "wamp.session.count") == 2


def test_session_list_returns_the_ids_of_all_sessions_of_the_realm():
    core = CoreRouter(CONFIG)
    sessions = [core.connect(), core.connect(), core.connect()]
    ids = value(sessions[0], "wamp.session.list")
    assert sorted(ids) == sorted(s.session.id for s in sessions)


def test_session_list_and_count_filter_by_authroles():
    core = CoreRouter(CONFIG)
    a, b = core.connect(), core.connect()
    everyone = sorted([a.session.id, b.session.id])
    assert sorted(value(a, "wamp.session.list", ["anonymous"])) == everyone
    assert sorted(value(a, "wamp.session.list", ["admin", "anonymous"])) == everyone
    assert sorted(value(a, "wamp.session.list", None)) == everyone
    assert value(a, "wamp.session.list", ["admin"]) == []
    assert value(a, "wamp.session.list", []) == []
    assert value(a, "wamp.session.count", ["anonymous"]) == 2
    assert value(a, "wamp.session.count", ["admin"]) == 0


def test_session_get_returns_the_session_details():
    core = CoreRouter(CONFIG)
    caller, other = core.connect(), core.connect()
    details = value(caller, "wamp.session.get", other.session.id)
    assert details["session"] == other.session.id
    assert details["authid"] == other.session.authid
    assert details["authrole"] == "anonymous"
    assert details["authmethod"] == "anonymous"
    assert details["transport"] == other.session.transport
    mine = value(caller, "wamp.session.get", caller.session.id)
    assert mine["session"] == caller.session.id
    assert mine["authid"] == welcome_of(caller).authid


def test_session_get_of_an_unknown_or_departed_session_is_no_such_session():
    core = CoreRouter(CONFIG)
    me, gone = core.connect(), core.connect()
    leave(gone)
    for unknown in (gone.session.id, 4242):
        assert error(me, "wamp.session.get", unknown) == "wamp.error.no_such_session", unknown


# -- wamp.subscription.* -------------------------------------------------------------------


def test_subscription_lookup_finds_the_id_by_uri_and_match_policy_or_none():
    core = CoreRouter(CONFIG)
    me = core.connect()
    exact = subscribe(me, "com.lookup.a")
    prefix = subscribe(me, "com.lookup", "prefix")
    wild = subscribe(me, "com..a", "wildcard")
    lookup = "wamp.subscription.lookup"
    assert value(me, lookup, "com.lookup.a") == exact
    assert value(me, lookup, "com.lookup.a", {"match": "exact"}) == exact
    assert value(me, lookup, "com.lookup", {"match": "prefix"}) == prefix
    assert value(me, lookup, "com..a", {"match": "wildcard"}) == wild
    assert value(me, lookup, "com.lookup") is None  # the default policy is exact
    assert value(me, lookup, "com.lookup", {"match": "wildcard"}) is None
    assert value(me, lookup, "com.nothing", {"match": "prefix"}) is None


def test_subscription_match_returns_every_subscription_matching_a_topic_or_none():
    core = CoreRouter(CONFIG)
    me = core.connect()
    exact = subscribe(me, "com.m.temp")
    prefix = subscribe(me, "com.m", "prefix")
    wild = subscribe(me, "com..temp", "wildcard")
    subscribe(me, "com.m.other")
    assert sorted(value(me, "wamp.subscription.match", "com.m.temp")) == \
        sorted([exact, prefix, wild])
    assert value(me, "wamp.subscription.match", "org.other") is None


def test_subscription_get_returns_id_created_uri_and_match():
    core = CoreRouter(CONFIG)
    me = core.connect()
    sub = subscribe(me, "com.g", "prefix")
    details = value(me, "wamp.subscription.get", sub)
    assert {k: details[k] for k in ("id", "uri", "match")} == {
        "id": sub, "uri": "com.g", "match": "prefix"}
    assert _created_recently(details["created"]), details["created"]


def test_subscription_list_groups_subscription_ids_by_match_policy():
    core = CoreRouter(CONFIG)
    me = core.connect("realm2")  # (realm1, the first, holds the health records' subscription)
    assert value(me, "wamp.subscription.list") == {"exact": [], "prefix": [], "wildcard": []}
    e1, e2 = subscribe(me, "com.l.one"), subscribe(me, "com.l.two")
    p = subscribe(me, "com.l", "prefix")
    w = subscribe(me, "com..one", "wildcard")
    listed = value(me, "wamp.subscription.list")
    assert set(listed) == {"exact", "prefix", "wildcard"}
    assert sorted(listed["exact"]) == sorted([e1, e2])
    assert listed["prefix"] == [p]
    assert listed["wildcard"] == [w]


def test_subscription_list_and_count_subscribers_follow_subscribe_and_unsubscribe():
    core = CoreRouter(CONFIG)
    a, b, c = core.connect(), core.connect(), core.connect()
    sub_id = subscribe(a, "com.shared")
    assert subscribe(b, "com.shared") == sub_id  # one subscription, two subscribers
    subscribers = value(c, "wamp.subscription.list_subscribers", sub_id)
    assert sorted(subscribers) == sorted([a.session.id, b.session.id])
    assert value(c, "wamp.subscription.count_subscribers", sub_id) == 2
    unsubscribe(b, sub_id)
    assert value(c, "wamp.subscription.list_subscribers", sub_id) == [a.session.id]
    assert value(c, "wamp.subscription.count_subscribers", sub_id) == 1
    unsubscribe(a, sub_id)  # the last one: the subscription is deleted
    assert value(c, "wamp.subscription.lookup", "com.shared") is None
    assert error(c, "wamp.subscription.count_subscribers", sub_id) == \
        "wamp.error.no_such_subscription"


# -- wamp.registration.* -------------------------------------------------------------------


def test_registration_lookup_finds_the_id_by_uri_and_match_policy_or_none():
    core = CoreRouter(CONFIG)
    me = core.connect()
    exact = register(me, "com.reg.a")
    prefix = register(me, "com.reg", "prefix")
    wild = register(me, "com..a", "wildcard")
    assert value(me, "wamp.registration.lookup", "com.reg.a") == exact
    assert value(me, "wamp.registration.lookup", "com.reg", {"match": "prefix"}) == prefix
    assert value(me, "wamp.registration.lookup", "com..a", {"match": "wildcard"}) == wild
    assert value(me, "wamp.registration.lookup", "com.reg") is None  # default: exact
    assert value(me, "wamp.registration.lookup", "com.none", {"match": "prefix"}) is None


def test_registration_match_returns_the_most_specific_registration_or_none():
    core = CoreRouter(CONFIG)
    me = core.connect()
    exact = register(me, "com.rm.a.b")
    short = register(me, "com.rm", "prefix")
    long = register(me, "com.rm.a", "prefix")
    wild = register(me, "org..b", "wildcard")
    assert value(me, "wamp.registration.match", "com.rm.a.b") == exact
    assert value(me, "wamp.registration.match", "com.rm.a.c") == long
    assert value(me, "wamp.registration.match", "com.rm.x") == short
    assert value(me, "wamp.registration.match", "org.x.b") == wild
    assert value(me, "wamp.registration.match", "net.none") is None


def test_registration_get_returns_id_created_uri_match_and_invoke():
    core = CoreRouter(CONFIG)
    me = core.connect()
    reg = register(me, "com.rg", "prefix", "roundrobin")
    details = value(me, "wamp.registration.get", reg)
    assert {k: details[k] for k in ("id", "uri", "match", "invoke")} == {
        "id": reg, "uri": "com.rg", "match": "prefix", "invoke": "roundrobin"}
    assert _created_recently(details["created"]), details["created"]


def test_registration_list_groups_registration_ids_by_match_policy():
    core = CoreRouter(CONFIG)
    me = core.connect()
    e = register(me, "com.rl.one")
    p1, p2 = register(me, "com.rl", "prefix"), register(me, "org.rl", "prefix")
    listed = value(me, "wamp.registration.list")
    assert listed["exact"] == [e]
    assert sorted(listed["prefix"]) == sorted([p1, p2])
    assert listed["wildcard"] == []


def test_registration_list_and_count_callees_follow_register_and_unregister():
    core = CoreRouter(CONFIG)
    a, b, c = core.connect(), core.connect(), core.connect()
    reg_id = register(a, "com.shared.proc", invoke="roundrobin")
    assert register(b, "com.shared.proc", invoke="roundrobin") == reg_id  # two callees
    callees = value(c, "wamp.registration.list_callees", reg_id)
    assert sorted(callees) == sorted([a.session.id, b.session.id])
    assert value(c, "wamp.registration.count_callees", reg_id) == 2
    unregister(a, reg_id)
    assert value(c, "wamp.registration.list_callees", reg_id) == [b.session.id]
    assert value(c, "wamp.registration.count_callees", reg_id) == 1
    leave(b)  # the last callee leaves: the registration is deleted
    assert value(c, "wamp.registration.lookup", "com.shared.proc") is None
    assert error(c, "wamp.registration.count_callees", reg_id) == \
        "wamp.error.no_such_registration"


def test_unknown_subscription_and_registration_ids_are_no_such_subscription_or_registration():
    core = CoreRouter(CONFIG)
    me = core.connect()
    sub, reg = subscribe(me, "com.known"), register(me, "com.known")
    for procedure in ("wamp.subscription.get", "wamp.subscription.list_subscribers",
                      "wamp.subscription.count_subscribers"):
        # a registration's id is not a subscription's
        assert error(me, procedure, reg) == "wamp.error.no_such_subscription", procedure
    for procedure in ("wamp.registration.get", "wamp.registration.list_callees",
                      "wamp.registration.count_callees"):
        assert error(me, procedure, sub) == "wamp.error.no_such_registration", procedure


# -- meta events: sessions -----------------------------------------------------------------


def test_on_join_carries_the_details_of_the_new_session():
    core = CoreRouter(CONFIG)
    watcher = core.connect()
    watch = MetaWatch(watcher, "wamp.session.on_join")
    newcomer = core.connect()
    [(topic, args)] = watch.about(newcomer.session.id)
    assert topic == "wamp.session.on_join" and len(args) == 1
    details = args[0]
    assert details["session"] == newcomer.session.id
    assert details["authid"] == newcomer.session.authid
    assert details["authrole"] == "anonymous"
    assert details["authmethod"] == "anonymous"
    assert details == value(watcher, "wamp.session.get", newcomer.session.id)


def test_on_leave_carries_session_id_authid_and_authrole_after_goodbye():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect(), "wamp.session.on_leave")
    leaver = core.connect()
    leave(leaver)
    assert watch.log == [("wamp.session.on_leave",
                          [leaver.session.id, leaver.session.authid, "anonymous"])]


def test_on_leave_is_published_when_the_transport_is_lost_without_goodbye():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect(), "wamp.session.on_leave")
    dropper = core.connect()
    dropper.drop()
    assert watch.log == [("wamp.session.on_leave",
                          [dropper.session.id, dropper.session.authid, "anonymous"])]


# -- meta events: subscriptions ------------------------------------------------------------


def test_subscribe_publishes_on_create_for_the_first_and_on_subscribe_for_each():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect(), *SUBSCRIPTION_EVENTS)
    first, second = core.connect(), core.connect()
    sub = subscribe(first, "com.ev", "prefix")
    subscribe(second, "com.ev", "prefix")
    events = watch.about(sub)
    assert [t for t, _ in events] == ["wamp.subscription.on_create",
                                      "wamp.subscription.on_subscribe",
                                      "wamp.subscription.on_subscribe"]
    create_args = events[0][1]
    assert create_args[0] == first.session.id
    details = create_args[1]
    assert {k: details[k] for k in ("id", "uri", "match")} == {
        "id": sub, "uri": "com.ev", "match": "prefix"}
    assert _created_recently(details["created"])
    assert events[1][1] == [first.session.id, sub]
    assert events[2][1] == [second.session.id, sub]


def test_unsubscribe_publishes_on_unsubscribe_and_on_delete_after_the_last():
    core = CoreRouter(CONFIG)
    a, b = core.connect(), core.connect()
    sub_id = subscribe(a, "com.ev3")
    subscribe(b, "com.ev3")
    watch = MetaWatch(core.connect(), *SUBSCRIPTION_EVENTS)
    unsubscribe(b, sub_id)
    unsubscribe(a, sub_id)
    assert watch.about(sub_id) == [
        ("wamp.subscription.on_unsubscribe", [b.session.id, sub_id]),
        ("wamp.subscription.on_unsubscribe", [a.session.id, sub_id]),
        ("wamp.subscription.on_delete", [a.session.id, sub_id]),
    ]


def test_subscriptions_of_a_leaving_session_are_unsubscribed_and_deleted():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect(), *SUBSCRIPTION_EVENTS, "wamp.session.on_leave")
    leaver = core.connect()
    leaver_id = leaver.session.id
    sub_id = subscribe(leaver, "com.ev4")
    leave(leaver)
    assert [(t, a) for t, a in watch.about(leaver_id) if t != "wamp.subscription.on_create"] == [
        ("wamp.subscription.on_subscribe", [leaver_id, sub_id]),
        ("wamp.subscription.on_unsubscribe", [leaver_id, sub_id]),
        ("wamp.subscription.on_delete", [leaver_id, sub_id]),
        ("wamp.session.on_leave", [leaver_id, welcome_of(leaver).authid, "anonymous"]),
    ]


# -- meta events: registrations ------------------------------------------------------------


def test_register_publishes_on_create_for_the_first_and_on_register_for_each():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect(), *REGISTRATION_EVENTS)
    first, second = core.connect(), core.connect()
    reg = register(first, "com.rev", invoke="roundrobin")
    register(second, "com.rev", invoke="roundrobin")
    events = watch.about(reg)
    assert [t for t, _ in events] == ["wamp.registration.on_create",
                                      "wamp.registration.on_register",
                                      "wamp.registration.on_register"]
    create_args = events[0][1]
    assert create_args[0] == first.session.id
    details = create_args[1]
    assert {k: details[k] for k in ("id", "uri", "match", "invoke")} == {
        "id": reg, "uri": "com.rev", "match": "exact", "invoke": "roundrobin"}
    assert _created_recently(details["created"])
    assert events[1][1] == [first.session.id, reg]
    assert events[2][1] == [second.session.id, reg]


def test_unregister_publishes_on_unregister_and_on_delete_after_the_last():
    core = CoreRouter(CONFIG)
    a, b = core.connect(), core.connect()
    reg_id = register(a, "com.rev3", invoke="random")
    register(b, "com.rev3", invoke="random")
    watch = MetaWatch(core.connect(), *REGISTRATION_EVENTS)
    unregister(b, reg_id)
    unregister(a, reg_id)
    assert watch.about(reg_id) == [
        ("wamp.registration.on_unregister", [b.session.id, reg_id]),
        ("wamp.registration.on_unregister", [a.session.id, reg_id]),
        ("wamp.registration.on_delete", [a.session.id, reg_id]),
    ]


def test_registrations_of_a_leaving_session_are_unregistered_and_deleted():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect(), *REGISTRATION_EVENTS, "wamp.session.on_leave")
    leaver = core.connect()
    leaver_id = leaver.session.id
    reg_id = register(leaver, "com.rev4")
    leave(leaver)
    assert [(t, a) for t, a in watch.about(leaver_id) if t != "wamp.registration.on_create"] == [
        ("wamp.registration.on_register", [leaver_id, reg_id]),
        ("wamp.registration.on_unregister", [leaver_id, reg_id]),
        ("wamp.registration.on_delete", [leaver_id, reg_id]),
        ("wamp.session.on_leave", [leaver_id, welcome_of(leaver).authid, "anonymous"]),
    ]


def test_meta_events_reach_pattern_based_subscriptions():
    core = CoreRouter(CONFIG)
    watcher = core.connect()
    subscribe(watcher, "wamp.session.", "prefix")
    newcomer = core.connect()
    event = of_type(watcher.inbox, m.Event)[0]
    assert event.topic == "wamp.session.on_join"
    assert event.args[0]["session"] == newcomer.session.id


# -- bad arguments -------------------------------------------------------------------------

ID_PROCEDURES = ["wamp.session.get",
                 "wamp.subscription.get", "wamp.subscription.list_subscribers",
                 "wamp.subscription.count_subscribers",
                 "wamp.registration.get", "wamp.registration.list_callees",
                 "wamp.registration.count_callees"]


def test_a_string_where_an_id_is_expected_is_invalid_argument():
    core = CoreRouter(CONFIG)
    me = core.connect()
    for procedure in ID_PROCEDURES:
        assert error(me, procedure, str(me.session.id)) == "wamp.error.invalid_argument", \
            procedure
    assert value(me, "wamp.session.count") == 1  # the caller's session is still fine


def test_a_missing_or_non_integer_id_is_invalid_argument():
    core = CoreRouter(CONFIG)
    me = core.connect()
    for procedure in ID_PROCEDURES:
        assert error(me, procedure) == "wamp.error.invalid_argument"
        for bad in (True, 1.5, None, [me.session.id], {"id": me.session.id}):
            assert error(me, procedure, bad) == "wamp.error.invalid_argument", (procedure, bad)


def test_an_authroles_filter_that_is_not_a_list_of_strings_is_invalid_argument():
    core = CoreRouter(CONFIG)
    me = core.connect()
    for procedure in ("wamp.session.list", "wamp.session.count"):
        for roles in ("anonymous", {"role": "anonymous"}, 7,
                      [{"role": "anonymous"}], [["anonymous"]], [1], ["anonymous", None]):
            assert error(me, procedure, roles) == "wamp.error.invalid_argument", \
                (procedure, roles)
    assert value(me, "wamp.session.count") == 1  # the caller's session is still fine


def test_a_uri_that_is_not_a_string_or_bad_lookup_options_are_invalid_argument():
    core = CoreRouter(CONFIG)
    me = core.connect()
    for procedure in ("wamp.subscription.lookup", "wamp.subscription.match",
                      "wamp.registration.lookup", "wamp.registration.match"):
        for bad in (12, None, ["com.x"]):
            assert error(me, procedure, bad) == "wamp.error.invalid_argument", (procedure, bad)
    for procedure in ("wamp.subscription.lookup", "wamp.registration.lookup"):
        for options in ({"match": "regex"}, {"match": ["prefix"]}, "prefix", ["prefix"]):
            assert error(me, procedure, "com.x", options) == "wamp.error.invalid_argument", \
                (procedure, options)


# -- realms are separate -------------------------------------------------------------------


def test_sessions_of_another_realm_are_invisible_to_the_session_meta_api():
    core = CoreRouter(CONFIG)
    one = core.connect("realm1")
    two_a, two_b = core.connect("realm2"), core.connect("realm2")
    assert value(one, "wamp.session.count") == 1
    assert value(one, "wamp.session.list") == [one.session.id]
    assert error(one, "wamp.session.get", two_a.session.id) == "wamp.error.no_such_session"
    assert sorted(value(two_a, "wamp.session.list")) == sorted(
        [two_a.session.id, two_b.session.id])


def test_subscriptions_and_registrations_of_another_realm_are_not_visible():
    core = CoreRouter(CONFIG)
    # realm2 looks at realm1's: it holds no subscription of the router's own (health records)
    one, two = core.connect("realm2"), core.connect("realm1")
    sub = subscribe(two, "com.realm.topic")
    reg = register(two, "com.realm.proc")
    nothing = {"exact": [], "prefix": [], "wildcard": []}
    assert value(one, "wamp.subscription.lookup", "com.realm.topic") is None
    assert value(one, "wamp.subscription.match", "com.realm.topic") is None
    assert value(one, "wamp.subscription.list") == nothing
    assert error(one, "wamp.subscription.get", sub) == "wamp.error.no_such_subscription"
    assert value(one, "wamp.registration.lookup", "com.realm.proc") is None
    assert value(one, "wamp.registration.match", "com.realm.proc") is None
    assert value(one, "wamp.registration.list") == nothing
    assert error(one, "wamp.registration.get", reg) == "wamp.error.no_such_registration"


def test_meta_events_of_another_realm_are_not_delivered():
    core = CoreRouter(CONFIG)
    watch = MetaWatch(core.connect("realm1"), "wamp.session.on_join")
    two = core.connect("realm2")
    one = core.connect("realm1")
    assert [a[0]["session"] for _, a in watch.log] == [one.session.id]
    assert watch.about(two.session.id) == []
