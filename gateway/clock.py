"""The only place Cairn reads the clocks.

A Pi has no real-time clock: its wall clock may be wrong for weeks and then jump. So every
stored publication records the wall clock *and* ``CLOCK_BOOTTIME`` (which never jumps and
counts through suspend) with this boot's id. When the offset between the two moves by more
than :data:`STEP_THRESHOLD_NS`, the wall clock was stepped: :class:`StepDetector` reports it
so the store can record an anchor, from which Spark re-bases earlier timestamps.
"""

from __future__ import annotations

import ctypes
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

STEP_THRESHOLD_NS = 2_000_000_000  # 2 s: NTP slews smaller errors; bigger moves are steps
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_SYNCED_PATHS = (Path("/run/systemd/timesync/synchronized"),)  # timesyncd's flag file
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
    return kernel_synchronized() or any(p.exists() for p in _SYNCED_PATHS)


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch as ``2026-11-22T01:02:03.456Z``."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


# RFC 3339, 5.6 date-time; datetime.fromisoformat alone takes any ISO 8601 form (week and
# ordinal dates, the basic format, no offset)
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})",
                      re.ASCII)


def parse_rfc3339(text: str) -> int:
    """An RFC 3339 timestamp as milliseconds since the epoch; ValueError if it is not one."""
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        raise ValueError(f"{text!r} is not in the form 2026-11-22T01:02:03.456Z")
    value = text[:-1] + "+00:00" if text[-1] in "zZ" else text
    return int(datetime.fromisoformat(value).timestamp() * 1000)


@dataclass(frozen=True)
class Reading:
    """One reading of the clocks, taken when a publication is received."""

    wall_ns: int
    boottime_ns: int
    synced: bool

    @property
    def wall_ms(self) -> int:
        return self.wall_ns // 1_000_000


@dataclass(frozen=True)
class Anchor:
    """A moment where wall time and boottime are paired for later re-basing: at start-up,
    at every step of the wall clock, and when the clock becomes synchronized."""

    reason: str  # "start" | "step" | "synced"
    boot_id: str
    boottime_ns: int
    wall_ns: int
    offset_before_ns: int | None
    synced: bool


class StepDetector:
    """Watches wall - boottime; each :meth:`read` may also return an anchor to record."""

    def __init__(self) -> None:
        self.boot_id = boot_id()
        self._offset: int | None = None
        self._synced: bool | None = None
        self._last_sync_check = 0
        self.steps = 0  # steps seen by this process (the store keeps them all, as anchors)

    def age_s(self, boot: str, boot_ns: int) -> float | None:
        """Seconds since ``boot_ns`` (CLOCK_BOOTTIME) of boot ``boot``, which no step of the
        wall clock moves; None for another boot's time."""
        if boot != self.boot_id or not boot_ns:
            return None
        return round((boottime_ns() - boot_ns) / 1e9, 1)

    def peek(self) -> Reading:
        """The clocks now, for a display: unlike :meth:`read`, it takes no anchor, which
        must go to the store with the publication that found it."""
        return Reading(wall_ns(), boottime_ns(), clock_synchronized())

    def read(self) -> tuple[Reading, Anchor | None]:
        boot = boottime_ns()
        wall = wall_ns()
        was_synced = self._synced
        if self._synced is None or boot - self._last_sync_check > 1_000_000_000:
            self._synced = clock_synchronized()
            self._last_sync_check = boot
        reading = Reading(wall, boot, self._synced)
        offset = wall - boot
        reason = None
        if self._offset is None:
            reason = "start"
        elif abs(offset - self._offset) > STEP_THRESHOLD_NS:
            reason = "step"
            self.steps += 1
        elif self._synced and was_synced is False:
            reason = "synced"
        anchor = None
        if reason is not None:
            anchor = Anchor(reason, self.boot_id, boot, wall, self._offset, self._synced)
        self._offset = offset
        return reading, anchor
