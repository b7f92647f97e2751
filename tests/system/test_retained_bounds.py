"""Retained delivery that cannot be used against the people it serves (issue 31, N3-N5),
each finding replayed against a real router (in this process, on real sockets, with its
SQLite store) and real autobahn clients:

- N3: large retained readings under ``sensor.`` cut every dashboard subscribing with
  get_retained off as a slow consumer, for good (they persist). Now a retained payload
  over its rule's ``max_payload`` is refused at publish, and retained events are paced
  by the subscriber's reading instead of pushed into its send buffer at once;
- N4: every serializer and pattern kind kept an encoded copy of every retained payload,
  never freed (64 MiB of payloads -> 1,100 MiB RSS). Now what the router holds for its
  retained events is what it counts (RSS figures: ``python -m bench.retained_memory``);
- N5: one anonymous session filled the realm's retained slots with junk, for good, and a
  real sensor was refused. Now a session holds a share of the slots, and when they are
  full, slots of a lower standing make room: anonymous and non-sensor ones first, a
  driver's never.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import sys
import types
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.shell.flow_control import Pacer
from harness.config import permission, realm, role, router_table, user
from harness.wamp import EVENT, HELLO, SUBSCRIBE, SUBSCRIBED, WELCOME
from harness.wamp_client import Client, RawSocketPeer, connect
from tests.conftest import RunningRouter, start_router
from tests.system.test_ops import parse_prometheus

TIMEOUT = 10
MB = 1_000_000
ACKED_RETAINED = PublishOptions(acknowledge=True, retain=True)
DRIVER_SECRET = "driver-ticket"

EVERYTHING = ("publish", "subscribe", "call", "register")
REALM = realm("realm1", role("anonymous", permission("", EVERYTHING)),
              user("driver", "anonymous", secret=DRIVER_SECRET), anonymous_role="anonymous")


class Router:
    """A router in this process on a data directory that outlives restarts, and the
    sessions of a test, closed at the end."""

    def __init__(self, tmp_path: Path, router_keys: str = "", realm_toml: str = REALM) -> None:
        self.unix_path = tmp_path / "wamp.sock"
        self.config = router_table(tmp_path / "data", rawsocket=["127.0.0.1:0",
                                                                 f"unix:{self.unix_path}"],
                                   extra=router_keys) + realm_toml
        self.data_dir = tmp_path / "data"
        self.node: Any = None
        self.sessions: list[Client] = []
        self.peers: list[RawSocketPeer] = []

    async def start(self) -> Router:
        self.node = await start_router(self.config)
        self.running = RunningRouter(self.node, str(self.unix_path))
        return self

    async def stop(self) -> None:
        for session in self.sessions:
            with contextlib.suppress(Exception):
                if session.is_attached():
                    await asyncio.wait_for(session.leave(), 2)
        self.sessions.clear()
        for peer in self.peers:
            peer.close()
        self.peers.clear()
        if self.node is not None:
            await self.node.stop()
            self.node = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def connect(self, transport: str = "websocket", serializer: str = "json",
                      **kwargs: Any) -> Client:
        session = await connect(self.running, transport, serializer, **kwargs)
        self.sessions.append(session)
        return session

    async def driver(self) -> Client:
        """A configured driver: the user "driver", logged in with its ticket."""
        return await self.connect(authmethods=["ticket"], authid="driver", secret=DRIVER_SECRET)

    @property
    def retention(self) -> Any:
        return self.node.router.realms["realm1"].retention

    async def metric(self, name: str) -> float:
        """The sum of a family's samples in /metrics (0 when it has none)."""
        def read() -> str:
            url = f"http://127.0.0.1:{self.node.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read().decode()

        family = parse_prometheus(await asyncio.to_thread(read)).get(name, {"samples": []})
        return sum(value for _, _, value in family["samples"])


@contextlib.asynccontextmanager
async def running(tmp_path: Path, router_keys: str = "", realm_toml: str = REALM):
    router = await Router(tmp_path, router_keys, realm_toml).start()
    try:
        yield router
    finally:
        await router.stop()


class Dashboard:
    """A subscriber to ``sensor.`` (prefix, get_retained), as the dashboard subscribes."""

    def __init__(self, session: Client) -> None:
        self.session = session
        self.events: list[tuple[str, bool, Any]] = []  # (topic, retained, first argument)

    @classmethod
    async def open(cls, router: Router, prefix: str = "sensor.", **kwargs: Any) -> Dashboard:
        dashboard = cls(await router.connect(**kwargs))
        await dashboard.session.subscribe(
            dashboard.on_event, prefix, options=SubscribeOptions(
                match="prefix", get_retained=True, details_arg="details"))
        return dashboard

    def on_event(self, *args: Any, details: Any = None, **kwargs: Any) -> None:
        self.events.append((details.topic, bool(details.retained), args[0] if args else None))

    async def until(self, count: int, timeout: float = TIMEOUT) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.events) < count:
            assert self.session.is_attached(), f"the dashboard was cut off after " \
                                               f"{len(self.events)} events"
            assert asyncio.get_running_loop().time() < deadline, \
                f"{len(self.events)} of {count} events within {timeout} s"
            await asyncio.sleep(0.02)


async def publish_big(session: Client, count: int, size: int = MB) -> list[str]:
    """``count`` acknowledged retained readings of ``size`` bytes under sensor.big;
    what each publish was answered (the publication id's type or the error's message)."""
    answers = []
    for i in range(count):
        try:
            await asyncio.wait_for(session.publish(
                f"sensor.big{i:02d}", i, "x" * size, options=ACKED_RETAINED), TIMEOUT)
            answers.append("published")
        except ApplicationError as e:
            answers.append(f"{e.error}: {e.args[0]}")
    return answers


# -- N3: large retained readings --------------------------------------------------------------

# 1 MB messages; 20 MB from one session in a test
BIG_MESSAGES = "max_message_size = 2097152\nsend_buffer_limit = 1048576\n[router.limits]\n"


async def test_a_retained_payload_over_its_rules_bound_is_refused_at_publish(tmp_path):
    """The default bound, 64 KiB: 20 readings of 1 MB under sensor. are delivered live but
    not retained, each acknowledged publish answered with an error that says why; a
    dashboard subscribing afterwards gets the readings that fit, and keeps its connection."""
    async with running(tmp_path, BIG_MESSAGES) as router:
        sensor = await router.connect("rawsocket-unix", "msgpack")
        live = await Dashboard.open(router)
        answers = await publish_big(sensor, 20)
        assert all(a.startswith("cairn.error.limit_reached: ") for a in answers), answers
        assert "over the 65536 bytes a retained payload on 'sensor.big00' may have" in answers[0]
        assert "max_retained_payload" in answers[0] and "not retained" in answers[0]
        await live.until(20)  # delivered live all the same
        await sensor.publish("sensor.small", "fits", options=ACKED_RETAINED)

        late = await Dashboard.open(router)
        await late.until(1)
        await sensor.publish("sensor.live", "after", options=ACKED_RETAINED)
        await late.until(2)
        assert late.events == [("sensor.small", True, "fits"), ("sensor.live", False, "after")]
        assert router.retention.count == 2
        assert await router.metric("cairn_limit_hits_total") >= 20

    # per rule: a rule with a larger bound takes them, others keep theirs
    rules = REALM + ('\n  [[realms.retention]]\n  uri = "sensor.big"\n  match = "prefix"\n'
                     '  max_payload = 1100000\n')
    async with running(tmp_path / "ruled", BIG_MESSAGES, rules) as router:
        sensor = await router.connect("rawsocket-unix", "msgpack")
        assert await publish_big(sensor, 1) == ["published"]
        with pytest.raises(ApplicationError) as refused:
            await sensor.publish("sensor.other", "x" * 70_000, options=ACKED_RETAINED)
        assert "max_retained_payload" in refused.value.args[0]


async def test_a_bound_lowered_drops_the_stored_payloads_over_it_at_start(tmp_path):
    """Readings retained under a larger bound stay out once it is lowered: the store no
    longer serves them after a restart (they were "durable" in the finding)."""
    rules = REALM + ('\n  [[realms.retention]]\n  uri = "sensor"\n  match = "prefix"\n'
                     '  max_payload = 1100000\n')
    router = await Router(tmp_path, BIG_MESSAGES, rules).start()
    try:
        sensor = await router.connect("rawsocket-unix", "msgpack")
        assert await publish_big(sensor, 3) == ["published"] * 3
        await sensor.publish("sensor.small", "fits", options=ACKED_RETAINED)
        router.config = router.config.replace("max_payload = 1100000", "max_payload = 1000")
        await router.restart()
        dashboard = await Dashboard.open(router)
        await dashboard.until(1)
        await asyncio.sleep(0.2)
        assert dashboard.events == [("sensor.small", True, "fits")]
    finally:
        await router.stop()
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "cairn.db")) as db:
        assert db.execute("SELECT topic FROM retained WHERE topic != ?",  # not the router's
                          (HEALTH_TOPIC,)).fetchall() == [("sensor.small",)]


def connection_of(router: Router, session_id: int) -> Any:
    return next(c for c in router.node.state.connections if c.session.id == session_id)


async def test_retained_events_are_paced_by_the_subscribers_reading_not_cut(tmp_path):
    """20 retained readings of 1 MB under sensor. (a rule allows them) against a 1 MiB send
    buffer: every dashboard subscribing with get_retained used to be disconnected as a slow
    consumer at once, and after every restart. Now each gets all 20, then live events; one
    that does not read holds the router to less than its send buffer, and gets them all
    once it reads."""
    rules = REALM + ('\n  [[realms.retention]]\n  uri = "sensor"\n  match = "prefix"\n'
                     '  max_payload = 1100000\n')
    # 20 MB from one session: more than its share of max_retained_bytes (a quarter)
    limits = "max_retained_per_session = 5000\n"  # (in BIG_MESSAGES' [router.limits])
    router = await Router(tmp_path, BIG_MESSAGES + limits, rules).start()
    try:
        sensor = await router.connect("rawsocket-unix", "msgpack")
        assert await publish_big(sensor, 20) == ["published"] * 20
        for transport, serializer in (("websocket", "json"), ("rawsocket-tcp", "cbor")):
            dashboard = await Dashboard.open(router, transport=transport, serializer=serializer)
            await dashboard.until(20)
            sensor.publish("sensor.live", "live")
            await dashboard.until(21)
            assert dashboard.events[:20] == [(f"sensor.big{i:02d}", True, i) for i in range(20)]
            assert dashboard.events[20] == ("sensor.live", False, "live")
        sensor.publish("sensor.big03", "newer", options=PublishOptions(retain=True))
        assert router.node.state.slow_consumers == 0

        # one that does not read
        peer = await RawSocketPeer.open(router.node.rawsocket_ports[0], "msgpack")
        router.peers.append(peer)
        peer.send([HELLO, "realm1", {"roles": {"subscriber": {}}}])
        welcome = await peer.receive(TIMEOUT)
        assert welcome[0] == WELCOME
        peer.send([SUBSCRIBE, 1, {"match": "prefix", "get_retained": True}, "sensor."])
        connection = None
        for _ in range(50):
            await asyncio.sleep(0.02)
            connection = connection_of(router, welcome[1])
            held = connection.transport.transport.unsent()
            assert held <= 1_048_576, f"{held} bytes wait for a peer that does not read"
        assert connection._open
        got = [await peer.receive(TIMEOUT) for _ in range(21)]
        assert got[0][0] == SUBSCRIBED
        assert [(e[0], e[3].get("retained"), e[3]["topic"]) for e in got[1:]] == \
            [(EVENT, True, f"sensor.big{i:02d}") for i in range(20) if i != 3] + \
            [(EVENT, True, "sensor.big03")]

        await router.restart()  # they persist; so does their delivery
        dashboard = await Dashboard.open(router)
        await dashboard.until(20)
        assert router.node.state.slow_consumers == 0
    finally:
        await router.stop()


# -- N4: what the router holds for retained events ------------------------------------------

_NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
             types.MethodType)


def held_bytes(root: Any) -> int:
    """The bytes of every object reachable from ``root`` (each once), but code."""
    seen: set[int] = set()
    todo, total = [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _NOT_DATA):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


async def test_the_router_holds_for_retained_events_what_it_counts(tmp_path):
    """64 retained payloads of 64,000 bytes, fetched by subscribers in JSON, MsgPack and
    CBOR, exact and prefix, twice: what the retained slots hold (payloads, any encoded
    copies) stays within what the router counts for them (cairn_retained_bytes and
    cairn_retained_cache_bytes), and the cache within its bound. An encoded copy per
    serializer and pattern kind, never freed, was what took 64 MiB to 1,100 MiB."""
    async with running(tmp_path) as router:
        sensor = await router.connect("rawsocket-unix", "msgpack")
        blob = "x" * 64_000
        await asyncio.gather(*(sensor.publish(f"sensor.mem.t{k:02d}", k, blob,
                                              options=ACKED_RETAINED) for k in range(64)))
        for _ in range(2):
            for serializer in ("json", "msgpack", "cbor"):
                dashboard = await Dashboard.open(router, "sensor.mem", serializer=serializer)
                await dashboard.until(64)
                exact = await router.connect(serializer=serializer)
                got: list[int] = []
                for k in range(64):
                    await exact.subscribe(lambda k, blob, got=got: got.append(k),
                                          f"sensor.mem.t{k:02d}",
                                          options=SubscribeOptions(get_retained=True))
                for _ in range(200):
                    if len(got) == 64:
                        break
                    await asyncio.sleep(0.02)
                assert sorted(got) == list(range(64))
                await exact.leave()
                await dashboard.session.leave()
        counted = await router.metric("cairn_retained_bytes") + \
            await router.metric("cairn_retained_cache_bytes")
        held = held_bytes(router.retention)
        assert await router.metric("cairn_retained_bytes") >= 64 * 64_000
        assert held <= counted * 1.05 + 256 * 1024, \
            f"the retained slots hold {held} bytes, the router counts {counted:.0f}"
        assert await router.metric("cairn_retained_cache_bytes") <= 64 * 2**20 // 16


# -- N5: the realm's retained slots ------------------------------------------------------------

async def test_one_session_cannot_take_the_realms_retained_slots(tmp_path):
    """One anonymous session publishes retained to 10,000 junk topics: it holds its share
    (max_retained_per_session, 2,500), and a new real sensor is still retained."""
    async with running(tmp_path) as router:
        junk = await router.connect("rawsocket-tcp", "msgpack")
        for start in range(0, 10_000, 500):
            for i in range(start, start + 500):
                junk.publish(f"junk.{i}", i, options=PublishOptions(retain=True))
            await junk.call("wamp.session.count")  # (the publishes before it are handled)
        assert router.retention.count == 2_500
        assert await router.metric("cairn_limit_hits_total") >= 7_500

        sensor = await router.connect()
        await sensor.publish("sensor.real", 21.5, options=ACKED_RETAINED)
        dashboard = await Dashboard.open(router)
        await dashboard.until(1)
        assert dashboard.events == [("sensor.real", True, 21.5)]


async def test_when_the_slots_are_full_junk_goes_first_and_a_drivers_never(tmp_path):
    """The realm's 40 slots filled: 10 by a configured driver (its sensors), 3 by an
    anonymous sensor, 2 by a driver on the Unix socket, the rest by two anonymous junk
    sessions. Junk takes no slot from anyone then; a new sensor, anonymous or a driver's,
    takes a junk one (the least recently published); nothing takes a driver's; and after
    a restart the store holds what the router held."""
    limits = "[router.limits]\nmax_retained = 40\nmax_retained_per_session = 15\n"
    async with running(tmp_path, limits) as router:
        driver = await router.driver()
        for i in range(10):
            await driver.publish(f"sensor.d{i}", i, options=ACKED_RETAINED)
        anonymous = await router.connect()
        for i in range(3):
            await anonymous.publish(f"sensor.a{i}", i, options=ACKED_RETAINED)
        local = await router.connect("rawsocket-unix", "msgpack")
        for i in range(2):
            await local.publish(f"sensor.u{i}", i, options=ACKED_RETAINED)
        for j in range(2):
            junk = await router.connect()
            for i in range(15):
                try:
                    await junk.publish(f"junk.{j}.{i}", i, options=ACKED_RETAINED)
                except ApplicationError as e:
                    assert "max_retained:" in e.args[0], e.args[0]
        assert router.retention.count == 40  # 25 junk slots: the last 5 were refused

        with pytest.raises(ApplicationError) as refused:  # nothing of lower standing
            await junk.publish("junk.more", 1, options=ACKED_RETAINED)
        assert "max_retained: 40 retained slots exist" in refused.value.args[0]
        await anonymous.publish("sensor.new", "in", options=ACKED_RETAINED)
        await driver.publish("sensor.d10", "in", options=ACKED_RETAINED)
        await local.publish("sensor.u2", "in", options=ACKED_RETAINED)
        assert router.retention.count == 40
        assert await router.metric("cairn_limit_hits_total") >= 3

        # anonymous sessions on sensor topics (standing 1) take the junk slots, and then none
        for j, name in enumerate("xy"):
            flood = await router.connect()
            for i in range(15 if j == 0 else 7):
                await flood.publish(f"sensor.{name}{i}", i, options=ACKED_RETAINED)
        with pytest.raises(ApplicationError) as refused:
            await flood.publish("sensor.y7", 7, options=ACKED_RETAINED)
        assert "max_retained: 40 retained slots exist" in refused.value.args[0]

        expected = {f"sensor.d{i}" for i in range(11)} | {f"sensor.u{i}" for i in range(3)} | \
            {f"sensor.a{i}" for i in range(3)} | {"sensor.new"} | \
            {f"sensor.x{i}" for i in range(15)} | {f"sensor.y{i}" for i in range(7)}
        assert len(expected) == 40
        dashboard = await Dashboard.open(router)
        await dashboard.until(40)
        assert {topic for topic, _, _ in dashboard.events} == expected

        await router.restart()
        dashboard = await Dashboard.open(router)
        await dashboard.until(40)
        assert {topic for topic, _, _ in dashboard.events} == expected
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "cairn.db")) as db:
        assert db.execute("SELECT COUNT(*) FROM retained WHERE topic != ?",
                          (HEALTH_TOPIC,)).fetchone()[0] == 40


# -- the pacer, on a connection that takes what the test says ---------------------------------

class Peer:
    """What a connection has written and the peer not read yet: ``unsent`` bytes."""

    def __init__(self) -> None:
        self.unsent = 0
        self.written: list[bytes] = []
        self.cut: list[int] = []

    def write(self, payload: bytes) -> None:
        self.written.append(payload)
        self.unsent += len(payload)


class Stream:
    def __init__(self, *sizes: int) -> None:
        self.payloads = [bytes([i]) * size for i, size in enumerate(sizes)]

    def next(self) -> bytes | None:
        return self.payloads.pop(0) if self.payloads else None


def test_the_pacer_writes_a_stream_as_the_peer_reads_and_the_rest_behind_it():
    peer = Peer()
    pacer = Pacer(lambda: peer.unsent, lambda msg: msg, peer.write, 1000, peer.cut.append)
    pacer.window = 100
    pacer.stream(Stream(60, 60, 950, 10))
    assert [len(p) for p in peer.written] == [60, 60]  # then more than the window waits
    pacer.queue(b"L" * 30)  # a live message: behind the stream
    pacer.pump()
    assert [len(p) for p in peer.written] == [60, 60]
    peer.unsent = 90
    pacer.pump()  # 950 more would pass the limit: it waits for the peer to read
    assert [len(p) for p in peer.written] == [60, 60]
    peer.unsent = 0
    pacer.pump()
    assert [len(p) for p in peer.written] == [60, 60, 950]
    peer.unsent = 40
    pacer.pump()
    assert [len(p) for p in peer.written] == [60, 60, 950, 10, 30]
    assert peer.written[-1] == b"L" * 30 and not pacer.waiting and peer.cut == []

    pacer.stream(Stream(100, 100))  # 80 unsent: one goes, the other waits
    assert peer.unsent == 180
    pacer.queue(b"L" * 900)  # live bytes and unsent ones over the limit: a slow consumer
    assert peer.cut == [180 + 900]


# -- configuration ------------------------------------------------------------------------------

def test_retention_rules_default_to_the_drivers_topics_and_are_checked():
    import tomllib

    from cairn.base.config_tools import ConfigError
    from cairn.gateway.core.config import DEFAULT_RETENTION, RetentionRule, parse

    def realm_of(text: str):
        return parse(tomllib.loads(text), "t.toml").realms[0]

    assert realm_of('[[realms]]\nname = "r"\n').retention == DEFAULT_RETENTION
    ruled = realm_of('[[realms]]\nname = "r"\n[[realms.retention]]\nuri = "plant."\n'
                     'match = "prefix"\nmax_payload = 4096\n')
    assert ruled.retention == (RetentionRule("plant.", "prefix", 4096),)
    limits = parse(tomllib.loads('[router.limits]\nmax_retained_per_session = 10\n'
                                 'max_retained_payload = 1000\n[[realms]]\nname = "r"\n'),
                   "t.toml").router.limits
    assert (limits.max_retained_per_session, limits.max_retained_payload) == (10, 1000)
    with pytest.raises(ConfigError, match=r"realms\[0\]\.retention\[0\]\.max_payload: must be "
                                          r"a positive integer, not 0"):
        realm_of('[[realms]]\nname = "r"\n[[realms.retention]]\nuri = "x"\nmax_payload = 0\n')
    with pytest.raises(ConfigError, match=r"realms\[0\]\.retention\[0\]\.uri: missing"):
        realm_of('[[realms]]\nname = "r"\n[[realms.retention]]\nmatch = "prefix"\n')


# -- the store forgets what made room, not what came after -------------------------------------

async def test_the_store_forgets_an_evicted_slot_but_not_a_newer_publication_of_it(tmp_path):
    """A slot evicted in the commit window of its own publication (a history topic: its
    retained value waits in memory for the write-back) stays gone after a restart; a slot
    published again after its eviction, in the same batch, stays."""
    from cairn.gateway.store import Store
    from tests.store.test_store import reading

    store = await Store.open(tmp_path / "cairn.db")
    try:
        evicted = reading(store, "sensor.junk", 1.0)  # history rule 0: retained in memory
        forgotten_then_newer = reading(store, "state.x", 1.0, rule=None)  # retained table
        store.append(evicted, 10)
        store.append(forgotten_then_newer, 10)
        store.forget_retained(evicted)
        store.forget_retained(forgotten_then_newer)
        newer = reading(store, "state.x", 2.0, rule=None)
        await store.append(newer, 0)
    finally:
        await store.close()
    store = await Store.open(tmp_path / "cairn.db")
    try:
        retained = await store.reader.load_retained()
        assert [(p.topic, p.kwargs["temperature"]) for p in retained] == [("state.x", 2.0)]
    finally:
        await store.close()
