"""The history topics a realm keeps, within their bounds (gateway.core.history_topics), on the
core in memory: a client's share, the realm's bound, and the drivers past both. What the
store and a restart show is in test_hostile_clients.py."""

from __future__ import annotations

from typing import Any

from autobahn.wamp import message as m

from cairn.gateway.core.retention import RetainedEvent
from cairn.gateway.core.session import Persist
from harness.config import (
    history_rule,
    named_users,
    permission,
    realm,
    role,
    router_table,
    ticket_of,
)
from harness.core import CoreRouter, Peer, of_type

PUB_SUB = ["publish", "subscribe"]
CONFIG = router_table("unused", extra=(
    "[router.limits]\nmax_history_topics = 6\nmax_history_topics_per_client = 3\n")) + realm(
    "realm1", role("user", permission("sensor", PUB_SUB), permission("wamp", ["call"])),
    named_users("user", "meter-1"), history_rule("sensor"), anonymous_role="user")


def anonymous(core: CoreRouter, address: str) -> Peer:
    peer = core.connect()
    peer.session.transport["peer"] = f"tcp4:{address}:40000"
    return peer


def publish(peer: Peer, topic: str, **options: Any) -> m.Published | m.Error:
    request = next(peer.core.requests)
    [answer] = [msg for msg in peer.send(m.Publish(request, topic, args=[1], acknowledge=True,
                                                   **options))
                if isinstance(msg, m.Published | m.Error) and msg.request == request]
    return answer


def stored(core: CoreRouter, topic: str) -> list[Persist]:
    """The Persist effects of ``topic``'s publications that history keeps."""
    return [p for p in core.effects_of(Persist)
            if p.pub.topic == topic and p.pub.history_rule is not None]


def test_a_client_past_its_share_of_history_topics_gets_its_publication_delivered_not_stored():
    core = CoreRouter(CONFIG)
    watcher = core.connect()
    watcher.send(m.Subscribe(1, "sensor", match="prefix"))
    publisher = anonymous(core, "10.0.0.2")
    for i in range(3):
        assert isinstance(publish(publisher, f"sensor.t{i}"), m.Published)
    refused = publish(publisher, "sensor.t3")
    assert isinstance(refused, m.Error) and refused.error == "cairn.error.limit_reached"
    assert "not stored in history: max_history_topics_per_client" in refused.args[0]
    assert [e.topic for e in of_type(watcher.inbox, m.Event)][-1] == "sensor.t3"
    assert stored(core, "sensor.t3") == []


def test_a_topic_a_client_already_has_keeps_its_history_past_the_share():
    core = CoreRouter(CONFIG)
    publisher = anonymous(core, "10.0.0.2")
    for i in range(4):
        publish(publisher, f"sensor.t{i}")
    assert isinstance(publish(publisher, "sensor.t0"), m.Published)
    assert len(stored(core, "sensor.t0")) == 2


def test_reconnecting_from_the_same_address_gives_no_new_share():
    core = CoreRouter(CONFIG)
    for i in range(3):
        publish(anonymous(core, "10.0.0.2"), f"sensor.t{i}")
    assert isinstance(publish(anonymous(core, "10.0.0.2"), "sensor.t3"), m.Error)
    assert isinstance(publish(anonymous(core, "10.0.0.3"), "sensor.t3"), m.Published)


def test_a_full_realm_refuses_new_history_topics_to_clients_and_not_to_drivers():
    core = CoreRouter(CONFIG)
    for address in ("10.0.0.2", "10.0.0.3"):
        peer = anonymous(core, address)
        for i in range(3):
            publish(peer, f"sensor.{address}.t{i}")
    refused = publish(anonymous(core, "10.0.0.4"), "sensor.new")
    assert isinstance(refused, m.Error)
    assert "not stored in history: max_history_topics: the realm keeps history for 6 " \
        "topics" in refused.args[0]
    driver = core.connect(authmethods=["ticket"], authid="meter-1")
    driver.send(m.Authenticate(ticket_of("meter-1")))
    for i in range(4):
        assert isinstance(publish(driver, f"sensor.meter.t{i}"), m.Published)
    assert len(stored(core, "sensor.meter.t3")) == 1


def test_a_retained_publication_refused_a_history_topic_is_still_retained():
    core = CoreRouter(CONFIG)
    publisher = anonymous(core, "10.0.0.2")
    for i in range(3):
        publish(publisher, f"sensor.t{i}")
    refused = publish(publisher, "sensor.t3", retain=True)
    assert "not retained" not in refused.args[0]
    [persist] = [p for p in core.effects_of(Persist) if p.pub.topic == "sensor.t3"]
    assert persist.pub.retain and persist.pub.history_rule is None
    late = core.connect()
    late.send(m.Subscribe(2, "sensor.t3", get_retained=True))
    [retained] = of_type(late.inbox, RetainedEvent)
    assert retained.pub.topic == "sensor.t3"
