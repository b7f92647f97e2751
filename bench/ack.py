"""Publish with acknowledge: PUBLISH(acknowledge=true) -> PUBLISHED round trip, Cairn vs
Crossbar.io. A part of ``python -m bench`` (``--only ack``).

Both servers store the topic (``bench.pubsub``): Cairn with a ``[[realms.history]]`` rule,
so PUBLISHED comes only after the SQLite transaction holding the event is committed with
fsync; Crossbar with an in-memory event history for the same URI (it has no durable store to
wait for). The history rule is an exact one and the subscriber subscribes exactly that URI:
in Crossbar that is the store's own subscription, the only kind it stores without logging a
warning per event (see :func:`bench.crossbar.node_config`).

Per server, transport and subscriber count (0 or 1): the lean blocking publisher of
:mod:`bench.wire` sends pre-serialized acknowledged PUBLISHes paced at ``rate``/s, one in
flight (the next waits for the PUBLISHED of the last, so a round trip longer than the
interval lowers the achieved rate, which is reported), after 20 warm-up publishes on another
session. Checked: every PUBLISHED answers its request, the subscriber (a
:class:`bench.pubsub.SubscriberGroup` process) received every event once and in order, and
Cairn's ``cairn_history_events`` (``/metrics``) grew by at least the number acknowledged.
"""

from __future__ import annotations

import argparse
import math
import re
import time
import urllib.request
from typing import Any

from bench.compare import LoadMeter, running_server
from bench.pubsub import SubscriberGroup, check, wait_delivered
from bench.wire import TOPIC, Publisher
from cairn.gateway.shell.metrics import quantile

CASES = [("rawsocket", "msgpack", 0), ("rawsocket", "msgpack", 1),
         ("websocket", "json", 0), ("websocket", "json", 1)]
WARMUP = 20


def paced_acks(pub: Publisher, n: int, rate: float) -> tuple[list[float], float]:
    """Round trips (s) of ``n`` acknowledged publishes started every 1/rate s (or when the
    previous one is answered, if later), and the achieved publishes/s."""
    interval = 1.0 / rate
    start = time.perf_counter() + 0.001
    rtts = []
    for i in range(n):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        rtts.append(pub.publish_ack(i, time.perf_counter_ns()))
    return rtts, n / (time.perf_counter() - start)


def cairn_history_events(server: Any) -> int | None:
    """``cairn_history_events`` from Cairn's /metrics (None for other servers)."""
    if server.name != "cairn":
        return None
    url = f"http://127.0.0.1:{server.ws_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(r"^cairn_history_events(?:\{[^}]*\})? (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else None


def ack_case(server: Any, transport: str, serializer: str, subscribers: int, rate: float,
             duration: float) -> dict[str, Any]:
    port = server.ws_port if transport == "websocket" else server.rs_port
    n = max(20, int(rate * duration))
    out: dict[str, Any] = {"transport": transport, "serializer": serializer,
                           "subscribers": subscribers, "rate_target": rate, "problems": []}
    group = SubscriberGroup(transport, serializer, port, 1, 1) if subscribers else None
    pub = None
    try:
        if group:
            group.wait_ready()
        warm = Publisher(transport, serializer, port, TOPIC)
        for i in range(WARMUP):
            warm.publish_ack(i, time.perf_counter_ns())
        warm.close()
        if group:
            if not wait_delivered(group.counts, WARMUP, 10):
                out["problems"].append("warm-up events did not all arrive")
            group.command("phase", "latency")
        stored0 = cairn_history_events(server)
        pub = Publisher(transport, serializer, port, TOPIC)
        meter = LoadMeter(server)
        rtts, achieved = paced_acks(pub, n, rate)
        out["load"] = meter.stop()
        values = sorted(rtts)
        out.update(published=n, rate=round(achieved),
                   p50_ms=round(quantile(values, 0.5, math.nan) * 1e3, 3),
                   p99_ms=round(quantile(values, 0.99, math.nan) * 1e3, 3),
                   max_ms=round(values[-1] * 1e3, 3))
        stored1 = cairn_history_events(server)
        if server.name == "cairn" and (stored0 is None or stored1 is None
                                       or stored1 - stored0 < n):
            out["problems"].append(f"cairn_history_events grew {stored0} -> {stored1}, "
                                   f"expected +{n}")
        if group:
            wait_delivered(group.counts, n, 10)
            stats = group.command("stop")
            out["problems"] += check(stats, n, 1)
            events = sorted(stats.latencies)
            out.update(event_p50_ms=round(quantile(events, 0.5, math.nan) / 1e6, 3),
                       event_p99_ms=round(quantile(events, 0.99, math.nan) / 1e6, 3))
    except Exception as e:
        out["problems"].append(f"failed: {type(e).__name__}: {e}")
    finally:
        if pub is not None:
            pub.close()
        if group:
            group.close()
    out["ok"] = not out["problems"]
    return out


def run(kind: str, opts: argparse.Namespace) -> dict[str, Any]:
    """All ack cases against one server started with history on the topic."""
    out: dict[str, Any] = {"server": kind, "cases": [], "problems": []}
    with running_server(kind, opts, history=(TOPIC, "exact")) as server:
        out["startup_s"] = round(server.startup_s, 3)
        for transport, serializer, subs in CASES:
            print(f"  {kind} ack {transport}/{serializer} subscribers={subs} ...", end=" ",
                  flush=True)
            r = ack_case(server, transport, serializer, subs, opts.ack_rate, opts.ack_duration)
            out["cases"].append(r)
            print(f"p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms @ {r.get('rate')}/s"
                  + ("" if r["ok"] else f"  PROBLEMS: {r['problems']}"), flush=True)
        out["problems"] += [line for line in server.log_lines()
                            if "Traceback" in line or "ERROR" in line
                            or "WARNING" in line.upper()][:20]
    return out
