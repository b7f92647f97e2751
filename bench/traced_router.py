"""``cairn`` with garbage-collection pauses logged, for ``bench.pubsub --trace-gc``.

Runs :func:`app.cli.main` unchanged, with a :data:`gc.callbacks` hook that appends one
line per collection longer than 1 ms to the file named by ``BENCH_GC_LOG``:
``<time.monotonic()> <generation> <pause ms>``. CLOCK_MONOTONIC is shared by all processes
on the host, so the benchmark can match pauses to its own phases.
"""

from __future__ import annotations

import gc
import os
import sys
import time

from cairn.app.cli import main

_started = 0.0


def _record(log, phase: str, info: dict) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
        return
    pause = time.perf_counter() - _started
    if pause > 0.001:
        log.write(f"{time.monotonic():.6f} {info['generation']} {pause * 1e3:.3f}\n")
        log.flush()


if __name__ == "__main__":
    path = os.environ.get("BENCH_GC_LOG")
    if path:
        gc_log = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
        gc.callbacks.append(lambda phase, info: _record(gc_log, phase, info))
    sys.exit(main())
