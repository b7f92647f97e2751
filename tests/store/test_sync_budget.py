"""``[sync] daily_bytes``: past the day's budget the uploader sends only the gateway's health
records, each as a batch of its own, and drains the backlog once a new day (24 h of
CLOCK_BOOTTIME) begins. A real SQLite store (readings and health records), the real
uploader, a directory sink; a day passes by stepping the boot-time clock sync.budget reads.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from cairn.base import clock
from cairn.base.config_tools import ConfigError
from cairn.formats import health as record_format
from cairn.formats.batch import manifest_name
from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.core.session import Sequence
from cairn.gateway.shell.health import sync_section
from cairn.gateway.shell.metrics import MessageCounters
from cairn.gateway.shell.metrics import render as render_metrics
from cairn.gateway.store import HistoryReader, Store, StoredPublication
from cairn.sync import budget as sync_budget
from cairn.sync.budget import DAY_NS
from cairn.sync.cli import parse_sync
from cairn.sync.sinks import SinkError
from harness.landing import landed
from tests.system.test_ops import cairn, doctor_lines, write_config
from tests.system.test_sync import BOOT, T0_MS, RecordingSink, status_of, uploader_for

HEALTH_EVERY = 50  # a health record after every 50 readings
LARGE = random.Random(45).randbytes(500_000)  # a 500 KB reading that does not compress


async def _fill(path: Path, readings: int, large_at: int | None
                ) -> tuple[list[int], list[int]]:
    store = await Store.open(path)
    sequence = Sequence(store.next_seq, store.publication_ids)
    seqs: tuple[list[int], list[int]] = ([], [])
    try:
        for i in range(readings):
            health = i % HEALTH_EVERY == HEALTH_EVERY - 1
            topic, kwargs = ((HEALTH_TOPIC, {"schema": 1, "uptime_s": i}) if health else
                             (f"sensor.dev{i % 4}", {"temperature": 20 + i % 10 / 10}))
            if i == large_at:
                kwargs["image"] = LARGE
            seq, publication = sequence.assign()
            seqs[health].append(seq)
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=topic, args=None,
                kwargs=kwargs, wall_ms=T0_MS + i * 1000, boot_id=BOOT,
                boottime_ns=5 * 10**9 + i * 10**9, clock_synced=True,
                history_rule=1 if health else 0))
        await store.flush()
    finally:
        await store.close()
    return seqs


def fill(data_dir: Path, events: int, large_at: int | None = None
         ) -> tuple[list[int], list[int]]:
    """(reading seqs, health record seqs) of a store holding ``events`` rows (seqs from 1,
    one a row); the row ``large_at`` carries LARGE."""
    return asyncio.run(_fill(data_dir / "cairn.db", events, large_at))


def a_day_later(monkeypatch: pytest.MonkeyPatch) -> None:
    now = clock.boottime_ns()
    monkeypatch.setattr(clock, "boottime_ns", lambda: now + DAY_NS)


def run_once(data_dir: Path, landing: Path, daily_bytes: int, batch_events: int = 100
             ) -> RecordingSink:
    sink = RecordingSink(landing)
    uploader = uploader_for(data_dir, sink, batch_events=batch_events, daily_bytes=daily_bytes)
    try:
        uploader.once()
    finally:
        uploader.reader.close()
    return sink


def batch_size(data_dir: Path, batch_events: int) -> int:
    """Bytes of the first batch the uploader would send (it sends nothing here)."""
    uploader = uploader_for(data_dir, RecordingSink(data_dir / "unused"),
                            batch_events=batch_events)
    try:
        return uploader.next_batch().size
    finally:
        uploader.reader.close()


def test_past_the_budget_only_health_records_go_and_the_backlog_drains_the_next_day(
        tmp_path, monkeypatch):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    readings, health = fill(data_dir, 300)
    budget = int(batch_size(data_dir, 100) * 2.2)

    run_once(data_dir, landing, budget)
    status = status_of(data_dir)
    assert status["health_only"] is True and status["budget_bytes"] == budget
    synced = status["synced_seq"]
    assert readings[0] < synced < readings[-1]  # some of the backlog went, not all
    manifests, rows = landed(landing)
    assert {r["seq"] for r in rows if r["topic"] == HEALTH_TOPIC} == set(health)
    ahead = [m for m in manifests if m["first_seq"] > synced]
    assert ahead and all(m["count"] == 1 and m["after_seq"] == m["first_seq"] - 1
                         for m in ahead)  # each record a batch of its own
    assert {r["seq"] for r in rows if r["topic"] != HEALTH_TOPIC} == \
        {s for s in readings if s <= synced}
    sent = sum(m["bytes"] for m in manifests) + sum(
        (landing / manifest_name(m["file"])).stat().st_size
        for m in manifests)
    assert status["budget_used"] == status["bytes_sent"] == sent
    assert status["backlog"] == len([s for s in readings + health if s > synced])

    again = run_once(data_dir, landing, budget)  # the same day: nothing new to send
    assert again.names == [] and status_of(data_dir)["synced_seq"] == synced

    a_day_later(monkeypatch)
    run_once(data_dir, landing, budget)
    status = status_of(data_dir)
    assert (status["synced_seq"], status["health_only"], status["backlog"]) == \
        (max(readings + health), False, 0)
    assert status["budget_used"] < budget  # a new window
    _, rows = landed(landing)
    assert {r["seq"] for r in rows} == set(readings + health)


def test_a_try_the_sink_did_not_finish_counts_against_the_budget(tmp_path):
    """The attack: a sink that took the data and refused the manifest was sent 6 MB in a
    minute against a 1 MB day, none of it counted (bytes counted once both files landed)."""
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    fill(data_dir, 300)
    uploader = uploader_for(data_dir, RecordingSink(landing), batch_events=100,
                            daily_bytes=10**6)
    batch = uploader.next_batch()
    (landing / manifest_name(batch.name)).mkdir(parents=True)   # no manifest can land there
    with pytest.raises(SinkError, match="cannot write"):
        uploader.once()
    uploader.reader.close()
    status = status_of(data_dir)
    assert status["synced_seq"] == 0 and (landing / batch.name).exists()
    assert status["bytes_sent"] == status["budget_used"] == batch.size


def test_a_budget_of_one_byte_sends_health_records_only(tmp_path):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    readings, health = fill(data_dir, 200)
    sink = run_once(data_dir, landing, daily_bytes=1)
    _, rows = landed(landing)
    assert [r["seq"] for r in rows] == health  # each one, though it is over the budget
    assert len(sink.names) == 2 * len(health)
    status = status_of(data_dir)
    assert (status["synced_seq"], status["health_only"]) == (0, True)
    assert status["budget_used"] > 1
    assert run_once(data_dir, landing, daily_bytes=1).names == []  # shipped already


def test_health_records_past_the_budgets_floor_wait_for_the_next_day(tmp_path, monkeypatch):
    """Health records go past the budget, but no further than its floor: a gateway made to
    record often (or large) cannot spend the link without bound."""
    monkeypatch.setattr(sync_budget, "HEALTH_FLOOR_BYTES", 4000)
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    readings, health = fill(data_dir, 1000)
    run_once(data_dir, landing, daily_bytes=1)
    status = status_of(data_dir)
    _, rows = landed(landing)
    shipped = [r["seq"] for r in rows]
    assert 0 < len(shipped) < len(health) and shipped == health[:len(shipped)]
    assert status["budget_used"] <= 1 + 4000 and status["health_only"] is True

    a_day_later(monkeypatch)
    run_once(data_dir, landing, daily_bytes=1)
    _, rows = landed(landing)
    assert [r["seq"] for r in rows][len(shipped):] == \
        health[len(shipped):2 * len(shipped)]  # the next window's floor


def left_out_over_budget(tmp_path: Path) -> tuple[Path, Path, list[int], int]:
    """300 rows, the 61st of them 500 KB, synced once with daily_bytes = 200000: (data dir,
    landing, every seq, the large row's seq)."""
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    readings, health = fill(data_dir, 300, large_at=60)
    run_once(data_dir, landing, daily_bytes=200_000)
    return data_dir, landing, sorted(readings + health), 61


def test_a_row_larger_than_a_days_budget_ships_as_a_gap_and_the_watermark_moves_on(tmp_path):
    """The attack: one 500 KB reading among small ones, daily_bytes = 200000: synced_seq
    stopped at 51 for good, every new day logged "daily budget spent (0 of 200000 bytes)"."""
    data_dir, landing, seqs, large = left_out_over_budget(tmp_path)
    status = status_of(data_dir)
    assert (status["synced_seq"], status["health_only"]) == (seqs[-1], False)
    manifests, rows = landed(landing)
    assert sorted(r["seq"] for r in rows) == [s for s in seqs if s != large]
    gaps = [g for m in manifests for g in m["gaps"]]
    assert [(g["first_seq"], g["last_seq"], g["count"]) for g in gaps] == [(large, large, 1)]
    assert gaps[0]["reason"].startswith("over budget: ")
    assert "more than a day's 200000 bytes" in gaps[0]["reason"]
    assert status["over_budget_rows"] == 1
    assert status["last_over_budget"] == {k: gaps[0][k] for k in ("first_seq", "last_seq",
                                                                  "reason")}


def test_the_health_record_counts_the_rows_left_out_over_budget(tmp_path):
    data_dir, _, _, large = left_out_over_budget(tmp_path)
    sync = record_format.build({"sync": sync_section(status_of(data_dir))})["sync"]
    assert sync["over_budget_rows"] == 1
    assert sync["last_over_budget"]["first_seq"] == large


def test_doctor_warns_of_rows_left_out_over_budget(tmp_path):
    data_dir, landing, _, large = left_out_over_budget(tmp_path)
    config = write_config(tmp_path / "cairn.toml", data_dir,
                          f'[sync]\nsink = "dir:{landing}"\ndaily_bytes = 200000\n')
    result = cairn("doctor", "--config", str(config))
    assert result.returncode == 0, result.stdout  # a warning: the rest of the data ships
    (level, detail), = doctor_lines(result.stdout)["sync budget"]
    assert level == "warn" and f"seq {large}" in detail and "daily_bytes" in detail


def test_without_a_budget_nothing_is_held_back(tmp_path):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    readings, health = fill(data_dir, 200)
    run_once(data_dir, landing, daily_bytes=0)
    status = status_of(data_dir)
    assert (status["synced_seq"], status["health_only"], status["budget_used"]) == \
        (max(readings + health), False, 0)
    assert status["bytes_sent"] > 0


def test_metrics_show_the_budget_and_the_bytes_sent():
    sync = {"bytes_sent": 123_456, "budget_bytes": 100_000, "budget_used": 100_512,
            "health_only": True}
    text = render_metrics({"sync": sync}, MessageCounters(), [])
    for line in ("cairn_sync_sent_bytes_total 123456", "cairn_sync_budget_bytes 100000",
                 "cairn_sync_budget_used_bytes 100512", "cairn_sync_health_only 1"):
        assert line in text.splitlines(), line


@pytest.mark.parametrize("value, problem", [(-1, "must be 0 (no limit) or bytes a day"),
                                            ("5MB", "expected an integer")])
def test_a_bad_daily_budget_is_a_config_error_naming_the_key(tmp_path, value, problem):
    data = {"sync": {"sink": f"dir:{tmp_path}", "daily_bytes": value}}
    with pytest.raises(ConfigError) as error:
        parse_sync(data, "cairn.toml")
    assert error.value.key == "sync.daily_bytes" and problem in str(error.value)


def test_the_reader_walks_one_topic_after_a_seq(tmp_path):
    readings, health = fill(tmp_path, 120)
    reader = HistoryReader(tmp_path / "cairn.db")
    try:
        assert [p.seq for p in reader.topic_after(health[0], HEALTH_TOPIC, 10)] == health[1:]
    finally:
        reader.close()
