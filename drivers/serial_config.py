"""``[[sensors]]``: the serial sensors ``cairn sensor run`` reads, validated like the rest of
the config (every problem names the file, the dotted key and what is wrong).

```toml
[[sensors]]
id = "greenhouse-1"          # readings on sensor.greenhouse-1
kind = "modbus"              # modbus | line
port = "/dev/serial/by-id/usb-FTDI_FT232R-if00-port0"
baudrate = 9600
address = 1                  # Modbus address, 1..247
interval = 10                # seconds between polls

[[sensors]]
id = "shed"
kind = "line"
port = "/dev/ttyAMA0"
```

See the README for every key and its default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import serial

from cairn.base.config_tools import ConfigError, Validator, describe
from cairn.drivers.config import DriverConfig, parse_driver, read_toml
from cairn.drivers.line import MAX_LINE, THS, RegexFormat
from cairn.drivers.modbus import FUNCTIONS, MAX_REGISTERS, XY_MD02, Register, register_block

TOP_LEVEL = {"router", "realms", "driver", "sensors", "mqtt", "sync"}
KINDS = ("modbus", "line")
COMMON_KEYS = {"id", "kind", "port", "baudrate", "parity", "stopbits", "interval", "deadband",
               "heartbeat", "stale_after"}
MODBUS_KEYS = COMMON_KEYS | {"address", "function", "registers", "timeout", "retries"}
LINE_KEYS = COMMON_KEYS | {"format", "regex", "match_id", "max_line"}
REGISTER_KEYS = {"register", "signed", "scale", "offset"}
THS_FIELDS = ("temperature", "humidity")
_ID = re.compile(r"^[^\s.#]+(\.[^\s.#]+)*$")


@dataclass(frozen=True)
class SensorConfig:
    id: str
    kind: str
    port: str
    baudrate: int = 9600
    parity: str = "N"
    stopbits: int = 1
    interval: float = 10.0
    deadband: dict[str, float] = field(default_factory=dict)  # per field
    default_deadband: float = 0.0
    heartbeat: float = 60.0
    stale_after: float = 30.0
    # modbus
    address: int = 1
    function: int = 4
    registers: tuple[Register, ...] = XY_MD02
    timeout: float = 0.5
    retries: int = 2
    # line
    format: str = THS
    regex: str | None = None
    match_id: str | None = None
    max_line: int = MAX_LINE

    @property
    def fields(self) -> tuple[str, ...]:
        if self.kind == "modbus":
            return tuple(r.name for r in self.registers)
        if self.regex is not None:
            return tuple(RegexFormat(self.regex).fields)
        return THS_FIELDS


@dataclass(frozen=True)
class SerialConfig:
    source: str
    driver: DriverConfig
    sensors: tuple[SensorConfig, ...]


def load(path: str | Path) -> SerialConfig:
    data, source = read_toml(path)
    return parse(data, source)


def parse(data: dict[str, Any], source: str) -> SerialConfig:
    v = Validator(source)
    v.keys(data, "", TOP_LEVEL)
    driver = parse_driver(data, source)
    tables = v.tables(data, "sensors")
    if not tables:
        raise ConfigError(source, "sensors", "no [[sensors]] entries: nothing to run")
    sensors = tuple(_sensor(v, t, f"sensors[{i}]") for i, t in enumerate(tables))
    _check_together(v, sensors)
    return SerialConfig(source, driver, sensors)


def _number(v: Validator, t: dict[str, Any], at: str, key: str, default: float,
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


def _int_in(v: Validator, t: dict[str, Any], at: str, key: str, default: int,
            allowed: range | tuple) -> int:
    value = v.get(t, at, key, int, default)
    if value not in allowed:
        shown = f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) else \
            " or ".join(map(str, allowed))
        raise ConfigError(v.source, f"{at}.{key}", f"must be {shown}, not {value}")
    return value


def _sensor(v: Validator, t: dict[str, Any], at: str) -> SensorConfig:
    kind = v.get(t, at, "kind", str, None)
    if kind is None:
        raise ConfigError(v.source, f"{at}.kind", "missing (modbus or line)")
    if kind not in KINDS:
        raise ConfigError(v.source, f"{at}.kind", f"must be modbus or line, not {kind!r}")
    v.keys(t, at, MODBUS_KEYS if kind == "modbus" else LINE_KEYS)
    sensor_id = v.get(t, at, "id", str, None)
    if not sensor_id:
        raise ConfigError(v.source, f"{at}.id", "missing (the device id: readings go to "
                                                "sensor.<id>)")
    if not _ID.match(sensor_id):
        raise ConfigError(v.source, f"{at}.id", f"{sensor_id!r} cannot be part of a topic "
                                                f"(no spaces, '#' or empty parts)")
    port = v.get(t, at, "port", str, None)
    if not port:
        raise ConfigError(v.source, f"{at}.port", "missing (a serial device such as "
                                                  "/dev/ttyUSB0)")
    baudrate = v.get(t, at, "baudrate", int, 9600)
    if baudrate not in serial.Serial.BAUDRATES:
        raise ConfigError(v.source, f"{at}.baudrate", f"not a standard baud rate: {baudrate}")
    parity = v.get(t, at, "parity", str, "N").upper()
    if parity not in ("N", "E", "O"):
        raise ConfigError(v.source, f"{at}.parity", f"must be N, E or O, not {t['parity']!r}")
    interval = _number(v, t, at, "interval", 10.0)
    common = dict(
        id=sensor_id, kind=kind, port=port, baudrate=baudrate, parity=parity,
        stopbits=_int_in(v, t, at, "stopbits", 1, (1, 2)), interval=interval,
        heartbeat=_number(v, t, at, "heartbeat", 60.0),
    )
    if kind == "modbus":
        registers = _registers(v, t, at)
        specific: dict[str, Any] = dict(
            address=_int_in(v, t, at, "address", 1, range(1, 248)),
            function=_int_in(v, t, at, "function", 4, tuple(FUNCTIONS)),
            registers=registers,
            timeout=_number(v, t, at, "timeout", 0.5),
            retries=_int_in(v, t, at, "retries", 2, range(0, 11)),
        )
        fields = tuple(r.name for r in registers)
    else:
        specific, fields = _line(v, t, at)
    # three missed readings; for Modbus plus the time one failing poll may take, so a
    # device that does not answer is reported as an error before it could go stale
    default_stale = 3 * interval
    if kind == "modbus":
        default_stale += (specific["retries"] + 1) * specific["timeout"]
    stale_after = _number(v, t, at, "stale_after", default_stale)
    if stale_after <= interval:
        raise ConfigError(v.source, f"{at}.stale_after",
                          f"must be longer than interval ({interval:g} s), not {stale_after:g}")
    per_field, default_deadband = _deadband(v, t, at, fields)
    return SensorConfig(**common, **specific, stale_after=stale_after, deadband=per_field,
                        default_deadband=default_deadband)


def _registers(v: Validator, t: dict[str, Any], at: str) -> tuple[Register, ...]:
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
            name, _int_in(v, spec, rat, "register", 0, range(0, 0x10000)),
            signed=v.get(spec, rat, "signed", bool, True), scale=float(scale),
            offset=float(offset)))
    start, count = register_block(registers)
    if count > MAX_REGISTERS:
        raise ConfigError(v.source, f"{at}.registers",
                          f"registers {start}..{start + count - 1} span {count}; one request "
                          f"reads at most {MAX_REGISTERS}")
    return tuple(registers)


def _line(v: Validator, t: dict[str, Any], at: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    regex = v.get(t, at, "regex", str, None)
    fmt = v.get(t, at, "format", str, "regex" if regex is not None else THS)
    if fmt not in (THS, "regex"):
        raise ConfigError(v.source, f"{at}.format", f"must be ths or regex, not {fmt!r}")
    if fmt == "regex" and regex is None:
        raise ConfigError(v.source, f"{at}.regex", "missing (format = \"regex\" needs one)")
    if fmt == THS and regex is not None:
        raise ConfigError(v.source, f"{at}.regex", "only used with format = \"regex\"")
    fields: tuple[str, ...] = THS_FIELDS
    if regex is not None:
        try:
            fields = tuple(RegexFormat(regex).fields)
        except re.error as e:
            raise ConfigError(v.source, f"{at}.regex", f"not a valid regex: {e}") from e
        except ValueError as e:
            raise ConfigError(v.source, f"{at}.regex", str(e)) from e
    specific = dict(format=fmt, regex=regex, match_id=v.get(t, at, "match_id", str, None),
                    max_line=v.positive(t, at, "max_line", MAX_LINE))
    return specific, fields


def _deadband(v: Validator, t: dict[str, Any], at: str,
              fields: tuple[str, ...]) -> tuple[dict[str, float], float]:
    value = t.get("deadband", 0.0)
    if isinstance(value, dict):
        per_field = {}
        for name in value:
            if name not in fields:
                raise ConfigError(v.source, f"{at}.deadband.{name}",
                                  f"no such field (this sensor has {', '.join(fields)})")
            per_field[name] = _number(v, value, f"{at}.deadband", name, 0.0, strict=False)
        return per_field, 0.0
    return {}, _number(v, t, at, "deadband", 0.0, strict=False)


def _check_together(v: Validator, sensors: tuple[SensorConfig, ...]) -> None:
    """What only shows across entries: duplicate ids, and entries that share a port (one
    bus or one line port) disagreeing on it."""
    first_on_port: dict[str, int] = {}
    for i, s in enumerate(sensors):
        at = f"sensors[{i}]"
        for j, other in enumerate(sensors[:i]):
            if other.id == s.id:
                raise ConfigError(v.source, f"{at}.id", f"duplicate id {s.id!r} (also "
                                                        f"sensors[{j}])")
        if s.port not in first_on_port:
            first_on_port[s.port] = i
            continue
        j = first_on_port[s.port]
        first = sensors[j]
        if s.kind != first.kind:
            raise ConfigError(v.source, f"{at}.port", f"{s.port} is already a {first.kind} "
                                                      f"port (sensors[{j}])")
        for key in ("baudrate", "parity", "stopbits") + (("format", "regex", "max_line")
                                                          if s.kind == "line" else ()):
            if getattr(s, key) != getattr(first, key):
                raise ConfigError(v.source, f"{at}.{key}",
                                  f"differs from sensors[{j}] on the same port "
                                  f"({getattr(first, key)!r})")
        for k, other in enumerate(sensors[:i]):
            if other.port != s.port:
                continue
            if s.kind == "modbus" and other.address == s.address:
                raise ConfigError(v.source, f"{at}.address",
                                  f"address {s.address} is already sensors[{k}] on {s.port}")
            if s.kind == "line":
                if s.match_id is None or other.match_id is None:
                    bad = i if s.match_id is None else k
                    raise ConfigError(v.source, f"sensors[{bad}].match_id",
                                      f"missing: several line sensors share {s.port}, so "
                                      f"each needs the id its sentences carry")
                if s.match_id == other.match_id:
                    raise ConfigError(v.source, f"{at}.match_id",
                                      f"{s.match_id!r} is already sensors[{k}] on {s.port}")
