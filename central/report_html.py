"""``report.html``: one static page a fleet operator opens from the report directory (no
server, no script, no network: inline SVG and CSS only). First the fleet (:mod:`central.fleet`):
the gateways that need attention, most urgent first, and a small multiple per flag (a bar per
gateway in the table's order, red where flagged, the threshold dashed). Then three plots,
from the reports the job already computed:

- rows per gateway per day (a heat map of the last :data:`DAYS` days),
- the gap map (each gateway's seq range, its gaps coloured by cause),
- clock spans (each span of unsynchronized time on the corrected time axis, with how far
  it was re-based).

Pure Python over plain rows (dicts), so it is tested without Spark. At most
:data:`MAX_GATEWAYS` gateways are drawn per plot; the page says when more were left out.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any

from cairn.central import fleet as fleet_rules

DAYS = 60
MAX_GATEWAYS = 300
ROW_H = 12          # px per gateway row
LABEL_W = 140       # px for the gateway names
PLOT_W = 720        # px of plot area
NOT_LANDED = "not landed"
PANEL_W, PANEL_H = 240, 48  # px of one flag's small multiple
PANEL_BARS = 120    # gateways drawn per small multiple: the most urgent

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; text-align: right; }
th { border-bottom: 1px solid #999; } td:first-child, th:first-child { text-align: left; }
svg text { font-size: 10px; } .note { color: #666; }
tr.flagged td { background: #fdecea; } td.gateway_id { text-align: left; }
td.reasons { text-align: left; min-width: 20em; max-width: 30em; }
td.last_seen, td.last_health { white-space: nowrap; }
.panels { display: flex; flex-wrap: wrap; gap: 8px 24px; }
.panel h3 { font-size: 0.85em; font-weight: normal; margin: 4px 0; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _svg(width: int, height: int, body: Iterable[str], label: str) -> str:
    return (f'<svg width="{width}" height="{height}" role="img" aria-label="{_esc(label)}">'
            + "".join(body) + "</svg>")


def _shade(value: int, top: int) -> str:
    """White (0) to dark blue (``top``)."""
    f = 0 if top <= 0 else min(1.0, value / top)
    r, g, b = (int(255 - f * (255 - c)) for c in (16, 60, 140))
    return f"rgb({r},{g},{b})"


def _label(y: int, text: str) -> str:
    return f'<text x="0" y="{y + ROW_H - 2}">{_esc(text)}</text>'


def _capped(names: list[str]) -> tuple[list[str], str]:
    if len(names) <= MAX_GATEWAYS:
        return names, ""
    return names[:MAX_GATEWAYS], (f'<p class="note">{len(names) - MAX_GATEWAYS} more '
                                  "gateways not drawn: see the CSV files.</p>")


def daily_plot(daily: list[dict[str, Any]]) -> str:
    """Heat map: a row per gateway, a column per day (the last DAYS days with rows)."""
    days = sorted({r["date"] for r in daily})[-DAYS:]
    if not days:
        return '<p class="note">No rows.</p>'
    names, note = _capped(sorted({r["gateway_id"] for r in daily}))
    cell = max(4, PLOT_W // len(days))
    top = max(r["rows"] for r in daily)
    col = {d: i for i, d in enumerate(days)}
    line = {n: i for i, n in enumerate(names)}
    body = [_label(i * ROW_H + 14, n) for i, n in enumerate(names)]
    for r in daily:
        if r["date"] in col and r["gateway_id"] in line:
            x, y = LABEL_W + col[r["date"]] * cell, line[r["gateway_id"]] * ROW_H + 14
            body.append(f'<rect x="{x}" y="{y}" width="{cell - 1}" height="{ROW_H - 1}" '
                        f'fill="{_shade(r["rows"], top)}"><title>{_esc(r["gateway_id"])} '
                        f'{_esc(r["date"])}: {r["rows"]:,} rows</title></rect>')
    body.append(f'<text x="{LABEL_W}" y="10">{_esc(days[0])}</text>')
    body.append(f'<text x="{LABEL_W + len(days) * cell}" y="10" text-anchor="end">'
                f'{_esc(days[-1])}</text>')
    return _svg(LABEL_W + len(days) * cell + 10, len(names) * ROW_H + 20, body,
                "rows per gateway per day") + note


def gap_plot(gateways: list[dict[str, Any]], gaps: list[dict[str, Any]]) -> str:
    """A bar per gateway over its seq range; gaps red (not landed) or orange (dropped on
    the gateway). Gateways without gaps are counted, not drawn."""
    with_gaps = sorted({g["gateway_id"] for g in gaps})
    clean = len(gateways) - len(with_gaps)
    note = f'<p class="note">{clean} gateways without gaps.</p>'
    if not with_gaps:
        return note
    names, more = _capped(with_gaps)
    span = {g["gateway_id"]: (g["min_seq"], g["max_seq"]) for g in gateways}
    body = []
    for i, name in enumerate(names):
        lo, hi = span[name]
        y = i * ROW_H
        scale = PLOT_W / max(1, hi - lo + 1)
        body += [_label(y, name), f'<rect x="{LABEL_W}" y="{y}" width="{PLOT_W}" '
                 f'height="{ROW_H - 2}" fill="#cfe3cf"/>']
        for g in (g for g in gaps if g["gateway_id"] == name):
            x = LABEL_W + (g["first_seq"] - lo) * scale
            w = max(1.0, g["missing"] * scale)
            colour = "#d62728" if g["cause"] == NOT_LANDED else "#ff9f1c"
            body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW_H - 2}" '
                        f'fill="{colour}"><title>{_esc(name)} seqs {g["first_seq"]}..'
                        f'{g["last_seq"]} ({g["missing"]:,}): {_esc(g["cause"])}</title></rect>')
    legend = ('<p class="note">Green: rows in the table; red: never landed; orange: dropped '
              "on the gateway.</p>")
    return legend + _svg(LABEL_W + PLOT_W + 10, len(names) * ROW_H + 4, body,
                         "gap map") + more + note


def _seconds(t: datetime | None) -> float:
    return 0.0 if t is None else t.timestamp()


def clock_plot(spans: list[dict[str, Any]]) -> str:
    """Each unsynchronized span on the corrected time axis; its title says how far the
    timestamps were re-based."""
    if not spans:
        return '<p class="note">No unsynchronized spans.</p>'
    names, more = _capped(sorted({s["gateway_id"] for s in spans}))
    t0 = min(_seconds(s["start"]) for s in spans)
    t1 = max(_seconds(s["end"]) for s in spans)
    scale = PLOT_W / max(1.0, t1 - t0)
    line = {n: i for i, n in enumerate(names)}
    body = [_label(i * ROW_H + 14, n) for i, n in enumerate(names)]
    for s in spans:
        if s["gateway_id"] not in line:
            continue
        x = LABEL_W + (_seconds(s["start"]) - t0) * scale
        w = max(2.0, (_seconds(s["end"]) - _seconds(s["start"])) * scale)
        shift = s.get("rebased_by_s")
        what = f"re-based by {shift:,.0f} s" if s["estimated"] else "not re-based (no anchor)"
        body.append(f'<rect x="{x:.1f}" y="{line[s["gateway_id"]] * ROW_H + 14}" '
                    f'width="{w:.1f}" height="{ROW_H - 2}" '
                    f'fill="{"#1f77b4" if s["estimated"] else "#999"}"><title>'
                    f'{_esc(s["gateway_id"])} seqs {s["first_seq"]}..{s["last_seq"]}: '
                    f'{s["events"]:,} events, {what}</title></rect>')
    body.append(f'<text x="{LABEL_W}" y="10">{_esc(_when(spans, "start", min))}</text>')
    body.append(f'<text x="{LABEL_W + PLOT_W}" y="10" text-anchor="end">'
                f'{_esc(_when(spans, "end", max))}</text>')
    return _svg(LABEL_W + PLOT_W + 10, len(names) * ROW_H + 20, body,
                "clock spans") + more


def _when(spans: list[dict[str, Any]], key: str, pick: Any) -> str:
    moment = pick(s[key] for s in spans if s[key] is not None)
    return moment.strftime("%Y-%m-%d %H:%M") if isinstance(moment, datetime) else str(moment)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return "" if value is None else str(value)


def _table(rows: list[dict[str, Any]], cols: list[tuple[str, str]],
           flagged: str | None = None) -> str:
    """A table of ``cols`` (key, heading); rows with ``flagged`` set get that class."""
    head = "".join(f"<th>{_esc(t)}</th>" for _, t in cols)
    lines = []
    for r in rows[:MAX_GATEWAYS]:
        cells = "".join(f'<td class="{key}">{_esc(_cell(r.get(key)))}</td>' for key, _ in cols)
        mark = ' class="flagged"' if flagged and r.get(flagged) else ""
        lines.append(f"<tr{mark}>{cells}</tr>")
    more = (f'<p class="note">{len(rows) - MAX_GATEWAYS} more gateways: see the CSV '
            "files.</p>" if len(rows) > MAX_GATEWAYS else "")
    return f"<table><tr>{head}</tr>{''.join(lines)}</table>{more}"


def _summary_table(gateways: list[dict[str, Any]]) -> str:
    return _table(gateways, [
        ("gateway_id", "gateway"), ("events", "rows"), ("min_seq", "first seq"),
        ("max_seq", "last seq"), ("gaps", "gaps"), ("not_landed", "not landed"),
        ("dropped_on_gateway", "dropped"), ("estimated", "re-based"),
        ("last_batch_ingested", "last batch")])


FLEET_COLUMNS = [
    ("urgency", "#"), ("gateway_id", "gateway"), ("reasons", "needs attention"),
    ("last_seen", "last seen"), ("last_health", "last health"), ("version", "version"),
    ("slot", "slot"), ("card_life_years", "card years"), ("clock_synchronized", "clock ok"),
    ("backlog_events", "backlog"),
    ("silent_devices", "silent devices"), ("last_update_result", "last update"),
    ("damaged_rows", "damaged rows"), ("lost_events", "lost"), ("budget_used", "budget used")]


def fleet_table(fleet: list[dict[str, Any]]) -> str:
    """The gateways in urgency order, flagged ones shaded, each flag's reason spelt out."""
    if not fleet:
        return '<p class="note">No gateways.</p>'
    return _table(sorted(fleet, key=lambda r: r["urgency"]), FLEET_COLUMNS, "flags")


def flag_panel(rule: fleet_rules.Rule, fleet: list[dict[str, Any]]) -> str:
    """One flag's small multiple: a bar per gateway (urgency order) of the value behind the
    flag (or 1 where flagged), red where flagged; the threshold dashed."""
    rows = sorted(fleet, key=lambda r: r["urgency"])
    hit = [rule.name in fleet_rules.flag_names(r) for r in rows]
    drawn = [(r, h, rule.metric(r) if rule.metric else float(h))
             for r, h in zip(rows[:PANEL_BARS], hit[:PANEL_BARS], strict=True)]
    top = max([v for _, _, v in drawn if v is not None] + [rule.threshold or 0, 1e-9])
    width = max(1.0, PANEL_W / max(1, len(drawn)))
    body = [f'<line x1="0" y1="{PANEL_H}" x2="{PANEL_W}" y2="{PANEL_H}" stroke="#999"/>']
    for i, (r, h, v) in enumerate(drawn):
        if v is None:
            continue
        tall = max(1.0, v / top * (PANEL_H - 2))
        body.append(f'<rect x="{i * width:.1f}" y="{PANEL_H - tall:.1f}" width="{width:.1f}" '
                    f'height="{tall:.1f}" fill="{"#d62728" if h else "#b8c4d6"}"><title>'
                    f'{_esc(r["gateway_id"])}: {_esc(_value(rule, v))}</title></rect>')
    if rule.threshold:
        y = PANEL_H - rule.threshold / top * (PANEL_H - 2)
        body.append(f'<line x1="0" y1="{y:.1f}" x2="{PANEL_W}" y2="{y:.1f}" stroke="#333" '
                    'stroke-dasharray="3,2"/>')
    return (f'<div class="panel"><h3>{_esc(rule.title)}: {sum(hit)} of {len(fleet)}</h3>'
            + _svg(PANEL_W, PANEL_H + 1, body, f"flag {rule.name}") + "</div>")


def _value(rule: fleet_rules.Rule, value: float) -> str:
    if rule.metric is None:
        return "flagged" if value else "not flagged"
    return f"{value:,.2f} {rule.unit}"


def fleet_section(fleet: list[dict[str, Any]]) -> str:
    flagged = sum(1 for r in fleet if r.get("flags"))
    return "\n".join([
        f'<p class="note">{flagged} of {len(fleet)} gateways need attention, most urgent '
        "first (fleet.csv has every column; the README lists the thresholds).</p>",
        fleet_table(fleet),
        '<div class="panels">' + "".join(flag_panel(rule, fleet)
                                         for rule in fleet_rules.FLAGS) + "</div>"])


def page(gateways: list[dict[str, Any]], gaps: list[dict[str, Any]],
         daily: list[dict[str, Any]], spans: list[dict[str, Any]],
         generated: datetime | date | str, fleet: list[dict[str, Any]] | None = None) -> str:
    """The whole page (UTF-8 HTML5); ``fleet``: the fleet report's rows."""
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>Cairn fleet report</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>Cairn fleet report</h1>",
        f'<p class="note">{len(gateways)} gateways; generated {_esc(generated)}. The '
        "numbers behind every plot are in the CSV and Parquet files beside this page.</p>",
        "<h2>Fleet: what needs attention</h2>", fleet_section(fleet or []),
        "<h2>Rows per gateway per day</h2>", daily_plot(daily),
        "<h2>Gap map</h2>", gap_plot(gateways, gaps),
        "<h2>Unsynchronized clock spans (corrected time)</h2>", clock_plot(spans),
        "<h2>Gateways</h2>", _summary_table(gateways),
        "</body></html>", ""])
