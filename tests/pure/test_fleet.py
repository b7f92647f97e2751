"""The fleet report's rules (sync/fleet.py): a gateway's row from its newest health record,
its flags with their reasons, and the urgency order. Plain values in, no Spark: milliseconds.
The Spark side (tests/spark/test_spark_fleet.py) builds the same rows from landed batches."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from cairn.central import fleet

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
HOUR = 3600.0


def record(**changes: Any) -> dict[str, Any]:
    """A healthy gateway's record (README, Health records); ``changes`` by dotted path."""
    r = {"schema": 1, "version": "0.9.0", "boot_id": "b1", "uptime_s": 5 * 86400,
         "system_uptime_s": 5 * 86400, "slot": "A", "update_on_trial": None,
         "last_update": {"result": "ok", "reason": "slot A proved healthy and is kept",
                         "version": "0.9.0", "at": "2026-11-20T10:00:00Z", "slot": "A",
                         "from_slot": "B"},
         "clock": {"synchronized": True, "steps": 1, "last_step": None},
         "store": {"available": True, "error": None, "bytes": 10**8, "events": 10**6,
                   "dropped_events": 0, "damaged_rows_skipped": 0},
         "backlog": {"events": 12, "oldest_age_s": 40},
         "sync": {"state": "ok", "last_success": "2026-11-25T11:59:00Z", "last_error": None,
                  "bytes_sent": 10**7, "budget_bytes": 0, "budget_used": 0,
                  "health_only": False, "damaged_rows_shipped": 0},
         "card": {"bytes_per_day": 2 * 10**9, "life_years": 13.7, "measuring": False,
                  "window_s": 86400, "endurance_tb": 10.0},
         "devices": {"t1": {"status": "ok", "reason": None, "errors": 0,
                            "last_reading_age_s": 8.0}},
         "limit_hits": {}}
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = r
        for key in parents:
            target = target[key]
        target[last] = value
    return r


def facts(name: str = "gw", health: dict[str, Any] | str | None = None, *,
          seen_ago: float = 60, health_ago: float | None = None, **kwargs: Any) -> fleet.Facts:
    seen = NOW.timestamp() - seen_ago
    health = record() if health is None else health
    text = health if isinstance(health, str) else json.dumps(health)
    return fleet.Facts(name, seen, seen - 300 if health_ago is None else
                       NOW.timestamp() - health_ago, text, **kwargs)


def row_of(f: fleet.Facts) -> dict[str, Any]:
    return fleet.row(f, NOW.timestamp())


def flags(f: fleet.Facts) -> dict[str, str]:
    r = row_of(f)
    names = fleet.flag_names(r)
    reasons = r["reasons"].split("; ") if r["reasons"] else []
    assert len(names) == len(reasons)
    return dict(zip(names, reasons, strict=True))


def test_a_healthy_gateway_has_no_flags():
    r = row_of(facts())
    assert (r["flags"], r["reasons"], r["health_problem"]) == (None, None, None)
    assert (r["version"], r["slot"], r["card_life_years"], r["clock_synchronized"],
            r["backlog_events"], r["devices"], r["silent_devices"]) == (
        "0.9.0", "A", 13.7, True, 12, 1, 0)


def test_every_column_is_in_the_row_with_its_type():
    r = row_of(facts(health=record(backlog__events=12.0)))
    names = [c.split()[0] for c in fleet.COLUMNS.split(",")]
    assert sorted(r) == sorted(names)
    assert isinstance(r["backlog_events"], int) and isinstance(r["uptime_s"], float)


def test_card_life_under_a_year_is_flagged_with_its_rate():
    found = flags(facts(health=record(card__life_years=0.4, card__bytes_per_day=68 * 10**9)))
    assert found == {"card_worn": "card life 0.4 years at 68.0 GB a day"}


def test_a_card_still_measuring_is_not_flagged():
    assert flags(facts(health=record(card__life_years=None, card__measuring=True))) == {}


@pytest.mark.parametrize("device, why", [
    ({"status": "error", "reason": "no response", "errors": 3, "last_reading_age_s": 90000},
     "t1 error (no response)"),
    ({"status": "stale", "reason": "no reading for 600 s", "last_reading_age_s": 900},
     "t1 stale (no reading for 600 s)"),
    ({"status": "ok", "last_reading_age_s": 1.5 * 86400}, "t1 no reading for 36.0 h"),
    ({"last_reading_age_s": 3 * 86400}, "t1 no reading for 3.0 days"),
])
def test_a_device_not_ok_or_without_a_reading_for_a_day_is_silent(device, why):
    r = row_of(facts(health=record(devices={"t1": device, "t2": {"status": "ok"}})))
    assert (r["flags"], r["reasons"]) == ("silent_devices", f"silent: {why}")
    assert (r["devices"], r["silent_devices"], r["silent_names"]) == (2, 1, why)


def test_devices_a_record_only_counts_are_in_the_gateways_devices():
    r = row_of(facts(health=record(devices_unlisted=4800)))
    assert (r["devices"], r["silent_devices"], r["flags"]) == (4801, 0, None)


def test_a_device_that_read_an_hour_ago_is_not_silent():
    assert flags(facts(health=record(devices__t1__last_reading_age_s=HOUR))) == {}


def test_a_clock_that_never_synchronized_is_flagged():
    found = flags(facts(health=record(clock__synchronized=False), ever_synced=False))
    assert found == {"clock_unsynced": "clock never synchronized in 5.0 days since start: "
                                       "times are the gateway's guess"}


def test_a_clock_that_lost_its_synchronization_is_flagged():
    found = flags(facts(health=record(clock__synchronized=False, uptime_s=3 * HOUR)))
    assert found == {"clock_unsynced": "clock not synchronized in 3.0 h since start"}


def test_a_clock_not_yet_synchronized_just_after_start_is_not_flagged():
    assert flags(facts(health=record(clock__synchronized=False, uptime_s=300))) == {}


@pytest.mark.parametrize("result", ["failed", "interrupted"])
def test_an_update_that_did_not_end_ok_is_flagged_with_its_reason(result):
    last = {"result": result, "reason": "not healthy within 300 s: router", "version": "1.0.0"}
    r = row_of(facts(health=record(last_update=last)))
    assert r["reasons"] == f"update to 1.0.0 {result}: not healthy within 300 s: router"
    assert (r["flags"], r["last_update_result"], r["last_update_version"]) == (
        "update_failed", result, "1.0.0")


def test_a_gateway_never_updated_is_not_flagged():
    assert flags(facts(health=record(last_update=None))) == {}


def test_damaged_rows_count_the_larger_of_the_store_and_the_uploader():
    r = row_of(facts(health=record(store__damaged_rows_skipped=3,
                                   sync__damaged_rows_shipped=5)))
    assert (r["flags"], r["damaged_rows"], r["reasons"]) == (
        "damaged_rows", 5, "5 damaged rows skipped (check the card)")


def test_a_store_that_is_unavailable_is_flagged_with_its_error():
    found = flags(facts(health=record(store__available=False, store__error="disk I/O error")))
    assert found == {"store_unavailable": "store unavailable: disk I/O error"}


def test_nothing_for_over_a_day_is_offline():
    found = flags(facts(seen_ago=2 * 86400))
    assert found == {"offline": "nothing for 2.0 days (newest event 2026-11-23 12:00)"}
    assert flags(facts(seen_ago=20 * HOUR)) == {}


def test_a_gateway_without_a_health_record_is_flagged():
    f = fleet.Facts("old", NOW.timestamp() - 60, None, None)
    r = row_of(f)
    assert r["flags"] == "no_health" and "no health record" in r["reasons"]
    assert r["health_problem"] is None and r["version"] is None


def test_events_long_after_the_last_health_record_are_flagged():
    assert flags(facts(health_ago=60 + 3 * HOUR)) == {
        "no_health": "no health record for 3.0 h before the newest event"}
    assert flags(facts(health_ago=60 + 20 * 60)) == {}  # within two intervals


def test_a_record_forty_minutes_old_of_an_hourly_gateway_is_not_late():
    """Two of the gateway's own intervals, not of the default 15 min (which would flag it)."""
    assert flags(facts(health=record(interval_s=3600.0), health_ago=60 + 40 * 60)) == {}
    assert "no_health" in flags(facts(health=record(interval_s=900.0),
                                      health_ago=60 + 40 * 60))


def test_a_backlog_older_than_a_day_is_flagged():
    found = flags(facts(health=record(backlog={"events": 250_000,
                                               "oldest_age_s": 3 * 86400})))
    assert found == {"backlog": "backlog of 250,000 events, the oldest 3.0 days old"}


def test_lost_events_are_flagged_from_the_gap_report():
    r = row_of(facts(gaps=2, not_landed=100, dropped_on_gateway=10))
    assert (r["flags"], r["gaps"], r["lost_events"]) == ("data_lost", 2, 110)
    assert r["reasons"] == "110 events lost in 2 gaps (100 never landed, 10 dropped on the " \
                           "gateway)"


def test_a_spent_data_budget_is_flagged_with_what_was_used():
    found = flags(facts(health=record(sync__budget_bytes=5_000_000,
                                      sync__budget_used=5_000_000, sync__health_only=True)))
    assert found == {"budget_spent": "data budget spent (5,000,000 of 5,000,000 bytes): "
                                     "health records only"}


def test_fields_a_newer_gateway_adds_are_ignored():
    newer = record(schema=2, radio={"rssi": -71}, card__spare={"x": 1})
    r = row_of(facts(health=newer))
    assert (r["flags"], r["health_problem"], r["card_life_years"]) == (None, None, 13.7)


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
])
def test_a_record_that_is_not_a_json_object_makes_the_row_say_so(text, problem):
    r = row_of(facts(health=text))
    assert r["health_problem"] == problem
    assert (r["flags"], r["reasons"]) == ("health_malformed",
                                          f"health record malformed: {problem}")


def test_a_record_without_fields_makes_the_row_say_so():
    r = row_of(fleet.Facts("gw", NOW.timestamp() - 60, NOW.timestamp() - 60, None))
    assert (r["flags"], r["health_problem"]) == ("health_malformed", "no fields")


def test_fields_of_the_wrong_type_are_named_and_the_rest_is_used():
    bad = record(card="worn", clock__synchronized="yes", devices={"t1": "ok"},
                 backlog__events=float("inf"), uptime_s=True)
    r = row_of(facts(health=bad))
    assert r["health_problem"] == ('uptime_s is true; card is "worn"; clock.synchronized is '
                                   '"yes"; backlog.events is Infinity; devices.t1 is "ok"')
    assert r["flags"] == "health_malformed"
    assert (r["version"], r["card_life_years"], r["clock_synchronized"]) == ("0.9.0", None,
                                                                             None)


def test_gateways_are_ordered_by_their_most_urgent_flag_then_the_next_then_name():
    worn = record(card__life_years=0.5)
    rows = fleet.fleet([
        facts("healthy-b"), facts("healthy-a"),
        facts("lost", gaps=1, not_landed=5),
        facts("worn-and-lost", worn, gaps=1, not_landed=5),
        facts("worn", worn),
        facts("offline", seen_ago=3 * 86400),
    ], NOW)
    assert [(r["urgency"], r["gateway_id"]) for r in rows] == [
        (1, "offline"), (2, "worn-and-lost"), (3, "worn"), (4, "lost"), (5, "healthy-a"),
        (6, "healthy-b")]


@pytest.fixture
def local_zone_utc_minus_5(monkeypatch):
    """The process's local time zone five hours behind UTC (a naive time read as local
    would be five hours off)."""
    monkeypatch.setenv("TZ", "Etc/GMT+5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_naive_now_is_utc_as_spark_hands_it(local_zone_utc_minus_5):
    naive = fleet.fleet([facts()], NOW.replace(tzinfo=None))
    assert naive == fleet.fleet([facts()], NOW)

