"""A device whose clock starts in the past (no RTC battery, no time source), as a user meets
it: readings taken while the clock is wrong, NTP's step to the true time, more readings,
``cairn-sync`` shipping the history to an HTTP sink on this host, and ``cairn spark ingest``
here re-basing what was taken before the step. Then its network cable pulled while its serial
sensor keeps reading, and put back: every reading reaches the table once, and the device's
own health records give it a row in the fleet report. Its own guest (qemu_device.py),
so that nothing another test did to a device (power cuts lose unacknowledged seqs) shows as a
gap.

The device is set up as a person flashing a card for a site would: its host name (the
gateway id sync ships under), its sink and its serial sensor come from the boot partition's
``cairn/`` folder; nothing is typed on it.

``make appliance-test``; as root."""

from __future__ import annotations

import asyncio
import json
import os
import time
import tty
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core.config import HEALTH_TOPIC
from harness.landing import landed
from harness.wamp_client import connect
from tests.appliance import qemu_device
from tests.system.test_sync import FlakyServer

pytestmark = [pytest.mark.appliance]

missing = qemu_device.tools_missing()
if missing or os.geteuid() != 0:
    pytestmark.append(pytest.mark.skip(
        reason=f"{missing} is not installed" if missing else "needs root"))

TOPIC = "sensor.clock-test"
GATEWAY = "qemu-clock"   # its provisioned host name: sync's default gateway id
SINK = "10.0.2.100:80"  # the guest's view of the host's sink (QEMU guestfwd)
PROVISIONED = {
    "hostname": GATEWAY + "\n",
    "sensors/uart.toml": qemu_device.SERIAL_SENSOR_CONFIG,
    "cairn.toml": (qemu_device.ROOT / "images/config/cairn.toml").read_text() + f"""
[sync]
sink = "http://{SINK}/landing/{{name}}"
interval = 5
""",
}


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
                              provision=PROVISIONED)
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


def landed_manifests(root, topic: str, key: str) -> set:
    _, rows = landed(root)
    return {r["kwargs"][key] for r in rows if r["topic"] == topic}


def _landed_numbers(root) -> set[int]:
    return landed_manifests(root, TOPIC, "n")


def _wait_landed(root, topic: str, key: str, expected: set, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not expected <= landed_manifests(root, topic, key):
        assert time.monotonic() < deadline, sorted(expected - landed_manifests(root, topic, key))
        time.sleep(2)


def _wait_health_naming(root, device: str, timeout: float = 300) -> None:
    """Until a health record that lists ``device`` has landed. The record at the router's
    start may come before the device's driver first reports, and the next one follows the
    change within a minute (HealthReporter.check_interval), in whichever batch holds it."""
    deadline = time.monotonic() + timeout
    while not any(device in (r["kwargs"].get("devices") or {})
                  for r in landed(root)[1] if r["topic"] == HEALTH_TOPIC):
        assert time.monotonic() < deadline, f"no health record naming {device} landed"
        time.sleep(2)


def test_readings_taken_before_ntp_steps_a_stale_clock_are_rebased_to_the_true_time(
        stale_clock_device, sink, spark, tmp_path):
    from cairn.central import spark as jobs

    device = stale_clock_device
    guest_wall = float(device.ssh("date +%s.%N").stdout)
    # systemd moves a clock older than its own build date up to that date: wrong by months
    assert time.time() - guest_wall > 30 * 86400, guest_wall
    with device.tunnel() as port:
        truth = asyncio.run(_take_readings(port, range(1, 11)))
        step = device.step_clock_to_host_time()
        truth |= asyncio.run(_take_readings(port, range(11, 21)))
    assert step > 30 * 86400

    # cairn-sync has shipped since boot (the card's [sync]): the readings taken before the
    # step left in batches stamped with the wrong clock, re-based from later batches' anchors
    _wait_landed(sink.root, TOPIC, "n", set(truth))

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


def _play_sensor(pty: str, temperatures: list[float], pace: float = 0.5) -> None:
    """The sensor on the host end of the guest's second UART, one sentence every ``pace`` s."""
    from cairn.drivers.line import ths_sentence

    fd = os.open(pty, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    try:
        for seq, temperature in enumerate(temperatures, 1):
            os.write(fd, f"{ths_sentence('uart-1', seq, temperature, 50.0)}\r\n".encode())
            time.sleep(pace)
    finally:
        os.close(fd)


def test_readings_taken_while_the_link_is_down_reach_the_table_once_and_the_gateway_its_fleet_row(
        stale_clock_device, sink, spark, tmp_path):
    from cairn.central import spark as jobs

    device = stale_clock_device
    version = device.ssh("/opt/cairn/bin/cairn --version").stdout.split()[-1]
    temperatures = [round(30 + k / 10, 1) for k in range(1, 21)]
    device.monitor("set_link nic off")   # the cable pulled: the sink is out of reach
    try:
        _play_sensor(device.serial_pty, temperatures)
        time.sleep(20)   # several of the uploader's tries (interval 5 s) fail meanwhile
        assert not landed_manifests(sink.root, "sensor.uart-1", "temperature") & set(temperatures)
    finally:
        device.monitor("set_link nic on")
    _wait_landed(sink.root, "sensor.uart-1", "temperature", set(temperatures))
    _wait_health_naming(sink.root, "uart-1")

    table, reports = tmp_path / "table", tmp_path / "reports"
    jobs.ingest(spark, str(sink.root), str(table))
    events = spark.read.parquet(str(table)).filter(f"gateway_id = '{GATEWAY}'")
    readings = [json.loads(r.kwargs)["temperature"]
                for r in events.filter("topic = 'sensor.uart-1'").collect()]
    assert sorted(t for t in readings if t in temperatures) == temperatures, sorted(readings)

    jobs.report(spark, str(table), str(reports))
    (fleet,) = spark.read.parquet(str(reports / "fleet")).filter(
        f"gateway_id = '{GATEWAY}'").collect()
    assert fleet.version == version, fleet
    assert fleet.slot in ("A", "B") and fleet.devices >= 1, fleet
    assert fleet.last_health is not None and fleet.health_problem is None, fleet
    flags = (fleet.flags or "").split(", ")
    assert not {"offline", "no_health", "data_lost", "health_malformed"} & set(flags), fleet
