"""What a sensor kind is (:class:`SensorKind`), and the checks of numbers its keys share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cairn.base.config_tools import ConfigError, Validator, describe
from cairn.drivers.serial_port import SerialPort

# what a kind's port task calls: a device's reading, or why it has none
OnReading = Callable[[str, dict[str, float]], None]
OnError = Callable[[str, str], None]


class PortTask(Protocol):
    """Reads one serial port for the sensors on it (or, for a kernel kind, one device),
    until cancelled."""

    async def run(self) -> None: ...


@dataclass(frozen=True)
class SensorKind:
    name: str
    # its own keys of a [[sensors]] entry, beside the ones every kind has
    keys: frozenset[str]
    # (v, table, at) -> (its fields of the SensorConfig, the names of the values it reads)
    parse: Callable[[Validator, dict[str, Any], str], tuple[dict[str, Any], tuple[str, ...]]]
    # keys that sensors sharing a port must agree on, beside the serial settings
    port_keys: tuple[str, ...]
    # (v, at, sensor, other, its index): two sensors of this kind on one port, other first
    check_shared: Callable[[Validator, str, Any, Any, int], None]
    # seconds a device may take to fail, beyond three missed readings, before it is stale
    stale_margin: Callable[[dict[str, Any]], float]
    # (the sensors of one port, on_reading, on_error) -> the task that reads them (and opens
    # their port: serial_port below)
    task: Callable[[list[Any], OnReading, OnError], PortTask]
    # the task's counters, for SerialDriver.stats()
    stats: Callable[[Any], dict[str, Any]]
    # the simulated device or bus of this kind (drivers.simulator, drivers.kernel_sim), for
    # tests and the demo
    simulator: type
    # Its sensors are on a serial port (keys port, baudrate, parity, stopbits). A kind that is
    # not names its device in options["device"], which then stands where the port would:
    # entries naming one device are checked together like entries sharing a port.
    serial: bool = True


def serial_port(sensor: Any) -> SerialPort:
    """The port of a serial kind's sensor (the first of those sharing it)."""
    return SerialPort(sensor.port, sensor.baudrate, parity=sensor.parity,
                      stopbits=sensor.stopbits)


def number(v: Validator, t: dict[str, Any], at: str, key: str, default: float,
           minimum: float = 0.0, strict: bool = True) -> float:
    if key not in t:
        return default
    value = t[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(v.source, f"{at}.{key}", f"expected a number, got {describe(value)}")
    if value < minimum or (strict and value == minimum):
        relation = "greater than" if strict else "at least"
        raise ConfigError(v.source, f"{at}.{key}", f"must be {relation} {minimum:g}, not {value}")
    return float(value)


def int_in(v: Validator, t: dict[str, Any], at: str, key: str, default: int,
           allowed: range | tuple) -> int:
    value = v.get(t, at, key, int, default)
    if value not in allowed:
        shown = f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) else \
            " or ".join(map(str, allowed))
        raise ConfigError(v.source, f"{at}.{key}", f"must be {shown}, not {value}")
    return value
