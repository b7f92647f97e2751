"""Readings of the clocks, and what the protocol core makes of them; no clock is read here.

A Pi has no real-time clock: its wall clock may be wrong for weeks and then jump. So every
stored publication records the wall clock *and* ``CLOCK_BOOTTIME`` (which never jumps and
counts through suspend) with this boot's id. When the offset between the two moves by more
than :data:`STEP_THRESHOLD_NS`, the wall clock was stepped: :class:`StepDetector` reports it
so the store can record an anchor, from which Spark re-bases earlier timestamps.

The shell reads the clocks (:mod:`base.clock`) and hands the core one :class:`Reading`
per call (``Outbox.now``, read when the core first asks), as aioquic is handed ``now``: the
core's behaviour over time is then a function of its inputs, and a test can give it any
time it likes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

STEP_THRESHOLD_NS = 2_000_000_000  # 2 s: NTP slews smaller errors; bigger moves are steps


class Reading(NamedTuple):  # a tuple: one is made for every call into the core
    """One reading of the clocks: the wall clock, CLOCK_BOOTTIME of boot ``boot_id``, and
    whether the wall clock was synchronized."""

    wall_ns: int
    boottime_ns: int
    synced: bool
    boot_id: str

    @property
    def wall_ms(self) -> int:
        return self.wall_ns // 1_000_000

    @property
    def monotonic_s(self) -> float:
        """CLOCK_BOOTTIME in seconds: for intervals, which no step of the wall clock moves."""
        return self.boottime_ns / 1e9


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
    """Watches wall - boottime over the readings it is shown (those of the publications the
    store keeps); :meth:`observe` returns the anchor a reading makes, if any."""

    def __init__(self) -> None:
        self._offset: int | None = None
        self._synced: bool | None = None
        self._latest_ns = 0  # boottime of the newest reading seen
        self.steps = 0  # steps seen by this process (the store keeps them all, as anchors)

    def observe(self, reading: Reading) -> Anchor | None:
        if reading.boottime_ns < self._latest_ns:
            return None  # taken before the newest one seen (a task's, from before it awaited)
        self._latest_ns = reading.boottime_ns
        was_synced, self._synced = self._synced, reading.synced
        offset = reading.wall_ns - reading.boottime_ns
        reason = None
        if self._offset is None:
            reason = "start"
        elif abs(offset - self._offset) > STEP_THRESHOLD_NS:
            reason = "step"
            self.steps += 1
        elif reading.synced and was_synced is False:
            reason = "synced"
        anchor = None
        if reason is not None:
            anchor = Anchor(reason, reading.boot_id, reading.boottime_ns, reading.wall_ns,
                            self._offset, reading.synced)
        self._offset = offset
        return anchor


def age_s(boot: str, boot_ns: int, now: Reading) -> float | None:
    """Seconds from ``boot_ns`` (CLOCK_BOOTTIME of boot ``boot``) to ``now``, which no step
    of the wall clock moves; None for another boot's time."""
    if boot != now.boot_id or not boot_ns:
        return None
    return round((now.boottime_ns - boot_ns) / 1e9, 1)


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
