"""The protocol core in memory (harness.core): what the router decides, message by message,
with no socket, event loop or store in between. The same behaviours meet real sockets in
test_broker.py, test_retention.py and test_history.py."""

from __future__ import annotations

import pytest
from autobahn.wamp import message as m
from autobahn.wamp import role

from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.core.publication import HistoryRead, StorageError
from cairn.gateway.core.session import (
    ClockStep,
    IllegalTransition,
    KeepSubscription,
    Persist,
    Read,
    Session,
    SessionState,
)
from harness.config import history_rule, open_realm, router_table
from harness.core import CoreRouter, Peer, of_type

CONFIG = router_table("unused") + open_realm(
    history=[history_rule("sensor")],
    extra='  [[realms.users]]\n  authid = "root"\n  role = "anonymous"\n  secret = "s3cret"\n')


def published(peer, topic: str, value: object, **options: object) -> list:
    return peer.send(m.Publish(1, topic, args=[value], acknowledge=True, **options))


def test_a_history_rules_subscription_is_kept_from_the_start():
    core = CoreRouter(CONFIG)
    kept = core.effects_of(KeepSubscription)  # the realm's rule, then the health records'
    assert [(k.uri, k.match) for k in kept] == [("sensor", "prefix"), (HEALTH_TOPIC, "exact")]


def test_a_stored_publish_is_acknowledged_only_once_it_is_durable():
    core = CoreRouter(CONFIG, hold_writes=True)
    publisher = core.connect()
    assert published(publisher, "sensor.t", 20.5, retain=True) == []
    [persist] = core.effects_of(Persist)
    assert (persist.pub.topic, persist.pub.args, persist.pub.retain) == ("sensor.t", [20.5], True)
    core.complete_writes()
    [ack] = of_type(publisher.inbox, m.Published)
    assert ack.publication == persist.pub.publication


def test_a_publish_the_store_cannot_keep_is_answered_with_storage_failed():
    core = CoreRouter(CONFIG, hold_writes=True)
    publisher = core.connect()
    published(publisher, "sensor.t", 20.5)
    core.complete_writes(StorageError("disk full"))
    [error] = of_type(publisher.inbox, m.Error)
    assert error.error == "cairn.error.storage_failed" and "disk full" in error.args[0]


def test_a_publish_no_rule_keeps_and_nobody_retains_is_acknowledged_at_once():
    core = CoreRouter(CONFIG, hold_writes=True)
    publisher = core.connect()
    [ack] = published(publisher, "live.only", 1)
    assert isinstance(ack, m.Published)
    assert core.effects_of(Persist) == []


def test_stored_publications_get_consecutive_seqs_in_receive_order():
    core = CoreRouter(CONFIG)
    a, b = core.connect(), core.connect()
    for peer, value in [(a, 1), (b, 2), (a, 3)]:
        published(peer, "sensor.t", value)
    assert [(p.pub.seq, p.pub.args) for p in core.effects_of(Persist)] == \
        [(1, [1]), (2, [2]), (3, [3])]


def test_the_first_stored_publication_records_the_clocks_anchor_before_it():
    core = CoreRouter(CONFIG)
    published(core.connect(), "sensor.t", 1)
    kinds = [type(e) for e in core.effects if isinstance(e, ClockStep | Persist)]
    assert kinds == [ClockStep, Persist]


def test_subscribe_with_get_retained_answers_subscribed_then_the_retained_event():
    core = CoreRouter(CONFIG)
    published(core.connect(), "sensor.t", 20.5, retain=True)
    subscriber = core.connect()
    subscribed, event = subscriber.send(m.Subscribe(7, "sensor.t", get_retained=True))
    assert isinstance(subscribed, m.Subscribed) and subscribed.request == 7
    assert event.MESSAGE_TYPE == m.Event.MESSAGE_TYPE and event.body[2] == [20.5]


def test_get_events_asks_the_store_for_the_callers_page_and_answers_with_its_rows():
    core = CoreRouter(CONFIG)
    reader = core.connect()
    [sub_id] = of_type(reader.send(m.Subscribe(1, "sensor", match="prefix")), m.Subscribed)
    assert reader.send(m.Call(2, "wamp.subscription.get_events",
                              args=[sub_id.subscription], kwargs={"limit": 5})) == []
    read: HistoryRead = core.reads[0].request
    assert (read.uri, read.match, read.caller, read.limit) == (
        "sensor", "prefix", (reader.session.authid, "anonymous"), 6)
    core.answer_read([])
    [result] = of_type(reader.inbox, m.Result)
    assert result.args == [[]] and result.kwargs == {"is_limit_reached": False}


def test_get_events_on_a_subscription_without_history_is_refused_without_a_read():
    core = CoreRouter(CONFIG)
    reader = core.connect()
    [sub] = of_type(reader.send(m.Subscribe(1, "live", match="prefix")), m.Subscribed)
    [error] = reader.send(m.Call(2, "wamp.subscription.get_events", args=[sub.subscription]))
    assert error.error == "wamp.error.invalid_argument"
    assert core.effects_of(Read) == []


# -- the session's states ------------------------------------------------------------------


def opening(core: CoreRouter) -> Peer:
    peer = Peer(core, Session(transport={"type": "memory", "peer": "memory"}))
    peer.session.link = peer
    return peer


def test_anything_but_hello_first_aborts_the_session_as_a_protocol_violation():
    core = CoreRouter(CONFIG)
    peer = opening(core)
    [abort] = peer.send(m.Subscribe(1, "sensor.t"))
    assert (abort.reason, peer.session.state) == ("wamp.error.protocol_violation",
                                                  SessionState.CLOSED)
    assert "expected HELLO, got SUBSCRIBE" in abort.message


def test_a_challenged_session_accepts_only_authenticate():
    core = CoreRouter(CONFIG)
    peer = core.connect(authmethods=["ticket"], authid="root")
    assert peer.session.state is SessionState.CHALLENGED
    [abort] = peer.send(m.Publish(1, "sensor.t"))
    assert "expected AUTHENTICATE, got PUBLISH" in abort.message


def test_authenticate_with_the_secret_establishes_the_session():
    core = CoreRouter(CONFIG)
    peer = core.connect(authmethods=["ticket"], authid="root")
    [welcome] = peer.send(m.Authenticate("s3cret"))
    assert isinstance(welcome, m.Welcome) and peer.session.state is SessionState.ESTABLISHED


def test_a_closed_session_is_not_heard_any_more():
    core = CoreRouter(CONFIG)
    peer = core.connect()
    [goodbye] = peer.send(m.Goodbye())
    assert goodbye.reason == "wamp.close.goodbye_and_out" and peer.closed
    assert peer.send(m.Publish(2, "sensor.t", args=[1], acknowledge=True)) == []
    assert core.effects_of(Persist) == []


def test_a_closed_session_cannot_be_moved_anywhere():
    session = Session()
    session.to(SessionState.CLOSED)
    for state in SessionState:
        with pytest.raises(IllegalTransition):
            session.to(state)


# -- publisher exclusion and black/white lists (WAMP "Subscriber Black- and Whitelisting",
#    "Publisher Exclusion"); tests/system/test_broker.py sends the same options over every wire ----


def subscribed(core: CoreRouter, topic: str = "com.bw", **hello: object) -> Peer:
    peer = core.connect(**hello)
    peer.send(m.Subscribe(1, topic))
    return peer


def delivered(peer: Peer) -> list:
    """The first argument of each EVENT the peer has received, in order."""
    return [msg.args[0] for msg in of_type(peer.inbox, m.Event)]


def publish_each(publisher: Peer, *options: dict) -> None:
    for n, extra in enumerate(options):
        publisher.send(m.Publish(100 + n, "com.bw", args=[n], **extra))


def test_the_publisher_does_not_receive_its_own_event_by_default():
    core = CoreRouter(CONFIG)
    publisher = subscribed(core)
    publish_each(publisher, {}, {"exclude_me": False})
    assert delivered(publisher) == [1]


def test_exclude_drops_the_listed_sessions():
    core = CoreRouter(CONFIG)
    a, b, publisher = subscribed(core), subscribed(core), core.connect()
    publish_each(publisher, {"exclude": [a.session.id]})
    assert (delivered(a), delivered(b)) == ([], [0])


def test_eligible_delivers_only_to_the_listed_sessions():
    core = CoreRouter(CONFIG)
    a, b, publisher = subscribed(core), subscribed(core), core.connect()
    publish_each(publisher, {"eligible": [a.session.id]})
    assert (delivered(a), delivered(b)) == ([0], [])


def test_an_empty_eligible_list_delivers_to_nobody():
    core = CoreRouter(CONFIG)
    a, b, publisher = subscribed(core), subscribed(core), core.connect()
    publish_each(publisher, {"eligible": []})
    assert (delivered(a), delivered(b)) == ([], [])


def test_exclude_takes_precedence_over_eligible():
    core = CoreRouter(CONFIG)
    a, b, publisher = subscribed(core), subscribed(core), core.connect()
    publish_each(publisher, {"eligible": [a.session.id, b.session.id],
                             "exclude": [b.session.id]})
    assert (delivered(a), delivered(b)) == ([0], [])


def test_exclude_authid_drops_sessions_with_a_listed_authid():
    core = CoreRouter(CONFIG)
    alice, bob = subscribed(core), subscribed(core)  # (the router names them)
    publish_each(core.connect(), {"exclude_authid": [alice.session.authid, "carol"]})
    assert (delivered(alice), delivered(bob)) == ([], [0])


def test_eligible_authid_delivers_only_to_sessions_with_a_listed_authid():
    core = CoreRouter(CONFIG)
    alice, bob = subscribed(core), subscribed(core)  # (the router names them)
    publish_each(core.connect(), {"eligible_authid": [alice.session.authid, "carol"]})
    assert (delivered(alice), delivered(bob)) == ([0], [])


def test_exclude_authrole_drops_only_sessions_with_a_listed_authrole():
    core = CoreRouter(CONFIG)
    subscriber = subscribed(core)  # anonymous sessions have the role "anonymous"
    publish_each(core.connect(), {"exclude_authrole": ["anonymous"]},
                 {"exclude_authrole": ["admin"]})
    assert delivered(subscriber) == [1]


def test_eligible_authrole_delivers_only_to_sessions_with_a_listed_authrole():
    core = CoreRouter(CONFIG)
    subscriber = subscribed(core)
    publish_each(core.connect(), {"eligible_authrole": ["anonymous", "admin"]},
                 {"eligible_authrole": ["admin"]})
    assert delivered(subscriber) == [0]


def test_eligible_does_not_override_publisher_exclusion():
    core = CoreRouter(CONFIG)
    publisher = subscribed(core)
    publish_each(publisher, {"eligible": [publisher.session.id]})
    assert delivered(publisher) == []


# -- which registration a CALL goes to (WAMP "Pattern-based Registration", "Shared
#    Registration"); tests/system/test_dealer.py calls over every wire ---------------------


def registered(core: CoreRouter, procedure: str, **options: object) -> Peer:
    callee = core.connect()
    [ack] = callee.send(m.Register(1, procedure, **options))
    assert isinstance(ack, m.Registered), ack
    return callee


def called(core: CoreRouter, caller: Peer, procedure: str, **options: object) -> Peer | None:
    """Which callee got the INVOCATION of a CALL (answered at once, so it is not pending)."""
    before = {id(p): len(p.inbox) for p in core.peers}
    caller.send(m.Call(next(core.requests), procedure, **options))
    for peer in core.peers:
        new = of_type(peer.inbox[before.get(id(peer), 0):], m.Invocation)
        if new:
            peer.send(m.Yield(new[0].request, args=["done"]))
            return peer
    return None


@pytest.mark.parametrize(("registrations", "calls"), [
    ([("com.app", "prefix"), ("com.app.run", "exact")],
     {"com.app.run": 1, "com.app.stop": 0}),
    ([("com.app", "prefix"), ("com.app.admin", "prefix")],
     {"com.app.admin.reset": 1, "com.app.user.reset": 0}),
    ([("com..reset", "wildcard"), ("com.app", "prefix")],
     {"com.app.reset": 1, "com.other.reset": 0}),
], ids=["exact-beats-prefix", "longer-prefix-beats-shorter", "prefix-beats-wildcard"])
def test_the_most_specific_registration_gets_the_call(registrations, calls):
    core = CoreRouter(CONFIG)
    callees = [registered(core, uri, match=match) for uri, match in registrations]
    caller = core.connect()
    assert {p: callees.index(called(core, caller, p)) for p in calls} == calls


def shared(core: CoreRouter, invoke: str, count: int = 3) -> list[Peer]:
    return [registered(core, "com.shared", invoke=invoke) for _ in range(count)]


def test_roundrobin_alternates_among_the_callees():
    core = CoreRouter(CONFIG)
    callees, caller = shared(core, "roundrobin"), core.connect()
    picks = [called(core, caller, "com.shared") for _ in range(7)]
    assert [callees.index(p) for p in picks] == [0, 1, 2, 0, 1, 2, 0]


def test_invoke_first_and_last_always_pick_the_first_and_last_registered_callee():
    core = CoreRouter(CONFIG)
    firsts, caller = shared(core, "first"), core.connect()
    assert {called(core, caller, "com.shared") for _ in range(4)} == {firsts[0]}
    core = CoreRouter(CONFIG)
    lasts, caller = shared(core, "last"), core.connect()
    assert {called(core, caller, "com.shared") for _ in range(4)} == {lasts[-1]}


def test_joining_a_shared_registration_with_another_policy_is_refused():
    core = CoreRouter(CONFIG)
    registered(core, "com.shared", invoke="roundrobin")
    [error] = core.connect().send(m.Register(2, "com.shared", invoke="first"))
    assert error.error == "wamp.error.procedure_already_exists"


def test_calls_go_to_the_remaining_callee_when_a_shared_callee_leaves():
    core = CoreRouter(CONFIG)
    leaving, staying = shared(core, "roundrobin", 2)
    leaving.send(m.Goodbye())
    caller = core.connect()
    assert {called(core, caller, "com.shared") for _ in range(3)} == {staying}


# -- call timeout: the core's timer, fired by hand ---------------------------------------------


def test_a_call_timeout_interrupts_the_callee_and_answers_the_caller_with_timeout():
    core = CoreRouter(CONFIG)
    callee, caller = registered(core, "com.slow"), core.connect()
    caller.send(m.Call(7, "com.slow", timeout=200))
    [invocation] = of_type(callee.inbox, m.Invocation)
    core.fire_timers()
    [interrupt] = of_type(callee.inbox, m.Interrupt)
    assert (interrupt.request, interrupt.mode) == (invocation.request, "killnowait")
    [error] = of_type(caller.inbox, m.Error)
    assert (error.request, error.error) == (7, "wamp.error.timeout")
    assert callee.send(m.Yield(invocation.request, args=["too late"])) == []
    assert of_type(caller.inbox, m.Result) == []


def test_a_call_answered_before_its_timeout_is_not_interrupted():
    core = CoreRouter(CONFIG)
    callee, caller = registered(core, "com.quick"), core.connect()
    caller.send(m.Call(7, "com.quick", timeout=100))
    [invocation] = of_type(callee.inbox, m.Invocation)
    callee.send(m.Yield(invocation.request, args=["quick"]))
    core.fire_timers()
    assert of_type(callee.inbox, m.Interrupt) == []
    assert [r.args for r in of_type(caller.inbox, m.Result)] == [["quick"]]


# -- subscriptions: matching, identity, unsubscribe (WAMP "Pattern-based Subscription") -------


def events_of(core: CoreRouter, topic: str, match: str, published: list[str]) -> list[str]:
    """Which of ``published`` (each published to itself as topic) a subscription gets."""
    subscriber = core.connect()
    subscriber.send(m.Subscribe(1, topic, match=match))
    publisher = core.connect()
    for n, name in enumerate(published):
        publisher.send(m.Publish(n + 1, name, args=[name]))
    return delivered(subscriber)


def test_an_exact_subscription_receives_only_its_own_topic():
    core = CoreRouter(CONFIG)
    got = events_of(core, "com.app.temp", "exact", ["com.app.temp.sub", "com.app.tem",
                                                    "com.app.temp"])
    assert got == ["com.app.temp"]


def test_a_prefix_subscription_matches_by_string_prefix():
    core = CoreRouter(CONFIG)
    got = events_of(core, "com.app", "prefix", ["com.app", "com.app.x", "com.apple", "com.ap",
                                                "org.com.app", "com.ap.p"])
    assert got == ["com.app", "com.app.x", "com.apple"]


def test_a_wildcard_subscription_matches_any_single_component():
    core = CoreRouter(CONFIG)
    got = events_of(core, "sensor..temp", "wildcard", [
        "sensor.kitchen.temp", "sensor.attic.temp", "sensor.kitchen.humidity",
        "sensor.kitchen.extra.temp", "sensor.temp", "other.kitchen.temp"])
    assert got == ["sensor.kitchen.temp", "sensor.attic.temp"]


def test_a_session_receives_one_event_per_matching_subscription_of_one_publication():
    core = CoreRouter(CONFIG)
    subscriber = core.connect()
    for n, (topic, match) in enumerate([("com.a.b", "exact"), ("com.a", "prefix"),
                                        ("com..b", "wildcard")]):
        subscriber.send(m.Subscribe(n + 1, topic, match=match))
    core.connect().send(m.Publish(9, "com.a.b", args=["once"]))
    events = of_type(subscriber.inbox, m.Event)
    assert [e.args for e in events] == [["once"]] * 3
    assert len({e.subscription for e in events}) == 3 and len({e.publication for e in events}) == 1


def subscription_of(peer: Peer, topic: str, match: str = "exact") -> int:
    [ack] = of_type(peer.send(m.Subscribe(next(peer.core.requests), topic, match=match)),
                    m.Subscribed)
    return ack.subscription


def test_sessions_subscribing_to_one_topic_and_match_share_one_subscription():
    core = CoreRouter(CONFIG)
    a, b = core.connect(), core.connect()
    assert subscription_of(a, "com.shared") == subscription_of(b, "com.shared")
    assert subscription_of(a, "com.shared", "prefix") != subscription_of(b, "com.shared")


def test_subscribing_twice_from_one_session_gives_the_same_subscription_and_one_event():
    core = CoreRouter(CONFIG)
    peer = core.connect()
    assert subscription_of(peer, "com.twice") == subscription_of(peer, "com.twice")
    core.connect().send(m.Publish(1, "com.twice", args=["x"]))
    assert delivered(peer) == ["x"]


def test_unsubscribe_stops_events_and_keeps_the_other_subscribers():
    core = CoreRouter(CONFIG)
    leaving, staying = core.connect(), core.connect()
    sub = subscription_of(leaving, "com.t")
    subscription_of(staying, "com.t")
    [ack] = leaving.send(m.Unsubscribe(5, sub))
    assert isinstance(ack, m.Unsubscribed) and ack.request == 5
    core.connect().send(m.Publish(1, "com.t", args=["after"]))
    assert (delivered(leaving), delivered(staying)) == ([], ["after"])


def test_unsubscribing_what_the_session_does_not_hold_gives_no_such_subscription():
    core = CoreRouter(CONFIG)
    owner, other = core.connect(), core.connect()
    sub = subscription_of(owner, "com.owned")
    refused = [other.send(m.Unsubscribe(3, 123456789)), other.send(m.Unsubscribe(4, sub))]
    owner.send(m.Unsubscribe(5, sub))
    refused.append(owner.send(m.Unsubscribe(6, sub)))  # twice
    assert [(e.request, e.error) for [e] in refused] == \
        [(n, "wamp.error.no_such_subscription") for n in (3, 4, 6)]


def test_a_session_that_leaves_is_removed_from_its_subscriptions():
    core = CoreRouter(CONFIG)
    leaving, staying = core.connect(), core.connect()
    sub = subscription_of(staying, "com.t")
    subscription_of(leaving, "com.t")

    def count() -> int:
        [result] = of_type(staying.send(m.Call(next(core.requests),
                                               "wamp.subscription.count_subscribers",
                                               args=[sub])), m.Result)
        return result.args[0]

    assert count() == 2
    leaving.send(m.Goodbye())
    assert count() == 1


# -- CANCEL (WAMP "Call Canceling"): what each mode does, with nothing to wait for ------------


def call_in_progress(core: CoreRouter, callee_can_cancel: bool = True
                     ) -> tuple[Peer, Peer, m.Invocation]:
    roles = None if callee_can_cancel else {"callee": role.RoleCalleeFeatures()}
    callee = core.connect(roles=roles)
    callee.send(m.Register(1, "com.slow"))
    caller = core.connect()
    caller.send(m.Call(1, "com.slow", args=["x"]))
    [invocation] = of_type(callee.inbox, m.Invocation)
    return caller, callee, invocation


def canceled(peer: Peer) -> list[tuple[int, str]]:
    return [(e.request, e.error) for e in of_type(peer.inbox, m.Error)]


def test_cancel_skip_answers_the_caller_at_once_and_drops_the_callees_late_answer():
    core = CoreRouter(CONFIG)
    caller, callee, invocation = call_in_progress(core)
    caller.send(m.Cancel(1, mode="skip"))
    assert canceled(caller) == [(1, "wamp.error.canceled")]
    assert of_type(callee.inbox, m.Interrupt) == []
    callee.send(m.Yield(invocation.request, args=["late"]))
    assert of_type(caller.inbox, m.Result) == []


def test_cancel_kill_interrupts_the_callee_and_forwards_its_answer():
    core = CoreRouter(CONFIG)
    caller, callee, invocation = call_in_progress(core)
    caller.send(m.Cancel(1, mode="kill"))
    [interrupt] = of_type(callee.inbox, m.Interrupt)
    assert (interrupt.request, interrupt.mode, interrupt.reason) == \
        (invocation.request, "kill", "wamp.error.canceled")
    assert canceled(caller) == []  # kill: the caller waits for the callee
    callee.send(m.Error(m.Invocation.MESSAGE_TYPE, invocation.request, "wamp.error.canceled",
                        args=["stopped"]))
    [error] = of_type(caller.inbox, m.Error)
    assert (error.request, error.error, error.args) == (1, "wamp.error.canceled", ["stopped"])


def test_cancel_killnowait_answers_the_caller_at_once_and_interrupts_the_callee():
    core = CoreRouter(CONFIG)
    caller, callee, invocation = call_in_progress(core)
    caller.send(m.Cancel(1, mode="killnowait"))
    [interrupt] = of_type(callee.inbox, m.Interrupt)
    assert interrupt.mode == "killnowait"
    assert canceled(caller) == [(1, "wamp.error.canceled")]
    callee.send(m.Error(m.Invocation.MESSAGE_TYPE, invocation.request, "wamp.error.canceled"))
    assert canceled(caller) == [(1, "wamp.error.canceled")]  # the callee's answer is dropped


def test_cancel_without_a_mode_is_killnowait():
    core = CoreRouter(CONFIG)
    caller, callee, _ = call_in_progress(core)
    caller.send(m.Cancel(1))
    assert [i.mode for i in of_type(callee.inbox, m.Interrupt)] == ["killnowait"]
    assert canceled(caller) == [(1, "wamp.error.canceled")]


def test_cancel_falls_back_to_skip_for_a_callee_without_call_canceling():
    core = CoreRouter(CONFIG)
    caller, callee, invocation = call_in_progress(core, callee_can_cancel=False)
    caller.send(m.Cancel(1, mode="kill"))  # kill would wait for the callee's answer
    assert canceled(caller) == [(1, "wamp.error.canceled")]
    assert of_type(callee.inbox, m.Interrupt) == []
    callee.send(m.Yield(invocation.request, args=["late"]))
    assert of_type(caller.inbox, m.Result) == []


def test_cancel_after_the_result_is_ignored():
    core = CoreRouter(CONFIG)
    caller, callee, invocation = call_in_progress(core)
    callee.send(m.Yield(invocation.request, args=["done"]))
    assert caller.send(m.Cancel(1, mode="kill")) == []
    assert of_type(callee.inbox, m.Interrupt) == []
