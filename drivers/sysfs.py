"""Kernel sensors as sysfs shows them, free of I/O: which files make a reading, and what their
texts mean. :mod:`drivers.kernel` lists the directories and reads the files; everything it
learns is handed here as data (a directory's names, a file's text or the errno of its read),
and what comes back is a reading in Cairn's units or a :class:`Fault` saying why there is none.

The three families, as the kernel's ABI documents describe them:

- **hwmon** (``Documentation/ABI/testing/sysfs-class-hwmon``): a chip's ``hwmonN`` directory
  holds ``temp<n>_input`` in m°C and ``humidity<n>_input`` in m%RH (sht3x, sht4x, sht21, lm75).
- **IIO** (``sysfs-bus-iio``): ``iio:deviceN`` holds ``in_<type>[<n>]_input`` (processed), or
  ``_raw`` with ``_scale`` and ``_offset``, where the value is (raw + offset) × scale (the
  offset is "added to raw prior to scaling"); a scale or offset may be shared by type
  (``in_temp_scale`` for ``in_temp0_raw``). Units: ``in_temp`` m°C, ``in_humidityrelative``
  m%RH, ``in_pressure`` kPa (bme280, dps310, dht11, hdc100x).
- **1-Wire thermometers** (``sysfs-driver-w1_therm``): ``28-<serial>/temperature`` in m°C,
  empty while a bulk read is pending; older kernels have only ``w1_slave``, two lines whose
  first ends ``crc=<xx> YES`` (or ``NO``) and whose second ends ``t=<m°C>``. A DS18B20 that
  lost power reads 85000, its power-on register value, not a measurement.

Values are rounded to 0.001 of Cairn's unit (°C, %RH, hPa): the resolution of the m°C and
m%RH files, and 0.1 Pa of pressure, finer than any of these chips measures.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

Reading = dict[str, float]


@dataclass(frozen=True)
class Errno:
    """What reading a file gave instead of text: the errno of the failed open or read."""

    code: int

    @property
    def name(self) -> str:
        return errno.errorcode.get(self.code, f"errno {self.code}")


Text = str | Errno  # what reading one file gave

# Why a read failed, in the words a person fixing the device needs. The I2C fault codes
# (Documentation/i2c/fault-codes.rst): ENXIO, no device acknowledged its address; the Pi's
# controller (i2c-bcm2835) says EREMOTEIO for any NACK.
ERRNO_HINTS = {
    errno.EREMOTEIO: "the chip did not answer on its bus (wiring, address or power)",
    errno.ENXIO: "no chip acknowledged the address (wiring, address or power)",
    errno.EIO: "I/O error (a DHT's checksum or timing failure, a CRC error, a bus fault)",
    errno.ETIMEDOUT: "the chip did not answer in time",
    errno.ENODEV: "the device went away",
    errno.ENOENT: "the file is gone (the device was removed, or renumbered)",
    errno.EAGAIN: "the chip is busy",
    errno.EBUSY: "the chip is busy",
    errno.EACCES: "permission denied",
}


@dataclass(frozen=True)
class Fault:
    """Why there is no reading: ``kind`` is what is counted (``EIO``, ``garbage``,
    ``power_on``...), ``reason`` the device's status reason."""

    kind: str
    reason: str


def read_fault(file: str, failed: Errno) -> Fault:
    hint = ERRNO_HINTS.get(failed.code)
    return Fault(failed.name, f"{file}: {failed.name}" + (f", {hint}" if hint else ""))


# --- the families -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ChannelType:
    """One kind of channel of a family: its files' prefix pattern and the factor from the
    kernel's unit to Cairn's."""

    pattern: re.Pattern[str]
    factor: Decimal
    unit: str   # Cairn's, for cairn sensor scan
    shown: str  # the pattern for people: temp<n>


@dataclass(frozen=True)
class Family:
    name: str
    types: Mapping[str, ChannelType]  # type name (the stem's group 1) -> how to read it
    defaults: Mapping[str, str]        # field -> channel stem, each read where present
    has_raw: bool                      # IIO: a _raw file (with _scale, _offset) may stand in

    def channel_type(self, stem: str) -> ChannelType | None:
        return next((t for t in self.types.values() if t.pattern.fullmatch(stem)), None)


MILLI = Decimal("0.001")
HWMON = Family("hwmon", {
    "temp": ChannelType(re.compile(r"temp\d+"), MILLI, "°C", "temp<n>"),
    "humidity": ChannelType(re.compile(r"humidity\d+"), MILLI, "%RH", "humidity<n>"),
}, {"temperature": "temp1", "humidity": "humidity1"}, has_raw=False)
IIO = Family("iio", {
    "temp": ChannelType(re.compile(r"in_temp\d*(_[a-z]+)?"), MILLI, "°C", "in_temp[<n>]"),
    "humidityrelative": ChannelType(re.compile(r"in_humidityrelative\d*(_[a-z]+)?"), MILLI,
                                    "%RH", "in_humidityrelative[<n>]"),
    "pressure": ChannelType(re.compile(r"in_pressure\d*(_[a-z]+)?"), Decimal(10), "hPa",
                            "in_pressure[<n>]"),
}, {"temperature": "in_temp", "humidity": "in_humidityrelative", "pressure": "in_pressure"},
    has_raw=True)
W1 = Family("w1", {
    "temperature": ChannelType(re.compile(r"temperature"), MILLI, "°C", "temperature"),
}, {"temperature": "temperature"}, has_raw=False)

W1_SLAVE = "w1_slave"
W1_POWER_ON = 85000  # m°C: the DS18B20's (and DS18S20's) temperature register after reset
# 1-Wire families with the w1_therm driver (drivers/w1/slaves/w1_therm.c)
W1_THERMOMETERS = {"10": "DS18S20", "22": "DS1822", "28": "DS18B20", "3b": "DS1825",
                   "42": "DS28EA00"}


# --- which files make a reading ---------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """Where one field's value comes from: a processed file, or raw with scale and offset."""

    field: str
    stem: str                  # its channel: temp1, in_temp, temperature
    value: str                 # temp1_input, in_temp_raw, temperature, w1_slave
    factor: Decimal            # kernel unit -> Cairn's
    scale: str | None = None   # IIO raw only; without one the raw is in the kernel unit
    offset: str | None = None

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.value, self.scale, self.offset) if f is not None)


@dataclass(frozen=True)
class Plan:
    """The files one reading of a device is made of, found from its directory's names."""

    sources: tuple[Source, ...]

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for s in self.sources for f in s.files)

    @property
    def channels(self) -> dict[str, str]:
        """Field -> stem: what a later plan must find again (a default channel once read
        is as required as a configured one: a file that goes is a fault, not a field less)."""
        return {s.field: s.stem for s in self.sources}


def plan(family: Family, channels: Mapping[str, str] | None,
         names: frozenset[str]) -> Plan | Fault:
    """The files to read for ``channels`` (field -> stem: each must be there), or, when
    none are configured, for the family's defaults that the directory has."""
    wanted = channels if channels is not None else family.defaults
    sources = []
    for field, stem in wanted.items():
        source = _source(family, field, stem, names)
        if source is None and channels is not None:
            also = f" or {stem}_raw" if family.has_raw else ""
            return Fault("missing", f"no {_value_file(family, stem)}{also} for {field} "
                                    f"(cairn sensor scan lists what it has)")
        if source is not None:
            sources.append(source)
    if not sources:
        expected = [_value_file(family, stem) for stem in wanted.values()]
        expected += [W1_SLAVE] if family is W1 else []
        return Fault("missing", f"none of {', '.join(expected)}")
    return Plan(tuple(sources))


def _value_file(family: Family, stem: str) -> str:
    return stem if family is W1 else f"{stem}_input"


def _source(family: Family, field: str, stem: str, names: frozenset[str]) -> Source | None:
    kind = family.channel_type(stem)
    factor = kind.factor if kind else Decimal(1)
    if family is W1:  # temperature where the kernel has it (since 2020), else w1_slave
        present = [name for name in (stem, W1_SLAVE) if name in names]
        return Source(field, stem, present[0], factor) if present else None
    if f"{stem}_input" in names:
        return Source(field, stem, f"{stem}_input", factor)
    if family.has_raw and f"{stem}_raw" in names:
        shared = _shared_stem(family, stem)
        scale = _first(names, f"{stem}_scale", f"{shared}_scale")
        offset = _first(names, f"{stem}_offset", f"{shared}_offset")
        return Source(field, stem, f"{stem}_raw", factor, scale, offset)
    return None


def _first(names: frozenset[str], *candidates: str) -> str | None:
    return next((name for name in candidates if name in names), None)


def _shared_stem(family: Family, stem: str) -> str:
    """in_temp0 (and in_temp_ambient) -> in_temp: the prefix of attributes shared by type."""
    for name, kind in family.types.items():
        if kind.pattern.fullmatch(stem):
            return f"in_{name}"
    return stem


# --- what the texts mean ----------------------------------------------------------------------

def reading(plan: Plan, texts: Mapping[str, Text]) -> Reading | Fault:
    """The reading the files of ``plan`` make, or the first fault among them."""
    values: Reading = {}
    for source in plan.sources:
        value = _value(source, texts)
        if isinstance(value, Fault):
            return value
        values[source.field] = value
    return values


def _value(source: Source, texts: Mapping[str, Text]) -> float | Fault:
    if source.value == W1_SLAVE:
        return w1_slave(texts[W1_SLAVE])
    raw = _number(source.value, texts[source.value])
    if isinstance(raw, Fault):
        return raw
    if source.value == "temperature" and raw == W1_POWER_ON:  # a 1-Wire thermometer's file
        return power_on_fault(source.value)
    offset = _number(source.offset, texts[source.offset]) if source.offset else Decimal(0)
    scale = _number(source.scale, texts[source.scale]) if source.scale else Decimal(1)
    for part in (offset, scale):
        if isinstance(part, Fault):
            return part
    return _cairn_unit((raw + offset) * scale * source.factor)


def _number(file: str, text: Text) -> Decimal | Fault:
    if isinstance(text, Errno):
        return read_fault(file, text)
    stripped = text.strip()
    if not stripped:
        return Fault("empty", f"{file} is empty (no value yet)")
    try:
        value = Decimal(stripped)
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite():
        return Fault("garbage", f"{file} reads {stripped[:24]!r}, not a number")
    return value


def _cairn_unit(value: Decimal) -> float:
    return float(value.quantize(MILLI))


def power_on_fault(file: str) -> Fault:
    return Fault("power_on", f"{file}: 85 °C, the DS18B20's power-on value, not a measurement "
                             f"(check its power supply and wiring)")


_W1_CRC = re.compile(r"crc=([0-9a-f]{2}) (YES|NO)\s*$")
_W1_T = re.compile(r"t=(-?\d+)\s*$")


def w1_slave(text: Text) -> float | Fault:
    """``72 01 4b 46 7f ff 0e 10 57 : crc=57 YES`` / ``72 01 4b 46 7f ff 0e 10 57 t=23125``.
    After ``NO`` the second line repeats the last good scratchpad, so it is not a reading."""
    if isinstance(text, Errno):
        return read_fault(W1_SLAVE, text)
    lines = text.splitlines()
    crc = _W1_CRC.search(lines[0]) if lines else None
    t = _W1_T.search(lines[1]) if len(lines) > 1 else None
    if crc is None or t is None:
        return Fault("garbage", f"{W1_SLAVE} reads {text.strip()[:40]!r}, not crc=.. and t=..")
    if crc.group(2) == "NO":
        return Fault("crc", f"{W1_SLAVE}: CRC mismatch (crc={crc.group(1)} NO), noise on the "
                            f"1-Wire line or a loose contact")
    if int(t.group(1)) == W1_POWER_ON:
        return power_on_fault(W1_SLAVE)
    return _cairn_unit(Decimal(t.group(1)) * MILLI)


# --- names of devices -------------------------------------------------------------------------

I2C_DEVICE = re.compile(r"(\d+)-([0-9a-f]{4})")          # 1-0076: bus 1, address 0x76
W1_DEVICE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{12})")  # 28-0316a2790b6f
RENUMBERED = re.compile(r"(hwmon\d+|iio:device\d+|w1_bus_master\d+)")


def i2c_address(device: str) -> tuple[int, int] | None:
    """``1-0076`` -> (1, 0x76), as the kernel names an I2C client (``%d-%04x``)."""
    match = I2C_DEVICE.fullmatch(device)
    return (int(match.group(1)), int(match.group(2), 16)) if match else None


def new_device_line(chip: str, address: int) -> str:
    """What ``/sys/bus/i2c/devices/i2c-N/new_device`` takes: ``bme280 0x76``."""
    return f"{chip} {address:#04x}\n"


def sensor_id(chip: str, device: str) -> str:
    """A device id for ``cairn sensor scan``'s entries, one topic component: bme280-1-0076,
    ds18b20-28-0316a2790b6f, dht11_0."""
    name = device if device.startswith(chip.lower()) else f"{chip.lower()}-{device}"
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


_NEW_DEVICE_HINTS = {
    errno.EACCES: "creating a chip needs root: run cairn sensor chips as root first (the "
                  "image's cairn-sensor@ unit does), or on Raspberry Pi OS let the boot "
                  "create it (dtoverlay=i2c-sensor,<chip> in config.txt)",
    errno.EROFS: "sysfs is read-only for this process (systemd's ProtectKernelTunables=): "
                 "run cairn sensor chips as root first (the image's cairn-sensor@ unit does)",
    errno.EBUSY: "another device has that address on the bus",
    errno.EINVAL: "the kernel refused the chip name or address",
}
_NEW_DEVICE_HINTS[errno.EPERM] = _NEW_DEVICE_HINTS[errno.EACCES]


def new_device_fault(path: object, line: str, failed: Errno) -> Fault:
    hint = _NEW_DEVICE_HINTS.get(failed.code)
    return Fault("new_device", f"cannot create the chip: writing {line.strip()!r} to {path}: "
                               f"{failed.name}" + (f", {hint}" if hint else ""))


# --- cairn sensor scan ------------------------------------------------------------------------

@dataclass(frozen=True)
class Found:
    """A device the kernel offers, as ``cairn sensor scan`` found it."""

    family: Family
    device: str | None   # its stable name; None when it has none (a thermal zone's hwmon)
    bus: str | None      # i2c, platform, spi, w1
    chip: str            # its name attribute, or the 1-Wire family's part
    directory: str       # hwmon2, iio:device0, 28-0316a2790b6f
    values: Mapping[str, float | Fault]  # channel stem -> what it reads now


_CHANNEL_FILE = {
    "hwmon": re.compile(r"((?:temp|humidity)\d+)_input"),
    "iio": re.compile(r"(in_(?:temp|humidityrelative|pressure)\d*(?:_[a-z]+)?)_(?:input|raw)"),
}


def channel_stems(family: Family, names: frozenset[str]) -> list[str]:
    """The channels of a directory Cairn reads, in the family's order of types."""
    if family is W1:
        return ["temperature"] if names & {"temperature", W1_SLAVE} else []
    stems = {m.group(1) for n in names if (m := _CHANNEL_FILE[family.name].fullmatch(n))}
    order = list(family.types)
    return sorted(stems, key=lambda s: (next(i for i, t in enumerate(order)
                                            if family.types[t].pattern.fullmatch(s)),
                                       len(s), s))


def scan_entry(found: Found, root: str | None = None) -> str:
    """A comment naming what was found, and the ``[[sensors]]`` entry that reads it (none
    for a device without a stable name). ``root``: a sysfs other than /sys."""
    shown = ", ".join(f"{stem} {_shown(found.family, stem, value)}"
                      for stem, value in found.values.items()) or "no channels Cairn reads"
    where = f"{found.device} on {found.bus}" if found.device else "no bus device"
    head = f"# {found.family.name} {found.directory}: {found.chip} ({where}): {shown}"
    if found.device is None or not found.values:
        return f"{head}\n#   not offered: {'no stable name' if found.values else 'nothing to read'}"
    lines = [head, "[[sensors]]", f'id = "{sensor_id(found.chip, found.device)}"',
             f'kind = "{found.family.name}"', f'device = "{found.device}"']
    defaults = {stem: name for name, stem in found.family.defaults.items()}
    if not set(found.values) <= set(defaults):
        table = ", ".join(f'{defaults.get(stem, stem)} = "{stem}"' for stem in found.values)
        lines.append(f"channels = {{ {table} }}")
    if root is not None:
        lines.append(f'sysfs = "{root}"')
    return "\n".join(lines)


def _shown(family: Family, stem: str, value: float | Fault) -> str:
    if isinstance(value, Fault):
        return f"({value.reason})"
    kind = family.channel_type(stem)
    return f"{value:g} {kind.unit if kind else ''}".rstrip()
