"""``report.html`` (sync/report_html.py): a static page with inline SVG plots that opens
from the report directory with no server and no network. Plain rows in, no Spark."""

from __future__ import annotations

from datetime import UTC, date, datetime
from html.parser import HTMLParser

from cairn.central import fleet, report_html
from tests.pure.test_fleet import NOW, facts, record

GATEWAYS = [
    {"gateway_id": "gw-1", "events": 900, "min_seq": 1, "max_seq": 1000, "gaps": 2,
     "not_landed": 90, "dropped_on_gateway": 10, "estimated": 300,
     "last_batch_ingested": datetime(2026, 11, 25, 8, 0)},
    {"gateway_id": "gw-2", "events": 500, "min_seq": 1, "max_seq": 500, "gaps": 0,
     "not_landed": 0, "dropped_on_gateway": 0, "estimated": 0, "last_batch_ingested": None},
]
GAPS = [{"gateway_id": "gw-1", "first_seq": 101, "last_seq": 190, "missing": 90,
         "cause": "not landed"},
        {"gateway_id": "gw-1", "first_seq": 301, "last_seq": 310, "missing": 10,
         "cause": "dropped on the gateway: max_events"}]
DAILY = [{"gateway_id": "gw-1", "date": date(2026, 11, 24), "rows": 400},
         {"gateway_id": "gw-1", "date": date(2026, 11, 25), "rows": 500},
         {"gateway_id": "gw-2", "date": date(2026, 11, 25), "rows": 500}]
SPANS = [{"gateway_id": "gw-1", "first_seq": 1, "last_seq": 300, "events": 300,
          "start": datetime(2026, 11, 24, 0, 0), "end": datetime(2026, 11, 24, 3, 0),
          "estimated": True, "rebased_by_s": 1_795_000_000.0}]
FLEET = fleet.fleet([facts("gw-ok"), facts("gw-worn", record(card__life_years=0.5)),
                     facts("gw-lost", gaps=1, not_landed=90)], NOW)


class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.titles: list[str] = []
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.titles.append(data)


def parsed() -> Elements:
    page = report_html.page(GATEWAYS, GAPS, DAILY, SPANS, datetime(2026, 11, 25, tzinfo=UTC),
                            FLEET)
    elements = Elements()
    elements.feed(page)
    return elements


def test_the_page_loads_nothing_from_anywhere():
    tags = parsed().tags
    assert not [t for t, _ in tags if t in {"script", "link", "img", "iframe", "object"}]
    assert not [a for _, attrs in tags for a in ("src", "href") if a in attrs]


def test_the_page_draws_rows_per_gateway_per_day():
    titles = parsed().titles
    assert "gw-1 2026-11-24: 400 rows" in titles and "gw-2 2026-11-25: 500 rows" in titles


def test_the_gap_map_draws_each_gap_with_its_cause():
    titles = parsed().titles
    assert "gw-1 seqs 101..190 (90): not landed" in titles
    assert "gw-1 seqs 301..310 (10): dropped on the gateway: max_events" in titles


def test_the_clock_plot_says_how_far_a_span_was_rebased():
    assert "gw-1 seqs 1..300: 300 events, re-based by 1,795,000,000 s" in parsed().titles


def test_names_are_escaped():
    page = report_html.page([dict(GATEWAYS[1], gateway_id="<b>x")], [], [], [], "now")
    assert "<b>x" not in page and "&lt;b&gt;x" in page


def test_the_fleet_table_lists_the_gateways_most_urgent_first_flagged_ones_shaded():
    tags = parsed().tags
    rows = [attrs.get("class") for t, attrs in tags if t == "tr"]
    table = report_html.fleet_table(list(reversed(FLEET)))
    assert table.index("gw-worn") < table.index("gw-lost") < table.index("gw-ok")
    assert rows[1:4] == ["flagged", "flagged", None]  # after the heading's row
    assert "card life 0.5 years at 2.0 GB a day" in table


def test_each_flag_has_a_small_multiple_its_flagged_gateways_in_red():
    elements = parsed()
    panels = [attrs["aria-label"] for t, attrs in elements.tags
              if t == "svg" and attrs["aria-label"].startswith("flag ")]
    assert panels == [f"flag {rule.name}" for rule in fleet.FLAGS]
    red = {attrs["fill"] for t, attrs in elements.tags if t == "rect"}
    assert "#d62728" in red
    assert "gw-worn: 2.00 of the card a year" in elements.titles
    assert "gw-lost: 90.00 events" in elements.titles
    assert "gw-ok: not flagged" in elements.titles and "gw-worn: flagged" not in elements.titles


def test_fleet_names_and_reasons_are_escaped():
    rows = fleet.fleet([facts("<b>x", record(last_update={"result": "failed",
                                                            "reason": "<i>why"}))], NOW)
    page = report_html.page([], [], [], [], "now", rows)
    assert "<b>x" not in page and "<i>why" not in page and "&lt;i&gt;why" in page


def test_a_card_whose_life_rounds_to_nothing_is_drawn_as_the_most_worn():
    rows = fleet.fleet([facts("gw-gone", record(card__life_years=0.0))], NOW)
    card = next(rule for rule in fleet.FLAGS if rule.name == "card_worn")
    assert "gw-gone: 20.00 of the card a year" in report_html.flag_panel(card, rows)
