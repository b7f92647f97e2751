"""Modbus RTU master for temperature/humidity sensors of the XY-MD02 class.

Three layers, each usable on its own:

- the wire format, free of I/O: :func:`crc16` (CRC-16/MODBUS), :func:`read_request`
  (functions 0x03 read holding registers and 0x04 read input registers),
  :func:`find_response` (the answer to a request among whatever bytes arrived, skipping
  line noise) and :func:`parse_response`;
- :class:`ModbusMaster`: one request/response exchange at a time on a
  :class:`~drivers.serial_port.SerialPort`, keeping the 3.5-character silence between
  frames, with a response timeout, retries and per-address counters;
- :class:`ModbusBus`: several devices (addresses) on one RS-485 line polled in turn by one
  task, each on its own interval, decoded through its register map; the port is reopened
  when it fails (an unplugged USB adapter) and every device on it is told why.

Frames are recognised by length, not by timing the silence between bytes: a response to a
read is ``address, function, byte count, data..., CRC`` and an exception response is
``address, function | 0x80, code, CRC``. Timing gaps of 1.5 characters from user space is
not reliable (a USB adapter delivers bytes in 1-16 ms bursts), length is.

Register numbers are the addresses on the wire (0-based PDU addresses, as XY-MD02 data
sheets give them: temperature at input register 1), not the "30002"-style numbering.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from cairn.drivers.serial_port import SerialPort, keep_open

log = logging.getLogger("cairn.modbus")

READ_HOLDING_REGISTERS = 0x03
READ_INPUT_REGISTERS = 0x04
FUNCTIONS = {READ_HOLDING_REGISTERS: "read holding registers",
             READ_INPUT_REGISTERS: "read input registers"}
MAX_REGISTERS = 125  # per read request (the response must fit 256 bytes)

EXCEPTION_CODES = {
    0x01: "ILLEGAL FUNCTION",
    0x02: "ILLEGAL DATA ADDRESS",
    0x03: "ILLEGAL DATA VALUE",
    0x04: "SERVER DEVICE FAILURE",
    0x05: "ACKNOWLEDGE",
    0x06: "SERVER DEVICE BUSY",
    0x08: "MEMORY PARITY ERROR",
    0x0A: "GATEWAY PATH UNAVAILABLE",
    0x0B: "GATEWAY TARGET DEVICE FAILED TO RESPOND",
}


# --- wire format -------------------------------------------------------------------------

def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc_table()


def crc16(data: bytes) -> int:
    """CRC-16/MODBUS (poly 0x8005 reflected, init 0xFFFF). Sent low byte first."""
    crc = 0xFFFF
    for byte in data:
        crc = (crc >> 8) ^ _CRC_TABLE[(crc ^ byte) & 0xFF]
    return crc


def with_crc(body: bytes) -> bytes:
    return body + crc16(body).to_bytes(2, "little")


def crc_ok(frame: bytes) -> bool:
    """A frame with its CRC appended has a CRC of zero."""
    return len(frame) >= 4 and crc16(frame) == 0


def read_request(address: int, function: int, start: int, count: int) -> bytes:
    """The 8-byte request for ``count`` registers from ``start`` on device ``address``."""
    if not 1 <= address <= 247:
        raise ValueError(f"address must be 1..247, not {address}")
    if function not in FUNCTIONS:
        raise ValueError(f"function must be 3 or 4, not {function}")
    if not 1 <= count <= MAX_REGISTERS:
        raise ValueError(f"count must be 1..{MAX_REGISTERS}, not {count}")
    if start < 0 or start + count > 0x10000:
        raise ValueError(f"registers {start}..{start + count - 1} are outside 0..65535")
    return with_crc(struct.pack(">BBHH", address, function, start, count))


def frame_gap(baudrate: int, char_time: float) -> float:
    """The silence that separates frames: 3.5 characters, or the fixed 1.75 ms the Modbus
    serial-line spec sets above 19200 baud."""
    return 3.5 * char_time if baudrate <= 19200 else 0.00175


@dataclass(frozen=True)
class Scan:
    """What :func:`find_response` made of the bytes so far."""

    frame: bytes | None = None   # the response (normal or exception), CRC checked
    skipped: int = 0             # bytes before it: line noise
    bad_crc: bool = False        # a complete frame-shaped candidate failed its CRC
    waiting: bool = False        # a candidate needs more bytes


def find_response(buf: bytes, address: int, function: int, count: int) -> Scan:
    """Find the response to a read of ``count`` registers: the first place in ``buf``
    where a frame with the right address, function (or exception function) and byte count
    passes its CRC. Noise before it is skipped."""
    bad_crc = waiting = False
    n = len(buf)
    for i in range(n):
        if buf[i] != address:
            continue
        if i + 2 > n:
            waiting = True
            break
        fc = buf[i + 1]
        if fc == function | 0x80:
            length = 5
        elif fc == function:
            if i + 3 > n:
                waiting = True
                break
            if buf[i + 2] != 2 * count:
                continue
            length = 5 + 2 * count
        else:
            continue
        if i + length > n:
            waiting = True
            continue
        candidate = bytes(buf[i:i + length])
        if crc_ok(candidate):
            return Scan(candidate, i)
        bad_crc = True
    return Scan(bad_crc=bad_crc, waiting=waiting)


def parse_response(frame: bytes, function: int, count: int) -> list[int]:
    """The register values of a CRC-checked response; an exception response raises
    :class:`ExceptionResponse`."""
    if frame[1] == function | 0x80:
        raise ExceptionResponse(frame[0], function, frame[2])
    return list(struct.unpack(f">{count}H", frame[3:3 + 2 * count]))


# --- errors --------------------------------------------------------------------------------

class ModbusError(Exception):
    """A failed exchange. ``kind`` names it in the counters."""

    kind = "error"


class NoAnswer(ModbusError):
    kind = "no_answer"


class CRCError(ModbusError):
    kind = "bad_crc"


class FrameError(ModbusError):
    """Bytes came back, but nothing in them is the answer (garbage, a truncated frame)."""

    kind = "bad_frame"


class ExceptionResponse(ModbusError):
    """The device answered with a Modbus exception: it is there, but refuses the request."""

    kind = "exception"

    def __init__(self, address: int, function: int, code: int) -> None:
        self.address, self.function, self.code = address, function, code
        self.name = EXCEPTION_CODES.get(code, "UNKNOWN EXCEPTION")
        super().__init__(f"address {address} answered exception {code:#04x} {self.name} "
                         f"to {FUNCTIONS.get(function, hex(function))}")


# --- register maps ---------------------------------------------------------------------------

def _places(x: float) -> int:
    exponent = Decimal(repr(float(x))).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


@dataclass(frozen=True)
class Register:
    """One value in a device's register map: ``raw * scale + offset``, rounded to the
    precision of scale and offset (so 215 * 0.1 is 21.5, not 21.500000000000004)."""

    name: str
    register: int
    signed: bool = True
    scale: float = 0.1
    offset: float = 0.0

    def decode(self, raw: int) -> float:
        if self.signed and raw >= 0x8000:
            raw -= 0x10000
        value = raw * self.scale + self.offset
        return round(value, max(_places(self.scale), _places(self.offset)))


XY_MD02 = (Register("temperature", 1), Register("humidity", 2))


def register_block(registers: Sequence[Register]) -> tuple[int, int]:
    """(start, count) of the one read that covers every register of the map."""
    numbers = [r.register for r in registers]
    return min(numbers), max(numbers) - min(numbers) + 1


def decode(registers: Sequence[Register], start: int, words: Sequence[int]) -> dict[str, float]:
    return {r.name: r.decode(words[r.register - start]) for r in registers}


# --- master ----------------------------------------------------------------------------------

@dataclass
class AddressStats:
    requests: int = 0
    ok: int = 0
    retries: int = 0
    no_answer: int = 0
    bad_crc: int = 0
    bad_frame: int = 0
    exception: int = 0
    noise_bytes: int = 0


class ModbusMaster:
    """Request/response exchanges on one port, one at a time (the caller serialises them;
    :class:`ModbusBus` does)."""

    def __init__(self, port: SerialPort, *, timeout: float = 0.5, retries: int = 2) -> None:
        self.port = port
        self.timeout = timeout
        self.retries = retries
        self.stats: dict[int, AddressStats] = defaultdict(AddressStats)

    @property
    def gap(self) -> float:
        return frame_gap(self.port.baudrate, self.port.char_time)

    async def read_registers(self, address: int, function: int, start: int, count: int, *,
                             timeout: float | None = None,
                             retries: int | None = None) -> list[int]:
        """Read ``count`` registers, trying ``1 + retries`` times when the answer is missing
        or damaged. An exception response is final (the device did answer). Raises
        :class:`ModbusError` or, when the port itself fails, PortError."""
        timeout = self.timeout if timeout is None else timeout
        tries = 1 + (self.retries if retries is None else retries)
        stats = self.stats[address]
        for attempt in range(tries):
            if attempt:
                stats.retries += 1
            stats.requests += 1
            try:
                words = await self._exchange(address, function, start, count, timeout, stats)
            except ExceptionResponse:
                stats.exception += 1
                raise
            except ModbusError as e:
                setattr(stats, e.kind, getattr(stats, e.kind) + 1)
                log.debug("%s: %s (try %d of %d)", self.port.path, e, attempt + 1, tries)
                await self._resync(stats)
                if attempt + 1 == tries:
                    if tries > 1:
                        e.args = (f"{e.args[0]} ({tries} tries)",)
                    raise
            else:
                stats.ok += 1
                return words
        raise AssertionError("unreachable")

    async def _exchange(self, address: int, function: int, start: int, count: int,
                        timeout: float, stats: AddressStats) -> list[int]:
        request = read_request(address, function, start, count)
        wait = self.port.last_activity + self.gap - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        stats.noise_bytes += self.port.discard_input()  # nobody asked for those
        self.port.write(request)
        # the clock starts when the request has left the wire
        deadline = self.port.last_activity + timeout
        buf = bytearray()
        while True:
            scan = find_response(buf, address, function, count)
            if scan.frame is not None:
                stats.noise_bytes += len(buf) - len(scan.frame)
                return parse_response(scan.frame, function, count)
            if scan.bad_crc and not scan.waiting:
                raise CRCError(f"bad CRC in the answer from address {address}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if scan.bad_crc:
                    raise CRCError(f"bad CRC in the answer from address {address}")
                if buf:
                    raise FrameError(f"no valid answer from address {address} "
                                     f"(garbled reply)")
                raise NoAnswer(f"no answer from address {address} within {timeout:g} s")
            buf += await self.port.read(remaining)

    async def _resync(self, stats: AddressStats) -> None:
        """After a failed exchange, wait until the line falls silent and forget what came,
        so the tail of a garbled or late answer is not read as the next one."""
        quiet = max(self.gap, 0.02)
        give_up = time.monotonic() + 1.0
        while time.monotonic() < give_up:
            data = await self.port.read(quiet)
            if not data:
                return
            stats.noise_bytes += len(data)


# --- a bus of devices ------------------------------------------------------------------------

@dataclass
class PollTarget:
    """One device on a bus, as the poller sees it. ``key`` is whatever the owner uses to
    tell devices apart (the driver uses the device id)."""

    key: str
    address: int
    function: int = READ_INPUT_REGISTERS
    registers: tuple[Register, ...] = XY_MD02
    interval: float = 10.0
    timeout: float = 0.5
    retries: int = 2
    next_due: float = field(default=0.0, compare=False)


class ModbusBus:
    """The devices on one serial line, polled in turn by one task.

    ``on_reading(key, values)`` gets each decoded reading; ``on_error(key, reason)`` gets a
    failed poll (after retries) or, for every device on the bus, a port that cannot be
    opened or went away. Both are plain callbacks run on the event loop.
    """

    def __init__(self, port: SerialPort, targets: Sequence[PollTarget],
                 on_reading: Callable[[str, dict[str, float]], None],
                 on_error: Callable[[str, str], None], *, max_backoff: float = 2.0) -> None:
        self.port = port
        self.targets = list(targets)
        self.on_reading = on_reading
        self.on_error = on_error
        self.max_backoff = max_backoff
        self.master = ModbusMaster(port)
        self.polls = 0
        self.port_failures = 0

    async def run(self) -> None:
        """Open, poll, and reopen after the port fails, forever (until cancelled)."""
        addresses = ", ".join(str(t.address) for t in self.targets)
        await keep_open(self.port, self._poll, self._port_down, log,
                        max_backoff=self.max_backoff, opened_note=f": polling {addresses}")

    def _port_down(self, reason: str) -> None:
        self.port_failures += 1
        for target in self.targets:
            self.on_error(target.key, reason)

    async def _poll(self) -> None:
        now = time.monotonic()
        for target in self.targets:
            target.next_due = now
        while True:
            target = min(self.targets, key=lambda t: t.next_due)
            wait = target.next_due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.poll_once(target)
            # keep the rhythm; a device that fell behind (slow bus) is not polled in a burst
            target.next_due = max(target.next_due + target.interval, time.monotonic())

    async def poll_once(self, target: PollTarget) -> None:
        start, count = register_block(target.registers)
        self.polls += 1
        try:
            words = await self.master.read_registers(
                target.address, target.function, start, count, timeout=target.timeout,
                retries=target.retries)
        except ModbusError as e:
            reason = f"{e} on {self.port.path}"
            if isinstance(e, ExceptionResponse):
                reason += f" (registers {start}..{start + count - 1})"
            self.on_error(target.key, reason)
            return
        try:
            self.on_reading(target.key, decode(target.registers, start, words))
        except Exception:  # a broken callback must not stop the bus
            log.exception("reading from address %d on %s", target.address, self.port.path)
