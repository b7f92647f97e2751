"""The card's wear, as the gateway can see it: bytes written per day, and years of card life.

Two counters, sampled now and then (each maintenance pass) and on request:

- the router's own ``write_bytes`` (``/proc/self/io``: what it sent towards storage: the
  store's WAL, its checkpoints and everything else it writes), and
- the bytes written to the disk that holds the data directory (``/sys/dev/block/M:m``, the
  whole disk when the data directory is on a partition of it: the card wears as a whole, so
  every writer counts, the file-system journal included).

The rate is taken over the samples of the last :data:`WINDOW_S` (a day), from the disk when
it is known, else from the router's own counter; years of life = ``card_endurance_tb`` over
a year at that rate, for a fresh card (how much an old card has already taken is not known).

A rate is projected only once it means something: measured over at least
:data:`MIN_SPAN_S` (an hour), from a first sample taken :data:`SETTLE_S` after the store
opened, so that its creation (and the page cache writing it back to the card a while later)
is not taken for a day's wear. Until then the report says ``measuring``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECTOR = 512
DAY_S = 86400
WINDOW_S = DAY_S
MIN_SPAN_S = 3600.0  # a rate over less than an hour is start-up and noise, not a day's wear
SETTLE_S = 60.0  # the store's creation reaches the card within this (dirty write-back ~30 s)
WARN_YEARS = 5.0  # cairn doctor warns below this
SYS_DEV_BLOCK = Path("/sys/dev/block")


def process_write_bytes() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def disk_of(path: Path) -> Path | None:
    """The /sys directory of the disk holding ``path``: its partition's parent when it is
    on a partition, None when there is no block device (tmpfs, overlay, a container)."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    node = SYS_DEV_BLOCK / f"{os.major(dev)}:{os.minor(dev)}"
    try:
        node = node.resolve(strict=True)
    except OSError:
        return None
    if (node / "partition").exists():
        node = node.parent
    return node if (node / "stat").exists() else None


def disk_write_bytes(disk: Path | None) -> int | None:
    """Bytes written to the disk since boot (sectors written, field 7 of its stat)."""
    if disk is None:
        return None
    try:
        return int((disk / "stat").read_text().split()[6]) * SECTOR
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    process: int | None
    disk: int | None


class WearMeter:
    """Made once the store is open; its first sample is the first taken :attr:`settle_s`
    later, so that start-up's writes are not taken for a rate."""

    min_span_s = MIN_SPAN_S
    settle_s = SETTLE_S

    def __init__(self, disk: Path | None, endurance_tb: float) -> None:
        self.disk = disk  # disk_of(the data directory)
        self.endurance_bytes = endurance_tb * 1e12
        self.opened = time.monotonic()
        self.samples: deque[Sample] = deque()

    def _read(self) -> Sample:
        return Sample(time.monotonic(), process_write_bytes(), disk_write_bytes(self.disk))

    def sample(self) -> Sample:
        """Take a sample (each maintenance pass); keep a day of them."""
        now = self._read()
        if now.at - self.opened < self.settle_s:
            return now
        self.samples.append(now)
        while self.samples and now.at - self.samples[0].at > WINDOW_S:
            self.samples.popleft()
        return now

    def report(self) -> dict[str, Any]:
        """Totals (the disk's since boot, the router's since it started), and the rate and
        card life over the last day: None (``measuring``) until :attr:`min_span_s` of it."""
        now = self._read()
        oldest = self.samples[0] if self.samples else now
        span = now.at - oldest.at
        source = "disk" if now.disk is not None and oldest.disk is not None else "process"
        written = _delta(getattr(oldest, source), getattr(now, source))
        measuring = span < self.min_span_s or written is None
        per_day = None if measuring else written / span * DAY_S
        return {
            "disk": self.disk.name if self.disk else None,
            "disk_written_bytes": now.disk,
            "process_written_bytes": now.process,
            "bytes_per_day": round(per_day) if per_day is not None else None,
            "measuring": measuring,
            "measured_s": round(span),  # the window the rate is taken over
            "needs_s": round(self.min_span_s),  # before a rate is projected
            "rate_from": source,
            "endurance_tb": self.endurance_bytes / 1e12,
            "life_years": round(self.endurance_bytes / (per_day * 365), 1) if per_day else None,
        }


def _delta(before: int | None, after: int | None) -> int | None:
    return after - before if before is not None and after is not None else None
