"""Loaded by a router process under test: shifts only the wall clock by the number of
seconds in $CAIRN_FAKE_CLOCK_FILE, re-read on every call, so a test can step it while the
router runs. Monotonic clocks (and so asyncio) are left alone, as on a real machine.

$CAIRN_FAKE_BOOTTIME_FILE, when set, shifts CLOCK_BOOTTIME the same way (only it: asyncio's
CLOCK_MONOTONIC stays), so that readings can be made "hours ago" by both clocks, without a
step. $CAIRN_FAKE_CLOCK_SYNCED ("1" or "0") stands in for the kernel's synchronized state,
and no flag file counts."""

import os
import time

_path = os.environ.get("CAIRN_FAKE_CLOCK_FILE")
_boot_path = os.environ.get("CAIRN_FAKE_BOOTTIME_FILE")
_synced = os.environ.get("CAIRN_FAKE_CLOCK_SYNCED")


def _read(path: str | None) -> float:
    if not path:
        return 0.0
    try:
        with open(path) as f:
            return float(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0.0


def _shift(clock: int) -> float:
    if clock == time.CLOCK_REALTIME:
        return _read(_path)
    return _read(_boot_path) if clock == time.CLOCK_BOOTTIME else 0.0


if _path or _boot_path:
    _real_time, _real_time_ns, _real_clock_gettime = time.time, time.time_ns, time.clock_gettime
    _real_clock_gettime_ns = time.clock_gettime_ns

    def _time() -> float:
        return _real_time() + _read(_path)

    def _time_ns() -> int:
        return _real_time_ns() + int(_read(_path) * 1e9)

    def _clock_gettime(clock: int) -> float:
        return _real_clock_gettime(clock) + _shift(clock)

    def _clock_gettime_ns(clock: int) -> int:
        return _real_clock_gettime_ns(clock) + int(_shift(clock) * 1e9)

    time.time, time.time_ns = _time, _time_ns
    time.clock_gettime, time.clock_gettime_ns = _clock_gettime, _clock_gettime_ns

if _synced is not None:
    from cairn.base import clock as _clock

    _clock.kernel_synchronized = lambda: _synced == "1"
    _clock.SYNCED_PATHS = ()
