"""An asyncio face on a pyserial port.

pyserial opens and configures the port (baud rate, parity, raw mode, an exclusive lock);
after that the port's file descriptor is watched with ``loop.add_reader``, so reading never
blocks the event loop, a timeout is an ordinary asyncio timeout, and cancelling a task that
waits on the port just works. No thread per port.

A port that goes away (USB adapter unplugged, pseudo-terminal closed) shows up as a
:class:`PortError` from :meth:`SerialPort.read` or :meth:`SerialPort.write`; the owner closes
it and opens it again later by path, so a stable name (a udev symlink such as
``/dev/serial/by-id/...``) finds the adapter again wherever it re-enumerates.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable

import serial

PARITIES = {"N": serial.PARITY_NONE, "E": serial.PARITY_EVEN, "O": serial.PARITY_ODD}


class PortError(Exception):
    """The port cannot be opened, or it went away."""


def describe_error(path: str, error: BaseException, opening: bool = False) -> str:
    """A short, stable reason (the same failure gives the same text, so a device status
    does not flap between spellings of one problem)."""
    code = getattr(error, "errno", None)
    if opening:
        if code in (errno.EAGAIN, errno.EWOULDBLOCK):  # the exclusive lock is taken
            return f"cannot open {path}: in use by another program"
        return f"cannot open {path}: {os.strerror(code) if code else error}"
    text = str(error)
    if code in (errno.EIO, errno.ENODEV, errno.ENXIO) or "returned no data" in text \
            or "Input/output error" in text:
        return f"{path} disconnected"
    return f"{path}: {text}"


class SerialPort:
    """One serial port, read through the event loop.

    Bytes that arrive are buffered until :meth:`read` takes them. ``last_activity`` is the
    monotonic time the line was last busy (the end of the last byte received or sent), which
    Modbus needs for its inter-frame gap.
    """

    def __init__(self, path: str, baudrate: int = 9600, *, parity: str = "N",
                 stopbits: int = 1, bytesize: int = 8, exclusive: bool = True) -> None:
        self.path = path
        self.baudrate = baudrate
        self.parity = parity
        self.stopbits = stopbits
        self.bytesize = bytesize
        self.exclusive = exclusive
        self.last_activity = 0.0
        self._serial: serial.Serial | None = None
        self._buffer = bytearray()
        self._error: str | None = None
        self._ready = asyncio.Event()

    @property
    def char_time(self) -> float:
        """Seconds one character takes on the wire: start bit, data, parity, stop bits."""
        bits = 1 + self.bytesize + (self.parity != "N") + self.stopbits
        return bits / self.baudrate

    @property
    def is_open(self) -> bool:
        return self._serial is not None

    async def open(self) -> None:
        """Open and configure the port (in a thread: opening a USB adapter can take a
        moment), discard whatever was queued before, and start watching it."""
        if self._serial is not None:
            return
        try:
            port = await asyncio.to_thread(
                serial.Serial, self.path, self.baudrate, bytesize=self.bytesize,
                parity=PARITIES[self.parity], stopbits=self.stopbits, timeout=0,
                write_timeout=1.0, exclusive=self.exclusive)
        except (serial.SerialException, OSError, ValueError) as e:
            raise PortError(describe_error(self.path, e, opening=True)) from e
        try:
            port.reset_input_buffer()
        except (serial.SerialException, OSError) as e:
            port.close()
            raise PortError(describe_error(self.path, e, opening=True)) from e
        self._serial = port
        self._buffer.clear()
        self._error = None
        self._ready.clear()
        asyncio.get_running_loop().add_reader(port.fileno(), self._on_readable)

    def close(self) -> None:
        port, self._serial = self._serial, None
        if port is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(port.fileno())
        with contextlib.suppress(Exception):
            port.close()

    def _on_readable(self) -> None:
        try:
            data = self._serial.read(4096)
        except (serial.SerialException, OSError) as e:
            self._fail(describe_error(self.path, e))
            return
        if data:
            self._buffer += data
            self.last_activity = time.monotonic()
            self._ready.set()

    def _fail(self, reason: str) -> None:
        """Stop watching a port that went away (its fd would stay readable forever) and
        wake whoever waits, who then gets the PortError."""
        self._error = reason
        if self._serial is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._serial.fileno())
        self._ready.set()

    async def read(self, timeout: float | None) -> bytes:
        """What has arrived, waiting up to ``timeout`` seconds for at least one byte
        (``b""`` when nothing came). Raises PortError once the port is gone."""
        if self._serial is None:
            raise PortError(f"{self.path} is not open")
        if not self._buffer and self._error is None:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if self._error is not None:
            raise PortError(self._error)
        return b""

    def discard_input(self) -> int:
        """Drop everything received so far; returns how many bytes were dropped."""
        dropped = len(self._buffer)
        self._buffer.clear()
        if self._serial is not None and self._error is None:
            try:
                dropped += self._serial.in_waiting
                self._serial.reset_input_buffer()
            except (serial.SerialException, OSError) as e:
                self._fail(describe_error(self.path, e))
        return dropped

    def write(self, data: bytes) -> None:
        """Send ``data`` (a few bytes: the kernel takes them at once). ``last_activity``
        moves to when the last of them will have left the wire."""
        if self._serial is None:
            raise PortError(f"{self.path} is not open")
        if self._error is not None:
            raise PortError(self._error)
        try:
            self._serial.write(data)
        except (serial.SerialException, OSError) as e:
            self._fail(describe_error(self.path, e))
            raise PortError(self._error) from e
        self.last_activity = time.monotonic() + len(data) * self.char_time


async def keep_open(port: SerialPort, work: Callable[[], Awaitable[None]],
                    on_down: Callable[[str], None], log: logging.Logger, *,
                    max_backoff: float = 2.0, opened_note: str = "") -> None:
    """Open ``port``, run ``work`` while it stays usable, and reopen it with backoff after it
    fails (an unplugged adapter), forever, until cancelled. ``on_down`` hears each failure."""
    backoff = 0.1
    try:
        while True:
            try:
                await port.open()
            except PortError as e:
                on_down(str(e))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max_backoff)
                continue
            log.info("%s open at %d baud%s", port.path, port.baudrate, opened_note)
            backoff = 0.1
            try:
                await work()
            except PortError as e:
                on_down(str(e))
            finally:
                port.close()
    finally:
        port.close()
