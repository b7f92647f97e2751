"""What the kernel kinds (``hwmon``, ``iio``, ``w1``) share: their keys and checks, and the
:class:`~cairn.drivers.kernel.KernelSensor` that polls each device. Not a kind itself: each
kind's module makes its :class:`SensorKind` with :func:`kernel_kind`."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from typing import Any

from cairn.base.config_tools import ConfigError, Validator, describe
from cairn.drivers import sysfs
from cairn.drivers.kernel import (
    DEFAULT_SYSFS,
    RETRY_DELAY,
    KernelDevice,
    KernelSensor,
    Sysfs,
)
from cairn.drivers.kernel_sim import SimSysfs
from cairn.drivers.kinds.kind import OnError, OnReading, SensorKind, int_in, number
from cairn.drivers.sysfs import HWMON, IIO, W1, Family

COMMON = frozenset({"device", "sysfs", "timeout", "retries"})
I2C_KEYS = frozenset({"chip", "channels"})  # hwmon and iio: chips a driver may create
_CHIP = re.compile(r"[A-Za-z0-9_.,+-]{1,19}")  # an I2C device id (I2C_NAME_SIZE 20)
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_FIELDS = {"topic", "options"}  # autobahn takes these kwargs for itself


def parse_device(v: Validator, t: dict[str, Any], at: str, family: Family) -> str:
    example = "its 1-Wire id, such as 28-0316a2790b6f" if family is W1 else \
        "its device's name in /sys/bus/*/devices, such as 1-0076 for I2C bus 1 address 0x76"
    device = v.get(t, at, "device", str, None)
    if not device:
        raise ConfigError(v.source, f"{at}.device",
                          f"missing ({example}; cairn sensor scan lists them)")
    if sysfs.RENUMBERED.fullmatch(device):
        raise ConfigError(v.source, f"{at}.device",
                          f"{device} is a number the kernel hands out again at each probe; "
                          f"name the device it belongs to ({example}; cairn sensor scan "
                          f"shows it)")
    if "/" in device or device in (".", ".."):
        raise ConfigError(v.source, f"{at}.device", f"{device!r} is a path; give {example}")
    if family is W1 and not sysfs.W1_DEVICE.fullmatch(device):
        raise ConfigError(v.source, f"{at}.device", f"{device!r} is not {example}")
    return device


def parse_sysfs(v: Validator, t: dict[str, Any], at: str) -> str:
    root = v.get(t, at, "sysfs", str, DEFAULT_SYSFS)
    if not root.startswith("/"):
        raise ConfigError(v.source, f"{at}.sysfs", f"expected an absolute path, not {root!r}")
    return root


def parse_chip(v: Validator, t: dict[str, Any], at: str, device: str) -> str | None:
    chip = v.get(t, at, "chip", str, None)
    if chip is None:
        return None
    if not _CHIP.fullmatch(chip):
        raise ConfigError(v.source, f"{at}.chip",
                          f"{chip!r} is not a chip name the kernel takes (such as bme280, "
                          f"sht3x, lm75)")
    if sysfs.i2c_address(device) is None:
        raise ConfigError(v.source, f"{at}.chip",
                          f"creates an I2C device, so device must be <bus>-<address> "
                          f"(1-0076), not {device!r}")
    return chip


def parse_channels(v: Validator, t: dict[str, Any], at: str,
                   family: Family) -> dict[str, str] | None:
    table = v.get(t, at, "channels", dict, None)
    if table is None:
        return None
    if not table:
        raise ConfigError(v.source, f"{at}.channels", "empty: name at least one channel")
    stems = ", ".join(kind.shown for kind in family.types.values())
    for name, stem in table.items():
        where = f"{at}.channels.{name}"
        if not _FIELD.fullmatch(name) or name in RESERVED_FIELDS:
            raise ConfigError(v.source, where, f"{name!r} cannot be a reading's field name")
        if not isinstance(stem, str):
            raise ConfigError(v.source, where, f"expected a channel such as "
                                               f"{family.defaults['temperature']!r}, got "
                                               f"{describe(stem)}")
        if stem.endswith(("_input", "_raw")):
            raise ConfigError(v.source, where, f"name the channel, not its file: "
                                               f"{stem.rsplit('_', 1)[0]!r}")
        if family.channel_type(stem) is None:
            raise ConfigError(v.source, where, f"{stem!r} is not one of the {family.name} "
                                               f"channels Cairn reads ({stems})")
    return dict(table)


def parser(family: Family):
    def parse(v: Validator, t: dict[str, Any],
              at: str) -> tuple[dict[str, Any], tuple[str, ...]]:
        device = parse_device(v, t, at, family)
        options = dict(
            device=device,
            sysfs=parse_sysfs(v, t, at),
            timeout=number(v, t, at, "timeout", 2.0),
            retries=int_in(v, t, at, "retries", 2, range(0, 11)),
            chip=None if family is W1 else parse_chip(v, t, at, device),
            channels=None if family is W1 else parse_channels(v, t, at, family),
        )
        return options, tuple(options["channels"] or family.defaults)
    return parse


def check_shared(v: Validator, at: str, sensor: Any, other: Any, k: int) -> None:
    raise ConfigError(v.source, f"{at}.device", f"{sensor.device} is already sensors[{k}]")


def stale_margin(options: dict[str, Any]) -> float:
    """The time a failing poll may take (every try timing out), so that a device in trouble
    shows error before it could go stale."""
    retries = options["retries"]
    return (retries + 1) * options["timeout"] + retries * RETRY_DELAY


def phase_of(sensor_id: str) -> float:
    """0..1, the same for an id at every start, spread over ids: where in its interval a
    device's polls fall (KernelSensor.run)."""
    return zlib.crc32(sensor_id.encode()) / 2**32


def kernel_device(family: Family, sensor: Any) -> KernelDevice:
    return KernelDevice(Sysfs(sensor.sysfs), family, sensor.device, sensor.channels,
                        sensor.chip)


def chips(sensors: Iterable[Any]) -> list[tuple[str, KernelDevice]]:
    """The (id, device) of each entry that creates an I2C chip (``chip = ...``)."""
    families = {f.name: f for f in (HWMON, IIO)}
    return [(s.id, kernel_device(families[s.kind], s)) for s in sensors
            if s.kind in families and s.chip is not None]


def tasker(family: Family):
    def task(sensors: list[Any], on_reading: OnReading, on_error: OnError) -> KernelSensor:
        (s,) = sensors  # check_shared refuses two entries naming one device
        device = kernel_device(family, s)
        return KernelSensor(s.id, device, on_reading, on_error, interval=s.interval,
                            timeout=s.timeout, retries=s.retries, phase=phase_of(s.id))
    return task


def kernel_kind(family: Family) -> SensorKind:
    keys = COMMON if family is W1 else COMMON | I2C_KEYS
    return SensorKind(family.name, keys, parser(family), port_keys=(),
                      check_shared=check_shared, stale_margin=stale_margin,
                      task=tasker(family), stats=KernelSensor.describe, simulator=SimSysfs,
                      serial=False)
