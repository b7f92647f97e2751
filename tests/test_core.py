"""The protocol core in memory (harness.core): what the router decides, message by message,
with no socket, event loop or store in between. The same behaviours meet real sockets in
test_broker.py, test_retention.py and test_history.py."""

from __future__ import annotations

import pytest
from autobahn.wamp import message as m

from gateway.core import (
    ClockStep,
    IllegalTransition,
    KeepSubscription,
    Persist,
    Read,
    Session,
    SessionState,
)
from gateway.publication import HistoryRead, StorageError
from harness.core import CoreRouter, Peer, of_type

CONFIG = """
[router]
data_dir = "unused"

[[realms]]
name = "realm1"
anonymous_role = "anonymous"

  [[realms.roles]]
  name = "anonymous"
  permissions = [
    { uri = "", match = "prefix", allow = ["publish", "subscribe", "call", "register"] },
  ]

  [[realms.users]]
  authid = "root"
  role = "anonymous"
  secret = "s3cret"

  [[realms.history]]
  uri = "sensor"
  match = "prefix"
"""


def published(peer, topic: str, value: object, **options: object) -> list:
    return peer.send(m.Publish(1, topic, args=[value], acknowledge=True, **options))


def test_a_history_rules_subscription_is_kept_from_the_start():
    core = CoreRouter(CONFIG)
    [kept] = core.effects_of(KeepSubscription)
    assert (kept.uri, kept.match) == ("sensor", "prefix")


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
    reader = core.connect(authid="alice")
    [sub_id] = of_type(reader.send(m.Subscribe(1, "sensor", match="prefix")), m.Subscribed)
    assert reader.send(m.Call(2, "wamp.subscription.get_events",
                              args=[sub_id.subscription], kwargs={"limit": 5})) == []
    read: HistoryRead = core.reads[0].request
    assert (read.uri, read.match, read.caller, read.limit) == ("sensor", "prefix",
                                                               ("alice", "anonymous"), 6)
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
