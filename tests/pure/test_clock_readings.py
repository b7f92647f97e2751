"""The core reads no clock: it is handed a reading for each call (``Outbox.now``), watches
wall - boottime across them for steps of the wall clock, and stamps what it stores with the
reading it was handed. In memory (harness.core), at any time a test likes; the real clocks,
faked in a router process, are tests/system/test_clock.py's and
tests/system/test_clock_sync.py's."""

from __future__ import annotations

from dataclasses import dataclass

from autobahn.wamp import message as m

from cairn.base.clock_readings import STEP_THRESHOLD_NS, Reading, StepDetector, age_s
from cairn.gateway.core.session import ClockStep, Persist
from harness.core import CoreRouter
from tests.core.test_core_retention import CONFIG, publish

T0_NS = 1_780_000_000 * 10**9  # a wall clock in 2026
HOUR_NS = 3600 * 10**9


def reading(wall_s: float, boot_s: float, synced: bool = True, boot: str = "boot-1") -> Reading:
    return Reading(T0_NS + int(wall_s * 1e9), int(boot_s * 1e9), synced, boot)


def reasons(detector: StepDetector, *readings: Reading) -> list[str | None]:
    return [a.reason if (a := detector.observe(r)) else None for r in readings]


def test_the_first_reading_is_the_start_anchor():
    anchor = StepDetector().observe(reading(0, 5))
    assert anchor is not None
    assert (anchor.reason, anchor.boot_id, anchor.boottime_ns, anchor.wall_ns) == \
        ("start", "boot-1", 5 * 10**9, T0_NS)
    assert anchor.offset_before_ns is None


def test_a_wall_clock_moved_past_the_threshold_is_a_step_with_the_offset_it_left():
    detector = StepDetector()
    detector.observe(reading(0, 5))
    anchor = detector.observe(reading(3600 + 1, 6))  # one second later, an hour ahead
    assert anchor is not None and anchor.reason == "step"
    assert anchor.offset_before_ns == T0_NS - 5 * 10**9
    assert detector.steps == 1


def test_a_drift_within_the_threshold_is_no_step():
    drift_s = STEP_THRESHOLD_NS / 1e9 - 0.5
    assert reasons(StepDetector(), reading(0, 5), reading(10 + drift_s, 15)) == ["start", None]


def test_the_clock_becoming_synchronized_is_an_anchor_once():
    assert reasons(StepDetector(), reading(0, 5, synced=False), reading(1, 6, synced=False),
                   reading(2, 7), reading(3, 8)) == ["start", None, "synced", None]


def test_a_reading_older_than_the_newest_seen_finds_no_step():
    """A task's outbox is made before it awaits: its reading may predate a step that a
    later call already recorded, and must not record it again (backwards)."""
    detector = StepDetector()
    assert reasons(detector, reading(0, 5), reading(3600, 10), reading(4, 9),
                   reading(3601, 11)) == ["start", "step", None, None]


def test_an_age_is_by_boottime_and_unknown_for_another_boot():
    now = reading(-7200, 65)  # the wall clock stepped back two hours since: no matter
    assert age_s("boot-1", 5 * 10**9, now) == 60.0
    assert age_s("boot-0", 5 * 10**9, now) is None


@dataclass
class HandClock:
    """The clocks as a test sets them, for :class:`CoreRouter` (the shell's SystemClock)."""

    now_reading: Reading
    reads: int = 0

    def now(self) -> Reading:
        self.reads += 1
        return self.now_reading


def test_the_core_stamps_what_it_stores_with_the_reading_of_the_call_and_records_a_step():
    core = CoreRouter(CONFIG)
    core.clock = HandClock(reading(0, 100))
    publisher = core.connect()
    publish(publisher, "sensor.t", 21.5, retain=True)
    core.clock.now_reading = reading(3 * 3600, 101)  # the wall clock set three hours ahead
    publish(publisher, "sensor.t", 21.6, retain=True)
    stored = [e.pub for e in core.effects if isinstance(e, Persist)]
    assert [(p.wall_ms, p.boottime_ns, p.boot_id) for p in stored] == [
        (T0_NS // 10**6, 100 * 10**9, "boot-1"), (T0_NS // 10**6 + 3 * 3600_000, 101 * 10**9,
                                                  "boot-1")]
    steps = [e for e in core.effects if isinstance(e, ClockStep)]
    assert [s.anchor.reason for s in steps] == ["start", "step"]
    assert steps[1].after_seq == stored[0].seq  # it holds for the seqs after the first


def test_a_call_is_timed_only_when_the_core_asks_and_then_once():
    core = CoreRouter(CONFIG)
    core.clock = HandClock(reading(0, 100))
    publisher, subscriber = core.connect(), core.connect()
    subscriber.send(m.Subscribe(1, "sensor.t"))
    core.clock.reads = 0
    publish(publisher, "sensor.t", 21.5)  # an event the store does not keep: no time needed
    assert core.clock.reads == 0
    publish(publisher, "sensor.t", 21.6, retain=True)  # kept: stamped (and step-checked)
    assert core.clock.reads == 1
