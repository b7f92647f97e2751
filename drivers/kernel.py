"""Kernel sensors read through sysfs: the hwmon, IIO and 1-Wire (w1_therm) devices of the
``hwmon``, ``iio`` and ``w1`` kinds, and what ``cairn sensor scan`` finds.

**Names.** A device is named by what stays stable: the name of its device under
``/sys/bus/*/devices`` (``1-0076``, bus 1 address 0x76, for I2C; ``dht11@0`` for the DHT11's
platform device; ``spi0.0``), whose ``hwmon/hwmonN`` or ``iio:deviceN`` child holds the files,
or a 1-Wire thermometer's id (``/sys/bus/w1/devices/28-<serial>`` holds them itself). The N
are the kernel's to hand out again (a chip that is removed and probed again may come back
under another), so the directory is looked up once and again after every failed reading.

**Creating a chip.** With ``chip = "bme280"`` and no device ``1-0076``, ``bme280 0x76`` is
written to ``/sys/bus/i2c/devices/i2c-1/new_device``, as the kernel's I2C documentation
(``instantiating-devices``) describes. That needs root: on the image ``cairn sensor chips``
does it as root before the driver starts (``cairn-sensor@.service``), and the driver, which
may not write sysfs there, finds the device made; run by hand as root, the driver makes it
itself. A device tree overlay does the same at boot where the card carries the overlay
(Raspberry Pi OS does; Cairn's card, with Debian's kernel and device trees, does not).

**Reading.** A read of a sysfs attribute blocks while the kernel driver measures: an SHT3x
~15 ms, a BME280 in forced mode up to ~40 ms, a DHT11 up to a second when its line is bad, a
DS18B20 750 ms at 12 bits. Each device therefore reads in a worker thread of its own, one read
at a time, and the event loop only waits for the answer, with a timeout; a read that outlives
it is waited for again at the next try, never started twice. A failed reading is retried
(``retries``, 2 s apart or the interval if shorter, the time a DHT11/DHT22 needs before it
answers again), then becomes the device's status with the reason, and the next good reading
makes it ``ok`` again. Each kind of fault is logged the first time and counted always.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.drivers import sysfs
from cairn.drivers.sysfs import W1, Errno, Family, Fault, Found, Plan, Reading, Text

log = logging.getLogger("cairn.kernel")

DEFAULT_SYSFS = "/sys"
RETRY_DELAY = 2.0  # s between tries: a DHT11/DHT22 ignores a start signal within 1-2 s
MAX_ATTRIBUTE = 4096  # bytes: a sysfs attribute is at most a page


def read_text(path: Path) -> Text:
    """A sysfs file's text, or the errno its open or read gave."""
    try:
        # O_NONBLOCK: sysfs ignores it, and a FIFO put in a test tree cannot hang the reader
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return Errno(e.errno)
    try:
        return os.read(fd, MAX_ATTRIBUTE).decode("ascii", errors="replace")
    except OSError as e:
        return Errno(e.errno)
    finally:
        os.close(fd)


def write_text(path: Path, text: str) -> Errno | None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as e:
        return Errno(e.errno)
    try:
        os.write(fd, text.encode("ascii"))
    except OSError as e:
        return Errno(e.errno)
    finally:
        os.close(fd)
    return None


def names_in(directory: Path) -> frozenset[str] | Errno:
    try:
        return frozenset(os.listdir(directory))
    except OSError as e:
        return Errno(e.errno)


class Sysfs:
    """Where sysfs is (``/sys``; a tree in a temporary directory for tests) and how its
    devices are found there."""

    def __init__(self, root: str | Path = DEFAULT_SYSFS) -> None:
        self.root = Path(root)

    def device_dir(self, family: Family, device: str) -> Path | None:
        """The device's directory: ``bus/w1/devices/<id>``, else ``bus/<any>/devices/<name>``
        (i2c, platform, spi...)."""
        buses = ("w1",) if family is W1 else names_in(self.root / "bus")
        if isinstance(buses, Errno):
            return None
        paths = (self.root / "bus" / bus / "devices" / device for bus in sorted(buses))
        return next((path for path in paths if path.exists()), None)

    @staticmethod
    def children(family: Family, device_dir: Path) -> list[Path]:
        """The directories that may hold its files, lowest number first."""
        if family is W1:
            return [device_dir]
        found = device_dir.glob("hwmon/hwmon*") if family is sysfs.HWMON else \
            device_dir.glob("iio:device*")
        return sorted(found, key=lambda p: (len(p.name), p.name))

    def i2c_adapter(self, bus: int) -> Path:
        return self.root / "bus" / "i2c" / "devices" / f"i2c-{bus}"


@dataclass(frozen=True)
class Located:
    directory: Path
    plan: Plan


@dataclass
class KernelStats:
    readings: int = 0
    faults: dict[str, int] = field(default_factory=dict)  # failed reads by kind of fault
    found: int = 0       # times the device's directory was looked up and found
    created: int = 0     # chips created through new_device
    directory: str | None = None  # where its files are now


class KernelDevice:
    """One configured device: finds its files, reads them (blocking: call it from a worker
    thread) and forgets where they were when a reading fails, so the next one looks again.
    Without configured ``channels`` it reads the family's defaults that the device has, and
    from its first find on needs those (a file that goes is a fault, not a field less)."""

    def __init__(self, sysfs_root: Sysfs, family: Family, device: str,
                 channels: Mapping[str, str] | None = None, chip: str | None = None) -> None:
        self.sysfs, self.family, self.device = sysfs_root, family, device
        self.channels, self.chip = channels, chip
        self.stats = KernelStats()
        self._located: Located | None = None

    @property
    def files(self) -> tuple[str, ...]:
        """The files a reading reads now (none before the device is found)."""
        return self._located.plan.files if self._located else ()

    def read(self) -> Reading | Fault:
        """A reading, or why there is none. After a failed read where the files were, the
        device is looked up again at once: one that was renumbered reads on, one that left
        or lost a file says so."""
        known, fresh = self._located, self._located is None
        if known is None:
            known = self._find()
            if isinstance(known, Fault):
                return known
        result = self._read_files(known)
        if not isinstance(result, Fault) or fresh:
            return result
        now = self._find()
        if isinstance(now, Fault):
            return now
        return self._read_files(now) if now.directory != known.directory else result

    def _find(self) -> Located | Fault:
        found = self._locate()
        self._located = None if isinstance(found, Fault) else found
        if isinstance(found, Fault):
            return found
        self.channels = found.plan.channels
        self.stats.found += 1
        self.stats.directory = str(found.directory)
        return found

    def _read_files(self, at: Located) -> Reading | Fault:
        result = sysfs.reading(at.plan, {f: read_text(at.directory / f) for f in at.plan.files})
        if isinstance(result, Fault):
            self._located = None  # where it is: looked up again before the next read
        return result

    def _locate(self) -> Located | Fault:
        device_dir = self.sysfs.device_dir(self.family, self.device)
        if device_dir is None and self.chip is not None:
            failed = self._create()
            if failed is not None:
                return failed
            device_dir = self.sysfs.device_dir(self.family, self.device)
        if device_dir is None:
            return self._absent()
        first_fault = None
        for child in self.sysfs.children(self.family, device_dir):
            names = names_in(child)
            found = sysfs.read_fault(child.name, names) if isinstance(names, Errno) else \
                sysfs.plan(self.family, self.channels, names)
            if isinstance(found, Plan):
                return Located(child, found)
            first_fault = first_fault or found
        return first_fault or self._without_files(device_dir)

    def create_chip(self) -> Fault | None:
        """Make the configured chip unless its device is there already (or none is
        configured): None when the device is there afterwards, else why not."""
        if self.chip is None or self.sysfs.device_dir(self.family, self.device) is not None:
            return None
        return self._create()

    def _create(self) -> Fault | None:
        """Write ``<chip> <address>`` to the bus's new_device; the kernel probes at once."""
        bus, address = sysfs.i2c_address(self.device)
        adapter = self.sysfs.i2c_adapter(bus)
        if not adapter.is_dir():
            return Fault("no_bus", f"no I2C bus i2c-{bus} to create {self.chip} on "
                                   f"(on a Pi, dtparam=i2c_arm=on in config.txt enables bus 1)")
        line = sysfs.new_device_line(self.chip, address)
        failed = write_text(adapter / "new_device", line)
        if failed is not None:
            return sysfs.new_device_fault(adapter / "new_device", line, failed)
        self.stats.created += 1
        log.info("created %s: wrote %r to %s", self.device, line.strip(),
                 adapter / "new_device")
        if self.sysfs.device_dir(self.family, self.device) is None:
            return Fault("absent", f"wrote {line.strip()!r} to {adapter / 'new_device'} but "
                                   f"{self.device} did not appear")
        return None

    def _absent(self) -> Fault:
        if self.family is W1:
            return Fault("absent", f"{self.device} is not on the 1-Wire bus (no "
                                   f"{self.sysfs.root}/bus/w1/devices/{self.device})")
        return Fault("absent", f"no device {self.device} in {self.sysfs.root}/bus/*/devices "
                               f"(not connected, or no overlay or chip = ... creates it)")

    def _without_files(self, device_dir: Path) -> Fault:
        """The device is there but shows no hwmon or IIO directory: its probe failed (no
        chip answering at the address), or no driver is bound to it."""
        what = "hwmon/hwmonN" if self.family is sysfs.HWMON else "iio:deviceN"
        driver = device_dir / "driver"
        if driver.exists():
            return Fault("no_files", f"{self.device}'s driver {driver.resolve().name} gives it "
                                     f"no {what} (another kind reads it?)")
        return Fault("unbound", f"{self.device} has no driver bound: its probe failed (no chip "
                                f"answering there?) or no driver knows it")


OnReading = Callable[[str, dict[str, float]], None]
OnError = Callable[[str, str], None]


class KernelSensor:
    """A kernel device polled every ``interval`` seconds, until cancelled (a PortTask)."""

    def __init__(self, key: str, device: KernelDevice, on_reading: OnReading,
                 on_error: OnError, *, interval: float = 10.0, timeout: float = 2.0,
                 retries: int = 2, phase: float = 0.0) -> None:
        self.key, self.device = key, device
        self.on_reading, self.on_error = on_reading, on_error
        self.interval, self.timeout, self.retries = interval, timeout, retries
        self.phase = phase  # 0..1: where in the interval its polls fall after the first
        self.stats = device.stats
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"sysfs-{key}")
        self._pending: asyncio.Future | None = None

    async def run(self) -> None:
        # The first reading at once, the next ones at the device's own phase of the interval:
        # devices polled together would wake their threads together, which then queue for
        # the GIL (and on a real bus for the bus), costing context switches by the dozen.
        due = time.monotonic() + self.phase * self.interval
        try:
            await self.poll_once()
            while True:
                due = max(due + self.interval, time.monotonic())
                await asyncio.sleep(due - time.monotonic())
                await self.poll_once()
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def poll_once(self) -> None:
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(RETRY_DELAY, self.interval))
            result = await self._read()
            if not isinstance(result, Fault):
                self.stats.readings += 1
                try:
                    self.on_reading(self.key, result)
                except Exception:  # a broken callback must not stop the device's polls
                    log.exception("reading from %s (%s)", self.key, self.device.device)
                return
            self._count(result)
        self.on_error(self.key, result.reason)

    async def _read(self) -> Reading | Fault:
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = loop.run_in_executor(self._executor, self.device.read)
        try:
            result = await asyncio.wait_for(asyncio.shield(self._pending), self.timeout)
        except TimeoutError:  # the read goes on: the next try waits for it (or takes its result)
            return Fault("timeout", f"no answer within {self.timeout:g} s (the kernel driver "
                                    f"is still reading)")
        except Exception as e:  # what a read raises costs this device a reading, never the driver
            log.exception("%s (%s): reading raised", self.key, self.device.device)
            result = Fault(type(e).__name__, f"reading failed: {e}")
        finally:
            if self._pending.done():
                self._pending = None
        return result

    def _count(self, fault: Fault) -> None:
        seen = self.stats.faults.get(fault.kind, 0) + 1
        self.stats.faults[fault.kind] = seen
        if seen == 1:
            log.warning("%s (%s): %s; retried, and counted from now on", self.key,
                        self.device.device, fault.reason)

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self.stats)


# --- cairn sensor scan ------------------------------------------------------------------------

def scan(root: Sysfs) -> list[Found]:
    """What the kernel offers: every hwmon, IIO and 1-Wire thermometer device, with the
    stable name of its device and what each of its channels reads now."""
    found = []
    for family, pattern in ((sysfs.HWMON, "class/hwmon/hwmon*"),
                            (sysfs.IIO, "bus/iio/devices/iio:device*")):
        for directory in sorted(root.root.glob(pattern)):
            found.append(_found(root, family, directory))
    for directory in sorted(root.root.glob("bus/w1/devices/*")):
        match = sysfs.W1_DEVICE.fullmatch(directory.name)
        if match and match.group(1) in sysfs.W1_THERMOMETERS:
            found.append(Found(W1, directory.name, "w1", sysfs.W1_THERMOMETERS[match.group(1)],
                               directory.name, _values(W1, directory)))
    return found


def _found(root: Sysfs, family: Family, directory: Path) -> Found:
    name = read_text(directory / "name")
    chip = name.strip() if isinstance(name, str) and name.strip() else "?"
    device, bus = _stable_name(root, directory)
    return Found(family, device, bus, chip, directory.name, _values(family, directory))


def _stable_name(root: Sysfs, directory: Path) -> tuple[str | None, str | None]:
    """The name and bus of the device a hwmonN or iio:deviceN belongs to, if that device
    is on a bus (a thermal zone's hwmon is not, and has no stable name)."""
    real = directory.resolve()
    device_dir = real.parent.parent if real.parent.name == "hwmon" else real.parent
    bus = (device_dir / "subsystem").resolve().name
    if (root.root / "bus" / bus / "devices" / device_dir.name).exists():
        return device_dir.name, bus
    return None, None


def _values(family: Family, directory: Path) -> dict[str, float | Fault]:
    names = names_in(directory)
    if isinstance(names, Errno):
        return {}
    values: dict[str, float | Fault] = {}
    for stem in sysfs.channel_stems(family, names):
        plan = sysfs.plan(family, {stem: stem}, names)
        result = plan if isinstance(plan, Fault) else sysfs.reading(
            plan, {f: read_text(directory / f) for f in plan.files})
        values[stem] = result if isinstance(result, Fault) else result[stem]
    return values
