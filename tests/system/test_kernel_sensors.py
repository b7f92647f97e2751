"""Kernel sensors (hwmon, iio and w1 kinds) on a sysfs tree in a temporary directory, laid out
file for file as the kernel's ABI documents describe it (drivers.kernel_sim); then the driver
as a process against a real router, the tree changed under it.

Faults come from the file system, honestly: nothing in the reader knows the tree is not
/sys. Each stands for errnos the kernel gives:

- ``EIO``: the real EIO (a symlink to /proc/self/mem, whose read at offset 0 fails), as a
  DHT11's checksum failure, an SHT3x's CRC error or a bus fault gives it;
- ``ENXIO``: the real ENXIO (a Unix socket, which open(2) refuses), as an I2C adapter gives it
  when no chip acknowledged the address;
- ``EISDIR`` (a directory): the errnos no file system gives, EREMOTEIO (the Pi's i2c-bcm2835
  on a NACK) and ETIMEDOUT (a DHT11 that does not answer);
- ``ENOENT`` (the file or device removed): a chip unbound or unplugged, or renumbered.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import sys
import time
import tomllib
from pathlib import Path

import pytest

from cairn.drivers import kernel, serial_config
from cairn.drivers.kernel import KernelDevice, KernelSensor, Sysfs
from cairn.drivers.kernel_sim import SimSysfs
from cairn.drivers.kinds.kernel import phase_of
from cairn.drivers.sysfs import HWMON, IIO, W1, Fault
from harness.device_events import retained_now
from harness.process import RouterProcess
from harness.waiting import until
from tests.system import test_serial_driver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim(tmp_path) -> SimSysfs:
    return SimSysfs(tmp_path / "sys")


def device(sim: SimSysfs, family, name: str, **kw) -> KernelDevice:
    return KernelDevice(Sysfs(sim.root), family, name, **kw)


# --- the families on the tree -----------------------------------------------------------------

HUMIDITY_SENSORS = {
    "sht3x-hwmon": (HWMON, lambda sim: sim.sht3x(temperature=23.4, humidity=41.5)),
    "sht21-hwmon": (HWMON, lambda sim: sim.sht21(temperature=23.4, humidity=41.5)),
    "bme280-iio": (IIO, lambda sim: sim.bme280(temperature=23.4, humidity=41.5)),
    "hdc1000-iio-raw": (IIO, lambda sim: sim.hdc1000(temperature=23.4, humidity=41.5)),
    "dht11-iio-gpio": (IIO, lambda sim: sim.dht11(temperature=23.4, humidity=41.5)),
}


@pytest.mark.parametrize("name", HUMIDITY_SENSORS)
def test_a_humidity_sensor_is_found_by_its_device_and_read_in_celsius_and_percent(sim, name):
    family, make = HUMIDITY_SENSORS[name]
    chip = make(sim)
    values = device(sim, family, chip.device).read()
    assert values["temperature"] == pytest.approx(23.4, abs=0.005)
    assert values["humidity"] == pytest.approx(41.5, abs=0.005)


def test_a_bme280_reads_pressure_in_hectopascal(sim):
    sim.bme280(pressure=1008.6)
    assert device(sim, IIO, "1-0076").read()["pressure"] == 1008.6


def test_a_ds18b20_is_read_from_its_temperature_file(sim):
    sim.ds18b20("0316a2790b6f", temperature=-7.25)
    assert device(sim, W1, "28-0316a2790b6f").read() == {"temperature": -7.25}


def test_an_older_kernel_s_ds18b20_is_read_from_w1_slave(sim):
    chip = sim.ds18b20("000005e2fdc3", temperature=19.5, w1_slave_only=True)
    assert not (chip.directory / "temperature").exists()
    assert device(sim, W1, "28-000005e2fdc3").read() == {"temperature": 19.5}


def test_a_reading_follows_the_values_the_chip_gives(sim):
    chip = sim.sht3x(temperature=20.0)
    reader = device(sim, HWMON, "1-0044")
    reader.read()
    chip.set(temperature=20.75)
    assert reader.read()["temperature"] == 20.75
    assert reader.stats.found == 1  # the directory is looked up once while it reads


# --- faults -----------------------------------------------------------------------------------

@pytest.mark.parametrize("code", [errno.EIO, errno.ENXIO, errno.EISDIR])
def test_an_errno_reading_a_value_is_a_fault_naming_it_and_the_next_good_read_is_a_reading(
        sim, code):
    chip = sim.sht3x()
    reader = device(sim, HWMON, "1-0044")
    chip.fail("temp1_input", code)
    fault = reader.read()
    assert fault.kind == errno.errorcode[code]
    assert fault.reason.startswith(f"temp1_input: {errno.errorcode[code]}")
    chip.set(temperature=21.0)
    assert reader.read()["temperature"] == 21.0


def test_a_dht11_checksum_failure_is_eio_and_its_next_reading_is_good(sim):
    chip = sim.dht11(temperature=18.0)
    reader = device(sim, IIO, "dht11@0")
    chip.fail("in_temp_input", errno.EIO)
    fault = reader.read()
    assert fault.kind == "EIO" and "checksum" in fault.reason
    chip.set(temperature=18.0)
    assert reader.read() == {"temperature": 18.0, "humidity": 60.0}


def test_a_ds18b20_s_power_on_value_is_a_fault(sim):
    chip = sim.ds18b20()
    chip.set(temperature=85.0)
    assert device(sim, W1, chip.device).read().kind == "power_on"


def test_garbage_in_a_value_file_is_a_fault_quoting_it(sim):
    chip = sim.bme280()
    chip.write("in_humidityrelative_input", "-EIO\n")
    assert device(sim, IIO, "1-0076").read() == \
        Fault("garbage", "in_humidityrelative_input reads '-EIO', not a number")


def test_a_default_channel_whose_file_goes_is_a_fault_not_a_field_less(sim):
    chip = sim.bme280()
    reader = device(sim, IIO, "1-0076")
    reader.read()
    chip.fail("in_pressure_input", errno.ENOENT)
    assert reader.read() == Fault("missing", "no in_pressure_input or in_pressure_raw for "
                                             "pressure (cairn sensor scan lists what it has)")


# --- finding the device -----------------------------------------------------------------------

def test_a_chip_that_comes_back_under_another_iio_device_is_found_again(sim):
    chip = sim.bme280(temperature=21.0)
    reader = device(sim, IIO, "1-0076")
    assert reader.read()["temperature"] == 21.0
    sim.remove(chip)
    assert reader.read().kind == "absent"
    sim.dht11()                                      # takes iio:device0 meanwhile
    chip = sim.bme280(temperature=22.0)
    assert chip.directory.name == "iio:device1"
    assert reader.read()["temperature"] == 22.0
    assert reader.stats.directory.endswith("1-0076/iio:device1")


def test_a_hwmon_chip_probed_again_under_another_number_reads_on_without_a_fault(sim):
    chip = sim.sht3x()
    reader = device(sim, HWMON, "1-0044")
    reader.read()
    sim.remove(chip)
    sim.sht3x(index=5, temperature=30.0)
    assert reader.read()["temperature"] == 30.0 and reader.stats.found == 2


def test_a_device_that_is_not_there_says_so(sim):
    sim.adapter(1)
    fault = device(sim, HWMON, "1-0044").read()
    assert fault.kind == "absent" and "no device 1-0044" in fault.reason


def test_a_ds18b20_that_left_the_bus_says_so(sim):
    fault = device(sim, W1, "28-0316a2790b6f").read()
    assert fault.kind == "absent" and "not on the 1-Wire bus" in fault.reason


def test_a_device_whose_probe_failed_says_it_has_no_driver(sim):
    sim.i2c_device(1, 0x77, "dps310", driver=None)  # the kernel's -121 at probe: no chip
    fault = device(sim, IIO, "1-0077").read()
    assert fault.kind == "unbound" and "probe failed" in fault.reason


# --- creating a chip through new_device -------------------------------------------------------

def test_a_missing_chip_is_created_through_new_device_then_read(sim):
    sim.adapter(1)
    reader = device(sim, IIO, "1-0076", chip="bme280")
    fault = reader.read()
    assert sim.new_device_lines(1) == ["bme280 0x76"]
    # a kernel probes within the write; the tree's "kernel" is this test, so it is later
    assert fault.kind == "absent" and "did not appear" in fault.reason
    sim.bme280(temperature=24.0)
    assert reader.read()["temperature"] == 24.0
    assert sim.new_device_lines(1) == ["bme280 0x76"] and reader.stats.created == 1


def test_a_chip_is_not_created_where_the_device_exists(sim):
    sim.i2c_device(1, 0x76, "bme280", driver=None)
    assert device(sim, IIO, "1-0076", chip="bme280").read().kind == "unbound"
    assert sim.new_device_lines(1) == []


def test_creating_a_chip_on_a_bus_that_is_not_there_says_how_to_enable_it(sim):
    fault = device(sim, HWMON, "1-0044", chip="sht3x").read()
    assert fault.kind == "no_bus" and "dtparam=i2c_arm=on" in fault.reason


def test_a_refused_new_device_write_says_what_happened(sim):
    # EISDIR stands for the EACCES (not root) or EROFS (systemd's ProtectKernelTunables=) of
    # a real /sys: root writes any file of a temporary directory
    (sim.adapter(1) / "new_device").unlink()
    (sim.adapter(1) / "new_device").mkdir()
    fault = device(sim, HWMON, "1-0044", chip="sht3x").read()
    assert fault == Fault("new_device", f"cannot create the chip: writing 'sht3x 0x44' to "
                                        f"{sim.root}/bus/i2c/devices/i2c-1/new_device: EISDIR")


# --- the poll task ----------------------------------------------------------------------------

class Scripted:
    """A device whose reads return what the test lists, taking ``delay`` seconds each."""

    def __init__(self, *results, delay: float = 0.0) -> None:
        self.results, self.delay = list(results), delay
        self.stats, self.device, self.reads = kernel.KernelStats(), "1-0044", 0

    def read(self):
        self.reads += 1
        time.sleep(self.delay)
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]


class Recorder:
    def __init__(self) -> None:
        self.readings: list[dict] = []
        self.errors: list[str] = []

    def task(self, scripted, **kw) -> KernelSensor:
        return KernelSensor("cellar", scripted, lambda key, values: self.readings.append(values),
                            lambda key, reason: self.errors.append(reason),
                            **{"interval": 0.05, **kw})


EIO = Fault("EIO", "temp1_input: EIO")


async def test_a_failed_read_is_retried_before_it_becomes_the_status():
    seen = Recorder()
    scripted = Scripted(EIO, EIO, {"temperature": 20.0})
    await seen.task(scripted, retries=2).poll_once()
    assert seen.readings == [{"temperature": 20.0}] and seen.errors == []
    assert scripted.reads == 3


async def test_the_last_try_s_fault_is_the_status_reason():
    seen = Recorder()
    sensor = seen.task(Scripted(Fault("EREMOTEIO", "temp1_input: EREMOTEIO"), EIO), retries=1)
    await sensor.poll_once()
    assert seen.errors == ["temp1_input: EIO"] and seen.readings == []
    assert sensor.stats.faults == {"EREMOTEIO": 1, "EIO": 1}


async def test_each_kind_of_fault_is_logged_once_and_counted_always(caplog):
    seen = Recorder()
    sensor = seen.task(Scripted(EIO), retries=0)
    with caplog.at_level(logging.WARNING, logger="cairn.kernel"):
        for _ in range(5):
            await sensor.poll_once()
    assert [r.getMessage() for r in caplog.records] == [
        "cellar (1-0044): temp1_input: EIO; retried, and counted from now on"]
    assert sensor.stats.faults == {"EIO": 5} and len(seen.errors) == 5


async def test_a_read_that_outlives_its_timeout_is_a_fault_and_is_not_started_again():
    seen = Recorder()
    scripted = Scripted({"temperature": 20.0}, delay=0.5)
    sensor = seen.task(scripted, timeout=0.1, retries=0)
    await sensor.poll_once()
    assert seen.errors == ["no answer within 0.1 s (the kernel driver is still reading)"]
    await sensor.poll_once()   # the same read, still running: waited for again
    assert scripted.reads == 1
    await asyncio.sleep(0.4)
    await sensor.poll_once()   # it came back: its reading counts
    assert seen.readings == [{"temperature": 20.0}] and scripted.reads == 1


async def test_a_read_that_raises_is_the_device_s_fault_and_the_polls_go_on():
    def refused():  # what Path.exists() raises for a directory it may not search
        raise PermissionError(errno.EACCES, "Permission denied")

    seen = Recorder()
    scripted = Scripted({"temperature": 20.0})
    scripted.read = refused
    sensor = seen.task(scripted, retries=0)
    await sensor.poll_once()
    assert seen.errors == ["reading failed: [Errno 13] Permission denied"]
    scripted.read = lambda: {"temperature": 20.0}
    await sensor.poll_once()
    assert seen.readings == [{"temperature": 20.0}]


async def test_a_slow_read_leaves_the_event_loop_free():
    seen = Recorder()
    sensor = seen.task(Scripted({"temperature": 20.0}, delay=0.3), retries=0)
    task = asyncio.create_task(sensor.poll_once())
    ticks, started = 0, time.monotonic()
    while not task.done():
        await asyncio.sleep(0.01)
        ticks += 1
    assert time.monotonic() - started >= 0.3 and ticks >= 10
    assert seen.readings == [{"temperature": 20.0}]


async def test_after_the_first_reading_a_device_polls_at_its_own_phase_of_the_interval():
    seen, times = Recorder(), []
    sensor = seen.task(Scripted({"temperature": 20.0}), interval=0.2, phase=0.5)
    sensor.on_reading = lambda key, values: times.append(time.monotonic())
    started = time.monotonic()
    task = asyncio.create_task(sensor.run())
    await until(lambda: len(times) >= 3, what="three polls")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert times[0] - started < 0.1                     # at once
    assert times[1] - started >= 0.2 * 1.5 - 0.01       # then at its phase: 0.3, 0.5, ...
    assert times[2] - started >= 0.2 * 2.5 - 0.01


def test_devices_get_phases_spread_over_the_interval_and_the_same_at_every_start():
    phases = [phase_of(f"sensor-{n}") for n in range(20)]
    assert all(0 <= p < 1 for p in phases) and len(set(phases)) == 20
    assert max(phases) - min(phases) > 0.5 and phase_of("sensor-3") == phases[3]


async def test_the_task_polls_every_interval_until_cancelled():
    seen = Recorder()
    task = asyncio.create_task(seen.task(Scripted({"temperature": 20.0}), interval=0.05).run())
    await until(lambda: len(seen.readings) >= 4, what="four polls")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# --- cairn sensor scan ------------------------------------------------------------------------

def test_scan_lists_every_family_with_entries_the_driver_accepts(sim):
    sim.sht3x()
    sim.bme280()
    sim.dht11()
    sim.ds18b20()
    sim.i2c_device(1, 0x77, "dps310", driver=None)  # no driver: nothing to list
    done = subprocess_run("sensor", "scan", "--sysfs", str(sim.root))
    assert done.returncode == 0, done.stderr
    assert "# 4 kernel sensor device(s)" in done.stdout
    assert "# hwmon hwmon0: sht3x (1-0044 on i2c): temp1 22.5 °C, humidity1 45 %RH" in \
        done.stdout
    config = serial_config.parse(tomllib.loads(done.stdout), "scan.toml")
    assert [(s.kind, s.device, s.sysfs) for s in config.sensors] == [
        ("hwmon", "1-0044", str(sim.root)), ("iio", "1-0076", str(sim.root)),
        ("iio", "dht11@0", str(sim.root)), ("w1", "28-0316a2790b6f", str(sim.root))]


def test_scan_of_a_tree_without_sensors_says_how_to_get_some(sim):
    done = subprocess_run("sensor", "scan", "--sysfs", str(sim.root))
    assert done.returncode == 0 and "# 0 kernel sensor device(s)" in done.stdout
    assert "dtoverlay=" in done.stdout


def test_scan_of_a_directory_that_is_not_there_exits_1(tmp_path):
    done = subprocess_run("sensor", "scan", "--sysfs", str(tmp_path / "nothing"))
    assert done.returncode == 1 and "no sysfs at" in done.stderr


# --- cairn sensor chips (root, before the driver: cairn-sensor@.service) ----------------------

def chips_config(tmp_path: Path, sim: SimSysfs, *entries: str) -> Path:
    path = tmp_path / "sensors.toml"
    path.write_text('[driver]\nrouter = "ws://127.0.0.1:1/ws"\n' + "".join(
        f'[[sensors]]\nsysfs = "{sim.root}"\n{entry}\n' for entry in entries))
    return path


def test_chips_creates_each_configured_chip_whose_device_is_not_there(sim, tmp_path):
    sim.adapter(1)
    sim.sht3x()  # 1-0044, there already
    config = chips_config(tmp_path, sim,
                          'id = "a"\nkind = "iio"\ndevice = "1-0076"\nchip = "bme280"',
                          'id = "b"\nkind = "hwmon"\ndevice = "1-0044"\nchip = "sht3x"',
                          'id = "c"\nkind = "hwmon"\ndevice = "1-0048"')
    done = subprocess_run("sensor", "chips", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert sim.new_device_lines(1) == ["bme280 0x76"]
    # this tree's "kernel" is the test, so the device made does not appear
    assert done.stdout.splitlines() == [
        "cairn: sensor a: 1-0076: cannot create bme280: wrote 'bme280 0x76' to "
        f"{sim.root}/bus/i2c/devices/i2c-1/new_device but 1-0076 did not appear",
        "cairn: sensor b: 1-0044: already there"]


def test_chips_on_a_bus_that_is_not_there_says_so_and_exits_0(sim, tmp_path):
    config = chips_config(tmp_path, sim,
                          'id = "a"\nkind = "hwmon"\ndevice = "3-0048"\nchip = "lm75"')
    done = subprocess_run("sensor", "chips", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "cairn: sensor a: 3-0048: cannot create lm75: no I2C bus i2c-3" in done.stdout


def test_chips_with_a_bad_config_exits_2_naming_the_key(sim, tmp_path):
    config = chips_config(tmp_path, sim,
                          'id = "a"\nkind = "hwmon"\ndevice = "1-0048"\nchip = "lm 75"')
    done = subprocess_run("sensor", "chips", "--config", str(config))
    assert done.returncode == 2 and "sensors[0].chip" in done.stderr, done.stderr


def subprocess_run(*args: str):
    import subprocess

    return subprocess.run([sys.executable, "-m", "cairn.drivers.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


# --- the driver process and a real router -----------------------------------------------------

# the serial driver's fixtures: a router process keeping history on sensor, and what a
# dashboard subscribed to sensor and gateway.device sees
router, watch = test_serial_driver.router, test_serial_driver.watch

@contextlib.asynccontextmanager
async def driver_process(router: RouterProcess, tmp_path: Path, sensors: str):
    """``cairn sensor run`` on a config of these entries, stopped with SIGTERM."""
    config = tmp_path / "sensors.toml"
    config.write_text(f'[driver]\nrouter = "rawsocket+tcp://127.0.0.1:{router.rawsocket_port}"'
                      f'\n\n{sensors}')
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cairn.drivers.cli", "sensor", "run", "--config", str(config),
        cwd=ROOT, stderr=asyncio.subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, stderr.decode()


def entry(sensor_id: str, kind: str, device_name: str, sim: SimSysfs) -> str:
    return (f'[[sensors]]\nid = "{sensor_id}"\nkind = "{kind}"\ndevice = "{device_name}"\n'
            f'sysfs = "{sim.root}"\ninterval = 0.1\n\n')


@pytest.mark.slow
async def test_kernel_readings_land_retained_and_follow_the_tree(router, sim, tmp_path, watch):
    bme = sim.bme280(temperature=21.5, humidity=40.0, pressure=1001.2)
    ds = sim.ds18b20(temperature=4.5)
    sensors = entry("porch", "iio", "1-0076", sim) + entry("tank", "w1", ds.device, sim)
    async with driver_process(router, tmp_path, sensors):
        await until(lambda: watch.readings("porch") and watch.readings("tank"),
                    what="the first readings")
        bme.set(temperature=22.25)
        await until(lambda: watch.readings("porch")[-1]["temperature"] == 22.25,
                    what="the changed reading")
        now = await retained_now(router)
        assert now["sensor.porch"] == {"temperature": 22.25, "humidity": 40.0,
                                       "pressure": 1001.2}
        assert now["sensor.tank"] == {"temperature": 4.5}
        assert now["gateway.device.porch.status"]["status"] == "ok"
    await until(lambda: watch.statuses("tank")[-1] == ("stale", "driver stopped"),
                what="the status at exit")


@pytest.mark.slow
async def test_an_errno_in_the_tree_is_the_device_status_until_a_good_reading(router, sim,
                                                                             tmp_path, watch):
    dht = sim.dht11(temperature=19.0, humidity=55.0)
    async with driver_process(router, tmp_path, entry("shed", "iio", "dht11@0", sim)):
        await until(lambda: watch.statuses("shed") == [("ok", None)], what="ok")
        dht.fail("in_humidityrelative_input", errno.EIO)  # three tries, 0.1 s apart
        await until(lambda: watch.statuses("shed")[-1][0] == "error", what="the error")
        assert watch.statuses("shed")[-1][1].startswith("in_humidityrelative_input: EIO, ")
        dht.set(humidity=56.0)
        await until(lambda: watch.statuses("shed")[-1] == ("ok", None), what="ok again")
        await until(lambda: watch.readings("shed")[-1] == {"temperature": 19.0,
                                                           "humidity": 56.0},
                    what="the next reading")
        assert (await retained_now(router))["gateway.device.shed.status"]["errors"] == 1
