"""A full disk must not stop live routing: acknowledged publishes that cannot be stored get
an error, everyone keeps receiving events, and storing resumes once space returns."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions

from tests.conftest import RunningRouter, start_router
from tests.test_durability import REALM
from tests.wamp_client import connect

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 2 MiB tmpfs, the data directory of the router under test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


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
        gaps = await node.store.gaps()
        assert any(g[5].startswith("write failed") for g in gaps), gaps
    finally:
        await node.stop()
