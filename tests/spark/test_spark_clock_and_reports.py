"""The central Spark jobs' clock correction and reports (``cairn spark ingest|report``) on
a real local Spark: the ingest tests' batches (tests/spark/test_spark.py), in a module of their own
so that `make test`'s workers share the Spark tests out more evenly.
"""

from __future__ import annotations

import csv
from typing import Any

import pytest

pytest.importorskip("pyspark")

from cairn.central import spark as jobs  # noqa: E402
from tests.spark.test_spark import (  # noqa: E402
    T0_MS,
    TRUE_START,
    clock_boots,
    epoch_ns,
    event,
    events,
    land,
    utc,
)

pytestmark = pytest.mark.spark

# -- time -------------------------------------------------------------------------------------

def test_clock_correction_rebases_unsynced_times_even_when_the_anchor_comes_later(
        spark, tmp_path):
    landing, table = tmp_path / "landing", tmp_path / "table"
    rows1, rows2, anchors, truth = clock_boots("gw-c")
    # shipped while the clock was still wrong: only the start anchor exists yet
    land(landing, "gw-c", rows1[:10], 0, anchors[:1])
    first = jobs.ingest(spark, str(landing), str(table))
    assert first.rows_estimated == 0  # nothing to re-base on yet: raw time, not estimated
    assert sorted(p.name for p in table.glob("date=*")) == ["date=1970-01-01"]

    land(landing, "gw-c", rows1[10:] + rows2, 10, anchors)
    second = jobs.ingest(spark, str(landing), str(table))
    assert second.rows_estimated == 9 + 8 and second.rows_rebased == 10

    got = {r.seq: r for r in spark.read.parquet(str(table)).collect()}
    assert len(got) == 33
    for seq, row in got.items():
        assert utc(row.event_time) == truth[seq], seq
        assert row.time_estimated is (seq <= 19 or seq >= 26), seq
        assert str(row.date) == truth[seq].date().isoformat()
    assert utc(got[1].timestamp).year == 1970 and got[1].wall_ms == 5000  # the raw time is kept
    assert got[1].time_anchor == 2 and got[26].time_anchor == 4 and got[20].time_anchor is None
    assert sorted(p.name for p in table.glob("date=*")) == ["date=2026-11-20",
                                                            "date=2026-11-21"]
    assert not list((table / "_staging").glob("*"))

    third = jobs.ingest(spark, str(landing), str(table))  # nothing new, nothing re-based
    assert (third.rows_added, third.rows_rebased) == (0, 0)


def test_an_anchor_that_leaves_the_reference_as_it_was_re_bases_nothing(spark, tmp_path):
    """A boot's reference is its first synchronized anchor: a later one (the clock synced
    again) changes no row, so the table is not searched for rows to re-base."""
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    start = {"id": 1, "reason": "start", "boot_id": "boot-1", "boottime_ns": 10**9,
             "wall_ns": T0_MS * 10**6, "offset_before_ns": None, "clock_synced": True,
             "after_seq": 0}
    land(landing, "g", events(range(1, 11)), 0, anchors=[start])
    jobs.ingest(spark, str(landing), table)
    resync = {**start, "id": 2, "reason": "sync", "boottime_ns": 10 * 10**9,
              "wall_ns": T0_MS * 10**6 + 9 * 10**9, "after_seq": 10}
    land(landing, "g", events(range(11, 21)), 10, anchors=[start, resync])

    later = jobs.ingest(spark, str(landing), table)

    assert (later.ingested, later.rows_rebased) == (1, 0) and "rebase" not in later.phases
    anchors = spark.read.parquet(f"{table}/_anchors").select("id").collect()
    assert sorted(r.id for r in anchors) == [1, 2]


def test_the_first_anchors_of_a_new_boot_re_base_nothing_already_ingested(spark, tmp_path):
    """A boot's rows come with its anchors (its first, "start", precedes them): a boot the
    table has no anchor of has no rows there to re-base."""
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    for boot, lo in (("boot-1", 0), ("boot-2", 10)):
        start = {"id": lo + 1, "reason": "start", "boot_id": boot, "boottime_ns": 10**9,
                 "wall_ns": T0_MS * 10**6, "offset_before_ns": None, "clock_synced": True,
                 "after_seq": lo}
        land(landing, "g", events(range(lo + 1, lo + 11), boot=boot), lo, anchors=[start])
        run = jobs.ingest(spark, str(landing), table)
        assert (run.ingested, run.rows_added, run.rows_rebased) == (1, 10, 0)
        assert "rebase" not in run.phases


# -- reports ----------------------------------------------------------------------------------

def test_reports_gaps_hourly_and_clock(spark, tmp_path, capsys, cairn_cli):
    landing, table, out = tmp_path / "landing", tmp_path / "table", tmp_path / "reports"
    # gateway g: seqs 101..200 never landed; 250 was a retained-only publication (never
    # history); 301..310 were dropped on the gateway (its loss record says so)
    land(landing, "g", events(range(1, 101)), 0)
    land(landing, "g", events([s for s in range(201, 301) if s != 250]), 200)
    land(landing, "g", events(range(311, 351)), 300, gaps=[
        {"id": 1, "realm": "realm1", "rule": 0, "first_seq": 301, "last_seq": 310,
         "count": 10, "reason": "max_events", "wall_ms": T0_MS}])
    # gateway h: a small hand-computed example for the hourly aggregates
    h = T0_MS  # 10:00
    land(landing, "h", [
        event(1, h + 60_000, kwargs={"temperature": 20, "humidity": 40}),
        event(2, h + 1_200_000, kwargs={"temperature": 22, "humidity": 50}),
        event(3, h + 3_540_000, kwargs={"temperature": 27, "humidity": 60}),
        event(4, h + 3_600_000, kwargs={"temperature": 30, "humidity": 70}),  # 11:00
        event(5, h + 3_700_000, kwargs={"temperature": "n/a"}),  # not a number: left out
        event(6, h + 100_000, topic="sensor.b", kwargs={"temperature": 15}),
        event(7, h + 200_000, topic="sensor.c", kwargs={"state": "on"}),  # no readings
    ], 0)
    rows1, rows2, anchors, truth = clock_boots("c")
    land(landing, "c", rows1 + rows2, 0, anchors)

    assert cairn_cli(["spark", "ingest", "--landing", str(landing), "--table", str(table),
                     "--master", "local[2]"]) == 0
    assert "5 manifests: 5 batches ingested" in capsys.readouterr().out
    assert cairn_cli(["spark", "report", "--table", str(table), "--out", str(out),
                     "--master", "local[2]"]) == 0
    printed = capsys.readouterr().out
    assert "g: 239 events, seq 1..350, 100 not landed, 10 dropped on the gateway (2 gaps), " \
           "1 seqs never history" in printed

    def read(name: str) -> list[Any]:
        assert (out / f"{name}.csv").read_text().startswith(
            spark.read.parquet(str(out / name)).columns[0])
        return spark.read.parquet(str(out / name)).collect()

    gaps = [(r.gateway_id, r.first_seq, r.last_seq, r.missing, r.cause) for r in read("gaps")]
    assert gaps == [("g", 101, 200, 100, "not landed"),
                    ("g", 301, 310, 10, "dropped on the gateway: max_events")]
    with (out / "gaps.csv").open() as f:
        assert [row["cause"] for row in csv.DictReader(f)] == ["not landed",
                                                              "dropped on the gateway: "
                                                              "max_events"]

    hourly = {(r.topic, utc(r.hour).hour): r for r in read("hourly") if r.gateway_id == "h"}
    assert set(hourly) == {("sensor.a", 10), ("sensor.a", 11), ("sensor.b", 10)}
    a10 = hourly["sensor.a", 10]
    assert (a10.readings, a10.temperature_min, a10.temperature_mean, a10.temperature_max) == (
        3, 20.0, 23.0, 27.0)
    assert (a10.humidity_min, a10.humidity_mean, a10.humidity_max) == (40.0, 50.0, 60.0)
    a11 = hourly["sensor.a", 11]
    assert (a11.readings, a11.temperature_mean, a11.humidity_max) == (1, 30.0, 70.0)
    b10 = hourly["sensor.b", 10]
    assert (b10.temperature_max, b10.humidity_mean) == (15.0, None)
    # the clock gateway's readings count in the hours they really happened
    c_hours = {utc(r.hour) for r in read("hourly") if r.gateway_id == "c"}
    assert c_hours == {t.replace(minute=0, second=0, microsecond=0) for t in truth.values()}

    steps = [(r.boot_id, r.step, r.step_s, r.clock_synced) for r in read("clock_steps")]
    assert steps == [("b1", 1, epoch_ns(TRUE_START) / 1e9, True), ("b2", 1, -5 * 3600.0, False)]
    spans = {r.boot_id: r for r in read("unsynced")}
    assert (spans["b1"].first_seq, spans["b1"].last_seq, spans["b1"].events) == (1, 19, 19)
    assert utc(spans["b1"].start) == truth[1]
    assert spans["b1"].duration_s == 18 * 600 and spans["b1"].estimated is True
    assert utc(spans["b1"].raw_start).year == 1970
    assert (spans["b2"].first_seq, spans["b2"].last_seq, spans["b2"].events) == (26, 33, 8)
    gateways = {r.gateway_id: r for r in read("gateways")}
    assert gateways["c"].estimated == 27 and gateways["c"].boots == 2


def test_cli_rejects_bad_usage(capsys, cairn_cli):
    assert cairn_cli(["spark", "ingest", "--landing", "x", "--table", "y", "--streaming"]) == 2
    assert "--checkpoint" in capsys.readouterr().err
    assert cairn_cli(["spark"]) == 2
    with pytest.raises(SystemExit) as e:
        cairn_cli(["spark", "report", "--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out


def test_reports_tell_an_operator_rows_per_day_rebasing_and_the_last_batch(spark, tmp_path):
    landing, table, out = tmp_path / "landing", tmp_path / "table", tmp_path / "reports"
    rows1, rows2, anchors, _ = clock_boots("c")
    land(landing, "c", rows1 + rows2, 0, anchors)
    bad = land(landing, "c", events(range(34, 40)), 33)
    (landing / bad.name).write_bytes(bad.data[:-5])
    jobs.ingest(spark, str(landing), str(table), str(tmp_path / "q"))
    jobs.report(spark, str(table), str(out))

    g = spark.read.parquet(str(out / "gateways")).first()
    assert g.quarantined == 1 and g.last_batch_ingested is not None
    daily = {str(r.date): r.rows for r in spark.read.parquet(str(out / "daily")).collect()}
    assert daily == {"2026-11-20": 25, "2026-11-21": 8}
    shifts = {r.boot_id: r.rebased_by_s for r in spark.read.parquet(str(out / "unsynced"))
              .collect()}
    assert shifts == {"b1": epoch_ns(TRUE_START) / 1e9, "b2": -2.5 * 3600}
    page = (out / "report.html").read_text()
    assert 'aria-label="rows per gateway per day"' in page and 'aria-label="clock spans"' in page
