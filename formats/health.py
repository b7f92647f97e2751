"""The health record: the gateway's own health, an event the router publishes on
:data:`TOPIC` and keeps in history, so that it ships in the same batches as the readings and
the central fleet report reads it. Its fields are :data:`FIELDS`, the one list of them: the
router writes a record through :func:`build` (gateway.shell.health), the fleet report reads
it through :data:`BY_PATH` (central.fleet), and the table in docs/fleet-report.md is
:func:`markdown` (``python -m cairn.formats.health``; tests/system/test_docs.py compares).

A record is the event's kwargs, a JSON object; a field path ``card.life_years`` is the key
``life_years`` of the object under ``card``, and ``devices.*.status`` the key ``status`` of
each device's object. A newer gateway may add fields (readers keep what they do not know,
``schema`` says which version wrote them), never change these.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

TOPIC = "cairn.gateway.health"
OWN_AUTHID = "cairn.router"  # whom the router's own publications name as their publisher
OWN_AUTHROLE = "cairn.router"
SCHEMA = 1
NUMBER = (int, float)
# What one record may hold: any client that may publish a retained sensor.* topic makes a
# "device" (4,800 junk topics once made a 264,598-byte record), so a record names the most
# telling devices and counts the rest (:func:`listed`), and no text runs on (:func:`build`).
MAX_DEVICES = 64            # devices a record names
MAX_DEVICE_BYTES = 12_288   # JSON the named devices take together
MAX_NAME = 64               # characters of a device name; a longer one is counted, not named
MAX_TEXT = 200              # characters of any text in a record (a reason, an error)
MAX_RECORD_BYTES = 16_384   # a record larger than this names no device at all


class Field(NamedTuple):
    path: str                       # dotted; "*" stands for each key of a table (a device)
    kind: type | tuple[type, ...]   # what a reader accepts (None is always "not known")
    meaning: str


FIELDS = (
    Field("schema", int, "`1`; a newer gateway may add fields (readers keep what they do not "
          "know), never change these"),
    Field("interval_s", NUMBER, "this router's `router.health_interval` in seconds: the "
          "central fleet report flags `no_health` after two of them without a record (a "
          "record without the field: two of the default 15 min)"),
    Field("version", str, "the installed Cairn"),
    Field("boot_id", str, "this boot"),
    Field("uptime_s", NUMBER, "the router's uptime"),
    Field("system_uptime_s", NUMBER, "the system's uptime (`CLOCK_BOOTTIME`)"),
    Field("slot", str, "the A/B slot running (null off the image)"),
    Field("update_on_trial", dict, "the update on trial"),
    Field("last_update", dict, "the last update's result: `result`, `reason`, `version`, "
          "`at`, `slot`, `from_slot`"),
    Field("last_update.result", str, "ok, failed (rolled back) or interrupted"),
    Field("last_update.reason", str, "why it failed"),
    Field("last_update.version", str, "the version it installed"),
    Field("clock", dict, "the clock"),
    Field("clock.synchronized", bool, "the wall clock is known to be synchronized"),
    Field("clock.steps", NUMBER, "steps recorded in the store"),
    Field("clock.last_step", dict, "`at`, `by_s`: how far it jumped"),
    Field("store", dict, "the store"),
    Field("store.available", bool, "the store is open"),
    Field("store.error", str, "why it is not"),
    Field("store.bytes", NUMBER, "its size"),
    Field("store.events", NUMBER, "history of the first realm, these records included"),
    Field("store.dropped_events", NUMBER, "dropped to stay within bounds"),
    Field("store.damaged_rows_skipped", NUMBER, "rows the router could not read"),
    Field("backlog", dict, "what is not yet synced"),
    Field("backlog.events", NUMBER, "events not yet synced"),
    Field("backlog.oldest_age_s", NUMBER, "the age of the oldest (by the wall clock)"),
    Field("sync", dict, "as the uploader last reported (null without one)"),
    Field("sync.state", str, "the uploader's state"),
    Field("sync.last_success", str, "its last shipment"),
    Field("sync.last_error", str, "its last failure"),
    Field("sync.bytes_sent", NUMBER, "bytes sent today"),
    Field("sync.budget_bytes", NUMBER, "`[sync] daily_bytes`"),
    Field("sync.budget_used", NUMBER, "of it, used today"),
    Field("sync.health_only", bool, "the budget is spent: only health records are sent"),
    Field("sync.uplink_clock", dict, "an S3 sink's view of the clock, null unless it "
          "measured one: `offset_s` (the server's lead on the wall clock), `measured` (the "
          "server's time then); see [Landing in S3](sync-and-spark.md#landing-in-s3)"),
    Field("sync.damaged_rows_shipped", int, "rows shipped as damage records"),
    Field("sync.over_budget_rows", int, "history rows larger than a whole day's budget, "
          "shipped as gaps (`over budget: ...`) so that the rest goes on"),
    Field("sync.last_over_budget", dict, "the last of them: `first_seq`, `last_seq`, "
          "`reason`"),
    Field("card", dict, "the card's wear"),
    Field("card.bytes_per_day", NUMBER, "bytes written a day"),
    Field("card.life_years", NUMBER, "years of card life at that rate"),
    Field("card.measuring", bool, "the rate is still being measured"),
    Field("card.window_s", NUMBER, "the window the rate is over"),
    Field("card.endurance_tb", NUMBER, "the card's endurance"),
    Field("devices", dict, "per device id (from `gateway.device.<id>.status` and "
          "`sensor.<id>`; `realm/id` for realms after the first), at most 64 of them in 12 KiB: "
          "the drivers' devices (those with a status topic) first, then a device not ok, the "
          "longest silent; a name over 64 characters is counted, not named"),
    Field("devices.*", dict, "a device"),
    Field("devices.*.status", str, "what its driver said last: ok, stale or error"),
    Field("devices.*.reason", str, "why"),
    Field("devices.*.errors", NUMBER, "times it went into error since its driver started"),
    Field("devices.*.last_reading_age_s", NUMBER, "how long ago its last reading came"),
    Field("devices_unlisted", int, "devices `devices` does not name (past its 64 or its "
          "12 KiB, or named at length): counted only"),
    Field("limit_hits", dict, "per bound of `[router.limits]`, times it was hit since start"),
    Field("config", dict, "which configuration runs"),
    Field("config.running", str, "`file` or `last-good`"),
    Field("config.problem", str, "why not the file, or why the last SIGHUP was not applied"),
)
BY_PATH = {field.path: field for field in FIELDS}
# the fields the uploader's status file gives the record's "sync" (base.data_dir.SyncStatus)
SYNC_STATUS_FIELDS = tuple(f.path.removeprefix("sync.") for f in FIELDS
                           if f.path.startswith("sync.")
                           and f.path != "sync.damaged_rows_shipped")


def build(values: dict[str, Any]) -> dict[str, Any]:
    """A record from its top-level fields (``{"clock": {...}, ...}``), each checked to be one
    of :data:`FIELDS`, down to the keys of its tables: a writer cannot add a field without
    listing it here (a devices table's keys are names, its entries' keys fields). Each text
    is cut to MAX_TEXT characters; a record still over MAX_RECORD_BYTES counts its devices
    instead of naming them."""
    for path, value in values.items():
        _check(path, value)
    record = {"schema": SCHEMA, **_cut(values)}
    if record.get("devices") and _size(record) > MAX_RECORD_BYTES:
        record["devices_unlisted"] = (record.get("devices_unlisted") or 0) + \
            len(record["devices"])
        record["devices"] = {}
    return record


def listed(devices: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], int]:
    """The devices a record names (by name) and how many it only counts: a driver's device
    (one with a ``status``) before readings alone, one not ok before one that is, the longest
    silent first, while there are fewer than MAX_DEVICES and they fit in MAX_DEVICE_BYTES; a
    name longer than MAX_NAME is never named."""
    named: dict[str, dict[str, Any]] = {}
    room = MAX_DEVICE_BYTES
    for name, device in sorted(devices.items(), key=_telling):
        if len(name) > MAX_NAME or len(named) == MAX_DEVICES:
            continue
        device = _cut(device)
        size = _size({name: device})
        if size <= room:
            named[name], room = device, room - size
    return dict(sorted(named.items())), len(devices) - len(named)


def _telling(item: tuple[str, dict[str, Any]]) -> tuple[Any, ...]:
    name, device = item
    age = device.get("last_reading_age_s")
    return ("status" not in device, device.get("status") == "ok",
            -age if isinstance(age, NUMBER) else 0, name)


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT - 1] + "…"
    if isinstance(value, dict):
        return {key: _cut(inner) for key, inner in value.items()}
    return [_cut(inner) for inner in value] if isinstance(value, list) else value


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def _check(path: str, value: Any) -> None:
    if path not in BY_PATH:
        raise KeyError(f"{path} is not a field of the health record (formats.health.FIELDS)")
    if not isinstance(value, dict) or path in ("limit_hits", "update_on_trial",
                                               "clock.last_step", "last_update",
                                               "sync.uplink_clock", "sync.last_over_budget"):
        return
    for key, inner in value.items():
        if path == "devices":  # {device id: {field: value}}
            for name, item in inner.items():
                _check(f"devices.*.{name}", item)
        else:
            _check(f"{path}.{key}", inner)


def markdown() -> str:
    """docs/fleet-report.md's table of the fields (top-level ones, their keys in the text)."""
    lines = ["| field | meaning |", "|---|---|"]
    for field in FIELDS:
        inner = [f for f in FIELDS if f.path.startswith(f"{field.path}.")]
        if "." in field.path:
            continue
        keys = ", ".join(f"`{f.path.rsplit('.', 1)[1]}` ({f.meaning})" for f in inner)
        lines.append(f"| `{field.path}` | {field.meaning}{': ' + keys if keys else ''} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
