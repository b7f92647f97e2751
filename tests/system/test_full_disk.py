"""A full disk must not stop live routing: acknowledged publishes that cannot be stored get
an error, everyone keeps receiving events, and storing resumes once space returns."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions

from harness.tmpfs import tmpfs
from harness.wamp_client import connect
from tests.conftest import RunningRouter, start_router
from tests.system.test_durability import REALM

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs, the data directory of the router under test."""
    with tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def fill(path: Path) -> None:
    """Write a filler file until the filesystem is full."""
    with contextlib.suppress(OSError), path.open("wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
            os.fsync(f.fileno())


async def test_live_routing_survives_a_full_disk_and_storing_resumes(small_disk, tmp_path):
    text = (f'[router]\nlisten = "127.0.0.1:0"\nrawsocket = ["127.0.0.1:0"]\n'
            f'data_dir = "{small_disk}"\n{REALM}')
    node = await start_router(text)
    router = RunningRouter(node, str(tmp_path / "unused.sock"))
    try:
        publisher = await connect(router)
        listener = await connect(router, "rawsocket-tcp", "msgpack")
        received: list[int] = []
        await listener.subscribe(lambda i, _: received.append(i), "sensor.big")
        acked = [(await publisher.publish("sensor.big", i, "x" * 2000,
                                          options=PublishOptions(acknowledge=True))).id
                 for i in range(5)]

        fill(small_disk / "filler")
        errors = []
        for i in range(5, 200):
            try:
                await publisher.publish("sensor.big", i, "x" * 20000,
                                        options=PublishOptions(acknowledge=True))
            except ApplicationError as e:
                errors.append(e)
                if len(errors) >= 3:
                    break
        assert errors, "the disk never filled up"
        assert errors[0].error == "cairn.error.storage_failed"
        assert "could not be stored" in errors[0].args[0]
        # live delivery went on for every publication, stored or not
        await asyncio.sleep(0.2)
        assert received == list(range(i + 1))

        (small_disk / "filler").unlink()
        recovered = await publisher.publish("sensor.big", "after", "x" * 100,
                                            options=PublishOptions(acknowledge=True))
        sub_id = await publisher.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        history = (await publisher.call("wamp.subscription.get_events", sub_id,
                                         limit=1000)).results[0]
        stored = [e["publication"] for e in history]
        assert set(acked) <= set(stored)
        assert stored[-1] == recovered.id
        gaps = await node.stores.store.reader.gaps()
        assert any(g[5].startswith("write failed") for g in gaps), gaps
    finally:
        await node.stop()


# -- starting on storage that cannot be written ------------------------------------------


def config_on(data_dir: Path) -> str:
    return (f'[router]\nlisten = "127.0.0.1:0"\nrawsocket = ["127.0.0.1:0"]\n'
            f'data_dir = "{data_dir}"\n{REALM}')


async def stored_once(data_dir: Path) -> int:
    """Run a router on ``data_dir`` for one acknowledged, retained reading; its publication."""
    node = await start_router(config_on(data_dir))
    try:
        publisher = await connect(RunningRouter(node, ""))
        done = await publisher.publish("sensor.t", 20.5, options=PublishOptions(
            acknowledge=True, retain=True))
        await publisher.leave()
        return done.id
    finally:
        await node.stop()


async def live_and_refused(node) -> tuple[list, ApplicationError]:
    """An EVENT still reaches a subscriber; an acknowledged publish to a history topic gets
    an error: the reading was routed, not stored."""
    router = RunningRouter(node, "")
    publisher, listener = await connect(router), await connect(router)
    received: list = []
    await listener.subscribe(lambda v: received.append(v), "sensor.t")
    with pytest.raises(ApplicationError) as refused:
        await publisher.publish("sensor.t", 21.0, options=PublishOptions(acknowledge=True))
    await publisher.publish("live.only", 1, options=PublishOptions(acknowledge=True))
    await asyncio.sleep(0.1)
    return list(received), refused.value


@pytest.fixture
def quick_retry(monkeypatch):
    from cairn.gateway.shell.store_service import StoreService
    monkeypatch.setattr(StoreService, "retry_interval", 0.2)


async def test_a_router_started_on_a_full_disk_routes_and_stores_once_space_returns(
        small_disk, quick_retry):
    """It used to exit 1 ("cannot start: disk I/O error"): no routing at all."""
    first = await stored_once(small_disk)
    fill(small_disk / "filler")
    node = await start_router(config_on(small_disk))
    try:
        received, refused = await live_and_refused(node)
        status = await node.web.status(node.router.realms["realm1"])
        (small_disk / "filler").unlink()
        for _ in range(100):
            if node.stores.error is None:
                break
            await asyncio.sleep(0.05)
        publisher = await connect(RunningRouter(node, ""))
        later = await publisher.publish("sensor.t", 22.0, options=PublishOptions(
            acknowledge=True))
        history = [e["publication"] for e in (await publisher.call(
            "wamp.subscription.get_events", await publisher.call(
                "wamp.subscription.lookup", "sensor", {"match": "prefix"}))).results[0]]
    finally:
        await node.stop()
    assert received == [21.0]
    assert refused.error == "cairn.error.storage_failed"
    assert "store is unavailable" in refused.args[0]
    assert status["store_error"]
    assert history == [first, later.id]


async def test_a_subscription_with_history_made_without_the_store_keeps_its_id_after_a_restart(
        small_disk, quick_retry):
    """It was kept in memory only: once the store opened it was never written, and after a
    restart its id named nothing."""
    await stored_once(small_disk)
    fill(small_disk / "filler")
    node = await start_router(config_on(small_disk))
    try:
        subscriber = await connect(RunningRouter(node, ""))
        made = (await subscriber.subscribe(lambda *a: None, "sensor.new")).id
        (small_disk / "filler").unlink()
        for _ in range(100):
            if node.stores.error is None:
                break
            await asyncio.sleep(0.05)
        await subscriber.leave()
    finally:
        await node.stop()
    node = await start_router(config_on(small_disk))
    try:
        looker = await connect(RunningRouter(node, ""))
        after_restart = await looker.call("wamp.subscription.lookup", "sensor.new")
    finally:
        await node.stop()
    assert after_restart == made


async def test_a_router_started_on_a_read_only_data_directory_routes_without_storing(
        small_disk):
    await stored_once(small_disk)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    node = await start_router(config_on(small_disk))
    try:
        received, refused = await live_and_refused(node)
        status = await node.web.status(node.router.realms["realm1"])
    finally:
        await node.stop()
    assert received == [21.0]
    assert refused.error == "cairn.error.storage_failed"
    assert "read-only file system" in status["store_error"].lower()


async def test_a_damaged_store_is_reported_not_replaced_and_routing_goes_on(tmp_path):
    """A file that is not a database is kept for a human (or `cairn restore`), not
    overwritten with a fresh store."""
    data = tmp_path / "data"
    data.mkdir()
    garbage = b"this is not a database, it was an SD card sector" * 100
    (data / "cairn.db").write_bytes(garbage)
    node = await start_router(config_on(data))
    try:
        received, refused = await live_and_refused(node)
        status = await node.web.status(node.router.realms["realm1"])
        metrics = await node.web.metrics()
    finally:
        await node.stop()
    assert received == [21.0]
    assert refused.error == "cairn.error.storage_failed"
    assert "not a database" in status["store_error"]
    assert "cairn_store_available 0" in metrics
    assert (data / "cairn.db").read_bytes() == garbage


async def test_an_emptied_store_does_not_hand_out_seqs_already_shipped(tmp_path):
    """A 0-byte cairn.db started again at seq 1, and the central dedupe then dropped the new
    readings as duplicates of shipped ones."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "cairn.db").write_bytes(b"")
    (data / "sync-status.json").write_text('{"state": "ok", "synced_seq": 5000}')
    await stored_once(data)
    with contextlib.closing(sqlite3.connect(data / "cairn.db")) as db:
        seqs = [row[0] for row in db.execute("SELECT seq FROM publications")]
    assert min(seqs) == 5001  # (the reading's or the router's health record at start)
