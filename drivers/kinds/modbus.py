"""``kind = "modbus"``: Modbus RTU temperature/humidity sensors of the XY-MD02 class, all the
devices of one port polled in turn by one :class:`~cairn.drivers.modbus.ModbusBus` (an RS-485
line carries one exchange at a time)."""

from __future__ import annotations

import dataclasses
from typing import Any

from cairn.base.config_tools import ConfigError, Validator, describe
from cairn.drivers.kinds.kind import (
    OnError,
    OnReading,
    SensorKind,
    int_in,
    number,
    serial_port,
)
from cairn.drivers.modbus import (
    FUNCTIONS,
    MAX_REGISTERS,
    XY_MD02,
    ModbusBus,
    PollTarget,
    Register,
    register_block,
)
from cairn.drivers.simulator import SimModbusBus

KEYS = frozenset({"address", "function", "registers", "timeout", "retries"})
REGISTER_KEYS = {"register", "signed", "scale", "offset"}


def parse(v: Validator, t: dict[str, Any], at: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    registers = parse_registers(v, t, at)
    options = dict(
        address=int_in(v, t, at, "address", 1, range(1, 248)),
        function=int_in(v, t, at, "function", 4, tuple(FUNCTIONS)),
        registers=registers,
        timeout=number(v, t, at, "timeout", 0.5),
        retries=int_in(v, t, at, "retries", 2, range(0, 11)),
    )
    return options, tuple(r.name for r in registers)


def parse_registers(v: Validator, t: dict[str, Any], at: str) -> tuple[Register, ...]:
    table = v.get(t, at, "registers", dict, None)
    if table is None:
        return XY_MD02
    if not table:
        raise ConfigError(v.source, f"{at}.registers", "empty: name at least one register")
    registers = []
    for name, spec in table.items():
        rat = f"{at}.registers.{name}"
        if isinstance(spec, int) and not isinstance(spec, bool):
            spec = {"register": spec}
        if not isinstance(spec, dict):
            raise ConfigError(v.source, rat, f"expected a register number or a table "
                                             f"{{ register, signed, scale, offset }}, got "
                                             f"{describe(spec)}")
        v.keys(spec, rat, REGISTER_KEYS)
        if "register" not in spec:
            raise ConfigError(v.source, f"{rat}.register", "missing (the register address, "
                                                           "0..65535)")
        scale = spec.get("scale", 0.1)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or scale == 0:
            raise ConfigError(v.source, f"{rat}.scale",
                              f"expected a non-zero number, got {describe(scale)}")
        offset = spec.get("offset", 0.0)
        if isinstance(offset, bool) or not isinstance(offset, int | float):
            raise ConfigError(v.source, f"{rat}.offset",
                              f"expected a number, got {describe(offset)}")
        registers.append(Register(
            name, int_in(v, spec, rat, "register", 0, range(0, 0x10000)),
            signed=v.get(spec, rat, "signed", bool, True), scale=float(scale),
            offset=float(offset)))
    start, count = register_block(registers)
    if count > MAX_REGISTERS:
        raise ConfigError(v.source, f"{at}.registers",
                          f"registers {start}..{start + count - 1} span {count}; one request "
                          f"reads at most {MAX_REGISTERS}")
    return tuple(registers)


def check_shared(v: Validator, at: str, sensor: Any, other: Any, k: int) -> None:
    if other.address == sensor.address:
        raise ConfigError(v.source, f"{at}.address",
                          f"address {sensor.address} is already sensors[{k}] on {sensor.port}")


def stale_margin(options: dict[str, Any]) -> float:
    """The time one failing poll may take, so that a device that does not answer is
    reported as an error before it could go stale."""
    return (options["retries"] + 1) * options["timeout"]


def task(sensors: list[Any], on_reading: OnReading, on_error: OnError) -> ModbusBus:
    targets = [PollTarget(s.id, s.address, s.function, s.registers, s.interval, s.timeout,
                          s.retries) for s in sensors]
    return ModbusBus(serial_port(sensors[0]), targets, on_reading, on_error)


def stats(bus: ModbusBus) -> dict[str, Any]:
    return {"port_failures": bus.port_failures,
            **{str(a): dataclasses.asdict(s) for a, s in bus.master.stats.items()}}


KIND = SensorKind("modbus", KEYS, parse, port_keys=(), check_shared=check_shared,
                  stale_margin=stale_margin, task=task, stats=stats, simulator=SimModbusBus)
