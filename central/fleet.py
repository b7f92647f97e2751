"""The fleet report: one row per gateway, from its newest health record (the
``cairn.gateway.health`` event; fields in the README, "Health records") and what the table
says of it, with flags for what needs a look, why, and an order of urgency. Plain Python over
plain values (no Spark): ``central.spark.reports.fleet_report`` hands each gateway's
:class:`Facts` to :func:`fleet`.

The rules, most urgent first (:data:`FLAGS`; a gateway's urgency is the most urgent flag it
has, then the next, then its name):

    store_unavailable  the record says the store is unavailable: nothing is being recorded
    offline            nothing newer than OFFLINE_S before the report
    card_worn          projected card life under CARD_LIFE_YEARS
    damaged_rows       rows the store could not read were skipped (a failing card, usually)
    update_failed      the last update's result is not ok (failed: rolled back; interrupted)
    clock_unsynced     the clock is not synchronized CLOCK_GRACE_S after start
    silent_devices     a device not ok, or without a reading for SILENT_DEVICE_S
    backlog            the oldest unsynced event is older than BACKLOG_AGE_S
    data_lost          seqs never landed or dropped on the gateway (the gap report)
    no_health          no health record, or none for two of its intervals before its newest
                       event (the record's interval_s; HEALTH_INTERVAL_S for records without)
    health_malformed   the newest record is not JSON, or fields have the wrong type
    budget_spent       the data budget is spent: only health records are sent

A record from a newer gateway may carry fields this job does not know: they stay in the
table; the report reads the fields it knows. A malformed record makes its gateway's row say
so (``health_problem``) and never fails the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cairn.formats.health import BY_PATH

DAY_S = 86_400.0
HEALTH_INTERVAL_S = 900.0        # the gateways' default router.health_interval
OFFLINE_S = DAY_S                # metered links upload every minute: a day of nothing is down
HEALTH_LATE_S = 2 * HEALTH_INTERVAL_S  # two intervals missed: a record is late
CARD_LIFE_YEARS = 1.0            # under a year: order the card and plan the visit
SILENT_DEVICE_S = DAY_S
CLOCK_GRACE_S = 3_600.0          # NTP or GPS may take a while after a cold start
BACKLOG_AGE_S = DAY_S            # the uplink (or its budget) does not keep up

# the report's columns, in order (a Spark DDL schema; CSV holds no lists: flags and reasons
# are joined into text)
COLUMNS = (
    "urgency long, gateway_id string, flags string, reasons string, last_seen timestamp,"
    " last_seen_age_s double, last_health timestamp, health_lag_s double, version string,"
    " slot string, uptime_s double, card_life_years double, card_bytes_per_day long,"
    " card_measuring boolean, clock_synchronized boolean, clock_steps long,"
    " backlog_events long, backlog_oldest_age_s double, devices long, silent_devices long,"
    " silent_names string, last_update_result string, last_update_version string,"
    " damaged_rows long, gaps long, lost_events long, budget_bytes long, budget_used long,"
    " health_only boolean, health_problem string")
_TYPES = dict(c.split() for c in COLUMNS.split(","))


@dataclass(frozen=True)
class Facts:
    """What the table says of one gateway (times in seconds since the epoch)."""
    gateway_id: str
    last_seen_s: float | None          # its newest event's corrected time
    last_health_s: float | None        # its newest health record's
    health: str | None                 # that record (the event's kwargs, JSON text)
    ever_synced: bool = True           # some event of it has a synchronized time
    gaps: int = 0
    not_landed: int = 0
    dropped_on_gateway: int = 0


# -- reading a record that may be newer, older or damaged ------------------------------------

class Record:
    """A health record's fields by path (``"card.life_years"``; the fields and their kinds
    are formats.health.FIELDS): a field that is missing is None; one of the wrong type is
    None too, and noted in :attr:`problems`."""

    def __init__(self, text: str | None) -> None:
        self.problems: list[str] = []
        self.fields: dict[str, Any] = {}
        if text is None:
            return
        try:
            fields = json.loads(text)
        except ValueError:
            self.problems.append("not JSON")
            return
        if isinstance(fields, dict):
            self.fields = fields
        else:
            self.problems.append(f"a JSON {type(fields).__name__}, not an object")

    def get(self, path: str) -> Any:
        value: Any = self.fields
        walked = []
        for key in path.split("."):
            if value is None:
                return None
            if not isinstance(value, dict):
                return self._wrong(".".join(walked), value)
            walked.append(key)
            value = value.get(key)
        return self.typed(path, value)

    def typed(self, path: str, value: Any, field: str | None = None) -> Any:
        """``value`` if it is of the kind of its ``field`` (``path``, unless a device's:
        ``devices.*.status``; a bool is not a number; a number is finite)."""
        kind = BY_PATH[field or path].kind
        if value is None:
            return None
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            return self._wrong(path, value)
        if isinstance(value, float) and not math.isfinite(value):
            return self._wrong(path, value)
        return value

    def _wrong(self, path: str, value: Any) -> None:
        problem = f"{path} is {json.dumps(value)[:40]}"
        if problem not in self.problems:
            self.problems.append(problem)


# -- the row ---------------------------------------------------------------------------------

def fleet(facts: list[Facts], now: datetime) -> list[dict[str, Any]]:
    """The report's rows, most urgent first, ``urgency`` numbering them from 1."""
    now_s = now.replace(tzinfo=now.tzinfo or UTC).timestamp()  # naive: UTC, as Spark's
    rows = sorted((row(f, now_s) for f in facts), key=urgency_key)
    for i, r in enumerate(rows, 1):
        r["urgency"] = i
    return rows


def row(facts: Facts, now_s: float) -> dict[str, Any]:
    """One gateway's row: the fields, then its flags and their reasons."""
    record = Record(facts.health)
    if facts.health is None and facts.last_health_s is not None:
        record.problems.append("no fields")  # the event's kwargs were null
    r = _fields(record, facts, now_s)
    silent = _silent(record)
    r.update(devices=len(_devices(record)) + (record.get("devices_unlisted") or 0),
             silent_devices=len(silent),
             silent_names=", ".join(silent) or None)
    r["health_problem"] = "; ".join(record.problems) or None
    found = [(rule.name, reason) for rule in FLAGS
             if (reason := rule.check(r, facts, record, silent))]
    r["flags"] = ", ".join(name for name, _ in found) or None
    r["reasons"] = "; ".join(reason for _, reason in found) or None
    return _typed_row(r)


def _fields(h: Record, facts: Facts, now_s: float) -> dict[str, Any]:
    seen, health = facts.last_seen_s, facts.last_health_s
    shipped = h.get("sync.damaged_rows_shipped") or 0
    return {
        "urgency": None, "gateway_id": facts.gateway_id,
        "last_seen": _time(seen), "last_seen_age_s": minus(now_s, seen),
        "last_health": _time(health), "health_lag_s": minus(seen, health),
        "version": h.get("version"), "slot": h.get("slot"),
        "uptime_s": h.get("uptime_s"),
        "card_life_years": h.get("card.life_years"),
        "card_bytes_per_day": h.get("card.bytes_per_day"),
        "card_measuring": h.get("card.measuring"),
        "clock_synchronized": h.get("clock.synchronized"),
        "clock_steps": h.get("clock.steps"),
        "backlog_events": h.get("backlog.events"),
        "backlog_oldest_age_s": h.get("backlog.oldest_age_s"),
        "last_update_result": h.get("last_update.result"),
        "last_update_version": h.get("last_update.version"),
        # the store's count and the uploader's may be the same rows: the larger is sure
        "damaged_rows": max(h.get("store.damaged_rows_skipped") or 0, shipped),
        "gaps": facts.gaps, "lost_events": facts.not_landed + facts.dropped_on_gateway,
        "budget_bytes": h.get("sync.budget_bytes"),
        "budget_used": h.get("sync.budget_used"),
        "health_only": h.get("sync.health_only"),
    }


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _typed_row(r: dict[str, Any]) -> dict[str, Any]:
    """Numbers as the column's type (JSON has one kind of number; Spark checks the kind)."""
    cast = {"long": int, "double": float}
    return {name: cast[_TYPES[name]](v) if v is not None and _TYPES[name] in cast else v
            for name, v in r.items()}


def _devices(h: Record) -> dict[str, Any]:
    return h.get("devices") or {}


def _silent(h: Record) -> list[str]:
    """'name: why' of each device that is not ok or has not read for SILENT_DEVICE_S."""
    silent = []
    for name, device in sorted(_devices(h).items()):
        device = h.typed(f"devices.{name}", device, "devices.*") or {}
        status = h.typed(f"devices.{name}.status", device.get("status"), "devices.*.status")
        age = h.typed(f"devices.{name}.last_reading_age_s",
                      device.get("last_reading_age_s"), "devices.*.last_reading_age_s")
        if status not in (None, "ok"):
            reason = h.typed(f"devices.{name}.reason", device.get("reason"),
                             "devices.*.reason")
            silent.append(f"{name} {status}" + (f" ({reason})" if reason else ""))
        elif age is not None and age > SILENT_DEVICE_S:
            silent.append(f"{name} no reading for {duration(age)}")
    return silent


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``5.0 h``, ``3.2 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


# -- the flags -------------------------------------------------------------------------------

Check = Callable[[dict[str, Any], Facts, Record, list[str]], str | None]


@dataclass(frozen=True)
class Rule:
    name: str
    title: str                                            # what it means, for the page
    check: Check                                          # its reason, or None: not flagged
    metric: Callable[[dict[str, Any]], float | None] | None = None  # plotted; None: 1 if flagged
    unit: str = ""
    threshold: float | None = None                        # drawn on the plot, in its unit


def _store(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    if h.get("store.available") is False:
        return f"store unavailable: {h.get('store.error') or 'no reason given'}"
    return None


def _over(r: dict[str, Any], key: str, limit: float) -> float | None:
    """``r[key]`` if it is over ``limit``."""
    value = r[key]
    return value if value is not None and value > limit else None


def _offline(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    if (age := _over(r, "last_seen_age_s", OFFLINE_S)) is None:
        return None
    return f"nothing for {duration(age)} (newest event {r['last_seen']:%Y-%m-%d %H:%M})"


def _card(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    life = r["card_life_years"]
    if life is not None and life < CARD_LIFE_YEARS:  # None while measuring
        per_day = r["card_bytes_per_day"]
        written = f" at {per_day / 1e9:.1f} GB a day" if per_day is not None else ""
        return f"card life {life:.1f} years{written}"
    return None


def _damaged(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    n = r["damaged_rows"]
    return f"{n:,} damaged rows skipped (check the card)" if n else None


def _update(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    result = r["last_update_result"]
    if result in (None, "ok"):
        return None
    version = r["last_update_version"] or "?"
    reason = h.get("last_update.reason")
    return f"update to {version} {result}" + (f": {reason}" if reason else "")


def _clock(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    uptime = r["uptime_s"]
    if r["clock_synchronized"] is not False or (uptime is not None and uptime < CLOCK_GRACE_S):
        return None
    since = f" in {duration(uptime)} since start" if uptime is not None else ""
    if not f.ever_synced:
        return f"clock never synchronized{since}: times are the gateway's guess"
    return f"clock not synchronized{since}"


def _devices_silent(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    return "silent: " + ", ".join(s) if s else None


def _backlog(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    if (age := _over(r, "backlog_oldest_age_s", BACKLOG_AGE_S)) is None:
        return None
    return f"backlog of {r['backlog_events'] or 0:,} events, the oldest {duration(age)} old"


def _lost(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    if not r["lost_events"]:
        return None
    return (f"{r['lost_events']:,} events lost in {f.gaps} gaps ({f.not_landed:,} never "
            f"landed, {f.dropped_on_gateway:,} dropped on the gateway)")


def _no_health(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    if f.last_health_s is None:
        return "no health record (a version before them, or none landed yet)"
    interval = h.get("interval_s")  # the gateway's own router.health_interval
    late = 2 * interval if interval and interval > 0 else HEALTH_LATE_S
    if (lag := _over(r, "health_lag_s", late)) is None:
        return None
    return f"no health record for {duration(lag)} before the newest event"


def _malformed(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    return f"health record malformed: {r['health_problem']}" if r["health_problem"] else None


def _budget(r: dict[str, Any], f: Facts, h: Record, s: list[str]) -> str | None:
    if not r["health_only"]:
        return None
    return (f"data budget spent ({r['budget_used'] or 0:,} of {r['budget_bytes'] or 0:,} "
            "bytes): health records only")


def _days(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / DAY_S


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600


def _wear(life_years: float | None) -> float | None:
    """The share of the card's endurance written in a year: larger is worse, as on the
    other plots. The gateway rounds life to 0.1 year: 0.0 is drawn as 0.05."""
    return None if life_years is None else 1 / max(life_years, 0.05)


def _share(used: float | None, budget: float | None) -> float | None:
    return used / budget if used is not None and budget else None


FLAGS: tuple[Rule, ...] = (
    Rule("store_unavailable", "store unavailable", _store),
    Rule("offline", f"nothing for over {OFFLINE_S / 3600:g} h", _offline,
         lambda r: _days(r["last_seen_age_s"]), "days", _days(OFFLINE_S)),
    Rule("card_worn", f"card life under {CARD_LIFE_YEARS:g} year (wear a year)", _card,
         lambda r: _wear(r["card_life_years"]), "of the card a year", 1 / CARD_LIFE_YEARS),
    Rule("damaged_rows", "damaged rows skipped", _damaged,
         lambda r: r["damaged_rows"], "rows", 0),
    Rule("update_failed", "last update failed or interrupted", _update),
    Rule("clock_unsynced", "clock not synchronized", _clock),
    Rule("silent_devices", f"devices not ok or silent for {SILENT_DEVICE_S / 3600:g} h",
         _devices_silent, lambda r: r["silent_devices"], "devices", 0),
    Rule("backlog", f"backlog older than {BACKLOG_AGE_S / 3600:g} h", _backlog,
         lambda r: _days(r["backlog_oldest_age_s"]), "days", _days(BACKLOG_AGE_S)),
    Rule("data_lost", "events lost", _lost, lambda r: r["lost_events"], "events", 0),
    Rule("no_health", f"no health record for {duration(HEALTH_LATE_S)}", _no_health,
         lambda r: _hours(r["health_lag_s"]), "hours", _hours(HEALTH_LATE_S)),
    Rule("health_malformed", "health record malformed", _malformed),
    Rule("budget_spent", "data budget spent", _budget,
         lambda r: _share(r["budget_used"], r["budget_bytes"]), "of budget", 1.0),
)

def flag_names(r: dict[str, Any]) -> list[str]:
    return (r.get("flags") or "").split(", ") if r.get("flags") else []


def urgency_key(r: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """Most urgent flag first, then the next ones (more flags before fewer), then the name;
    gateways without flags last."""
    has = set(flag_names(r))
    return tuple(0 if rule.name in has else 1 for rule in FLAGS), r["gateway_id"]
