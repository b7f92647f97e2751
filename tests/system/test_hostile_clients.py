"""Hostile and buggy neighbours: each attack of issue 19, replayed against a real router
process over real sockets, and what the router must do about it (``[router.limits]``).

Connections from "the LAN" come from this machine's own non-loopback address (the router
listens on all addresses then, which it allows only when a realm has users), so that the
router sees a network peer; local ones come over loopback and the Unix socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, RegisterOptions, SubscribeOptions

from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.shell.flow_control import FairShare, ReadBudget
from harness.config import history_rule, permission, realm, role, user
from harness.process import RouterProcess, lan_address
from harness.waiting import until
from harness.wamp_client import Client, RawSocketPeer, connect
from tests.system.test_bad_input import stalled_subscriber
from tests.system.test_ops import parse_prometheus

pytestmark = pytest.mark.slow

PUB_SUB = ("publish", "subscribe")

REALM = realm(
    "realm1",
    role("anonymous", permission("sensor", PUB_SUB), permission("state", PUB_SUB),
         permission("flood", ["subscribe"]), permission("x", ["subscribe", "register", "call"]),
         permission("p", ["register"]), permission("wamp", ["call"])),
    user("alice", "anonymous", secret="secret-a"),
    history_rule("sensor"),
    anonymous_role="anonymous")


async def open_from(address: str, port: int, first: bytes = b"") -> tuple:
    reader, writer = await asyncio.open_connection(address, port, local_addr=(address, 0))
    if first:
        writer.write(first)
        await writer.drain()
    return reader, writer


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Did the router close the connection (EOF or reset) within ``seconds``?"""
    try:
        while await asyncio.wait_for(reader.read(4096), seconds):
            pass
    except TimeoutError:  # (an OSError too: first)
        return False
    except OSError:
        return True
    return True


async def still_open(held: list[tuple], expected: int, timeout: float = 30) -> int:
    """How many of the connections the router has not closed: after a second, or later once
    no more than ``expected`` are (a loaded machine closes them late; a generous deadline
    costs nothing, it ends when they are closed)."""
    waits = [asyncio.ensure_future(closed_within(reader, timeout)) for reader, _ in held]
    await asyncio.sleep(1)
    deadline = time.monotonic() + timeout
    while sum(not w.done() or not w.result() for w in waits) > expected and \
            time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    for w in waits:
        w.cancel()
    return sum(not w.done() or w.cancelled() or not w.result() for w in waits)


def metrics(router: RouterProcess) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{router.port}/metrics", timeout=5) as r:
        return parse_prometheus(r.read().decode())


def hits(router: RouterProcess, limit: str) -> float:
    for _, labels, value in metrics(router).get("cairn_limit_hits_total", {"samples": []})[
            "samples"]:
        if labels == {"limit": limit}:
            return value
    return 0


def log_lines(router: RouterProcess, word: str) -> int:
    return sum(word in line for line in router.log_path.read_text().splitlines())


@pytest.fixture
def lan_router(tmp_path: Path):
    routers = []

    def start(limits: str = "", nofile: int | None = None, settings: str = "",
              rawsocket_host: str | None = None) -> RouterProcess:  # settings: [router] keys
        router = RouterProcess(tmp_path, REALM, router_toml=f"{settings}[router.limits]\n{limits}",
                               host="0.0.0.0", unix=True, nofile=nofile,
                               rawsocket_host=rawsocket_host).start()
        routers.append(router)
        return router

    yield start
    for router in routers:
        router.stop()


# -- time before a session --------------------------------------------------------------------

SLOW = 'handshake_timeout = "1s"\n'


@pytest.mark.parametrize("port, first", [
    ("http", b"GET / HTTP/1.1\r\nHost: x"),                       # a partial HTTP head
    ("rawsocket", b"\x7f"),                                        # a partial handshake
    ("http", b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
             b"Sec-WebSocket-Protocol: wamp.2.json\r\n\r\n"),     # a WebSocket, no HELLO
    ("rawsocket", b"\x7f\xf1\x00\x00"),                            # a RawSocket, no HELLO
], ids=["http-head", "rawsocket-handshake", "websocket-no-hello", "rawsocket-no-hello"])
async def test_a_connection_without_a_session_is_closed_after_the_handshake_timeout(
        lan_router, port, first):
    router = lan_router(SLOW)
    address = lan_address()
    reader, writer = await open_from(address, router.port if port == "http"
                                     else router.rawsocket_port, first)
    started = time.monotonic()
    assert await closed_within(reader, 5)
    assert 0.9 <= time.monotonic() - started < 5
    writer.close()
    assert hits(router, "handshake_timeout") == 1


async def test_a_login_left_waiting_for_its_authentication_is_closed(lan_router):
    router = lan_router(SLOW)
    reader, writer = await open_from(lan_address(), router.rawsocket_port, b"\x7f\xf1\x00\x00")
    await reader.readexactly(4)
    hello = b'[1,"realm1",{"roles":{"publisher":{}},"authmethods":["ticket"],"authid":"alice"}]'
    writer.write(len(hello).to_bytes(4, "big") + hello)
    assert await closed_within(reader, 5)


async def test_a_session_outlives_the_handshake_timeout(lan_router):
    router = lan_router(SLOW)
    session = await connect(router)
    await asyncio.sleep(1.5)
    assert session.is_attached()
    await session.call("wamp.session.count")
    await session.leave()


# -- how many connections -----------------------------------------------------------------


async def test_one_lan_host_cannot_hold_more_than_its_share_of_connections(lan_router):
    """The attack: ~1,100 one-byte connections from one host against a router limited to
    1,024 file descriptors exhausted them (new clients, local drivers and /status timed
    out, and asyncio logged a traceback per failed accept)."""
    router = lan_router('handshake_timeout = "60s"\nmax_pending_connections = 2000\n'
                        'max_pending_per_address = 2000\n', nofile=1024)
    address = lan_address()
    held = []
    for _ in range(11):
        opened = await asyncio.gather(*(open_from(address, router.port, b"G")
                                        for _ in range(100)), return_exceptions=True)
        held += [o for o in opened if not isinstance(o, BaseException)]
    assert len(held) > 1024 - 32  # the kernel let most of them in before the router said no
    assert await still_open(held, 32) == 32  # max_connections_per_address

    # a driver on the Unix socket and a local client still get in, /status answers
    driver = await connect(router, "rawsocket-unix", "msgpack")
    await driver.call("wamp.session.count")
    local = await connect(router)
    with urllib.request.urlopen(f"http://127.0.0.1:{router.port}/status", timeout=5):
        pass
    assert hits(router, "max_connections_per_address") == 1100 - 32
    assert log_lines(router, "max_connections_per_address") == 1  # not one per refusal
    assert log_lines(router, "Traceback") == 0
    await driver.leave()
    await local.leave()
    for _, writer in held:
        writer.close()


async def test_network_connections_are_capped_in_total_and_local_ones_apart(lan_router):
    router = lan_router("max_connections = 10\nmax_connections_per_address = 100\n"
                        "max_pending_per_address = 100\n")
    address = lan_address()
    held = [await open_from(address, router.rawsocket_port, b"\x7f") for _ in range(15)]
    assert await still_open(held, 10) == 10
    assert hits(router, "max_connections") == 5
    local = await connect(router, "rawsocket-tcp", "msgpack")  # loopback: not counted
    await local.leave()
    for _, writer in held:
        writer.close()


async def test_one_address_holds_at_most_its_share_of_connections_without_a_session(
        lan_router):
    router = lan_router("max_pending_per_address = 5\n")
    address = lan_address()
    held = [await open_from(address, router.rawsocket_port, b"\x7f") for _ in range(8)]
    assert await still_open(held, 5) == 5
    assert hits(router, "max_pending_per_address") == 3
    for _, writer in held:
        writer.close()


def ipv6_lan_addresses() -> list[str]:
    """This machine's IPv6 addresses that are not loopback (link-local ones with their
    interface), to connect from as other hosts of the LAN would; the test is skipped
    without two of them."""
    out = subprocess.run(["ip", "-6", "-o", "addr", "show"], capture_output=True,
                         text=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        address = fields[3].split("/")[0]
        if address == "::1" or "tentative" in line:
            continue
        found.append(f"{address}%{fields[1]}" if address.startswith("fe80") else address)
    if len(found) < 2:
        pytest.skip("this machine has fewer than two non-loopback IPv6 addresses")
    return found[:2]


async def hold_half_open(address: str, port: int, count: int, stop: asyncio.Event) -> None:
    """``count`` connections from ``address`` that never finish their RawSocket handshake,
    each opened again as soon as the router closes (or refuses) it: the N6 attacker."""
    async def one() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                reader, writer = await open_from(address, port, b"\x7f")
                while not stop.is_set() and not await closed_within(reader, 0.2):
                    pass
                writer.close()
            await asyncio.sleep(0.2)
    await asyncio.gather(*(one() for _ in range(count)))


async def lan_client_gets_in(address: str, port: int) -> bool:
    """A WebSocket upgrade from ``address``: answered 101, or refused (closed)? The router
    does one or the other within its handshake timeout; the bound here is only a backstop
    (a loaded machine can take seconds)."""
    reader, writer = await open_from(address, port, UPGRADE.format(
        host=f"{address}:{port}", more="").encode())
    try:
        line = await asyncio.wait_for(reader.readline(), 60)
    except OSError:
        line = b""
    finally:
        writer.close()
    return line.startswith(b"HTTP/1.1 101")


async def admitted_under_attack(router: RouterProcess, held_each: int,
                                tries: int = 22) -> tuple[int, int]:
    """Two IPv6 hosts each hold ``held_each`` half-open RawSocket connections; a client
    from the IPv4 LAN address tries ``tries`` times to open a WebSocket: (how often it got
    in, how many of the attackers' connections were open at the end)."""
    attackers, client = ipv6_lan_addresses(), lan_address()
    stop = asyncio.Event()
    attack = asyncio.gather(*(hold_half_open(a, router.rawsocket_port, held_each, stop)
                              for a in attackers))
    await asyncio.sleep(2)  # let them fill what they can
    admitted = 0
    for _ in range(tries):
        admitted += await lan_client_gets_in(client, router.port)
        await asyncio.sleep(0.2)
    pending = (await asyncio.to_thread(metrics, router))["cairn_connections"]["samples"]
    stop.set()
    await attack
    return admitted, next(v for _, labels, v in pending if labels == {"kind": "pending"})


async def test_two_lan_hosts_holding_half_open_connections_do_not_keep_a_third_out(lan_router):
    """The attack (N6): two LAN hosts held 32 half-open connections each, opened again as
    the handshake timeout closed them; the 64 pending slots were theirs, and a LAN client
    got in 3 times out of 22. (The default handshake timeout here: a shorter one can cut the
    LAN client's own handshake on a loaded machine, and the penalty of an address whose
    handshake timed out then keeps it out for a minute, as it should.)"""
    router = lan_router(rawsocket_host="[::]")
    admitted, _ = await admitted_under_attack(router, held_each=32)
    assert admitted == 22
    assert hits(router, "max_pending_per_address") > 0


async def test_past_three_quarters_of_the_pending_slots_only_addresses_holding_none_get_one(
        lan_router):
    router = lan_router("max_pending_per_address = 64\n", rawsocket_host="[::]")
    admitted, pending = await admitted_under_attack(router, held_each=64)
    assert admitted == 22
    assert 32 <= pending <= 48 + 1  # (+1: the client's own, if it was counted meanwhile)
    assert hits(router, "pending_early_drop") > 0


# -- what a session can make the router hold ----------------------------------------------

ACKED_RETAINED = PublishOptions(acknowledge=True, retain=True)


def local_router(tmp_path: Path, limits: str) -> RouterProcess:
    return RouterProcess(tmp_path, REALM, router_toml=f"[router.limits]\n{limits}").start()


def noop(*args, **kwargs) -> None:
    pass


async def test_a_session_holds_at_most_its_share_of_subscriptions(tmp_path):
    router = local_router(tmp_path, "max_subscriptions_per_session = 5\n")
    try:
        session = await connect(router)
        subs = [await session.subscribe(noop, f"x.{i}") for i in range(5)]
        with pytest.raises(ApplicationError) as refused:
            await session.subscribe(noop, "x.5")
        assert refused.value.error == "cairn.error.limit_reached"
        assert "max_subscriptions_per_session" in refused.value.args[0]
        again = await session.subscribe(noop, "x.0")  # the same one again holds no more
        await subs[0].unsubscribe()
        await again.unsubscribe()  # (autobahn sends UNSUBSCRIBE with the last handler)
        await session.subscribe(noop, "x.5")
        other = await connect(router)  # the bound is per session
        await other.subscribe(noop, "x.6")
        assert hits(router, "max_subscriptions_per_session") == 1
    finally:
        router.stop()


async def test_a_session_holds_at_most_its_share_of_registrations(tmp_path):
    router = local_router(tmp_path, "max_registrations_per_session = 3\n")
    try:
        session = await connect(router)
        for i in range(3):
            await session.register(noop, f"p.{i}", options=RegisterOptions(invoke="roundrobin"))
        with pytest.raises(ApplicationError) as refused:
            await session.register(noop, "p.3")
        assert refused.value.error == "cairn.error.limit_reached"
    finally:
        router.stop()


def kept_subscriptions(router: RouterProcess) -> list[str]:
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        return [uri for (uri,) in db.execute("SELECT uri FROM subscriptions")]


async def test_subscriptions_with_history_a_client_left_behind_are_bounded(tmp_path):
    """The attack: 50,000 subscriptions under a history rule from one session were all
    kept, in memory and in the store, and reloaded at every start."""
    router = local_router(tmp_path, "max_history_subscriptions = 20\n")
    try:
        session = await connect(router)
        subs = [await session.subscribe(noop, f"sensor.s{i}") for i in range(200)]
        await session.leave()
        other = await connect(router)  # the oldest left without subscribers makes room
        newest = await other.subscribe(noop, "sensor.new")
        await other.leave()
        router.stop()
        kept = kept_subscriptions(router)
        assert set(kept) == {"sensor", *[f"sensor.s{i}" for i in range(1, 20)], "sensor.new",
                             HEALTH_TOPIC}  # the rules' own subscriptions, outside the bound
        router.start()
        session = await connect(router)
        with pytest.raises(ApplicationError) as forgotten:  # its id names nothing now
            await session.call("wamp.subscription.get_events", subs[0].id)
        assert forgotten.value.error == "wamp.error.no_such_subscription"
        assert (await session.call("wamp.subscription.get_events", subs[1].id)).results[0] == []
        assert (await session.subscribe(noop, "sensor.new")).id == newest.id  # kept: same id
        await session.leave()
    finally:
        router.stop()


async def test_new_history_topics_past_the_realms_bound_are_refused_after_a_restart_too(
        tmp_path):
    """The attack: one event on each of 40,000 ever-new topics under a history rule grew the
    store's topic registry (and the router) by 9.4 MiB, for good. Now a realm keeps history
    for at most max_history_topics topics, those the store kept included; a driver's (here
    alice, a configured user) are not refused."""
    router = local_router(tmp_path, "max_history_topics = 4\n")
    try:
        anonymous = await connect(router, "rawsocket-tcp", "msgpack")
        acked = PublishOptions(acknowledge=True)
        for name in "abcd":
            await anonymous.publish(f"sensor.{name}", 1, options=acked)
        with pytest.raises(ApplicationError) as refused:
            await anonymous.publish("sensor.e", 1, options=acked)
        assert refused.value.error == "cairn.error.limit_reached"
        assert "not stored in history: max_history_topics" in refused.value.args[0]
        alice = await connect(router, authmethods=["ticket"], authid="alice",
                              secret="secret-a")
        await alice.publish("sensor.alice", 1, options=acked)
        await alice.leave()
        await anonymous.leave()
        router.stop()
        router.start()
        anonymous = await connect(router, "rawsocket-tcp", "msgpack")
        with pytest.raises(ApplicationError) as refused:
            await anonymous.publish("sensor.f", 1, options=acked)
        assert "the realm keeps history for 5 topics" in refused.value.args[0]
        await anonymous.publish("sensor.a", 2, options=acked)
        sub = await anonymous.subscribe(noop, "sensor.a")
        events = (await anonymous.call("wamp.subscription.get_events", sub.id)).results[0]
        assert [e["args"] for e in events] == [[1], [2]]
        await anonymous.leave()
        assert hits_in(metrics(router), "max_history_topics") == 1
    finally:
        router.stop()
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        topics = {t for (t,) in db.execute("SELECT topic FROM topics")}
    assert topics == {"sensor.a", "sensor.b", "sensor.c", "sensor.d", "sensor.alice", HEALTH_TOPIC}


async def has_history(router: RouterProcess, sub_id: int) -> bool:
    """Does ``sub_id`` still name a kept subscription (get_events answers for it)?"""
    session = await connect(router)
    try:
        await session.call("wamp.subscription.get_events", sub_id)
        return True
    except ApplicationError as e:
        assert e.error == "wamp.error.no_such_subscription"
        return False
    finally:
        await session.leave()


async def test_a_client_churning_through_history_topics_forgets_only_its_own(tmp_path):
    """The attack: one client (another address) subscribing to 1,000 history topics forgot
    every kept subscription of the realm, a dashboard's that had stepped away included."""
    router = local_router(tmp_path, "max_history_subscriptions = 20\n")
    try:
        dashboard = await connect(router)
        kept = await dashboard.subscribe(noop, "sensor.dash")
        await dashboard.leave()
        attacker = await connect(router, local_addr=("127.0.0.2", 0))
        for i in range(50):
            await attacker.subscribe(noop, f"sensor.junk{i}")
        await attacker.leave()
        assert await has_history(router, kept.id)
    finally:
        router.stop()


async def test_a_client_holding_its_share_of_kept_subscriptions_leaves_others_room(tmp_path):
    """While one client held 1,000 subscriptions with history, a dashboard's new one was
    not kept: its id was gone once it stepped away."""
    router = local_router(tmp_path, "max_history_subscriptions = 20\n"
                                    "max_history_subscriptions_per_client = 5\n")
    try:
        attacker = await connect(router, local_addr=("127.0.0.2", 0))
        for i in range(30):
            await attacker.subscribe(noop, f"sensor.junk{i}")
        dashboard = await connect(router)
        kept = await dashboard.subscribe(noop, "sensor.dash")
        await dashboard.leave()
        assert await has_history(router, kept.id)
        assert hits(router, "max_history_subscriptions") == 25
    finally:
        router.stop()


def slow_consumers_cut(router: RouterProcess) -> float:
    return sum(v for _, _, v in metrics(router)["cairn_slow_consumer_disconnects_total"][
        "samples"])


async def test_a_unix_socket_subscriber_that_stops_reading_is_cut_like_any_other(tmp_path):
    """The device's own socket gets no pass: a local subscriber that never reads is
    disconnected once send_buffer_limit waits for it, and the others lose nothing."""
    router = RouterProcess(tmp_path, REALM, unix=True,
                           router_toml="send_buffer_limit = 262144\n").start()
    try:
        healthy, received = await connect(router), []
        await healthy.subscribe(lambda i, blob: received.append(i), "sensor.flood")
        slow = await stalled_subscriber(str(router.unix_path), "sensor.flood")
        publisher, published = await connect(router), 0
        while not slow_consumers_cut(router) and published < 500:
            await publisher.publish("sensor.flood", published, "x" * 10_000,
                                    options=PublishOptions(acknowledge=True))
            published += 1
        assert published < 500, "the stalled Unix socket subscriber was not cut"
        await until(lambda: len(received) == published)
        assert received == list(range(published))
        assert await slow.closed(timeout=5)
        slow.close()
    finally:
        router.stop()


async def test_retained_slots_are_bounded_in_number_per_topic_and_in_bytes(tmp_path):
    router = local_router(tmp_path, "max_retained = 3\nmax_retained_per_topic = 2\n"
                                    "max_retained_bytes = 2000\n")
    try:
        session = await connect(router)
        for i in range(3):
            await session.publish(f"state.{i}", i, options=ACKED_RETAINED)
        with pytest.raises(ApplicationError) as refused:
            await session.publish("state.3", 3, options=ACKED_RETAINED)
        assert refused.value.error == "cairn.error.limit_reached"
        assert "not retained" in refused.value.args[0] and "max_retained" in refused.value.args[0]
        await session.publish("state.0", "newer", options=ACKED_RETAINED)  # a slot that exists

        with pytest.raises(ApplicationError):  # a third audience of one topic
            for role in ("a", "b", "c"):
                await session.publish("state.1", role, options=PublishOptions(
                    acknowledge=True, retain=True, eligible_authrole=[role]))
        with pytest.raises(ApplicationError) as big:
            await session.publish("state.2", "x" * 3000, options=ACKED_RETAINED)
        assert "max_retained_bytes" in big.value.args[0]

        got: list = []
        await session.subscribe(lambda v, details=None: got.append((details.topic, v)), "state.",
                                options=SubscribeOptions(match="prefix", get_retained=True,
                                                         details_arg="details"))
        await asyncio.sleep(0.3)
        assert sorted(got) == [("state.0", "newer"), ("state.1", 1), ("state.2", 2)]
    finally:
        router.stop()


async def test_a_restart_after_a_flood_loads_only_what_the_bounds_allow(tmp_path):
    """The attack left 50,000 subscriptions and 150,000 retained slots in the store: the
    router restarted at 329 MiB instead of 46 MiB. Now the store is trimmed at start."""
    router = local_router(tmp_path, "")
    router.stop()
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        db.executemany("INSERT INTO subscriptions (id, realm, uri, match, created)"
                       " VALUES (?, 'realm1', ?, 'exact', '2026-01-01T00:00:00.000Z')",
                       [(10**6 + i, f"sensor.flood{i}") for i in range(50_000)])
        db.executemany("INSERT INTO retained (realm, topic, audience_key, seq, publication,"
                       " wall_ms, payload) VALUES ('realm1', ?, '', ?, ?, 0, ?)",
                       [(f"flood.{i}", i + 1, i + 1, b"\x92\x91\x01\xc0") for i in range(50_000)])
        db.commit()
    # 1.7 s to load and trim the 100,000 rows on an idle machine, over 15 s on CI with
    # the image build beside it (what is measured here is memory, not start-up time)
    router.start()  # (harness.process.STARTUP_TIMEOUT)
    try:
        rss = int(Path(f"/proc/{router.proc.pid}/status").read_text()
                  .split("VmRSS:")[1].split()[0]) // 1024
        retained = [v for n, _, v in metrics(router)["cairn_retained_slots"]["samples"]]
        assert retained == [10_000]
        # 329 MiB when every row was kept; 124-149 measured (same code, beside other tests)
        # for loading the 100,000 rows and trimming them: the peak varies with when the
        # garbage collector runs, so the bound tells the two apart, not the runs
        assert rss < 200, f"{rss} MiB after loading"
    finally:
        router.stop()
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        # and the two rules' own subscriptions (the sensors' and the router's health records)
        assert db.execute("SELECT COUNT(*) FROM subscriptions").fetchone()[0] == 1000 + 2
        assert db.execute("SELECT COUNT(*) FROM retained WHERE topic != ?",  # not the router's
                          (HEALTH_TOPIC,)).fetchone()[0] == 10_000


# -- a publish storm ------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def store_files_mib(router: RouterProcess) -> float:
    return sum(f.stat().st_size for f in router.data_dir.glob("cairn.db*")) / 2**20


async def calm_publishes(session: Client, count: int, latencies: list[float]) -> None:
    """``count`` acknowledged publishes, one every 0.2 s, each one's latency noted."""
    for i in range(count):
        started = time.monotonic()
        await session.publish("sensor.calm", i, options=PublishOptions(acknowledge=True))
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.2)


async def test_a_publish_storm_is_paused_not_buffered_and_the_store_stays_in_bounds(tmp_path):
    """The attack: one session pipelining 64 KiB publishes to a history topic for 4 s took
    the router from 45 MiB to 2.5 GiB, the store to 2.6 GB with max_store_bytes 20 MiB and
    another client's acknowledged publishes to 16 s; the file did not shrink afterwards.
    (No hard cap on the session's reads, as by default: this is the store queue's own
    bound.)"""
    router = RouterProcess(tmp_path, REALM, router_toml="max_store_bytes = 20971520").start()
    try:
        peer = await RawSocketPeer.open(router.rawsocket_port, "msgpack")
        peer.send([1, "realm1", {"roles": {"publisher": {}}}])
        assert (await peer.receive())[0] == 2
        calm = await connect(router)
        latencies, peaks, sent = [], [], 0
        payload = "x" * 65536

        async def storm() -> None:  # 4 s on an idle machine; longer on a busy one
            nonlocal sent
            deadline = time.monotonic() + 15
            while sent < 1700 and time.monotonic() < deadline:  # 106 MiB
                peer.send([16, sent, {}, "sensor.storm", [payload]])
                sent += 1
                await peer.writer.drain()  # blocks while the router does not read

        async def watch() -> None:
            while len(latencies) < 20:
                peaks.append(rss_mib(router.proc.pid))
                await asyncio.sleep(0.1)

        async with asyncio.timeout(30):  # a publisher paused for good would hang here
            await asyncio.gather(storm(), calm_publishes(calm, 20, latencies), watch())
        await asyncio.sleep(3)  # the store catches up, prunes and shrinks
        files = store_files_mib(router)
        families = metrics(router)
        await calm.leave()
        peer.close()
    finally:
        router.stop()
    print(f"sent {sent} x 64 KiB; router RSS peak {max(peaks):.0f} MiB; acked publish max "
          f"{max(latencies):.2f} s; store files {files:.1f} MiB")
    assert sent * 64 / 1024 > 100  # a storm: more than 100 MiB offered
    assert max(peaks) < 250
    assert max(latencies) < 5
    assert files < 20 * 1.5 + 4  # the bound, what pruning frees for reuse, the WAL's limit
    stored = [v for n, _, v in families["cairn_store_bytes"]["samples"]][0]
    assert stored < 20 * 2**20 * 1.3
    assert hits_in(families, "max_store_queue_bytes") >= 1
    assert families["cairn_store_queued_bytes"]["samples"][0][2] < 4 * 2**20


class PipeliningPublisher:
    """Acknowledged publishes pipelined as fast as the socket takes them, counting the
    PUBLISHED answers as they come (never an error or ABORT)."""

    def __init__(self, peer: RawSocketPeer) -> None:
        self.peer = peer
        self.sent = self.acked = 0
        self._counting: asyncio.Task | None = None

    async def run(self, payload: str, count: int, wave: int | None = None) -> None:
        """``count`` publishes; with ``wave``, that many at a time, each wave once the one
        before was acknowledged (so that the router cannot read them all at once)."""
        self.peer.send([1, "realm1", {"roles": {"publisher": {}}}])
        assert (await self.peer.receive())[0] == 2
        self._counting = asyncio.create_task(self._count())
        while self.sent < count:
            self.peer.send([16, self.sent + 1, {"acknowledge": True}, "sensor.storm",
                            [self.sent, payload]])
            self.sent += 1
            await self.peer.writer.drain()  # blocks while the router does not read
            if wave and self.sent % wave == 0:
                await until(lambda: self.acked == self.sent, timeout=30)

    async def _count(self) -> None:
        while (msg := await self.peer.receive(timeout=30)) is not None:
            assert msg[0] == 17, f"expected PUBLISHED, got {msg}"
            self.acked += 1

    async def all_acknowledged(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.acked < self.sent and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._counting.cancel()
        return self.acked == self.sent


# -- fair shares: connections read in turn, a quantum each; an optional hard cap ----------


def test_a_fair_share_is_a_quantum_of_messages_a_turn():
    share = FairShare()
    share.spend(FairShare.messages - 1, 100)
    assert share.left
    share.spend(1, 100)
    assert not share.left
    share.turn()
    assert share.left


def test_a_message_larger_than_a_quantum_is_paid_off_a_quantum_a_turn():
    share = FairShare()
    share.spend(1, 3 * FairShare.size)  # handled whole, then three turns in debt
    turns = 0
    while not share.left:
        share.turn()
        turns += 1
    assert turns == 3


def test_a_fair_share_saves_up_no_more_than_a_quantum():
    share = FairShare()
    for _ in range(10):
        share.turn()  # turns with nothing to read
    share.spend(FairShare.messages, 100)
    assert not share.left


def test_a_read_budget_allows_a_seconds_worth_at_once_then_its_rate():
    budget = ReadBudget(messages=100, size=10_000, now=0.0)
    assert budget.spend(100, 1_000, now=0.0) is None  # a second's worth at once
    assert budget.spend(10, 100, now=0.1) is None  # refilled at the rate
    limit, wait = budget.spend(50, 100, now=0.1)  # 50 in debt: half a second to wait
    assert limit == "max_messages_per_second" and wait == pytest.approx(0.5)
    assert budget.spend(1, 1, now=10.0) is None  # refilled, to a second's worth only
    assert budget.spend(100, 1, now=10.0) is not None


def test_a_read_budget_names_the_budget_that_ran_out():
    budget = ReadBudget(messages=100, size=10_000, now=0.0)
    limit, wait = budget.spend(1, 30_000, now=0.0)  # one big message: 2 s of bytes in debt
    assert limit == "max_bytes_per_second" and wait == pytest.approx(2.0)


def test_a_read_budget_caps_only_what_is_configured():
    budget = ReadBudget(messages=None, size=10_000, now=0.0)
    assert budget.spend(1_000_000, 0, now=0.0) is None
    assert budget.spend(1, 20_000, now=0.0) == ("max_bytes_per_second", pytest.approx(1.0))


async def test_a_lone_client_is_not_held_to_a_fixed_rate(tmp_path):
    """Out of the box one connection was read at 1,000 messages a second (a second's worth
    at once) however idle the router: 10,000 pipelined publishes took at least 9 s, each
    pause counted as a hit of max_messages_per_second. Read in turns, a client alone takes
    the router's whole time: no cap holds it back, every publish is acknowledged and
    delivered in order. (How fast is a benchmark's question: bench.pubsub --limits.)"""
    router = RouterProcess(tmp_path, REALM).start()  # the embedded default limits
    try:
        subscriber, publisher = await connect(router), await connect(router)
        received: list[int] = []
        await subscriber.subscribe(received.append, "state.burst")
        started = time.monotonic()
        acks = [publisher.publish("state.burst", i, options=PublishOptions(acknowledge=True))
                for i in range(10_000)]
        await asyncio.gather(*acks)
        await until(lambda: len(received) == 10_000, timeout=60, what="every event")
        took = time.monotonic() - started
        # (on a loaded machine the router's 20 s ping timeout may have dropped a client
        # still working through what it was sent: that is not what this test is about)
        for session in (publisher, subscriber):
            if session.is_attached():
                await session.leave()
        held = {limit: hits(router, limit)
                for limit in ("max_messages_per_second", "max_bytes_per_second")}
    finally:
        router.stop()
    print(f"10,000 pipelined publishes acknowledged and delivered in {took:.2f} s")
    assert received == list(range(10_000))
    assert held == {"max_messages_per_second": 0, "max_bytes_per_second": 0}


RESULT = 50  # WAMP message type


class Flooder:
    """A session pipelining unacknowledged publishes as fast as its socket takes them, then
    a CALL: its RESULT says the router read them all and kept the session."""

    def __init__(self, peer: RawSocketPeer) -> None:
        self.peer = peer
        self.sent = 0
        self.answer: list | None = None

    async def run(self, count: int) -> None:
        self.peer.send([1, "realm1", {"roles": {"publisher": {}, "caller": {}}}])
        assert (await self.peer.receive())[0] == 2
        payload = "x" * 200
        for start in range(1, count + 1, 100):
            for request in range(start, min(start + 100, count + 1)):
                self.peer.send([16, request, {}, "state.flood", [request, payload]])
            self.sent = request
            await self.peer.writer.drain()  # blocks while the router does not read
        self.peer.send([48, count + 1, {}, "wamp.session.count"])
        self.answer = await self.peer.receive(timeout=120)


async def round_trips_until(session: Client, done: Callable[[], bool]) -> list[float]:
    """One call after the other until ``done()``; each one's round trip."""
    latencies = []
    while not done():
        started = time.monotonic()
        await session.call("wamp.session.count")
        await session.publish("state.calm", 1, options=PublishOptions(acknowledge=True))
        latencies.append(time.monotonic() - started)
    return latencies


async def test_a_flood_leaves_a_neighbours_round_trips_prompt_and_the_flooders_connected(
        tmp_path):
    """Without a cap, two sessions pipelining publishes as fast as their sockets take them
    are read a quantum a turn each, and an honest session's call and acknowledged publish
    come back in well under a second while they do; the flooders are slowed, not cut off:
    each gets its every publish read and its call answered."""
    router = RouterProcess(tmp_path, REALM).start()  # the embedded default limits
    try:
        honest = await connect(router)
        flooders = [Flooder(await RawSocketPeer.open(router.rawsocket_port, "msgpack"))
                    for _ in range(2)]
        floods = asyncio.gather(*(f.run(count=30_000) for f in flooders))
        await until(lambda: all(f.sent for f in flooders), what="both floods to begin")
        latencies = await round_trips_until(honest, floods.done)
        await floods
        await honest.leave()
        for flooder in flooders:
            flooder.peer.close()
    finally:
        router.stop()
    print(f"{len(latencies)} round trips during the floods: max {max(latencies) * 1000:.1f} "
          f"ms, median {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms")
    assert [f.answer[0] for f in flooders] == [RESULT] * 2  # read to the end, still there
    assert len(latencies) >= 10  # the floods lasted
    assert max(latencies) < 1.0


async def test_what_a_session_pipelines_is_handled_in_order_across_its_turns(tmp_path):
    """5,000 acknowledged publishes and a GOODBYE in one go take many turns: every publish
    is acknowledged in the order sent, then the GOODBYE is answered and the socket closed."""
    router = RouterProcess(tmp_path, REALM).start()
    try:
        peer = await RawSocketPeer.open(router.rawsocket_port, "msgpack")
        peer.send([1, "realm1", {"roles": {"publisher": {}}}])
        assert (await peer.receive())[0] == 2
        for request in range(1, 5001):
            peer.send([16, request, {"acknowledge": True}, "state.burst", [request]])
        peer.send([6, {}, "wamp.close.normal"])
        answers = [await peer.receive(timeout=60) for _ in range(5001)]
        closed = await peer.closed(timeout=60)
    finally:
        router.stop()
    assert [a[:2] for a in answers[:-1]] == [[17, request] for request in range(1, 5001)]
    assert answers[-1][0] == 6  # GOODBYE
    assert closed


async def test_a_configured_message_cap_slows_a_session_and_gets_every_publish_acknowledged(
        tmp_path):
    """Past max_messages_per_second the router stops reading the session for a while (TCP
    backpressure): nothing is refused, nobody is cut off, the sender just waits."""
    router = RouterProcess(tmp_path, REALM, router_toml=(
        "[router.limits]\nmax_messages_per_second = 200")).start()
    try:
        storm = PipeliningPublisher(await RawSocketPeer.open(router.rawsocket_port, "msgpack"))
        started = time.monotonic()
        await storm.run("x", count=1000, wave=100)
        everything = await storm.all_acknowledged(timeout=30)
        took = time.monotonic() - started
        families = metrics(router)
        storm.peer.close()
    finally:
        router.stop()
    print(f"{storm.acked} of {storm.sent} acknowledged in {took:.2f} s")
    assert everything, f"{storm.acked} of {storm.sent} acknowledged"
    # a second's worth at once, then 200 a second (the last wave read at once, in debt)
    assert took >= (1000 - 200 - 100) / 200 * 0.9
    assert hits_in(families, "max_messages_per_second") >= 1


async def test_a_configured_byte_cap_reads_a_pipelining_session_at_that_rate(tmp_path):
    """The soak's storm, one session pipelining 4 KiB publishes as fast as its socket takes
    them, under ``max_bytes_per_second = 1 MiB``: it is read at that rate. (Timed by the
    acknowledgements, which follow the router's reads: the sender may finish at once, the
    kernel's buffers can take all 8 MiB.)"""
    router = RouterProcess(tmp_path, REALM, router_toml=(
        "[router.limits]\nmax_bytes_per_second = 1048576")).start()
    try:
        storm = PipeliningPublisher(await RawSocketPeer.open(router.rawsocket_port, "msgpack"))
        started = time.monotonic()
        await storm.run("x" * 4096, count=2048)  # 8 MiB
        assert await storm.all_acknowledged(timeout=60)
        took = time.monotonic() - started
        families = metrics(router)
        storm.peer.close()
    finally:
        router.stop()
    print(f"storm: {storm.sent} sent and acknowledged in {took:.2f} s")
    at_the_cap = (2048 * 4096 - 2**20) / 2**20  # a second's worth at once, then a second's a second
    assert took >= at_the_cap * 0.9
    assert took <= at_the_cap / 0.4
    assert hits_in(families, "max_bytes_per_second") >= 1


async def test_publishing_to_ever_new_topics_does_not_grow_the_router(tmp_path):
    """The soak's junk-slot attacker: each refused publish to a topic never seen before
    left an entry in each per-URI cache (authorization, rules, subscriptions), 10,000 to
    50,000 of them before one started over: +4.4 MiB from 10,000 to 40,000 topics. Under a
    history rule, each was also a topic the store's registry held for good: +9.4 MiB for
    40,000 (now a client makes at most max_history_topics_per_client)."""
    router = RouterProcess(tmp_path, REALM, router_toml=(
        "[router.limits]\nmax_retained = 100")).start()
    try:
        session = await connect(router, "rawsocket-tcp", "msgpack")
        sizes = []
        for start in range(0, 40_000, 1000):
            for i in range(start, start + 1000):
                session.publish(f"{'sensor' if i % 2 else 'state'}.junk.t{i}", i,
                                options=PublishOptions(retain=True))
            await session.call("wamp.session.count")  # (the publishes before it are handled)
            sizes.append(rss_mib(router.proc.pid))
        await session.leave()
    finally:
        router.stop()
    print(f"RSS after 10,000 topics {sizes[9]:.1f} MiB, after 40,000 {sizes[-1]:.1f} MiB")
    assert sizes[-1] - sizes[9] < 2


def hits_in(families: dict[str, dict], limit: str) -> float:
    return sum(v for _, labels, v in families.get("cairn_limit_hits_total", {"samples": []})[
        "samples"] if labels == {"limit": limit})


# -- browsers on the LAN: other sites' pages, DNS rebinding ---------------------------------

UPGRADE = ("GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Protocol: wamp.2.json\r\n{more}\r\n")


async def status_line(port: int, request: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode("latin-1"))
        return (await asyncio.wait_for(reader.readline(), 5)).decode("latin-1").strip()
    finally:
        writer.close()


async def upgrade(port: int, host: str, origin: str | None) -> str:
    more = f"Origin: {origin}\r\n" if origin is not None else ""
    return await status_line(port, UPGRADE.format(host=host, more=more))


async def test_a_page_from_another_site_cannot_open_a_wamp_session(tmp_path):
    """Any web page a LAN browser opened could join with the anonymous role's rights."""
    router = RouterProcess(tmp_path, REALM).start()
    try:
        here = f"127.0.0.1:{router.port}"
        refused = await upgrade(router.port, here, "http://evil.example")
        other_port = await upgrade(router.port, here, "http://127.0.0.1:9999")
        null = await upgrade(router.port, here, "null")
        dashboard = await upgrade(router.port, here, f"http://{here}")
        no_browser = await upgrade(router.port, here, None)
        counted = hits(router, "allowed_origins")
    finally:
        router.stop()
    assert refused.startswith("HTTP/1.1 403")
    assert other_port.startswith("HTTP/1.1 403")
    assert null.startswith("HTTP/1.1 403")
    assert dashboard.startswith("HTTP/1.1 101")  # the page Cairn serves itself
    assert no_browser.startswith("HTTP/1.1 101")  # a WAMP client that is no browser
    assert counted == 3


async def test_dns_rebinding_gets_neither_status_nor_metrics(tmp_path):
    """A name of the attacker's resolving to the gateway made /status and /metrics the
    attacker's page's own origin."""
    router = RouterProcess(tmp_path, REALM).start()
    try:
        answers = {host: await status_line(
            router.port, f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n")
            for host in ("rebind.evil.example:8080", f"127.0.0.1:{router.port}",
                         f"localhost:{router.port}", f"{socket.gethostname()}.local",
                         f"[::1]:{router.port}")}
        counted = hits(router, "allowed_hosts")
    finally:
        router.stop()
    assert answers.pop("rebind.evil.example:8080").startswith("HTTP/1.1 403")
    assert all(line.startswith("HTTP/1.1 200") for line in answers.values()), answers
    assert counted == 1


# the gateway's name and Grafana's origin, let in
GREENHOUSE_LAN = ('allowed_hosts = ["gateway.greenhouse.lan"]\n'
                  'allowed_origins = ["https://grafana.greenhouse.lan:3000"]\n')


async def named_and_from_grafana(port: int) -> tuple[str, str]:
    """The status lines of a GET /status for the gateway by name and of a WebSocket upgrade
    from Grafana's origin."""
    named = await status_line(
        port, "GET /status HTTP/1.1\r\nHost: gateway.greenhouse.lan:8080\r\n\r\n")
    grafana = await upgrade(port, "gateway.greenhouse.lan:8080",
                            "https://grafana.greenhouse.lan:3000")
    return named, grafana


async def test_configured_hosts_and_origins_are_let_in(tmp_path):
    router = RouterProcess(tmp_path, REALM, router_toml=GREENHOUSE_LAN).start()
    try:
        named, grafana = await named_and_from_grafana(router.port)
        other = await upgrade(router.port, "gateway.greenhouse.lan:8080",
                              "https://grafana.greenhouse.lan")
    finally:
        router.stop()
    assert named.startswith("HTTP/1.1 200")
    assert grafana.startswith("HTTP/1.1 101")
    assert other.startswith("HTTP/1.1 403")


# -- RawSocket frames and handshakes that autobahn does not handle --------------------------


async def test_a_rawsocket_ping_gets_a_pong_with_its_payload_and_no_traceback(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        peer = await RawSocketPeer.open(router.rawsocket_port, "json")
        peer.send_bytes(b"are you there", frame_type=1)
        header = await asyncio.wait_for(peer.reader.readexactly(4), 5)
        payload = await asyncio.wait_for(peer.reader.readexactly(13), 5)
        peer.send([1, "realm1", {"roles": {"subscriber": {}}}])
        welcome = await peer.receive()
        peer.close()
    finally:
        router.stop()
    assert (header[0], int.from_bytes(header[1:], "big")) == (2, 13)  # PONG
    assert payload == b"are you there"
    assert welcome[0] == 2
    assert "Traceback" not in router.log_path.read_text()


async def test_an_unknown_serializer_gets_the_handshake_error_and_no_traceback(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.rawsocket_port)
        writer.write(bytes([0x7F, 0xF7, 0, 0]))  # serializer 7: none
        reply = await asyncio.wait_for(reader.read(8), 5)
        closed = await closed_within(reader, 5)
        writer.close()
    finally:
        router.stop()
    assert reply == bytes([0x7F, 0x10, 0, 0])  # error 1: serializer unsupported
    assert closed
    assert "Traceback" not in router.log_path.read_text()
    assert "Serializer unsupported" in router.log_path.read_text()


# -- /status and /metrics from the LAN ------------------------------------------------------


async def lan_get(address: str, port: int, path: str, token: str | None = None) -> str:
    reader, writer = await open_from(address, port, (
        f"GET {path} HTTP/1.1\r\nHost: {address}:{port}\r\n"
        + (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n").encode())
    try:
        return (await asyncio.wait_for(reader.readline(), 5)).decode().strip()
    finally:
        writer.close()


async def test_status_and_metrics_answer_other_hosts_only_with_the_token(lan_router, tmp_path):
    """They told anyone on the LAN the sessions, the sync sink and the store's figures."""
    token_file = tmp_path / "status.token"
    token_file.write_text("a-long-random-token-for-prometheus\n")
    router = lan_router(settings=f'status_token_file = "{token_file}"\n')
    address = lan_address()
    answers = {(path, token): await lan_get(address, router.port, path, token)
               for path in ("/status", "/metrics")
               for token in (None, "wrong-token-of-some-length", token_file.read_text().strip())}
    dashboard = await lan_get(address, router.port, "/")
    local = metrics(router)  # from the device itself: no token
    for (path, token), line in answers.items():
        expected = {None: "401", "wrong-token-of-some-length": "401"}.get(token, "200")
        assert line.startswith(f"HTTP/1.1 {expected}"), (path, token, line)
    assert dashboard.startswith("HTTP/1.1 200")
    assert "cairn_store_bytes" in local


async def test_without_a_token_status_and_metrics_answer_the_device_only(lan_router):
    router = lan_router()
    from_lan = await lan_get(lan_address(), router.port, "/metrics")
    assert from_lan.startswith("HTTP/1.1 403")
    assert "cairn_store_bytes" in metrics(router)



async def test_an_address_whose_half_open_connection_timed_out_gets_no_reserved_slot(
        lan_router):
    """OpenSSH's per-source penalty: closing its own half-open connections does not make
    an attacker a newcomer again."""
    router = lan_router('handshake_timeout = "4s"\nmax_pending_per_address = 64\n'
                        'max_connections_per_address = 64\n', rawsocket_host="[::]")
    penalised, filler = ipv6_lan_addresses()
    reader, writer = await open_from(penalised, router.rawsocket_port, b"\x7f")
    await asyncio.sleep(1)
    stop = asyncio.Event()
    attack = asyncio.create_task(hold_half_open(filler, router.rawsocket_port, 64, stop))
    assert await closed_within(reader, 5)  # cut by the handshake timeout, the pool still full
    writer.close()
    again, again_writer = await open_from(penalised, router.rawsocket_port, b"\x7f")
    refused = await closed_within(again, 0.5)
    newcomer = await lan_client_gets_in(lan_address(), router.port)
    stop.set()
    await attack
    again_writer.close()
    assert refused
    assert newcomer


# -- SIGHUP: what of [router] it reloads ------------------------------------------------------


async def sighup(router: RouterProcess, marker: str = "SIGHUP: reloaded") -> str:
    """Send SIGHUP and wait until the router logged ``marker``: its log since then."""
    logged = len(router.log_lines())
    assert router.proc is not None
    router.proc.send_signal(signal.SIGHUP)
    await until(lambda: any(marker in line for line in router.log_lines()[logged:]),
                what=f"{marker!r} in the log")
    return "\n".join(router.log_lines()[logged:])


async def reloaded_with(router: RouterProcess, keys: str) -> str:
    """``keys`` added to the [router] table of the router's config file, then
    :func:`sighup`: its log since then."""
    text = router.config.read_text().replace("[router]\n", f"[router]\n{keys}", 1)
    router.config.write_text(text)
    return await sighup(router)


async def test_a_sighup_the_moment_the_ports_open_reloads_and_does_not_end_the_router(tmp_path):
    """A SIGHUP from `cairn config apply` or a test, sent as soon as the router accepts
    connections, used to land before its handler: SIGHUP's default action ended the router."""
    router = RouterProcess(tmp_path, REALM).start()  # (returns as soon as the port accepts)
    try:
        await sighup(router)
        assert router.proc is not None and router.proc.poll() is None
    finally:
        router.stop()


async def test_a_rotated_status_token_is_the_only_one_after_sighup(lan_router, tmp_path):
    """The attack (N9): the token file rotated after a leak and SIGHUP sent, the old token
    still read /status and the new one got 401 until a restart."""
    token_file = tmp_path / "status.token"
    token_file.write_text("the-leaked-token-of-last-week\n")
    router = lan_router(settings=f'status_token_file = "{token_file}"\n')
    address = lan_address()
    token_file.write_text("a-fresh-token-after-the-leak\n")
    await sighup(router)
    old = await lan_get(address, router.port, "/status", "the-leaked-token-of-last-week")
    new = await lan_get(address, router.port, "/status", "a-fresh-token-after-the-leak")
    assert old.startswith("HTTP/1.1 401")
    assert new.startswith("HTTP/1.1 200")


async def test_allowed_hosts_and_origins_are_reloaded_on_sighup(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        await reloaded_with(router, GREENHOUSE_LAN)
        named, grafana = await named_and_from_grafana(router.port)
    finally:
        router.stop()
    assert named.startswith("HTTP/1.1 200")
    assert grafana.startswith("HTTP/1.1 101")


async def test_sighup_logs_which_changed_router_keys_wait_for_a_restart(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        logged = await reloaded_with(router, "max_message_size = 4096\n")
    finally:
        router.stop()
    assert "router.max_message_size changed: it takes effect at the next restart" in logged
    assert "router.listen" not in logged
