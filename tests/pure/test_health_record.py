"""formats.health: what a health record may hold, whatever the clients publish. Any client
that may publish a retained ``sensor.*`` topic makes a device of it, so a record names the
most telling devices, counts the rest, and stays within its size."""

from __future__ import annotations

import json

from cairn.formats import health

OK = {"status": "ok", "reason": None, "errors": 0, "last_reading_age_s": 8.0}


def junk(count: int) -> dict[str, dict]:
    """Readings alone (no status topic), as a client publishing sensor.<random> makes them."""
    return {f"junk-{i:05d}-{'x' * 20}": {"last_reading_age_s": 1.0} for i in range(count)}


def test_a_drivers_devices_are_named_before_readings_alone():
    devices = {**junk(4800), "pump": dict(OK), "boiler": dict(OK, status="error")}
    named, unlisted = health.listed(devices)
    assert {"pump", "boiler"} <= set(named)
    assert len(named) == health.MAX_DEVICES and unlisted == 4802 - health.MAX_DEVICES


def test_a_device_not_ok_is_named_before_one_that_is():
    devices = {f"ok-{i:03d}": dict(OK) for i in range(100)}
    devices["zz-broken"] = dict(OK, status="error")
    assert "zz-broken" in health.listed(devices)[0]


def test_the_longest_silent_readings_are_named_first():
    devices = junk(100) | {"zz-silent": {"last_reading_age_s": 3 * 86400.0}}
    assert "zz-silent" in health.listed(devices)[0]


def test_a_few_devices_are_all_named_in_name_order():
    named, unlisted = health.listed({"t2": dict(OK), "t1": {"last_reading_age_s": 3.0}})
    assert (list(named), unlisted) == (["t1", "t2"], 0)


def test_a_name_longer_than_the_limit_is_counted_not_named():
    named, unlisted = health.listed({"x" * (health.MAX_NAME + 1): dict(OK), "t1": dict(OK)})
    assert (list(named), unlisted) == (["t1"], 1)


def test_named_devices_fit_their_byte_budget_with_long_reasons():
    devices = {f"d{i:02d}": dict(OK, status="error", reason="r" * 10_000) for i in range(64)}
    named, unlisted = health.listed(devices)
    assert len(json.dumps(named, separators=(",", ":"))) <= health.MAX_DEVICE_BYTES
    assert unlisted > 0
    assert all(len(d["reason"]) == health.MAX_TEXT for d in named.values())


def test_every_text_of_a_record_is_cut_to_the_limit():
    record = health.build({"config": {"running": "file", "problem": "p" * 100_000},
                           "store": {"error": "e" * 100_000}})
    assert len(record["config"]["problem"]) == len(record["store"]["error"]) == health.MAX_TEXT


def test_a_record_over_its_size_counts_its_devices_instead_of_naming_them():
    many = {f"d{i}": {"limit": i} for i in range(2_000)}  # a free-form table run large
    record = health.build({"devices": {"t1": dict(OK)}, "devices_unlisted": 3,
                           "limit_hits": many})
    assert (record["devices"], record["devices_unlisted"]) == ({}, 4)


def test_the_record_of_thousands_of_junk_topics_stays_small():
    devices, unlisted = health.listed(junk(4800) | {"pump": dict(OK)})
    record = health.build({"devices": devices, "devices_unlisted": unlisted})
    assert len(json.dumps(record)) <= health.MAX_RECORD_BYTES
    assert record["devices_unlisted"] == 4801 - len(devices) and "pump" in record["devices"]
