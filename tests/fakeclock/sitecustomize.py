"""Loaded by a router process under test: shifts only the wall clock by the number of
seconds in $CAIRN_FAKE_CLOCK_FILE, re-read on every call, so a test can step it while the
router runs. Monotonic clocks (and so asyncio) are left alone, as on a real machine."""

import os
import time

_path = os.environ.get("CAIRN_FAKE_CLOCK_FILE")
if _path:
    _real_time, _real_time_ns, _real_clock_gettime = time.time, time.time_ns, time.clock_gettime
    _real_clock_gettime_ns = time.clock_gettime_ns

    def _offset() -> float:
        try:
            with open(_path) as f:
                return float(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def _time() -> float:
        return _real_time() + _offset()

    def _time_ns() -> int:
        return _real_time_ns() + int(_offset() * 1e9)

    def _clock_gettime(clock: int) -> float:
        value = _real_clock_gettime(clock)
        return value + _offset() if clock == time.CLOCK_REALTIME else value

    def _clock_gettime_ns(clock: int) -> int:
        value = _real_clock_gettime_ns(clock)
        return value + int(_offset() * 1e9) if clock == time.CLOCK_REALTIME else value

    time.time, time.time_ns = _time, _time_ns
    time.clock_gettime, time.clock_gettime_ns = _clock_gettime, _clock_gettime_ns
