"""A sysfs tree in a directory, laid out file for file as the kernel's ABI documents describe
it (``sysfs-class-hwmon``, ``sysfs-bus-iio``, ``sysfs-driver-w1_therm``) and as a Raspberry
Pi's kernel shows it, whose values tests and benchmarks change: hwmon chips (sht3x, sht21) and
IIO chips (bme280, hdc100x) on the Pi's I2C buses, a DHT11 on a GPIO (IIO on a platform
device), DS18B20s on a 1-Wire bus master. The kind of the ``hwmon``, ``iio`` and ``w1``
sensors (drivers.kinds), as :mod:`drivers.simulator` is the serial kinds'.

What it makes, less what Cairn does not read (power/, uevent...)::

    devices/platform/soc/3f804000.i2c/i2c-1/       bus 1: new_device, delete_device, name
        1-0076/                                    a chip: name, subsystem, driver
            iio:device0/                           name, in_temp_input, ... (hwmon/hwmon2/)
    devices/platform/dht11@0/iio:device1/
    devices/w1_bus_master1/28-0316a2790b6f/        temperature, w1_slave, resolution...
    bus/{i2c,platform,w1}/devices/<name>, bus/iio/devices/iio:deviceN, class/hwmon/hwmonN
        -> the directories above (relative symlinks, as the kernel's)

Faults a file system really gives, put where a value file was (:meth:`SimChip.fail`):

- ``EIO``: a symlink to ``/proc/self/mem``, whose read at offset 0 fails with EIO (address 0
  is never mapped: vm.mmap_min_addr);
- ``ENXIO``: a Unix socket, which open(2) refuses with ENXIO;
- ``EISDIR``: a directory, whose read(2) gives EISDIR (it stands for the errnos no file
  system gives: EREMOTEIO, ETIMEDOUT);
- ``ENOENT``: the file removed.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# The Pi 3's I2C controllers as its device tree names them (bus 0, 1, 2)
PI_I2C = {0: "3f205000.i2c", 1: "3f804000.i2c", 2: "3f805000.i2c"}
# hdc100x: (raw + offset) * scale, as the kernel's driver declares them
HDC_TEMP_SCALE, HDC_TEMP_OFFSET = 2.517700195, -15887.515151
HDC_HUMIDITY_SCALE = 1.525878906


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def _write(path: Path, text: str) -> None:
    """Atomically, so a reader never sees a half-written value; over whatever a fault put
    there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    partial = path.with_name(f".{path.name}.new")
    partial.write_text(text)
    os.replace(partial, path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _socket_at(path: Path) -> None:
    """A Unix socket file at ``path`` (bound where the 108-byte limit allows, then moved)."""
    scratch = Path(tempfile.mkdtemp(prefix="cs"))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(scratch / "s"))
    os.replace(scratch / "s", path)
    scratch.rmdir()


def _kernel_text(file: str, value: float) -> str:
    """As the drivers print: pressure in kPa with nine decimals, the rest as integers."""
    return f"{value:.9f}\n" if file.startswith("in_pressure") else f"{round(value)}\n"


def crc8(data: bytes) -> int:
    """Dallas/Maxim CRC-8 (x^8 + x^5 + x^4 + 1, reflected), the 1-Wire scratchpad's."""
    crc = 0
    for byte in data:
        for _ in range(8):
            mix = (crc ^ byte) & 1
            crc = (crc >> 1) ^ (0x8C if mix else 0)
            byte >>= 1
    return crc


def w1_slave_text(millidegrees: int, good_crc: bool = True) -> str:
    """What w1_therm prints for a DS18B20 scratchpad holding this temperature (12 bits)."""
    raw = round(millidegrees * 16 / 1000) & 0xFFFF
    pad = bytes([raw & 0xFF, raw >> 8, 0x4B, 0x46, 0x7F, 0xFF, 0x0C, 0x10])
    crc = crc8(pad) if good_crc else crc8(pad) ^ 0x5A
    hexes = " ".join(f"{b:02x}" for b in pad + bytes([crc]))
    return (f"{hexes} : crc={crc:02x} {'YES' if good_crc else 'NO'}\n"
            f"{hexes} t={millidegrees if good_crc else 0}\n")


@dataclass
class SimChip:
    """One simulated device. ``fields``: Cairn field -> (its file, kernel units per Cairn
    unit, offset in raw units), which :meth:`set` writes."""

    device: str                # the stable name: 1-0076, dht11@0, 28-0316a2790b6f
    device_dir: Path
    directory: Path            # where its value files are: hwmonN, iio:deviceN, the w1 dir
    fields: dict[str, tuple[str, float, float]]
    links: list[Path] = field(default_factory=list)
    w1: bool = False  # a 1-Wire thermometer: w1_slave shows each value too

    def set(self, **values: float) -> None:
        for name, value in values.items():
            file, per_unit, offset = self.fields[name]
            if self.w1:
                self.write("w1_slave", w1_slave_text(round(value * 1000)))
            if file != "w1_slave":
                self.write(file, _kernel_text(file, value * per_unit - offset))

    def write(self, file: str, text: str) -> None:
        _write(self.directory / file, text)

    def fail(self, file: str, code: int) -> None:
        """Make reading ``file`` fail with ``code`` (EIO, ENXIO, EISDIR or ENOENT)."""
        path = self.directory / file
        _remove(path)
        if code == errno.EIO:
            os.symlink("/proc/self/mem", path)
        elif code == errno.ENXIO:
            _socket_at(path)
        elif code == errno.EISDIR:
            path.mkdir()
        elif code != errno.ENOENT:
            raise ValueError(f"a file system cannot give {errno.errorcode.get(code, code)}; "
                             f"EIO, ENXIO, EISDIR or ENOENT")


class SimSysfs:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # --- I2C --------------------------------------------------------------------------------

    def adapter(self, bus: int) -> Path:
        """The bus's adapter directory (made once), with its new_device file."""
        path = self.root / "devices/platform/soc" / PI_I2C.get(bus, f"i2c@{bus}") / f"i2c-{bus}"
        if not path.exists():
            path.mkdir(parents=True)
            for name, text in (("name", f"bcm2835 (i2c@{bus})\n"), ("new_device", ""),
                               ("delete_device", "")):
                (path / name).write_text(text)
            _link(path / "subsystem", self.root / "bus/i2c")
            _link(self.root / f"bus/i2c/devices/i2c-{bus}", path)
        return path

    def new_device_lines(self, bus: int) -> list[str]:
        """What was written to the bus's new_device (the driver creating a chip)."""
        return (self.adapter(bus) / "new_device").read_text().splitlines()

    def i2c_device(self, bus: int, address: int, name: str, driver: str | None) -> SimChip:
        """A client the kernel made (by overlay or new_device); ``driver`` None: its probe
        failed, so it has no driver and no hwmon or IIO directory."""
        device = f"{bus}-{address:04x}"
        device_dir = self.adapter(bus) / device
        device_dir.mkdir()
        (device_dir / "name").write_text(f"{name}\n")
        (device_dir / "modalias").write_text(f"i2c:{name}\n")
        _link(device_dir / "subsystem", self.root / "bus/i2c")
        if driver is not None:
            _link(device_dir / "driver", self.root / f"bus/i2c/drivers/{driver}")
        chip = SimChip(device, device_dir, device_dir, {})
        self._publish(chip, self.root / f"bus/i2c/devices/{device}", device_dir)
        return chip

    def hwmon_chip(self, bus: int, address: int, name: str, driver: str,
                   values: dict[str, float], index: int | None = None) -> SimChip:
        """An I2C chip a hwmon driver bound: its files in ``<device>/hwmon/hwmonN``."""
        chip = self.i2c_device(bus, address, name, driver)
        n = self._free("class/hwmon", "hwmon") if index is None else index
        chip.directory = chip.device_dir / "hwmon" / f"hwmon{n}"
        chip.directory.mkdir(parents=True)
        (chip.directory / "name").write_text(f"{name}\n")
        _link(chip.directory / "device", chip.device_dir)
        _link(chip.directory / "subsystem", self.root / "class/hwmon")
        self._publish(chip, self.root / f"class/hwmon/hwmon{n}", chip.directory)
        chip.fields = {"temperature": ("temp1_input", 1000, 0),
                       "humidity": ("humidity1_input", 1000, 0)}
        chip.fields = {k: f for k, f in chip.fields.items() if k in values}
        chip.set(**values)
        return chip

    def sht3x(self, bus: int = 1, address: int = 0x44, temperature: float = 22.5,
              humidity: float = 45.0, **kw) -> SimChip:
        return self.hwmon_chip(bus, address, "sht3x", "sht3x",
                               {"temperature": temperature, "humidity": humidity}, **kw)

    def sht21(self, bus: int = 1, address: int = 0x40, temperature: float = 22.5,
              humidity: float = 45.0, **kw) -> SimChip:
        return self.hwmon_chip(bus, address, "sht21", "sht21",
                               {"temperature": temperature, "humidity": humidity}, **kw)

    def iio_chip(self, chip: SimChip, name: str, fields: dict[str, tuple[str, float, float]],
                 values: dict[str, float], extra: dict[str, str],
                 index: int | None = None) -> SimChip:
        """An IIO device under ``chip``'s device directory."""
        n = self._free("bus/iio/devices", "iio:device") if index is None else index
        chip.directory = chip.device_dir / f"iio:device{n}"
        chip.directory.mkdir()
        (chip.directory / "name").write_text(f"{name}\n")
        (chip.directory / "dev").write_text(f"{240 + n}:0\n")
        _link(chip.directory / "subsystem", self.root / "bus/iio")
        for file, text in extra.items():
            (chip.directory / file).write_text(text)
        self._publish(chip, self.root / f"bus/iio/devices/iio:device{n}", chip.directory)
        chip.fields = fields
        chip.set(**values)
        return chip

    def bme280(self, bus: int = 1, address: int = 0x76, temperature: float = 21.0,
               humidity: float = 50.0, pressure: float = 1013.25, **kw) -> SimChip:
        """The bmp280 driver's channels: processed temperature (m°C), humidity (m%RH) and
        pressure (kPa), each with its oversampling ratio."""
        chip = self.i2c_device(bus, address, "bme280", "bmp280")
        ratios = {f"in_{t}_oversampling_ratio": "1\n"
                  for t in ("temp", "humidityrelative", "pressure")}
        return self.iio_chip(chip, "bme280", {
            "temperature": ("in_temp_input", 1000, 0),
            "humidity": ("in_humidityrelative_input", 1000, 0),
            "pressure": ("in_pressure_input", 0.1, 0)},
            {"temperature": temperature, "humidity": humidity, "pressure": pressure},
            ratios, **kw)

    def hdc1000(self, bus: int = 1, address: int = 0x40, temperature: float = 21.0,
                humidity: float = 50.0, **kw) -> SimChip:
        """The hdc100x driver's raw channels, with scale and offset:
        value = (raw + offset) x scale, in m°C and m%RH."""
        chip = self.i2c_device(bus, address, "hdc1000", "hdc100x")
        return self.iio_chip(chip, "hdc1000", {
            "temperature": ("in_temp_raw", 1000 / HDC_TEMP_SCALE, HDC_TEMP_OFFSET),
            "humidity": ("in_humidityrelative_raw", 1000 / HDC_HUMIDITY_SCALE, 0)},
            {"temperature": temperature, "humidity": humidity},
            {"in_temp_scale": f"{HDC_TEMP_SCALE:.9f}\n",
             "in_temp_offset": f"{HDC_TEMP_OFFSET:.6f}\n",
             "in_humidityrelative_scale": f"{HDC_HUMIDITY_SCALE:.9f}\n"}, **kw)

    # --- a DHT11 on a GPIO ----------------------------------------------------------------

    def dht11(self, name: str = "dht11@0", temperature: float = 19.0,
              humidity: float = 60.0, **kw) -> SimChip:
        """The dht11 overlay's platform device, bound by the dht11 IIO driver: processed
        temperature (m°C) and humidity (m%RH)."""
        device_dir = self.root / "devices/platform" / name
        device_dir.mkdir(parents=True)
        _link(device_dir / "subsystem", self.root / "bus/platform")
        _link(device_dir / "driver", self.root / "bus/platform/drivers/dht11")
        (device_dir / "modalias").write_text("of:Ndht11T(null)Cdht11\n")
        chip = SimChip(name, device_dir, device_dir, {})
        self._publish(chip, self.root / f"bus/platform/devices/{name}", device_dir)
        return self.iio_chip(chip, "dht11", {
            "temperature": ("in_temp_input", 1000, 0),
            "humidity": ("in_humidityrelative_input", 1000, 0)},
            {"temperature": temperature, "humidity": humidity}, {}, **kw)

    # --- 1-Wire ----------------------------------------------------------------------------

    def ds18b20(self, serial: str = "0316a2790b6f", temperature: float = 21.0,
                w1_slave_only: bool = False) -> SimChip:
        """A DS18B20 under w1_bus_master1: ``temperature`` (m°C) and ``w1_slave``; an older
        kernel's (``w1_slave_only``) has no ``temperature``."""
        master = self.root / "devices/w1_bus_master1"
        if not master.exists():
            master.mkdir(parents=True)
            _link(self.root / "bus/w1/devices/w1_bus_master1", master)
        device = f"28-{serial}"
        directory = master / device
        directory.mkdir()
        (directory / "name").write_text(f"{device}\n")
        (directory / "resolution").write_text("12\n")
        (directory / "ext_power").write_text("1\n")
        _link(directory / "subsystem", self.root / "bus/w1")
        _link(directory / "driver", self.root / "bus/w1/drivers/w1_slave_driver")
        file = "w1_slave" if w1_slave_only else "temperature"
        chip = SimChip(device, directory, directory, {"temperature": (file, 1000, 0)}, w1=True)
        self._publish(chip, self.root / f"bus/w1/devices/{device}", directory)
        chip.set(temperature=temperature)
        return chip

    # --- devices coming and going ----------------------------------------------------------

    def remove(self, chip: SimChip) -> None:
        """The device goes away (unplugged, unbound, deleted): its directory and links."""
        for link in chip.links:
            _remove(link)
        shutil.rmtree(chip.device_dir)

    def _publish(self, chip: SimChip, link: Path, target: Path) -> None:
        _link(link, target)
        chip.links.append(link)

    def _free(self, folder: str, prefix: str) -> int:
        """The lowest number not in use, as the kernel's ida hands them out."""
        used = {p.name for p in (self.root / folder).glob(f"{prefix}*")}
        return next(n for n in range(len(used) + 1) if f"{prefix}{n}" not in used)
