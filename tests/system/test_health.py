"""The gateway's health records (gateway.shell.health): what each field says, when a record is
made, that only the router may publish them, and that they travel in the sync batches.

A real router in this process on real sockets and a real SQLite store; the records are read
as a client reads them (a subscription to ``cairn.gateway.health``) or assembled by the
router's own reporter (``node.health.record()``) where a field's value is checked.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from cairn.base import clock
from cairn.base.clock_readings import Anchor, rfc3339
from cairn.base.console import installed_version
from cairn.drivers.runtime import DeviceStatus, RouterLink
from cairn.formats.batch import encode_rows
from cairn.formats.health import MAX_DEVICES, MAX_RECORD_BYTES, SCHEMA
from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.core.retention import OWN_AUTHID
from cairn.gateway.ops import update_state
from cairn.gateway.shell.health import HealthReporter
from cairn.gateway.store import HistoryReader
from cairn.sync.sinks import DirectorySink, HttpSink
from cairn.sync.uploader import Uploader
from harness.config import history_rule, open_realm, router_table
from harness.landing import landed
from harness.waiting import until
from harness.wamp_client import connect
from tests.conftest import RunningRouter, start_router
from tests.system.test_sync import FlakyServer

ACK = PublishOptions(acknowledge=True)
RETAINED = PublishOptions(acknowledge=True, retain=True)


async def health_router(tmp_path: Path, interval: str = "1h", limits: str = "") -> RunningRouter:
    extra = f'health_interval = "{interval}"\n' + (f"[router.limits]\n{limits}\n" if limits
                                                     else "")
    node = await start_router(router_table(tmp_path / "data", rawsocket=["127.0.0.1:0"],
                                           extra=extra)
                              + open_realm(history=[history_rule("sensor")]))
    return RunningRouter(node, "")


async def records_of(router: RunningRouter) -> tuple[Any, list[dict[str, Any]]]:
    """A session subscribed to the health records (the retained one first), and the list
    they arrive in."""
    session = await connect(router)
    records: list[dict[str, Any]] = []
    await session.subscribe(lambda **record: records.append(record), HEALTH_TOPIC,
                            options=SubscribeOptions(get_retained=True))
    return session, records


def health_records_held(router: RunningRouter) -> int:
    """The seq of the router's newest health record (retained), 0 before the first."""
    held = router.node.router.realms["realm1"].retention.newest(HEALTH_TOPIC, "exact")
    return held[0].seq if held else 0


@pytest.fixture
async def router(tmp_path):
    router = await health_router(tmp_path)
    await until(lambda: health_records_held(router), what="the record made at start")
    yield router
    await router.node.stop()


# -- when a record is made -------------------------------------------------------------------

async def test_the_router_records_its_health_at_start_and_every_interval(tmp_path):
    router = await health_router(tmp_path, interval="1s")
    try:
        session, records = await records_of(router)
        await until(lambda: len(records) >= 3, timeout=5, what="three health records")
        await session.leave()
    finally:
        await router.node.stop()
    assert all(r["schema"] == SCHEMA for r in records)
    assert records[-1]["uptime_s"] > records[0]["uptime_s"]


async def test_without_a_change_no_record_comes_before_the_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(HealthReporter, "check_interval", 0.05)
    router = await health_router(tmp_path, interval="1h")
    try:
        session, records = await records_of(router)
        await until(lambda: records, what="the record made at start")
        await asyncio.sleep(0.5)
        await session.leave()
    finally:
        await router.node.stop()
    assert len(records) == 1


async def test_a_device_going_into_error_is_recorded_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(HealthReporter, "check_interval", 0.05)
    router = await health_router(tmp_path, interval="1h")
    try:
        session, records = await records_of(router)
        await session.publish("gateway.device.pump.status", status="ok", options=RETAINED)
        await until(lambda: records and "pump" in records[-1]["devices"], what="pump ok")
        await session.publish("gateway.device.pump.status", status="error",
                              reason="no answer from address 7", errors=1, options=RETAINED)
        await until(lambda: records[-1]["devices"]["pump"]["status"] == "error", timeout=2,
                    what="a record of the error")
        await session.leave()
    finally:
        await router.node.stop()


# -- only the router publishes there ---------------------------------------------------------

async def test_a_client_may_not_publish_on_the_health_topic(router):
    session, records = await records_of(router)
    await until(lambda: records, what="the record made at start")
    with pytest.raises(ApplicationError) as refused:
        await session.publish(HEALTH_TOPIC, schema=1, devices={}, options=ACK)
    session.publish(HEALTH_TOPIC, schema=1, devices={})  # unacknowledged: dropped
    await asyncio.sleep(0.2)
    await session.leave()
    assert refused.value.error == "wamp.error.not_authorized"
    assert "reserved for the router" in refused.value.args[0]
    assert len(records) == 1 and "version" in records[0]


# -- the fields ------------------------------------------------------------------------------

async def test_version_boot_and_uptimes(router):
    record = await router.node.health.record()
    assert record["schema"] == SCHEMA == 1
    assert record["version"] == installed_version()
    assert record["boot_id"] == clock.boot_id()
    assert 0 <= record["uptime_s"] < 60
    assert abs(record["system_uptime_s"] - clock.boottime_ns() / 1e9) < 5


async def test_the_record_states_its_interval(router):
    """The fixture's router.health_interval is 1h: the fleet report reads it."""
    assert (await router.node.health.record())["interval_s"] == 3600.0


async def test_slot_trial_and_the_last_updates_result(router, tmp_path, monkeypatch):
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("console=ttyAMA0 rauc.slot=B root=/dev/vda3\n")
    monkeypatch.setattr(update_state, "CMDLINE", cmdline)
    monkeypatch.setattr(update_state, "UPDATE_DIR", tmp_path / "update")
    update_state.record(tmp_path / "update", "failed", "the router did not become ready",
                        update_state.Trial("B", "0.2.0", "A"))
    record = await router.node.health.record()
    assert record["slot"] == "B" and record["update_on_trial"] is None
    last = record["last_update"]
    assert (last["result"], last["version"], last["reason"]) == \
        ("failed", "0.2.0", "the router did not become ready")


async def test_clock_state_steps_and_the_last_step(router):
    store = router.node.stores.store
    now = clock.wall_ns()
    boot = clock.boottime_ns()
    store.add_anchor(Anchor("step", clock.boot_id(), boot, now, now - boot - 3600 * 10**9,
                            True), 0)
    await store.flush()
    record = await router.node.health.record()
    assert record["clock"]["synchronized"] is clock.clock_synchronized()
    assert record["clock"]["steps"] == 1
    assert record["clock"]["last_step"] == {"at": rfc3339(now // 10**6), "by_s": 3600.0}


async def test_store_size_events_and_damage(router):
    session = await connect(router)
    for i in range(3):
        await session.publish("sensor.t1", temperature=20 + i, options=ACK)
    await session.leave()
    record = await router.node.health.record()
    store = record["store"]
    assert store["available"] is True and store["error"] is None
    assert store["bytes"] == await router.node.stores.store.reader.size_bytes() > 0
    assert store["events"] == 3 + 1  # the readings and the record made at start
    assert (store["dropped_events"], store["damaged_rows_skipped"]) == (0, 0)


def mark_all_synced(db: Path) -> None:
    """What the uploader does once the sink confirmed everything."""
    reader = HistoryReader(db)
    try:
        reader.set_synced_seq(reader.highest_seq())
    finally:
        reader.close()


async def test_backlog_and_its_oldest_age_until_sync_ships_it(router, tmp_path):
    session = await connect(router)
    await session.publish("sensor.t1", temperature=20, options=ACK)
    await session.leave()
    await asyncio.sleep(1.1)
    record = await router.node.health.record()
    assert record["backlog"]["events"] == 2  # the record made at start, the reading
    assert record["backlog"]["oldest_age_s"] >= 1
    await asyncio.to_thread(mark_all_synced, tmp_path / "data" / "cairn.db")
    record = await router.node.health.record()
    assert record["backlog"] == {"events": 0, "oldest_age_s": None}


async def test_sync_is_none_until_the_uploader_reports(router):
    assert (await router.node.health.record())["sync"] is None


def upload_once(data_dir: Path, daily_bytes: int) -> None:
    uploader = Uploader("gw-health", HistoryReader(data_dir / "cairn.db"),
                        DirectorySink(data_dir.parent / "landing"),
                        data_dir / "sync-status.json", daily_bytes=daily_bytes)
    try:
        uploader.once()
    finally:
        uploader.reader.close()


async def test_sync_state_bytes_sent_and_budget_as_the_uploader_reports_them(router, tmp_path):
    session = await connect(router)
    await session.publish("sensor.t1", temperature=20, options=ACK)  # commits the record too
    await session.leave()
    await asyncio.to_thread(upload_once, tmp_path / "data", 1)
    sync = (await router.node.health.record())["sync"]
    assert (sync["state"], sync["last_error"], sync["damaged_rows_shipped"]) == \
        ("idle", None, 0)
    assert sync["bytes_sent"] == sync["budget_used"] > 0
    assert (sync["budget_bytes"], sync["health_only"]) == (1, True)


async def test_card_wear_says_measuring_at_first(router):
    card = (await router.node.health.record())["card"]
    assert card["measuring"] is True and card["bytes_per_day"] is None
    assert (card["life_years"], card["endurance_tb"]) == (None, 10.0)
    assert 0 <= card["window_s"] < 60


async def test_devices_status_errors_and_last_reading_age(router):
    session = await connect(router)
    await session.publish("gateway.device.pump.status", status="error",
                          reason="no answer from address 7", errors=2, options=RETAINED)
    await session.publish("sensor.pump", temperature=20.5, options=RETAINED)
    await session.publish("sensor.mqtt-only", temperature=19.0, options=RETAINED)
    await session.leave()
    await asyncio.sleep(0.3)
    devices = (await router.node.health.record())["devices"]
    assert list(devices) == ["mqtt-only", "pump"]
    pump = devices.pop("pump")
    assert (pump["status"], pump["reason"], pump["errors"]) == \
        ("error", "no answer from address 7", 2)
    assert 0.3 <= pump["last_reading_age_s"] < 5
    assert list(devices["mqtt-only"]) == ["last_reading_age_s"]  # no status topic


async def test_junk_retained_topics_are_counted_and_the_record_stays_small(router):
    """Any client that may publish a retained sensor.* topic makes a device of it."""
    session = await connect(router)
    await session.publish("gateway.device.pump.status", status="ok", options=RETAINED)
    for i in range(300):
        session.publish(f"sensor.junk-{i:04d}-{'x' * 40}", temperature=i,
                        options=PublishOptions(retain=True))
    await session.publish("sensor.pump", temperature=20.5, options=RETAINED)  # after them
    await session.leave()
    record = await router.node.health.record()
    assert "pump" in record["devices"] and len(record["devices"]) == MAX_DEVICES
    assert record["devices_unlisted"] == 301 - MAX_DEVICES
    assert len(json.dumps(record).encode()) <= MAX_RECORD_BYTES


async def test_limit_hits(tmp_path):
    router = await health_router(tmp_path, limits="max_subscriptions_per_session = 1")
    try:
        session = await connect(router)
        await session.subscribe(lambda: None, "sensor.a")
        with pytest.raises(ApplicationError):
            await session.subscribe(lambda: None, "sensor.b")
        await session.leave()
        record = await router.node.health.record()
    finally:
        await router.node.stop()
    assert record["limit_hits"] == {"max_subscriptions_per_session": 1}


def test_a_drivers_device_status_counts_its_errors():
    link = RouterLink("ws://127.0.0.1:1/ws", "realm1")  # never connected: it queues
    status = DeviceStatus("pump", link)
    for state in ("ok", "error", "error", "ok", "error"):
        status.set(state, "no answer" if state == "error" else None)
    assert [p.kwargs["errors"] for p in link.backlog if p.status][-1] == 2


# -- in the sync batches ---------------------------------------------------------------------

async def test_health_records_travel_in_the_sync_batches_with_every_field(tmp_path):
    router = await health_router(tmp_path, interval="1s")
    server = FlakyServer(tmp_path / "landing").start()
    try:
        session, records = await records_of(router)
        await until(lambda: len(records) >= 2, timeout=5, what="two health records")
        # committed with the reading (a record waits up to a minute for a commit)
        await session.publish("sensor.t1", temperature=20, options=ACK)
        await session.leave()
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1) as thread:  # SQLite objects stay in theirs
            uploader = await loop.run_in_executor(thread, lambda: Uploader(
                "gw-health", HistoryReader(tmp_path / "data" / "cairn.db"),
                HttpSink(server.url), tmp_path / "data" / "sync-status.json"))
            await loop.run_in_executor(thread, uploader.once)
            await loop.run_in_executor(thread, uploader.reader.close)
    finally:
        server.stop()
        await router.node.stop()
    _, rows = landed(tmp_path / "landing")
    health = [r for r in rows if r["topic"] == HEALTH_TOPIC]
    assert len(health) >= 2 and {r["authid"] for r in health} == {OWN_AUTHID}
    assert health[1]["kwargs"] == records[1]  # every field, as the subscriber got it
    assert any(r["topic"] == "sensor.t1" for r in rows)
    one = encode_rows("gw-health", [health[1]])
    print(f"one health record: {len(json.dumps(health[1]['kwargs']))} B of JSON kwargs, "
          f"{len(gzip.decompress(one))} B as a batch line, {len(one)} B gzipped alone")

