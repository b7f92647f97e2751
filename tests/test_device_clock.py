"""A device whose clock starts in the past (no RTC battery, no time source), as a user meets
it: readings taken while the clock is wrong, NTP's step to the true time, more readings,
``cairn-sync`` shipping the history to an HTTP sink on this host, and ``cairn spark ingest``
here re-basing what was taken before the step. Its own guest (tests/qemu_device.py), so that
nothing another test did to a device (power cuts lose unacknowledged seqs) shows as a gap.

``make appliance-test``; as root."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from autobahn.wamp.types import PublishOptions

from harness.landing import landed
from harness.wamp_client import connect
from tests import qemu_device
from tests.test_sync import FlakyServer

pytestmark = [pytest.mark.appliance]

missing = qemu_device.tools_missing()
if missing or os.geteuid() != 0:
    pytestmark.append(pytest.mark.skip(
        reason=f"{missing} is not installed" if missing else "needs root"))

TOPIC = "sensor.clock-test"
GATEWAY = "qemu-clock"
SINK = "10.0.2.100:80"  # the guest's view of the host's sink (QEMU guestfwd)
SYNC_CONFIG = f"""
[sync]
sink = "http://{SINK}/landing/{{name}}"
gateway_id = "{GATEWAY}"
interval = 5
"""


@pytest.fixture(scope="module")
def sink(tmp_path_factory):
    server = FlakyServer(root=tmp_path_factory.mktemp("landing"), failures=0).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stale_clock_device(image, sink, tmp_path_factory):
    """First boot (and its reboot into the read-only root) with the RTC at 2000-01-01."""
    img, boot = image
    guest = qemu_device.Guest(img, boot, tmp_path_factory.mktemp("clock-device"),
                              sensor_uart=False)
    guest.start(rtc_base="2000-01-01T00:00:00", host_services={SINK: sink.port})
    guest.wait_ready()
    yield guest
    guest.close()


async def _take_readings(port: int, numbers: range, pace: float = 0.5) -> dict[int, float]:
    """Acknowledged, retained readings ``{"n": n}``, one every ``pace`` s. Returns the host's
    time each was sent: the truth that Spark's re-basing must find again."""
    session = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
    sent, acks = {}, []
    for n in numbers:
        sent[n] = time.time()
        acks.append(session.publish(TOPIC, n=n, options=PublishOptions(acknowledge=True,
                                                                       retain=True)))
        await asyncio.sleep(pace)
    await asyncio.wait_for(asyncio.gather(*acks), 60)  # durable within the commit window
    session.leave()
    return sent


def _landed_numbers(root) -> set[int]:
    _, rows = landed(root)
    return {r["kwargs"]["n"] for r in rows if r["topic"] == TOPIC}


def test_readings_taken_before_ntp_steps_a_stale_clock_are_rebased_to_the_true_time(
        stale_clock_device, sink, spark, tmp_path):
    from cairn.sync import spark as jobs

    device = stale_clock_device
    guest_wall = float(device.ssh("date +%s.%N").stdout)
    # systemd moves a clock older than its own build date up to that date: wrong by months
    assert time.time() - guest_wall > 30 * 86400, guest_wall
    with device.tunnel() as port:
        truth = asyncio.run(_take_readings(port, range(1, 11)))
        step = device.step_clock_to_host_time()
        truth |= asyncio.run(_take_readings(port, range(11, 21)))
    assert step > 30 * 86400

    device.ssh(f"printf '%s' '{SYNC_CONFIG}' | sudo tee -a /etc/cairn/cairn.toml > /dev/null "
               "&& sudo systemctl start cairn-sync.service")
    deadline = time.monotonic() + 300
    while _landed_numbers(sink.root) != set(truth):
        assert time.monotonic() < deadline, sorted(_landed_numbers(sink.root))
        time.sleep(2)
    device.ssh("sudo systemctl stop cairn-sync.service")

    table, reports = tmp_path / "table", tmp_path / "reports"
    jobs.ingest(spark, str(sink.root), str(table))
    rows = {json.loads(r.kwargs)["n"]: r for r in spark.read.parquet(str(table)).collect()
            if r.topic == TOPIC}
    assert set(rows) == set(truth)
    for n, row in sorted(rows.items()):
        taken = row.event_time.timestamp()  # naive, in local time, as PySpark hands it back
        assert abs(taken - truth[n]) < 1.0, (n, datetime.fromtimestamp(truth[n], UTC), row)
        assert row.time_estimated is (n <= 10), (n, row)
    assert all(abs(r.wall_ms / 1000 - truth[n]) > 30 * 86400 for n, r in rows.items() if n <= 10)

    jobs.report(spark, str(table), str(reports))
    assert spark.read.parquet(str(reports / "gaps")).filter(
        f"gateway_id = '{GATEWAY}'").count() == 0
