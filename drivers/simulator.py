"""Simulated serial sensors on pseudo-terminals, for tests, benchmarks and ``cairn demo``.

Each simulated port is a pty whose slave end gets a stable name in a directory, as udev
would give it (``<dir>/modbus0 -> /dev/pts/7``), so a driver opens ``<dir>/modbus0`` with
pyserial like any serial port. Behind it:

- :class:`SimModbusBus`: N Modbus RTU devices on one line (addresses 1..N), XY-MD02 style:
  temperature and humidity in input registers 1 and 2 (signed, x10), the device address and
  baud code in holding registers 0x101 and 0x102. The register layout is configurable per
  device (clones differ). Answers take as long as they would on a real line at the bus's
  baud rate (request + response bits and the 3.5-character gap), and a device only answers
  when the driver set the port to the bus's baud rate (a pty reports the slave's termios on
  the master side).
- :class:`SimLineSensor`: a sensor printing ``$THS,<id>,<seq>,<t>,<rh>*<xor>`` lines.

Values drift slowly and plausibly (a mean-reverting random walk); tests can pin them with
``hold()`` or script them with ``source``.

Faults, from Python (``port.inject(fault, times=..)``, ``port.unplug()``,
``port.replug()``) or at a steady random rate (``fault_rate``; ``cairn sensor sim
--fault-rate 0.05``):

- Modbus: ``bad_crc``, ``no_answer``, ``garbage`` (random bytes instead of the answer),
  ``noise`` (random bytes, then the answer), ``exception`` (an exception response, ``code``
  default 4, SERVER DEVICE FAILURE);
- line: ``bad_checksum``, ``garbage`` (a line of random bytes), ``partial`` (a sentence cut
  off by the next one), ``overlong`` (a line that goes on and on), ``split`` (one sentence
  written in two pieces, not a fault but a test of reassembly), ``silence`` (skip a
  sentence);
- both: unplug (the pty is closed and its name removed: the driver's port fails) and
  replug (a new pty, possibly another /dev/pts number, behind the same name).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import random
import struct
import termios
import time
import tty
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

from cairn.drivers.line import ths_sentence
from cairn.drivers.modbus import (
    FUNCTIONS,
    MAX_REGISTERS,
    READ_HOLDING_REGISTERS,
    READ_INPUT_REGISTERS,
    Register,
    crc_ok,
    frame_gap,
    with_crc,
)

MODBUS_FAULTS = ("bad_crc", "no_answer", "garbage", "noise", "exception")
LINE_FAULTS = ("bad_checksum", "garbage", "partial", "overlong", "split", "silence")
RANDOM_MODBUS_FAULTS = ("bad_crc", "no_answer", "garbage", "noise")
RANDOM_LINE_FAULTS = ("bad_checksum", "garbage", "partial")
BITS_PER_CHAR = 11  # Modbus RTU: start, 8 data, parity or second stop, stop

_BAUD_CONSTANTS = {getattr(termios, name): int(name[1:]) for name in dir(termios)
                   if name.startswith("B") and name[1:].isdigit()}
XY_MD02_BAUD_CODES = {9600: 0, 14400: 1, 19200: 2}

# (function, register) for every value the device answers
XY_MD02_LAYOUT: tuple[tuple[int, Register], ...] = (
    (READ_INPUT_REGISTERS, Register("temperature", 1)),
    (READ_INPUT_REGISTERS, Register("humidity", 2)),
    (READ_HOLDING_REGISTERS, Register("address", 0x101, signed=False, scale=1)),
    (READ_HOLDING_REGISTERS, Register("baud_code", 0x102, signed=False, scale=1)),
)


class Drift:
    """A value that wanders slowly around a mean (Ornstein-Uhlenbeck): over ``tau``
    seconds it forgets where it was; it stays within about ``spread`` of the mean."""

    def __init__(self, mean: float, spread: float, rng: random.Random, *, tau: float = 600.0,
                 low: float = -40.0, high: float = 100.0) -> None:
        self.mean, self.spread, self.tau = mean, spread, tau
        self.low, self.high = low, high
        self.rng = rng
        self.value = mean + rng.uniform(-spread, spread) / 2
        self._at = time.monotonic()

    def now(self) -> float:
        t = time.monotonic()
        dt, self._at = t - self._at, t
        if dt > 0:
            decay = math.exp(-dt / self.tau)
            self.value = self.mean + (self.value - self.mean) * decay + \
                self.spread * math.sqrt(1 - decay * decay) * self.rng.gauss(0, 1)
            self.value = min(max(self.value, self.low), self.high)
        return self.value


class Climate:
    """Temperature and humidity of one simulated sensor. ``hold()`` pins values;
    ``source`` (a callable returning a dict) overrides everything, for scripted tests."""

    def __init__(self, rng: random.Random) -> None:
        self.temperature = Drift(rng.uniform(18, 24), 1.5, rng, low=-40, high=80)
        self.humidity = Drift(rng.uniform(40, 60), 5.0, rng, low=0, high=100)
        self.held: dict[str, float] = {}
        self.source: Callable[[], dict[str, float]] | None = None

    def hold(self, **values: float) -> None:
        self.held.update(values)

    def release(self) -> None:
        self.held.clear()
        self.source = None

    def read(self) -> dict[str, float]:
        values = {"temperature": self.temperature.now(), "humidity": self.humidity.now()}
        values.update(self.held)
        if self.source is not None:
            values.update(self.source())
        return values


class PtyPort:
    """A pty with a stable name. The simulator keeps the slave end open itself, so the
    master never sees a hang-up while no driver has the port open."""

    def __init__(self, link: Path, rng: random.Random) -> None:
        self.link = link
        self.rng = rng
        self.master: int | None = None
        self.slave: int | None = None
        self.device: str | None = None  # /dev/pts/N
        self.dropped = 0                # bytes lost because nobody read the port
        self.faults: deque[tuple[str, int | None, dict]] = deque()
        self.fault_rate = 0.0
        self.injected: Counter[str] = Counter()
        self._replug: asyncio.TimerHandle | None = None

    @property
    def plugged(self) -> bool:
        return self.master is not None

    def plug(self) -> None:
        """Create the pty and point the name at it (atomically: a driver never sees a
        half-made link)."""
        self._replug = None
        if self.master is not None:
            return
        master, slave = os.openpty()
        tty.setraw(slave)
        flags = fcntl.fcntl(master, fcntl.F_GETFL)
        fcntl.fcntl(master, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.master, self.slave, self.device = master, slave, os.ttyname(slave)
        tmp = self.link.with_name(f".{self.link.name}.new")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(self.device, tmp)
        os.replace(tmp, self.link)
        asyncio.get_running_loop().add_reader(master, self._on_readable)

    def unplug(self, for_seconds: float | None = None) -> None:
        """Pull the adapter: the driver's open port fails and the name disappears.
        With ``for_seconds``, plug it back in after that long."""
        if self._replug is not None:
            self._replug.cancel()
            self._replug = None
        if self.master is not None:
            asyncio.get_running_loop().remove_reader(self.master)
            with contextlib.suppress(FileNotFoundError):
                self.link.unlink()
            for fd in (self.master, self.slave):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.master = self.slave = None
        if for_seconds is not None:
            self._replug = asyncio.get_running_loop().call_later(for_seconds, self.plug)

    def replug(self) -> None:
        self.unplug()
        self.plug()

    def inject(self, fault: str, times: int = 1, address: int | None = None,
               **options: object) -> None:
        """Make the next ``times`` exchanges (of ``address``, on a bus) go wrong."""
        if fault not in self.FAULTS:
            raise ValueError(f"unknown fault {fault!r} (use {', '.join(self.FAULTS)})")
        for _ in range(times):
            self.faults.append((fault, address, options))

    def next_fault(self, address: int | None = None) -> tuple[str | None, dict]:
        for i, (fault, at, options) in enumerate(self.faults):
            if at is None or at == address:
                del self.faults[i]
                self.injected[fault] += 1
                return fault, options
        if self.fault_rate and self.rng.random() < self.fault_rate:
            fault = self.rng.choice(self.RANDOM_FAULTS)
            self.injected[fault] += 1
            return fault, {}
        return None, {}

    def garbage(self, low: int = 3, high: int = 16) -> bytes:
        return bytes(self.rng.randrange(256) for _ in range(self.rng.randint(low, high)))

    def write(self, data: bytes) -> None:
        """Put bytes on the line; like a real line, they are lost when nobody listens."""
        if self.master is None:
            self.dropped += len(data)
            return
        try:
            written = os.write(self.master, data)
        except (BlockingIOError, OSError):
            written = 0
        self.dropped += len(data) - written

    def line_baudrate(self) -> int | None:
        """The baud rate the driver set on its end (the slave's termios)."""
        if self.master is None:
            return None
        try:
            return _BAUD_CONSTANTS.get(termios.tcgetattr(self.master)[4])
        except termios.error:
            return None

    def _on_readable(self) -> None:
        try:
            data = os.read(self.master, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        if data:
            self.received(data)

    def received(self, data: bytes) -> None:
        """Bytes the driver sent."""

    FAULTS: tuple[str, ...] = ()
    RANDOM_FAULTS: tuple[str, ...] = ()


class SimModbusDevice:
    """One XY-MD02-like device: a Climate behind a register layout."""

    def __init__(self, address: int, rng: random.Random,
                 layout: tuple[tuple[int, Register], ...] = XY_MD02_LAYOUT,
                 baudrate: int = 9600) -> None:
        self.address = address
        self.climate = Climate(rng)
        self.layout = layout
        self.baudrate = baudrate
        self.requests = 0

    def hold(self, **values: float) -> None:
        self.climate.hold(**values)

    @property
    def source(self) -> Callable[[], dict[str, float]] | None:
        return self.climate.source

    @source.setter
    def source(self, source: Callable[[], dict[str, float]] | None) -> None:
        self.climate.source = source

    def values(self) -> dict[str, float]:
        return {**self.climate.read(), "address": self.address,
                "baud_code": XY_MD02_BAUD_CODES.get(self.baudrate, 0)}

    def answer(self, function: int, start: int, count: int) -> bytes:
        """The response PDU (after the address) to a read, or an exception PDU."""
        if function not in FUNCTIONS:
            return bytes([function | 0x80, 0x01])
        if not 1 <= count <= MAX_REGISTERS:
            return bytes([function | 0x80, 0x03])
        registers = {r.register: r for fc, r in self.layout if fc == function}
        if any(n not in registers for n in range(start, start + count)):
            return bytes([function | 0x80, 0x02])
        values = self.values()
        words = [encode(registers[n], values.get(registers[n].name, 0.0))
                 for n in range(start, start + count)]
        return struct.pack(f">BB{count}H", function, 2 * count, *words)


def encode(register: Register, value: float) -> int:
    raw = round((value - register.offset) / register.scale)
    if register.signed:
        raw = max(-0x8000, min(0x7FFF, raw))
        return raw & 0xFFFF
    return max(0, min(0xFFFF, raw))


class SimModbusBus(PtyPort):
    """Modbus RTU devices sharing one simulated RS-485 line."""

    FAULTS = MODBUS_FAULTS
    RANDOM_FAULTS = RANDOM_MODBUS_FAULTS

    def __init__(self, link: Path, rng: random.Random, baudrate: int = 9600,
                 wire_timing: bool = True) -> None:
        super().__init__(link, rng)
        self.baudrate = baudrate
        self.wire_timing = wire_timing
        self.devices: dict[int, SimModbusDevice] = {}
        self.requests = 0
        self.answered = 0
        self.baud_mismatch = 0
        self.noise_bytes = 0
        self._rx = bytearray()

    def add_device(self, address: int, **kwargs) -> SimModbusDevice:
        device = SimModbusDevice(address, self.rng, baudrate=self.baudrate, **kwargs)
        self.devices[address] = device
        return device

    @property
    def char_time(self) -> float:
        return BITS_PER_CHAR / self.baudrate

    def received(self, data: bytes) -> None:
        self._rx += data
        # read requests (and writes of one register) are 8 bytes; slide over noise
        while len(self._rx) >= 8:
            if crc_ok(bytes(self._rx[:8])):
                request = bytes(self._rx[:8])
                del self._rx[:8]
                self._request(request)
            else:
                del self._rx[0]
                self.noise_bytes += 1

    def _request(self, request: bytes) -> None:
        address, function, start, count = struct.unpack(">BBHH", request[:6])
        self.requests += 1
        device = self.devices.get(address)
        if device is None:
            return  # nobody home at that address: silence, as on a real bus
        if self.line_baudrate() != device.baudrate:
            self.baud_mismatch += 1  # the device hears noise at the wrong speed
            return
        device.requests += 1
        fault, options = self.next_fault(address)
        if fault == "no_answer":
            return
        if fault == "exception":
            pdu = bytes([function | 0x80, int(options.get("code", 0x04))])
        else:
            pdu = device.answer(function, start, count)
        response = with_crc(bytes([address]) + pdu)
        if fault == "bad_crc":
            response = response[:-1] + bytes([response[-1] ^ 0x5A])
        elif fault == "garbage":
            response = self.garbage()
        elif fault == "noise":
            response = self.garbage() + response
        self.answered += 1
        delay = 0.0
        if self.wire_timing:  # the request and the answer cross the wire, the gap between
            delay = (len(request) + len(response)) * self.char_time + \
                frame_gap(self.baudrate, self.char_time)
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self.write, response)
        else:
            self.write(response)


class SimLineSensor(PtyPort):
    """A text sensor printing a $THS sentence every ``interval`` seconds."""

    FAULTS = LINE_FAULTS
    RANDOM_FAULTS = RANDOM_LINE_FAULTS

    def __init__(self, link: Path, rng: random.Random, sensor_id: str,
                 interval: float = 1.0) -> None:
        super().__init__(link, rng)
        self.sensor_id = sensor_id
        self.interval = interval
        self.climate = Climate(rng)
        self.seq = 0
        self.sent = 0
        self.format: Callable[[str, int, float, float], str] = ths_sentence
        self._task: asyncio.Task | None = None

    def hold(self, **values: float) -> None:
        self.climate.hold(**values)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.send_one()

    async def send_one(self) -> None:
        self.seq += 1
        values = self.climate.read()
        line = self.format(self.sensor_id, self.seq, values["temperature"],
                           values["humidity"]).encode("ascii")
        fault, _ = self.next_fault()
        if fault == "silence":
            return
        if fault == "bad_checksum":
            line = line[:-2] + (b"00" if line[-2:] != b"00" else b"FF")
        elif fault == "garbage":
            line = bytes(b for b in self.garbage(8, 40) if b not in b"\r\n")
        elif fault == "partial":
            line = line[:len(line) // 2]  # cut off: the next sentence follows on this line
            self.write(line)
            self.sent += 1
            return
        elif fault == "overlong":
            line = b"#" * 2000
        elif fault == "split":
            half = len(line) // 2
            self.write(line[:half])
            await asyncio.sleep(0.05)
            line = line[half:]
        self.write(line + b"\r\n")
        self.sent += 1


class Simulator:
    """N Modbus devices on one bus (``<dir>/modbus0``, addresses 1..N) and N line sensors
    (``<dir>/line0``, ``<dir>/line1``, ...). Use as ``async with Simulator(dir) as sim``."""

    def __init__(self, directory: str | Path, *, modbus: int = 2, line: int = 1,
                 baudrate: int = 9600, fault_rate: float = 0.0, line_interval: float = 1.0,
                 seed: int | None = None, wire_timing: bool = True) -> None:
        self.directory = Path(directory).absolute()
        self.rng = random.Random(seed)
        self.bus: SimModbusBus | None = None
        self.lines: list[SimLineSensor] = []
        if modbus:
            self.bus = SimModbusBus(self.directory / "modbus0", self.rng, baudrate,
                                    wire_timing)
            for address in range(1, modbus + 1):
                self.bus.add_device(address)
        for i in range(line):
            self.lines.append(SimLineSensor(self.directory / f"line{i}", self.rng, f"ths{i}",
                                            line_interval))
        self.fault_rate = fault_rate

    @property
    def ports(self) -> list[PtyPort]:
        return ([self.bus] if self.bus else []) + list(self.lines)

    @property
    def fault_rate(self) -> float:
        return self._fault_rate

    @fault_rate.setter
    def fault_rate(self, rate: float) -> None:
        self._fault_rate = rate
        for port in self.ports:
            port.fault_rate = rate

    async def start(self) -> Simulator:
        self.directory.mkdir(parents=True, exist_ok=True)
        for port in self.ports:
            port.plug()
        for sensor in self.lines:
            sensor.start()
        return self

    async def stop(self) -> None:
        for sensor in self.lines:
            await sensor.stop()
        for port in self.ports:
            port.unplug()

    async def __aenter__(self) -> Simulator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def describe(self) -> list[str]:
        lines = []
        if self.bus:
            lines.append(f"{self.bus.link} -> {self.bus.device}  Modbus RTU at "
                         f"{self.bus.baudrate} baud, addresses "
                         f"{', '.join(map(str, self.bus.devices))} (XY-MD02 registers)")
        for sensor in self.lines:
            lines.append(f"{sensor.link} -> {sensor.device}  $THS sentences every "
                         f"{sensor.interval:g} s from id {sensor.sensor_id}")
        return lines

    def sample_config(self, router: str = "ws://127.0.0.1:8080/ws",
                      realm: str = "realm1") -> str:
        """A ``[driver]`` + ``[[sensors]]`` config for these ports."""
        out = [f'[driver]\nrouter = "{router}"\nrealm = "{realm}"\n']
        if self.bus:
            for address in self.bus.devices:
                out.append(f'[[sensors]]\nid = "sim-modbus-{address}"\nkind = "modbus"\n'
                           f'port = "{self.bus.link}"\nbaudrate = {self.bus.baudrate}\n'
                           f'address = {address}\ninterval = 5\n')
        for sensor in self.lines:
            out.append(f'[[sensors]]\nid = "sim-{sensor.sensor_id}"\nkind = "line"\n'
                       f'port = "{sensor.link}"\nmatch_id = "{sensor.sensor_id}"\n'
                       f'interval = {sensor.interval:g}\n')
        return "\n".join(out)

    def stats(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.bus:
            out[self.bus.link.name] = {
                "requests": self.bus.requests, "answered": self.bus.answered,
                "baud_mismatch": self.bus.baud_mismatch, "faults": dict(self.bus.injected)}
        for sensor in self.lines:
            out[sensor.link.name] = {"sent": sensor.sent, "dropped_bytes": sensor.dropped,
                                     "faults": dict(sensor.injected)}
        return out
