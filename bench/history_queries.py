"""The get_events part of the store benchmark: the cases, their pages checked, timed
through the router, and afterwards the SQL each case runs, with its plan and bare time."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.lean_wamp import WampClient, WampError
from bench.measure import CpuMeter, fmt_ms, latency_summary, rounded
from bench.store_data import (
    DEVICES,
    HISTORY_PREFIX,
    PAGE,
    SPARSE_PREFIX,
    SPARSE_TOPIC,
    device_topic,
)
from cairn.base.clock_readings import rfc3339
from cairn.gateway.core.config import Limits
from cairn.gateway.core.history import EventsQuery, history_query
from cairn.gateway.core.patterns import wildcard_matches
from cairn.gateway.store import Store, eligible

# -- 3. get_events ----------------------------------------------------------------------------


GET_EVENTS_CASES = [  # "sub": the prefix subscription queried
    {"id": "newest", "sub": HISTORY_PREFIX, "label": "get_events newest page (reverse)"},
    {"id": "middle", "sub": HISTORY_PREFIX,
     "label": "get_events middle page (after_publication)"},
    {"id": "window", "sub": HISTORY_PREFIX,
     "label": "get_events 1-minute time window (middle)"},
    {"id": "topic", "sub": HISTORY_PREFIX,
     "label": "get_events topic filter (1% of events, reverse)"},
    {"id": "sparse", "sub": SPARSE_PREFIX,
     "label": f"extra: get_events sparse prefix '{SPARSE_PREFIX}' (0.02%, reverse)"},
]


def make_query(case: str, pop: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], Any]:
    """(get_events kwargs, what to check the page against)."""
    if case == "newest":
        return {"limit": PAGE, "reverse": True}, None
    if case == "middle":
        pubs = pop["mid_pubs"]
        k = rng.randrange(len(pubs) - PAGE - 1)
        return {"limit": PAGE, "after_publication": pubs[k]}, pubs[k + 1:k + 1 + PAGE]
    if case == "window":
        span = pop["last_ms"] - pop["first_ms"]
        start = pop["first_ms"] + span // 2 + rng.randrange(-span // 20, span // 20 + 1)
        start -= start % 1000
        return ({"limit": PAGE, "from_time": rfc3339(start),
                 "until_time": rfc3339(start + 60_000)}, (start, start + 60_000))
    if case == "topic":
        topic = device_topic(rng.randrange(DEVICES))
        return {"limit": PAGE, "reverse": True, "topic": topic}, topic
    if case == "sparse":
        return {"limit": PAGE, "reverse": True}, pop["sparse_events"]
    raise ValueError(case)


def check_page(case: str, events: list[dict[str, Any]], more: bool, expect: Any) -> str | None:
    if case == "sparse":
        if len(events) != min(PAGE, expect) or more != (expect > PAGE):
            return f"{len(events)} events (is_limit_reached={more}) of {expect} stored"
        if any(e["details"].get("topic") != SPARSE_TOPIC for e in events):
            return f"events of other topics in the page of {SPARSE_PREFIX!r}"
        return None
    if len(events) != PAGE or not more:
        return f"{len(events)} events (is_limit_reached={more}), expected a full page of {PAGE}"
    stamps = [e["timestamp"] for e in events]
    if case in ("newest", "topic", "sparse") and stamps != sorted(stamps, reverse=True):
        return "page not newest-first"
    if case == "middle" and [e["publication"] for e in events] != expect:
        return "page is not the 100 events after the given publication"
    if case == "window":
        lo, hi = rfc3339(expect[0]), rfc3339(expect[1])
        if not all(lo <= s <= hi for s in stamps) or stamps != sorted(stamps):
            return "events outside the time window or out of order"
    if case == "topic" and any(e["details"].get("topic") != expect for e in events):
        return "events of other topics in a topic-filtered page"
    return None


async def bench_get_events(client: WampClient, pid: int, sub_ids: dict[str, int],
                           pop: dict[str, Any], calls: int, budget_s: float,
                           seed: int) -> list[dict[str, Any]]:
    results = []
    for case in GET_EVENTS_CASES:
        rng = random.Random(seed)
        meter = CpuMeter(pid)
        problems: list[str] = []
        notes: list[str] = []
        lat: list[int] = []
        t_end = None
        for i in range(5 + calls):
            kwargs, expect = make_query(case["id"], pop, rng)
            t0 = time.perf_counter_ns()
            try:
                args, kw, now = await client.call("wamp.subscription.get_events",
                                                  [sub_ids[case["sub"]]], kwargs)
            except (WampError, TimeoutError) as e:
                problems.append(f"{type(e).__name__}: {e}")
                break
            if i >= 5:
                lat.append(now - t0)
                t_end = t_end or time.monotonic() + budget_s
            problem = check_page(case["id"], args[0] if args else [],
                                 bool(kw.get("is_limit_reached")), expect)
            if problem and len(problems) < 3:
                problems.append(problem)
            if t_end is not None and time.monotonic() > t_end and len(lat) >= 10:
                notes.append(f"stopped at the time budget of {budget_s:.0f} s after "
                             f"{len(lat)} of {calls} calls")
                break
        summary = latency_summary(lat)
        results.append({**case, **summary, "cpu": meter.stop(), "example_kwargs": make_query(
            case["id"], pop, random.Random(seed))[0], "problems": problems, "notes": notes,
            "ok": not problems})
        print(f"  {case['label']}: p50 {fmt_ms(summary['p50_ms'])}, p99 "
              f"{fmt_ms(summary['p99_ms'])} ({summary['n']} calls)"
              + (f"; {notes[0]}" if notes else "")
              + (f"  PROBLEMS: {problems}" if problems else ""), flush=True)
    return results


# -- 7. diagnosis: the SQL get_events runs ------------------------------------------------------


async def diagnose_get_events(db_path: Path, sub_ids: dict[str, int], pop: dict[str, Any],
                              seed: int) -> dict[str, Any]:
    """Replay each get_events case through gateway.core.history.history_query on a Store opened on
    the benchmark database (router stopped), record the SQL it runs, and show its query plan
    and its bare execution time."""
    store = await Store.open(db_path)
    recorded: list[tuple[str, tuple[Any, ...]]] = []
    query_fn = store.reader.query

    async def recording_query(sql: str, params: Any, *limits: Any) -> list[tuple[Any, ...]]:
        recorded.append((sql, tuple(params)))
        return await query_fn(sql, params, *limits)

    store.reader.query = recording_query  # type: ignore[method-assign]
    realm = SimpleNamespace(name="realm1", limits=Limits(),
                            broker=SimpleNamespace(may_receive=lambda session, topic: True))
    caller = SimpleNamespace(id=1, authid="bench", authrole="anonymous", closed=False)
    out: dict[str, Any] = {}
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    db.create_function("eligible", 3, eligible, deterministic=True)
    db.create_function("wildcard_match", 2, wildcard_matches, deterministic=True)
    try:
        for case in GET_EVENTS_CASES:
            kwargs, _ = make_query(case["id"], pop, random.Random(seed))
            runs = []
            for _ in range(3):
                recorded.clear()
                t0 = time.perf_counter()
                sub = SimpleNamespace(id=sub_ids[case["sub"]], uri=case["sub"], match="prefix")
                query = history_query(realm, caller, sub, EventsQuery.parse(kwargs), 1000)
                query.result(await store.reader.read_history(query.request))
                runs.append((time.perf_counter() - t0) * 1000)
                if runs[-1] > 500:
                    break
            in_process_ms = sorted(runs)[len(runs) // 2]
            statements = []
            for sql, params in recorded:
                plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
                times = []
                for _ in range(5):
                    t1 = time.perf_counter()
                    db.execute(sql, params).fetchall()
                    times.append((time.perf_counter() - t1) * 1000)
                    if times[-1] > 500:
                        break
                statements.append({"sql": sql, "params": list(params), "plan": plan,
                                   "sql_ms_median": rounded(sorted(times)[len(times) // 2])})
            out[case["id"]] = {"kwargs": kwargs, "in_process_ms": rounded(in_process_ms),
                               "statements": statements}
    finally:
        db.close()
        await store.close()
    return out
