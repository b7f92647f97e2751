"""``/metrics`` in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from autobahn.wamp import message as m

from cairn.base.clock_readings import parse_rfc3339


class MessageCounters:
    """WAMP messages in and out, counted on the hot path with one dict update: received ones
    by class, sent ones by type code; named when rendered."""

    def __init__(self) -> None:
        self.received: Counter[type] = Counter()
        self.sent: Counter[int] = Counter()

    def received_by_name(self) -> dict[str, int]:
        return _by_name((cls.MESSAGE_TYPE, n) for cls, n in self.received.items())

    def sent_by_name(self) -> dict[str, int]:
        return _by_name(self.sent.items())


_NAMES = {cls.MESSAGE_TYPE: cls.__name__.upper() for cls in (
    m.Hello, m.Welcome, m.Abort, m.Challenge, m.Authenticate, m.Goodbye, m.Error, m.Publish,
    m.Published, m.Subscribe, m.Subscribed, m.Unsubscribe, m.Unsubscribed, m.Event, m.Call,
    m.Cancel, m.Result, m.Register, m.Registered, m.Unregister, m.Unregistered, m.Invocation,
    m.Interrupt, m.Yield)}


def _by_name(counts: Iterable[tuple[int, int]]) -> dict[str, int]:
    named: Counter[str] = Counter()
    for code, n in counts:
        named[_NAMES.get(code, "OTHER")] += n
    return dict(sorted(named.items()))


def _line(name: str, value: float | int | None, labels: dict[str, str] | None = None) -> str:
    if value is None:
        return ""
    label_text = ""
    if labels:
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        label_text = "{" + inner + "}"
    return f"{name}{label_text} {value}\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _update_metrics(update: dict[str, Any]) -> list[str]:
    """The A/B system: the slot running and whether the last update was kept (none off an
    A/B image)."""
    if not update.get("slot"):
        return []
    last = update.get("last") or {}
    failed = {"ok": 0, "failed": 1}.get(last.get("result"))
    return [
        _metric("cairn_system_slot_info", "gauge", "The root slot this boot runs (A or B).",
                [_line("cairn_system_slot_info", 1, {"slot": update["slot"]})]),
        _metric("cairn_update_last_failed", "gauge",
                "1 when the last system update was not kept (the device went back to the "
                "slot it came from), 0 when it was kept.",
                [_line("cairn_update_last_failed", failed,
                       {"version": str(last.get("version") or "")})]),
    ]


def _metric(name: str, kind: str, help_text: str, samples: list[str]) -> str:
    body = "".join(s for s in samples if s)
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{body}"


def render(status: dict[str, Any], counters: MessageCounters,
           commit_latencies: list[float]) -> str:
    """All metrics, from the node's status dict (see Node.status) and counters."""
    store = status.get("store") or {}
    sync = status.get("sync") or {}
    clock = status.get("clock") or {}
    wear = status.get("wear") or {}
    latencies = sorted(commit_latencies)
    parts = [
        _metric("cairn_uptime_seconds", "gauge", "Seconds since the router started.",
                [_line("cairn_uptime_seconds", status.get("uptime_s"))]),
        _metric("cairn_sessions", "gauge", "Open WAMP sessions per realm.",
                [_line("cairn_sessions", n, {"realm": realm})
                 for realm, n in status.get("sessions_by_realm", {}).items()]),
        _metric("cairn_messages_received_total", "counter", "WAMP messages received by type.",
                [_line("cairn_messages_received_total", n, {"type": t})
                 for t, n in counters.received_by_name().items()]),
        _metric("cairn_messages_sent_total", "counter", "WAMP messages sent by type.",
                [_line("cairn_messages_sent_total", n, {"type": t})
                 for t, n in counters.sent_by_name().items()]),
        _metric("cairn_slow_consumer_disconnects_total", "counter",
                "Sessions disconnected because they stopped reading.",
                [_line("cairn_slow_consumer_disconnects_total", status.get("slow_consumers"))]),
        _metric("cairn_protocol_violations_total", "counter",
                "Sessions aborted for breaking the protocol.",
                [_line("cairn_protocol_violations_total", status.get("protocol_violations"))]),
        _metric("cairn_config_fallback", "gauge",
                "1 while the router runs on its last good configuration: its config file "
                "failed validation or could not be started on (see cairn.router.status).",
                [_line("cairn_config_fallback",
                       int((status.get("config") or {}).get("running") == "last-good"))]),
        _metric("cairn_store_available", "gauge",
                "1 while the store is open; 0 while it cannot be (routing without storing).",
                [_line("cairn_store_available", 0 if status.get("store_error") else 1)]),
        _metric("cairn_store_bytes", "gauge", "Size of the SQLite store.",
                [_line("cairn_store_bytes", store.get("bytes"))]),
        _metric("cairn_history_events", "gauge", "Publications held in history.",
                [_line("cairn_history_events", store.get("events"))]),
        _metric("cairn_history_first_seq", "gauge", "Oldest seq held in history.",
                [_line("cairn_history_first_seq", store.get("first_seq"))]),
        _metric("cairn_history_last_seq", "gauge", "Newest seq held in history.",
                [_line("cairn_history_last_seq", store.get("last_seq"))]),
        _metric("cairn_history_oldest_timestamp_seconds", "gauge",
                "Wall-clock time of the oldest event held in history.",
                [_line("cairn_history_oldest_timestamp_seconds", _epoch(store.get("oldest")))]),
        _metric("cairn_history_newest_timestamp_seconds", "gauge",
                "Wall-clock time of the newest event held in history.",
                [_line("cairn_history_newest_timestamp_seconds", _epoch(store.get("newest")))]),
        _metric("cairn_history_dropped_events_total", "counter",
                "Events dropped to stay within bounds or lost to failed writes (gap records).",
                [_line("cairn_history_dropped_events_total", store.get("dropped_events"))]),
        _metric("cairn_store_failed_writes_total", "counter",
                "Publications the store could not write.",
                [_line("cairn_store_failed_writes_total", status.get("failed_writes"))]),
        _metric("cairn_store_damaged_rows_total", "counter",
                "Rows of the store that could not be decoded (a damaged card), left out of "
                "what was read, by table (cairn doctor lists them, cairn repair mends).",
                [_line("cairn_store_damaged_rows_total", n, {"table": table})
                 for table, n in sorted((status.get("store_damaged_rows") or {}).items())]),
        _metric("cairn_sync_damaged_rows_total", "counter",
                "History rows cairn sync could not decode and shipped as gaps (this run).",
                [_line("cairn_sync_damaged_rows_total", sync.get("damaged_rows"))]),
        _metric("cairn_store_queued_bytes", "gauge",
                "Payload bytes waiting for their commit (router.limits.max_store_queue_bytes).",
                [_line("cairn_store_queued_bytes", status.get("store_queued_bytes"))]),
        _metric("cairn_group_commit_seconds", "summary",
                "Latency of the store's group commits (recent commits).",
                [_line("cairn_group_commit_seconds", _quantile(latencies, q), {"quantile": str(q)})
                 for q in (0.5, 0.99)] +
                [_line("cairn_group_commit_seconds_count", len(latencies))]),
        _metric("cairn_retained_topics", "gauge", "Topics with a retained event.",
                [_line("cairn_retained_topics", status.get("retained_topics"))]),
        _metric("cairn_retained_slots", "gauge",
                "Retained slots (topic x audience; router.limits.max_retained).",
                [_line("cairn_retained_slots", status.get("retained_slots"))]),
        _metric("cairn_retained_bytes", "gauge",
                "Payload bytes of the retained slots (router.limits.max_retained_bytes).",
                [_line("cairn_retained_bytes", status.get("retained_bytes"))]),
        _metric("cairn_retained_cache_bytes", "gauge",
                "Encoded retained EVENT parts kept for the next subscribers (at most "
                "router.limits.max_retained_bytes / 16).",
                [_line("cairn_retained_cache_bytes", status.get("retained_cache_bytes"))]),
        _metric("cairn_sync_backlog_events", "gauge", "Events not yet shipped upstream.",
                [_line("cairn_sync_backlog_events", sync.get("backlog"))]),
        _metric("cairn_sync_synced_seq", "gauge", "Highest seq confirmed by the sink.",
                [_line("cairn_sync_synced_seq", store.get("synced_seq"))]),
        _metric("cairn_sync_last_success_timestamp_seconds", "gauge",
                "When the uploader last had a batch confirmed (or found nothing to send).",
                [_line("cairn_sync_last_success_timestamp_seconds",
                       _epoch(sync.get("last_success")))]),
        _metric("cairn_sync_ok", "gauge", "1 when the last sync attempt succeeded.",
                [_line("cairn_sync_ok", int(sync.get("last_error") is None) if sync else None)]),
        _metric("cairn_sync_sent_bytes_total", "counter",
                "Batch and manifest bytes the sink confirmed (HTTP headers not counted).",
                [_line("cairn_sync_sent_bytes_total", sync.get("bytes_sent"))]),
        _metric("cairn_sync_budget_bytes", "gauge",
                "The uploader's daily budget ([sync] daily_bytes); absent without one.",
                [_line("cairn_sync_budget_bytes", sync.get("budget_bytes") or None)]),
        _metric("cairn_sync_budget_used_bytes", "gauge",
                "Bytes sent in the budget's current 24 h window (health records may take "
                "it past the budget).",
                [_line("cairn_sync_budget_used_bytes",
                       sync.get("budget_used") if sync.get("budget_bytes") else None)]),
        _metric("cairn_sync_health_only", "gauge",
                "1 while the day's budget is spent: only health records are sent.",
                [_line("cairn_sync_health_only",
                       int(bool(sync.get("health_only"))) if sync else None)]),
        _metric("cairn_clock_synchronized", "gauge", "1 when the wall clock is synchronized.",
                [_line("cairn_clock_synchronized", int(bool(clock.get("synchronized"))))]),
        _metric("cairn_clock_steps_total", "counter", "Steps of the wall clock recorded.",
                [_line("cairn_clock_steps_total", store.get("clock_steps"))]),
        _metric("cairn_connections", "gauge",
                "Open connections: network (other hosts), local (Unix socket, loopback), "
                "and network ones without a session yet (pending).",
                [_line("cairn_connections", n, {"kind": kind})
                 for kind, n in (status.get("connections") or {}).items()]),
        _metric("cairn_limit_hits_total", "counter",
                "Times a bound of [router.limits] refused or cut something.",
                [_line("cairn_limit_hits_total", n, {"limit": limit})
                 for limit, n in sorted((status.get("limit_hits") or {}).items())]),
        _metric("cairn_process_written_bytes_total", "counter",
                "Bytes the router has written towards storage (its write_bytes).",
                [_line("cairn_process_written_bytes_total", wear.get("process_written_bytes"))]),
        _metric("cairn_disk_written_bytes_total", "counter",
                "Bytes written to the disk that holds the data directory, by anyone, since "
                "boot.",
                [_line("cairn_disk_written_bytes_total", wear.get("disk_written_bytes"),
                       {"disk": wear.get("disk") or ""})]),
        _metric("cairn_card_wear_measuring", "gauge",
                "1 while the card's write rate is still being measured (under an hour since "
                "the router started): no rate and no card life yet.",
                [_line("cairn_card_wear_measuring",
                       int(bool(wear.get("measuring"))) if wear else None)]),
        _metric("cairn_card_wear_window_seconds", "gauge",
                "The window the card's write rate is taken over (at most a day).",
                [_line("cairn_card_wear_window_seconds", wear.get("measured_s"))]),
        _metric("cairn_card_written_bytes_per_day", "gauge",
                "Bytes written to the card per day, over the last day.",
                [_line("cairn_card_written_bytes_per_day", wear.get("bytes_per_day"))]),
        _metric("cairn_card_life_years", "gauge",
                "Years a fresh card of router.card_endurance_tb lasts at that rate.",
                [_line("cairn_card_life_years", wear.get("life_years"))]),
        *_update_metrics(status.get("update") or {}),
        _metric("cairn_card_endurance_bytes", "gauge",
                "The card's write endurance (router.card_endurance_tb).",
                [_line("cairn_card_endurance_bytes", _bytes(wear.get("endurance_tb")))]),
    ]
    return "".join(parts)


def _bytes(tb: float | None) -> int | None:
    return None if tb is None else round(tb * 1e12)


def _epoch(rfc3339_text: str | None) -> float | None:
    if not rfc3339_text:
        return None
    try:
        return parse_rfc3339(rfc3339_text) / 1000
    except ValueError:
        return None


def quantile(values: Iterable[float], q: float, empty: Any = None) -> Any:
    """The nearest-rank quantile: the smallest of ``values`` with at least a share ``q`` of
    them at or below it (``empty`` when there are none). The one definition that /metrics
    and the benchmarks share."""
    ordered = sorted(values)
    if not ordered:
        return empty
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _quantile(values: list[float], q: float) -> float | None:
    found = quantile(values, q)
    return None if found is None else round(found, 6)
