"""The serial driver end to end: simulated sensors on real ptys, the driver, and a real
router process; what a dashboard sees on sensor.<id> and gateway.device.<id>.status."""

from __future__ import annotations

import asyncio
import tomllib
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from cairn.drivers import serial_config
from cairn.drivers.serial_driver import SerialDriver
from cairn.drivers.simulator import Simulator
from harness.device_events import retained_now, watching
from harness.process import RouterProcess
from harness.waiting import until
from harness.wamp_client import all_history, connect
from tests.system.test_durability import REALM

pytestmark = pytest.mark.slow

BAUD = 115200


@pytest.fixture
def router(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    yield router
    router.stop()


@pytest.fixture
async def sim(tmp_path):
    async with Simulator(tmp_path / "dev", modbus=2, line=1, baudrate=BAUD,
                         line_interval=0.05, seed=11) as sim:
        yield sim


@pytest.fixture
async def watch(router):
    async with watching(router) as seen:
        yield seen


class Running:
    def __init__(self) -> None:
        self.drivers: list[tuple[SerialDriver, asyncio.Task]] = []

    def start(self, router: RouterProcess, sensors: str, backlog: int = 1000) -> SerialDriver:
        text = (f'[driver]\nrouter = "rawsocket+tcp://127.0.0.1:{router.rawsocket_port}"\n'
                f'backlog = {backlog}\n\n{sensors}')
        driver = SerialDriver(serial_config.parse(tomllib.loads(text), "test.toml"),
                              stale_check=0.05, drain_timeout=1.0)
        self.drivers.append((driver, asyncio.create_task(driver.run())))
        return driver

    async def stop(self) -> None:
        for _, task in self.drivers:
            task.cancel()
        await asyncio.gather(*(task for _, task in self.drivers), return_exceptions=True)


@pytest.fixture
async def drivers():
    running = Running()
    yield running
    await running.stop()


def modbus(sim: Simulator, device: str, address: int = 1, **keys) -> str:
    keys = {"interval": 0.05, **keys}
    extra = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return (f'[[sensors]]\nid = "{device}"\nkind = "modbus"\nport = "{sim.bus.link}"\n'
            f'baudrate = {BAUD}\naddress = {address}\ntimeout = 0.1\n{extra}\n')


def line(sim: Simulator, device: str, **keys) -> str:
    keys = {"interval": 0.05, **keys}
    extra = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return f'[[sensors]]\nid = "{device}"\nkind = "line"\nport = "{sim.lines[0].link}"\n{extra}\n'


async def test_readings_arrive_retained_on_sensor_topics_with_status_ok(router, sim, drivers):
    sim.bus.devices[1].hold(temperature=21.5, humidity=48.3)
    sim.lines[0].hold(temperature=-2.5, humidity=90.0)
    driver = drivers.start(router, modbus(sim, "md1") + line(sim, "ths"))
    await until(lambda: driver.link.stats.published >= 4, what="readings and statuses")
    # a dashboard that connects now gets the values at once, retained
    retained = await retained_now(router)
    assert retained["sensor.md1"] == {"temperature": 21.5, "humidity": 48.3}
    assert retained["sensor.ths"] == {"temperature": -2.5, "humidity": 90.0}
    assert retained["gateway.device.md1.status"]["status"] == "ok"
    assert retained["gateway.device.ths.status"]["status"] == "ok"


async def test_deadband_suppresses_small_changes(router, sim, drivers, watch):
    device = sim.bus.devices[1]
    device.hold(temperature=20.0, humidity=50.0)
    drivers.start(router, modbus(sim, "db", deadband=0.5))
    await until(lambda: watch.readings("db"), what="the first reading")
    device.hold(temperature=20.5, humidity=50.4)   # within the band (not more than 0.5)
    await asyncio.sleep(0.4)                        # about 8 polls
    assert watch.readings("db") == [{"temperature": 20.0, "humidity": 50.0}]
    device.hold(temperature=20.6)
    await until(lambda: len(watch.readings("db")) == 2, what="the change past the band")
    assert watch.readings("db")[1] == {"temperature": 20.6, "humidity": 50.4}


async def test_heartbeat_republishes_an_unchanged_reading(router, sim, drivers, watch):
    sim.bus.devices[1].hold(temperature=20.0, humidity=50.0)
    driver = drivers.start(router, modbus(sim, "hb", deadband=1.0, heartbeat=0.3))
    await until(lambda: len(watch.readings("hb")) >= 4, what="three heartbeats")
    assert all(r == {"temperature": 20.0, "humidity": 50.0} for r in watch.readings("hb"))
    polls = driver.ports[str(sim.bus.link)].polls
    assert polls >= 2 * len(watch.readings("hb"))   # only the heartbeats were published


async def test_unplug_sets_error_and_replug_sets_ok_again(router, sim, drivers, watch):
    drivers.start(router, modbus(sim, "plug"))
    await until(lambda: watch.statuses("plug") == [("ok", None)], what="ok")
    sim.bus.unplug()
    await until(lambda: watch.statuses("plug")[-1][0] == "error", what="error")
    # the first error says the port went away; when the reopen attempt follows before the
    # link sent it, the newer status supersedes it (the link keeps only a device's latest)
    assert watch.statuses("plug")[1] in (
        ("error", f"{sim.bus.link} disconnected"),
        ("error", f"cannot open {sim.bus.link}: No such file or directory"))
    await until(lambda: watch.statuses("plug")[-1] ==
                ("error", f"cannot open {sim.bus.link}: No such file or directory"),
                what="the port is gone")
    readings = len(watch.readings("plug"))
    sim.bus.plug()
    await until(lambda: watch.statuses("plug")[-1] == ("ok", None), what="ok again")
    await until(lambda: len(watch.readings("plug")) > readings, what="readings again")


async def test_a_device_that_does_not_answer_gets_error_with_the_reason(router, sim, drivers,
                                                                       watch):
    drivers.start(router, modbus(sim, "here", 1) +
                  modbus(sim, "missing", 7, retries=1, stale_after=5))
    await until(lambda: watch.statuses("missing"), what="a status")
    assert watch.statuses("missing")[0] == (
        "error", f"no answer from address 7 within 0.1 s (2 tries) on {sim.bus.link}")
    await until(lambda: len(watch.readings("here")) >= 1, what="the other device's readings")


async def test_an_exception_response_sets_error_naming_the_exception(router, sim, drivers,
                                                                    watch):
    drivers.start(router, modbus(sim, "badmap", registers="{ temperature = 40 }"))
    await until(lambda: watch.statuses("badmap"), what="a status")
    state, reason = watch.statuses("badmap")[0]
    assert state == "error" and "exception 0x02 ILLEGAL DATA ADDRESS" in reason


async def test_a_line_sensor_that_goes_quiet_becomes_stale_then_ok(router, sim, drivers,
                                                                  watch):
    drivers.start(router, line(sim, "quiet", stale_after=0.5))
    await until(lambda: watch.statuses("quiet") == [("ok", None)], what="ok")
    sim.lines[0].inject("silence", times=10**6)
    await until(lambda: watch.statuses("quiet")[-1][0] == "stale", what="stale")
    sim.lines[0].faults.clear()
    await until(lambda: watch.statuses("quiet")[-1] == ("ok", None), what="ok again")


async def test_stopping_the_driver_marks_its_devices_stale(router, sim, drivers, watch):
    drivers.start(router, modbus(sim, "bye"))
    await until(lambda: watch.statuses("bye") == [("ok", None)], what="ok")
    await drivers.stop()
    await until(lambda: len(watch.statuses("bye")) == 2, what="the last status")
    assert watch.statuses("bye")[-1] == ("stale", "driver stopped")


async def test_garbage_on_the_lines_never_stops_the_driver(router, sim, drivers, watch):
    sim.fault_rate = 0.5
    driver = drivers.start(router, modbus(sim, "noisy-md", 1, deadband=0, heartbeat=0.01) +
                           modbus(sim, "noisy-md2", 2, deadband=0, heartbeat=0.01) +
                           line(sim, "noisy-ths", heartbeat=0.01))
    for fault in ("garbage", "overlong", "partial", "garbage"):
        sim.lines[0].inject(fault)
    sim.bus.inject("garbage", times=5)

    def faults() -> tuple[int, int, int]:
        """(bus errors, bad lines, overlong lines) the driver counted so far."""
        stats = driver.stats()
        bus = stats["modbus"].get(str(sim.bus.link), {})
        lines = stats["line"].get(str(sim.lines[0].link), {})
        return (sum(bus.get(a, {}).get(k, 0) for a in ("1", "2")
                    for k in ("bad_crc", "bad_frame", "no_answer")),
                lines.get("malformed", 0) + lines.get("checksum_errors", 0),
                lines.get("overlong", 0))

    def counted() -> bool:
        bus, bad, overlong = faults()
        return bus > 5 and bad > 2 and overlong > 0

    # polls, not seconds: a busy machine polls less often in the same time
    await until(counted, timeout=60, what="the driver to count the faults")
    assert not drivers.drivers[0][1].done()
    assert faults()[2] == 1
    sim.fault_rate = 0.0
    before = {d: len(watch.readings(d)) for d in ("noisy-md", "noisy-md2", "noisy-ths")}
    await until(lambda: all(len(watch.readings(d)) > n + 3 for d, n in before.items()),
                what="clean readings again")


# --- the router goes away -----------------------------------------------------------------

def counter_source(sim: Simulator):
    """Every poll of device 1 reads a new temperature: 0.1, 0.2, ... (so every reading is a
    publication), as integer tenths for exact comparison."""
    ticks = count(1)
    sim.bus.devices[1].source = lambda: {"temperature": next(ticks) / 10, "humidity": 50.0}


def record_queued(driver: SerialDriver, device: str) -> list[int]:
    """The tenths of every reading the driver queues for ``device``, in order. A poll that
    times out on a busy machine takes a value from the simulator that never becomes a
    reading, so the values queued, not the counter's range, are what must arrive."""
    queued: list[int] = []
    publish = driver.link.publish

    def recording(topic: str, kwargs: dict[str, Any], *args: Any, **options: Any) -> Any:
        if topic == f"sensor.{device}":
            queued.append(round(kwargs["temperature"] * 10))
        return publish(topic, kwargs, *args, **options)

    driver.link.publish = recording
    return queued


async def history_tenths(router: RouterProcess, device: str) -> list[int]:
    session = await connect(router)
    sub = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
    events = await all_history(session, sub)
    await session.leave()
    return [round(e["kwargs"]["temperature"] * 10) for e in events
            if e["details"]["topic"] == f"sensor.{device}"]


# A publication in flight when the router dies is sent again after reconnecting (delivery is
# at least once), so a restart loses nothing the backlog held.
IN_FLIGHT = 0


async def restart_router(router: RouterProcess, driver: SerialDriver, down: float) -> None:
    await until(lambda: driver.link.stats.published >= 10, what="some readings")
    router.kill()
    await asyncio.sleep(down)
    await asyncio.to_thread(router.start)  # the driver's event loop carries on meanwhile
    await until(lambda: driver.link.stats.connected and not driver.link.backlog,
                timeout=15, what="the driver to reconnect and drain its backlog")


async def test_a_router_restart_loses_no_reading_within_the_backlog(router, sim, drivers):
    counter_source(sim)
    driver = drivers.start(router, modbus(sim, "count", deadband=0))
    queued = record_queued(driver, "count")
    await restart_router(router, driver, down=1.0)
    await asyncio.sleep(0.2)
    await drivers.stop()
    got = set(await history_tenths(router, "count"))  # a set: delivery is at least once
    assert got <= set(queued)  # (and the recording saw every reading)
    missing = set(queued) - got
    assert driver.link.stats.dropped_full == 0 and driver.link.stats.reconnects >= 1
    assert len(missing) <= driver.link.stats.dropped_refused <= IN_FLIGHT
    assert max(got) > 30   # readings were taken, and kept, while the router was down


async def test_a_long_outage_drops_only_the_oldest_readings_beyond_the_backlog(router, sim,
                                                                               drivers):
    counter_source(sim)
    driver = drivers.start(router, modbus(sim, "bounded", deadband=0), backlog=5)
    queued = record_queued(driver, "bounded")
    await restart_router(router, driver, down=1.0)
    await drivers.stop()
    got = set(await history_tenths(router, "bounded"))
    assert got <= set(queued)
    missing = set(queued) - got
    stats = driver.link.stats
    assert stats.dropped_full > 0
    # every reading lost is one the link counted as dropped for a full backlog (it may
    # also count one it was still sending when it made room, and that one arrived)
    assert len(missing) <= stats.dropped_full + stats.dropped_refused
    assert stats.dropped_refused <= IN_FLIGHT
    # what was dropped is the oldest waiting readings: after the gap, the newest are there
    assert max(missing) < max(got) - 3


async def test_during_an_outage_a_fast_sensor_drops_only_its_own_oldest_readings(router, sim,
                                                                                 drivers):
    counter_source(sim)
    driver = drivers.start(router, modbus(sim, "slow", interval=2, deadband=0) +
                           line(sim, "fast", deadband=0, heartbeat=0.01), backlog=10)
    queued = record_queued(driver, "slow")
    await restart_router(router, driver, down=1.0)
    await drivers.stop()
    assert set(driver.link.stats.dropped_by_device) == {"fast"}
    assert set(queued) <= set(await history_tenths(router, "slow"))


# --- the command line ---------------------------------------------------------------------

async def test_sensor_run_publishes_until_sigterm(router, sim, tmp_path, watch):
    import signal
    import sys

    config = tmp_path / "sensors.toml"
    config.write_text(f'[driver]\nrouter = "{router.ws_url}"\n\n' + modbus(sim, "cli"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cairn.drivers.cli", "sensor", "run", "--config", str(config),
        cwd=Path(__file__).resolve().parents[2], stderr=asyncio.subprocess.PIPE)
    try:
        await until(lambda: watch.readings("cli"), what="a reading from the subprocess")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, stderr.decode()
    await until(lambda: watch.statuses("cli")[-1] == ("stale", "driver stopped"),
                what="the last status")
