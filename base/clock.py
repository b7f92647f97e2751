"""The only place Cairn reads the clocks: the wall clock, ``CLOCK_BOOTTIME`` and this boot's
id, and whether the kernel (or systemd-timesyncd) says the wall clock is synchronized. The
shell takes a :class:`~base.clock_readings.Reading` of them for each call into the
protocol core (:class:`SystemClock`); what the core makes of readings (steps, anchors, ages)
is :mod:`base.clock_readings`.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

from cairn.base.clock_readings import Reading

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
SYNCED_PATHS = (Path("/run/systemd/timesync/synchronized"),)  # timesyncd's flag file
STA_UNSYNC = 0x0040  # adjtimex(2) status bit: the clock is not synchronized
TIME_ERROR = 5       # adjtimex(2) return value: the clock is not synchronized


class Timex(ctypes.Structure):
    """``struct timex`` of adjtimex(2) as glibc declares it on Linux: ``long`` fields and a
    ``struct timeval``, so ctypes' native sizes and alignment give the kernel's layout on
    x86_64 and aarch64 (LP64: 208 bytes, status at offset 40) and on 32-bit ARM alike."""

    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long),
                ("status", ctypes.c_int), ("constant", ctypes.c_long),
                ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long),
                ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long),
                ("shift", ctypes.c_int), ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long),
                ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
                ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_reserved", ctypes.c_int * 11)]


# libc's adjtimex (Linux); None elsewhere, where only the flag file counts
_adjtimex = getattr(ctypes.CDLL(None, use_errno=True), "adjtimex", None)
if _adjtimex is not None:
    _adjtimex.argtypes = [ctypes.POINTER(Timex)]
    _adjtimex.restype = ctypes.c_int


def wall_ns() -> int:
    return time.time_ns()


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def boot_id() -> str:
    try:
        return _BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def adjtimex() -> tuple[int, Timex] | None:
    """The kernel's clock state: adjtimex(2) with modes 0 (reads only, needs no privilege)
    returns the clock state and fills the struct; None where it cannot be read."""
    if _adjtimex is None:
        return None
    timex = Timex()
    state = _adjtimex(ctypes.byref(timex))
    return None if state < 0 else (state, timex)


def kernel_synchronized() -> bool:
    """True when the kernel's clock is synchronized: any NTP daemon that disciplines it
    (chrony, ntpd, systemd-timesyncd, ...) clears STA_UNSYNC."""
    read = adjtimex()
    if read is None:
        return False
    state, timex = read
    return state != TIME_ERROR and not timex.status & STA_UNSYNC


def clock_synchronized() -> bool:
    """True when the kernel says the clock is synchronized, or systemd-timesyncd's flag
    file does (timesyncd sets both; the file also covers a kernel that cannot be read)."""
    return kernel_synchronized() or any(p.exists() for p in SYNCED_PATHS)


class SystemClock:
    """This machine's clocks, read for each call into the core. Whether the clock is
    synchronized is asked at most once a second (a system call and a file's existence)."""

    def __init__(self) -> None:
        self.boot_id = boot_id()
        self._synced = False
        self._sync_checked_ns: int | None = None

    def now(self) -> Reading:
        boot = boottime_ns()
        wall = wall_ns()
        if self._sync_checked_ns is None or boot - self._sync_checked_ns > 1_000_000_000:
            self._synced = clock_synchronized()
            self._sync_checked_ns = boot
        return Reading(wall, boot, self._synced, self.boot_id)
