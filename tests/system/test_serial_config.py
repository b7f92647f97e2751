"""[[sensors]] validation, the serial kinds' and the kernel kinds': defaults, and every mistake
named by file, dotted key and problem; plus ``cairn sensor`` exit codes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from cairn.drivers.modbus import XY_MD02, Register
from cairn.drivers.serial_config import load, parse
from cairn.gateway.core.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MODBUS = '[[sensors]]\nid = "gh1"\nkind = "modbus"\nport = "/dev/ttyUSB0"\n'
LINE = '[[sensors]]\nid = "shed"\nkind = "line"\nport = "/dev/ttyAMA0"\n'
IIO = '[[sensors]]\nid = "porch"\nkind = "iio"\ndevice = "1-0076"\n'
HWMON = '[[sensors]]\nid = "cellar"\nkind = "hwmon"\ndevice = "1-0044"\n'
W1 = '[[sensors]]\nid = "tank"\nkind = "w1"\ndevice = "28-0316a2790b6f"\n'


def parsed(text: str):
    return parse(tomllib.loads(text), "cairn.toml")


def error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parsed(text)
    return caught.value


def test_a_modbus_sensor_gets_xy_md02_defaults():
    (s,) = parsed(MODBUS).sensors
    assert (s.baudrate, s.parity, s.stopbits, s.address, s.function) == (9600, "N", 1, 1, 4)
    assert s.registers == XY_MD02 and (s.interval, s.heartbeat) == (10.0, 60.0)
    assert (s.timeout, s.retries, s.default_deadband) == (0.5, 2, 0.0)
    assert s.stale_after == 3 * 10 + 3 * 0.5


def test_a_line_sensor_defaults_to_ths_sentences():
    (s,) = parsed(LINE).sensors
    assert (s.format, s.regex, s.match_id, s.max_line, s.stale_after) == ("ths", None, None,
                                                                          256, 30.0)


def test_the_driver_section_defaults_to_the_local_router():
    assert parsed(MODBUS).driver.router == "ws://127.0.0.1:8080/ws"


def test_a_register_map_takes_numbers_or_tables():
    (s,) = parsed(MODBUS + 'function = 3\nregisters = { temperature = 0, humidity = '
                           '{ register = 1, signed = false, scale = 0.01, offset = -2 } }\n'
                  ).sensors
    assert s.registers == (Register("temperature", 0),
                           Register("humidity", 1, signed=False, scale=0.01, offset=-2.0))


def test_deadband_per_field():
    (s,) = parsed(MODBUS + "deadband = { temperature = 0.2, humidity = 1 }\n").sensors
    assert s.deadband == {"temperature": 0.2, "humidity": 1.0} and s.default_deadband == 0


def test_regex_sets_the_format_and_its_groups_are_the_fields():
    (s,) = parsed(LINE + "regex = 'T=(?P<temperature>[-.0-9]+)'\n").sensors
    assert s.format == "regex" and s.fields == ("temperature",)


def test_a_kernel_sensor_needs_only_its_device_and_gets_defaults():
    (s,) = parsed(IIO).sensors
    assert (s.device, s.sysfs, s.chip, s.channels) == ("1-0076", "/sys", None, None)
    assert (s.interval, s.timeout, s.retries, s.heartbeat) == (10.0, 2.0, 2, 60.0)
    assert s.fields == ("temperature", "humidity", "pressure")
    # three missed readings, then every try timing out with 2 s between tries
    assert s.stale_after == 3 * 10 + 3 * 2.0 + 2 * 2.0


def test_a_kernel_sensor_s_device_stands_where_a_port_would():
    (s,) = parsed(W1).sensors
    assert s.port == "28-0316a2790b6f"


def test_a_hwmon_sensor_reads_temperature_and_humidity_by_default():
    assert parsed(HWMON).sensors[0].fields == ("temperature", "humidity")


def test_configured_channels_are_the_fields_and_take_their_deadbands():
    (s,) = parsed(HWMON + 'channels = { board = "temp1", remote = "temp2" }\n'
                          'deadband = { remote = 0.5 }\n').sensors
    assert s.fields == ("board", "remote") and s.deadband == {"remote": 0.5}


def test_the_same_file_as_the_router_is_accepted(tmp_path):
    path = tmp_path / "cairn.toml"
    path.write_text('[router]\nlisten = "127.0.0.1:8080"\n[[realms]]\nname = "realm1"\n'
                    + MODBUS)
    assert load(path).sensors[0].id == "gh1"


MISTAKES = [
    ("", "sensors", "no [[sensors]]"),
    ("[[sensor]]\nid = 'x'\n", "sensor", "unknown key"),
    (MODBUS.replace('kind = "modbus"\n', ""), "sensors[0].kind", "missing"),
    (MODBUS.replace('"modbus"', '"zigbee"'), "sensors[0].kind", "modbus, line, hwmon, iio or w1"),
    (MODBUS.replace('id = "gh1"\n', ""), "sensors[0].id", "missing"),
    (MODBUS.replace('"gh1"', '"green house"'), "sensors[0].id", "cannot be part of a topic"),
    (MODBUS.replace('port = "/dev/ttyUSB0"\n', ""), "sensors[0].port", "missing"),
    (MODBUS + "baudrate = 9601\n", "sensors[0].baudrate", "not a standard baud rate"),
    (MODBUS + "parity = 'X'\n", "sensors[0].parity", "N, E or O"),
    (MODBUS + "stopbits = 3\n", "sensors[0].stopbits", "1 or 2"),
    (MODBUS + "address = 0\n", "sensors[0].address", "1..247"),
    (MODBUS + "address = '1'\n", "sensors[0].address", "expected an integer"),
    (MODBUS + "function = 6\n", "sensors[0].function", "3 or 4"),
    (MODBUS + "interval = 0\n", "sensors[0].interval", "greater than 0"),
    (MODBUS + "timeout = 'fast'\n", "sensors[0].timeout", "expected a number"),
    (MODBUS + "retries = -1\n", "sensors[0].retries", "0..10"),
    (MODBUS + "interval = 10\nstale_after = 5\n", "sensors[0].stale_after", "longer than"),
    (MODBUS + "deadband = -1\n", "sensors[0].deadband", "at least 0"),
    (MODBUS + "deadband = { pressure = 1 }\n", "sensors[0].deadband.pressure", "no such field"),
    (MODBUS + "regex = 'x'\n", "sensors[0].regex", "unknown key"),
    (MODBUS + "registers = {}\n", "sensors[0].registers", "empty"),
    (MODBUS + "registers = { t = 'one' }\n", "sensors[0].registers.t", "register number"),
    (MODBUS + "registers = { t = { scale = 1 } }\n", "sensors[0].registers.t.register",
     "missing"),
    (MODBUS + "registers = { t = 70000 }\n", "sensors[0].registers.t.register", "0..65535"),
    (MODBUS + "registers = { t = { register = 1, scale = 0 } }\n",
     "sensors[0].registers.t.scale", "non-zero"),
    (MODBUS + "registers = { t = { register = 1, gain = 2 } }\n",
     "sensors[0].registers.t.gain", "unknown key"),
    (MODBUS + "registers = { a = 0, b = 200 }\n", "sensors[0].registers", "at most 125"),
    (LINE + "address = 1\n", "sensors[0].address", "unknown key"),
    (LINE + "format = 'nmea'\n", "sensors[0].format", "ths or regex"),
    (LINE + "format = 'regex'\n", "sensors[0].regex", "missing"),
    (LINE + "regex = '(?P<t>'\n", "sensors[0].regex", "not a valid regex"),
    (LINE + "regex = 'T=(\\d+)'\n", "sensors[0].regex", "named group"),
    (MODBUS + MODBUS.replace("ttyUSB0", "ttyUSB1"), "sensors[1].id", "duplicate id"),
    (MODBUS + MODBUS.replace("gh1", "gh2"), "sensors[1].address", "already sensors[0]"),
    (MODBUS + MODBUS.replace("gh1", "gh2") + "address = 2\nbaudrate = 19200\n",
     "sensors[1].baudrate", "differs from sensors[0]"),
    (MODBUS + LINE.replace("ttyAMA0", "ttyUSB0"), "sensors[1].port", "already a modbus port"),
    (LINE + LINE.replace("shed", "barn"), "sensors[1].match_id", "several line sensors"),
    ('[driver]\nrouter = "http://x"\n' + MODBUS, "driver.router", "expected ws://"),
    # the kernel kinds
    (IIO.replace('device = "1-0076"\n', ""), "sensors[0].device", "missing"),
    (IIO.replace("1-0076", "iio:device0"), "sensors[0].device", "hands out again"),
    (HWMON.replace("1-0044", "hwmon2"), "sensors[0].device", "hands out again"),
    (IIO.replace("1-0076", "/sys/bus/i2c/devices/1-0076"), "sensors[0].device", "a path"),
    (W1.replace("28-0316a2790b6f", "1-0076"), "sensors[0].device", "not its 1-Wire id"),
    (W1.replace("28-0316a2790b6f", "w1_bus_master1"), "sensors[0].device", "hands out"),
    (IIO + 'port = "/dev/ttyUSB0"\n', "sensors[0].port", "unknown key"),
    (IIO + "baudrate = 9600\n", "sensors[0].baudrate", "unknown key"),
    (W1 + 'chip = "ds18b20"\n', "sensors[0].chip", "unknown key"),
    (W1 + 'channels = { t = "temperature" }\n', "sensors[0].channels", "unknown key"),
    (IIO.replace("1-0076", "dht11@0") + 'chip = "dht11"\n', "sensors[0].chip", "1-0076"),
    (IIO + 'chip = "bme280 0x76"\n', "sensors[0].chip", "not a chip name"),
    (IIO + 'channels = { temperature = "temp1" }\n', "sensors[0].channels.temperature",
     "not one of the iio channels"),
    (HWMON + 'channels = { temperature = "temp1_input" }\n',
     "sensors[0].channels.temperature", "not its file: 'temp1'"),
    (HWMON + "channels = { temperature = 1 }\n", "sensors[0].channels.temperature",
     "expected a channel"),
    (HWMON + 'channels = { topic = "temp1" }\n', "sensors[0].channels.topic", "field name"),
    (HWMON + "channels = {}\n", "sensors[0].channels", "empty"),
    (HWMON + "deadband = { pressure = 1 }\n", "sensors[0].deadband.pressure", "no such field"),
    (HWMON + "retries = 11\n", "sensors[0].retries", "0..10"),
    (HWMON + "timeout = 0\n", "sensors[0].timeout", "greater than 0"),
    (HWMON + 'sysfs = "sys"\n', "sensors[0].sysfs", "absolute path"),
    (IIO + IIO.replace("porch", "porch-2"), "sensors[1].device", "already sensors[0]"),
    (HWMON + IIO.replace("1-0076", "1-0044"), "sensors[1].device", "already a hwmon device"),
]


@pytest.mark.parametrize("text, key, problem", MISTAKES,
                         ids=[f"{key}-{problem}" for _, key, problem in MISTAKES])
def test_a_mistake_is_named_by_key(text, key, problem):
    e = error(text)
    assert (e.source, e.key) == ("cairn.toml", key) and problem in e.problem, str(e)


def cairn_sensor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cairn.drivers.cli", "sensor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=20)


def test_sensor_run_with_a_bad_config_exits_2_naming_file_and_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(MODBUS + "address = 300\n")
    result = cairn_sensor("run", "--config", str(path))
    assert result.returncode == 2
    assert f"{path}: sensors[0].address: must be 1..247, not 300" in result.stderr


def test_sensor_run_with_a_missing_file_exits_2(tmp_path):
    result = cairn_sensor("run", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2 and "cannot read file" in result.stderr


def test_sensor_without_a_subcommand_exits_2():
    assert cairn_sensor().returncode == 2


def test_sensor_sim_prints_its_ports_and_a_config_that_validates(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.drivers.cli", "sensor", "sim", "--modbus", "3", "--line", "2",
         "--dir", str(tmp_path / "sim")], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    links = [tmp_path / "sim" / name for name in ("modbus0", "line0", "line1")]
    try:
        deadline = time.monotonic() + 15
        while not all(link.is_symlink() for link in links):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        assert all(os.readlink(link).startswith("/dev/pts/") for link in links)
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert not any(link.exists() for link in links)   # unplugged on the way out
    config = parsed(stdout)   # the whole output is a config for these ports
    assert [(s.kind, s.port) for s in config.sensors] == [
        ("modbus", str(links[0]))] * 3 + [("line", str(links[1])), ("line", str(links[2]))]
