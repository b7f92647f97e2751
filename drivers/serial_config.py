"""``[[sensors]]``: the sensors ``cairn sensor run`` reads (on serial ports, and kernel devices
in sysfs), validated like the rest of the config (every problem names the file, the dotted key
and what is wrong).

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

[[sensors]]
id = "porch"
kind = "iio"                 # hwmon | iio | w1: a kernel driver's device, read in sysfs
device = "1-0076"            # I2C bus 1, address 0x76 (never iio:deviceN)
```

See the README for every key and its default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import serial

from cairn.base.config_tools import ConfigError, Validator
from cairn.drivers.config import DriverConfig, parse_driver, read_toml
from cairn.drivers.kinds import KINDS
from cairn.drivers.kinds.kind import int_in, number

TOP_LEVEL = {"router", "realms", "driver", "sensors", "mqtt", "sync"}
# the keys of every kind, and of every serial kind; each kind adds its own (drivers.kinds)
COMMON_KEYS = {"id", "kind", "interval", "deadband", "heartbeat", "stale_after"}
SERIAL_KEYS = {"port", "baudrate", "parity", "stopbits"}
_ID = re.compile(r"^[^\s.#]+(\.[^\s.#]+)*$")


@dataclass(frozen=True)
class SensorConfig:
    """A [[sensors]] entry: the keys every kind has, and its kind's own (``options``, as
    attributes too: ``sensor.address`` of a Modbus sensor)."""
    id: str
    kind: str
    port: str  # its serial port; for a kernel kind, its device (options["device"])
    baudrate: int = 9600
    parity: str = "N"
    stopbits: int = 1
    interval: float = 10.0
    deadband: dict[str, float] = field(default_factory=dict)  # per field
    default_deadband: float = 0.0
    heartbeat: float = 60.0
    stale_after: float = 30.0
    fields: tuple[str, ...] = ()  # the names of the values it reads
    options: dict[str, Any] = field(default_factory=dict)  # its kind's keys (drivers.kinds)

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options", {})
        if name in options:
            return options[name]
        raise AttributeError(f"a {self.__dict__.get('kind')} sensor has no {name!r}")


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


def _sensor(v: Validator, t: dict[str, Any], at: str) -> SensorConfig:
    name = v.get(t, at, "kind", str, None)
    if name is None:
        raise ConfigError(v.source, f"{at}.kind", f"missing ({_kinds()})")
    if name not in KINDS:
        raise ConfigError(v.source, f"{at}.kind", f"must be {_kinds()}, not {name!r}")
    kind = KINDS[name]
    v.keys(t, at, COMMON_KEYS | (SERIAL_KEYS if kind.serial else set()) | kind.keys)
    sensor_id = v.get(t, at, "id", str, None)
    if not sensor_id:
        raise ConfigError(v.source, f"{at}.id", "missing (the device id: readings go to "
                                                "sensor.<id>)")
    if not _ID.match(sensor_id):
        raise ConfigError(v.source, f"{at}.id", f"{sensor_id!r} cannot be part of a topic "
                                                f"(no spaces, '#' or empty parts)")
    on_port = _serial(v, t, at) if kind.serial else {}
    interval = number(v, t, at, "interval", 10.0)
    common = dict(id=sensor_id, kind=name, interval=interval,
                  heartbeat=number(v, t, at, "heartbeat", 60.0))
    options, fields = kind.parse(v, t, at)
    common.update(on_port or {"port": options["device"]})
    # three missed readings, and the time a failing read of the kind may take
    default_stale = 3 * interval + kind.stale_margin(options)
    stale_after = number(v, t, at, "stale_after", default_stale)
    if stale_after <= interval:
        raise ConfigError(v.source, f"{at}.stale_after",
                          f"must be longer than interval ({interval:g} s), not {stale_after:g}")
    per_field, default_deadband = _deadband(v, t, at, fields)
    return SensorConfig(**common, stale_after=stale_after, deadband=per_field,
                        default_deadband=default_deadband, fields=fields, options=options)


def _serial(v: Validator, t: dict[str, Any], at: str) -> dict[str, Any]:
    """A serial kind's port and its settings."""
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
    return dict(port=port, baudrate=baudrate, parity=parity,
                stopbits=int_in(v, t, at, "stopbits", 1, (1, 2)))


def _kinds() -> str:
    """"modbus or line": the kinds there are."""
    names = list(KINDS)
    return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"


def _deadband(v: Validator, t: dict[str, Any], at: str,
              fields: tuple[str, ...]) -> tuple[dict[str, float], float]:
    value = t.get("deadband", 0.0)
    if isinstance(value, dict):
        per_field = {}
        for name in value:
            if name not in fields:
                raise ConfigError(v.source, f"{at}.deadband.{name}",
                                  f"no such field (this sensor has {', '.join(fields)})")
            per_field[name] = number(v, value, f"{at}.deadband", name, 0.0, strict=False)
        return per_field, 0.0
    return {}, number(v, t, at, "deadband", 0.0, strict=False)


def _check_together(v: Validator, sensors: tuple[SensorConfig, ...]) -> None:
    """What only shows across entries: duplicate ids, and entries that share a port (one
    bus or one line port) disagreeing on it, or that name one kernel device."""
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
        serial_kind = KINDS[s.kind].serial
        if s.kind != first.kind:
            key = "port" if serial_kind else "device"
            raise ConfigError(v.source, f"{at}.{key}", f"{s.port} is already a {first.kind} "
                                                       f"{key} (sensors[{j}])")
        shared = ("baudrate", "parity", "stopbits") if serial_kind else ()
        for key in (*shared, *KINDS[s.kind].port_keys):
            if getattr(s, key) != getattr(first, key):
                raise ConfigError(v.source, f"{at}.{key}",
                                  f"differs from sensors[{j}] on the same port "
                                  f"({getattr(first, key)!r})")
        for k, other in enumerate(sensors[:i]):
            if other.port == s.port:
                KINDS[s.kind].check_shared(v, at, s, other, k)
