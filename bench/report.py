"""The summary of ``python -m bench``: one row per figure (Cairn | Crossbar | Mosquitto |
ratio | target | result), as a text table and as Markdown for docs/benchmarks.md."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.pubsub import fmt

Check = Callable[[float | None, float | None], bool | None]  # (cairn, ratio) -> pass?

MS = ".2f"
SHORT = {"websocket": "ws", "rawsocket": "rs"}


@dataclass
class Row:
    metric: str
    cairn: Any = None
    crossbar: Any = None
    mosquitto: Any = None
    spec: str = ""
    target: str = ""
    result: str = "info"  # pass, FAIL, info, ERROR
    ratio: float | None = None
    anchor: str = "crossbar"  # what the ratio divides by


def ratio(cairn: Any, anchor: Any) -> float | None:
    if not isinstance(cairn, int | float) or not isinstance(anchor, int | float) or not anchor:
        return None
    return round(cairn / anchor, 2)


def row(metric: str, cairn: Any, crossbar: Any = None, mosquitto: Any = None, spec: str = "",
        target: str = "", passes: Check | None = None, ok: bool = True,
        anchor: str = "crossbar") -> Row:
    """Ratio: Cairn / Crossbar, or / Mosquitto (``anchor``, or where Crossbar has no
    number)."""
    q = ratio(cairn, crossbar) if anchor == "crossbar" else None
    if q is None:
        q, anchor = ratio(cairn, mosquitto), "mosquitto"
    r = Row(metric, cairn, crossbar, mosquitto, spec, target, ratio=q, anchor=anchor)
    if not ok:
        r.result = "ERROR"
    elif passes is not None:
        verdict = passes(cairn if isinstance(cairn, int | float) else None, q)
        r.result = "-" if verdict is None else "pass" if verdict else "FAIL"
    return r


def at_least(limit: float) -> Check:
    return lambda _c, q: None if q is None else q >= limit


def at_most(limit: float) -> Check:
    return lambda _c, q: None if q is None else q <= limit


# -- rows per part ----------------------------------------------------------------------------


def pubsub_rows(compare: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    crossbar = {case_key(r): r for r in compare["crossbar"]["results"]}
    for c in compare["cairn"]["results"]:
        x = crossbar.get(case_key(c), {})
        name = f"{c['case']} {SHORT[c['transport']]}/{c['serializer']}"
        ok = c["ok"] and bool(x) and x["ok"]
        targeted = c["subscribers"] in (1, 100)
        rows.append(row(f"pub/sub {name}: events/s", c.get("events_per_s"),
                        x.get("events_per_s"), spec=",", target=">= 3x" if targeted else "",
                        passes=at_least(3) if targeted else None, ok=ok))
        rate = c.get("lat_rate")
        rows.append(row(f"pub/sub {name}: p50 ms @ {fmt(rate, ',')}/s", c.get("p50_ms"),
                        x.get("p50_ms"), spec=MS, ok=ok))
        rows.append(row(f"pub/sub {name}: p99 ms @ {fmt(rate, ',')}/s", c.get("p99_ms"),
                        x.get("p99_ms"), spec=MS, target="<= 0.5x", passes=at_most(0.5),
                        ok=ok))
    return rows


def case_key(r: dict[str, Any]) -> tuple[str, str, int]:
    return r["transport"], r["serializer"], r["subscribers"]


def server_rows(compare: dict[str, Any], starts: dict[str, list[float]],
                mosquitto: dict[str, Any] | None) -> list[Row]:
    cairn, crossbar = compare.get("cairn", {}), compare.get("crossbar", {})
    mosq = mosquitto or {}
    return [
        row(f"start-up s, to all ports accepting (median of {len(starts.get('cairn', []))} "
            f"vs {len(starts.get('crossbar', []))} starts)", median(starts.get("cairn")),
            median(starts.get("crossbar")), mosq.get("startup_s"), spec=".2f",
            target="< 1 s", passes=lambda c, _q: None if c is None else c < 1.0),
        row("idle RSS MiB (process tree, before any client)", mib(cairn.get("idle_rss")),
            mib(crossbar.get("idle_rss")), mib(mosq.get("idle_rss")), spec=".1f",
            target="<= 0.25x", passes=at_most(0.25)),
        row("RSS MiB after the pub/sub workload", mib(cairn.get("rss_after")),
            mib(crossbar.get("rss_after")), spec=".1f"),
    ]


def ack_rows(ack: dict[str, dict[str, Any]]) -> list[Row]:
    rows = []
    crossbar = {case_key(r): r for r in ack.get("crossbar", {}).get("cases", [])}
    for c in ack.get("cairn", {}).get("cases", []):
        x = crossbar.get(case_key(c), {})
        name = (f"{SHORT[c['transport']]}/{c['serializer']}, "
                f"{c['subscribers'] or 'no'} subscriber{'' if c['subscribers'] == 1 else 's'}")
        ok = c["ok"] and (not x or x["ok"])
        for q in ("p50", "p99"):
            rows.append(row(f"publish acknowledge {name}: {q} ms @ {fmt(c.get('rate'), ',')}/s",
                            c.get(f"{q}_ms"), x.get(f"{q}_ms"), spec=MS, ok=ok))
    return rows


def retained_rows(ret: dict[str, dict[str, Any]]) -> list[Row]:
    cairn, crossbar, mosq = (ret.get(k, {}) for k in ("cairn", "crossbar", "mosquitto"))
    n = cairn.get("retained") or mosq.get("retained")
    rows = []
    prefix_x = crossbar.get("prefix", {})
    no_prefix = (f"none ({prefix_x.get('delivered_min')} of {n})"
                 if prefix_x and prefix_x.get("delivered_min", 0) < (n or 0) else None)
    # Crossbar's prefix shortfall is the finding, not an error of the run
    ok_c = bool(cairn.get("prefix", {}).get("ok")) and "error" not in cairn
    ok_m = not mosq or (bool(mosq.get("prefix", {}).get("ok")) and "error" not in mosq)
    repeats = get(cairn, "prefix", "repeats")
    for label, key in (("SUBSCRIBED", "subscribed"), ("last EVENT", "last")):
        for q in ("p50", "p99"):
            rows.append(row(
                f"get_retained prefix, {n:,} topics -> {label}: {q} ms of {repeats} (MQTT: "
                f"prefix/#, {'SUBACK' if key == 'subscribed' else 'last PUBLISH'})",
                get(cairn, "prefix", key, f"{q}_ms"),
                no_prefix if key == "last" else get(crossbar, "prefix", key, f"{q}_ms"),
                get(mosq, "prefix", key, f"{q}_ms"), spec=MS, ok=ok_c and ok_m,
                anchor="mosquitto"))
    ok_x = not crossbar or "error" not in crossbar
    for q in ("p50", "p99"):
        rows.append(row(f"get_retained exact topic -> its EVENT: {q} ms of "
                        f"{get(cairn, 'exact', 'event', 'n')}",
                        get(cairn, "exact", "event", f"{q}_ms"),
                        get(crossbar, "exact", "event", f"{q}_ms"), spec=MS,
                        ok=bool(get(cairn, "exact", "ok")) and ok_x
                        and get(crossbar, "exact", "ok") is not False))
    rows.append(row(f"get_retained {n:,} exact SUBSCRIBEs at once -> last EVENT: p50 ms",
                    get(cairn, "all_exact", "last", "p50_ms"),
                    get(crossbar, "all_exact", "last", "p50_ms"), spec=MS,
                    ok=bool(get(cairn, "all_exact", "ok")) and ok_x
                    and get(crossbar, "all_exact", "ok") is not False))
    return rows


def sessions_rows(sessions: dict[str, dict[str, Any]]) -> list[Row]:
    rows = []
    crossbar = {(r["transport"], r["serializer"]): r
                for r in sessions.get("crossbar", {}).get("cases", [])}
    for c in sessions.get("cairn", {}).get("cases", []):
        x = crossbar.get((c["transport"], c["serializer"]), {})
        rows.append(row(f"{c['sessions']:,} idle sessions {SHORT[c['transport']]}/"
                        f"{c['serializer']}: MiB per 1,000", c.get("mib_per_1000"),
                        x.get("mib_per_1000"), spec=".1f",
                        ok=c["ok"] and (not x or x["ok"])))
    return rows


def footprint_rows(fp: dict[str, Any]) -> list[Row]:
    return [row("installed MiB (runtime venv; Mosquitto: package)",
                fp.get("cairn", {}).get("mib"), fp.get("crossbar", {}).get("mib"),
                fp.get("mosquitto", {}).get("mib"), spec=".1f", ok="cairn" in fp)]


def durable_rows(d: dict[str, Any]) -> list[Row]:
    return [row(f"durable publishes/s, {d.get('publishers')} publishers x "
                f"{d.get('window')} in flight (acknowledged, fsynced)", d.get("per_s"), spec=",",
                target=">= 20,000", passes=lambda c, _q: None if c is None else c >= 20_000,
                ok=bool(d.get("ok"))),
            Row(f"durable publishes: the same clients against a trivial server: "
                f"{fmt(d.get('generator_per_s'), ',')}/s", ratio=ratio(d.get("per_s"),
                                                                     d.get("generator_per_s")),
                anchor="clients alone")]


def fanout_rows(compare: dict[str, Any], fanout: dict[str, Any]) -> list[Row]:
    """Issue 46's figures: each 1->1 and 1->10 case's server CPU per delivered event (Cairn
    on its default config, Crossbar, Mosquitto's 1->N over MQTT QoS 0), Cairn's events/s
    against Mosquitto's, and Cairn's default config against its limits lifted."""
    default = {case_key(r): r for r in compare.get("cairn", {}).get("results", [])}
    crossbar = {case_key(r): r for r in compare.get("crossbar", {}).get("results", [])}
    mosquitto = {r["subscribers"]: r for r in fanout.get("mosquitto", [])}
    rows = []
    for lifted in fanout.get("cairn_lifted", {}).get("results", []):
        key = case_key(lifted)
        c, x, q = default.get(key, {}), crossbar.get(key, {}), mosquitto.get(key[2], {})
        name = f"{lifted['case']} {SHORT[lifted['transport']]}/{lifted['serializer']}"
        ok = c.get("ok", False) and lifted["ok"] and q.get("ok", False)
        rows.append(row(f"pub/sub {name}: server CPU µs per delivered event",
                        c.get("server_cpu_us_per_event"), x.get("server_cpu_us_per_event"),
                        q.get("broker_cpu_us_per_event"), spec=".1f", ok=ok))
        rows.append(row(f"pub/sub {name}: events/s against Mosquitto's 1->{key[2]} (MQTT QoS 0)",
                        c.get("events_per_s"), mosquitto=q.get("events_per_s"), spec=",",
                        target=">= 0.25x" if key[2] == 1 else "",
                        passes=at_least(0.25) if key[2] == 1 else None, ok=ok,
                        anchor="mosquitto"))
        r = Row(f"pub/sub {name}: events/s with the limits lifted "
                f"({fmt(c.get('events_per_s'), ',')} on the default config)",
                lifted.get("events_per_s"), spec=",", target=">= 0.9x" if key[2] == 1 else "",
                ratio=ratio(c.get("events_per_s"), lifted.get("events_per_s")),
                anchor="lifted")
        r.result = ("ERROR" if not ok else "-" if r.ratio is None or key[2] != 1
                    else "pass" if r.ratio >= 0.9 else "FAIL")
        rows.append(r)
    return rows


def check_rows(compare: dict[str, Any], check: list[dict[str, Any]]) -> list[Row]:
    """Generator check: the clients against a trivial server must outrun the fastest
    router by a margin, or the router figures measure the clients. The same run gives the
    latency floor: what the clients, the kernel and the machine take without any router."""
    routers = compare.get("cairn", {}).get("results", []) + \
        compare.get("crossbar", {}).get("results", [])
    crossbar = {case_key(r): r for r in compare.get("crossbar", {}).get("results", [])}
    rows = []
    for f in check:
        best = max((r.get("events_per_s") or 0 for r in routers
                    if case_key(r) == case_key(f)), default=0)
        name = f"{f['case']} {SHORT[f['transport']]}/{f['serializer']}"
        q = ratio(f.get("events_per_s"), best)
        r = Row(f"generator check {name}: {fmt(f.get('events_per_s'), ',')} events/s with the "
                f"{f['server']} server", target=">= 1.5x", ratio=q, anchor="fastest router")
        r.result = ("ERROR" if not f["ok"] else "-" if q is None
                    else "pass" if q >= 1.5 else "FAIL")
        rows.append(r)
    for f in check:
        name = f"{f['case']} {SHORT[f['transport']]}/{f['serializer']}"
        floor = f.get("p99_ms")
        anchor = crossbar.get(case_key(f), {}).get("p99_ms")
        rows.append(Row(f"latency floor {name}: p99 {fmt(floor, '.2f')} ms with the "
                        f"{f['server']} server @ {fmt(f.get('lat_rate'), ',')}/s",
                        crossbar=anchor, spec=MS, ratio=ratio(floor, anchor), anchor="floor"))
    return rows


# -- helpers and rendering ----------------------------------------------------------------------


def get(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def median(values: list[float] | None) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
                 3)


def mib(rss: dict[str, Any] | None) -> float | None:
    return round(rss["rss_bytes"] / 2**20, 1) if rss else None


def cell(value: Any, spec: str) -> str:
    if isinstance(value, int | float):
        return format(value, spec)
    return "-" if value is None else str(value)


HEAD = ("metric", "Cairn", "Crossbar", "Mosquitto", "ratio", "target", "result")


ANCHOR_MARK = {"crossbar": "", "mosquitto": " (M)", "fastest router": " (R)",
               "clients alone": " (C)", "floor": " (F)", "lifted": " (L)"}


def cells(r: Row) -> tuple[str, ...]:
    q = cell(r.ratio, ".2f") + (ANCHOR_MARK[r.anchor] if r.ratio is not None else "")
    return (r.metric, cell(r.cairn, r.spec), cell(r.crossbar, r.spec),
            cell(r.mosquitto, r.spec), q, r.target or "-", r.result)


def text_table(rows: list[Row]) -> str:
    return aligned([HEAD, *(cells(r) for r in rows)])


def aligned(lines: Sequence[Sequence[str]]) -> str:
    """``lines`` (the head first) as a text table: the first column left-aligned, the others
    right-aligned, a rule of dashes under the head."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for i, line in enumerate(lines):
        out.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                             for j, (c, w) in enumerate(zip(line, widths, strict=True))))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|---" + "|---:" * (len(HEAD) - 1) + "|"]
    for r in rows:
        c = list(cells(r))
        c[-1] = f"**{c[-1]}**" if c[-1] in ("FAIL", "ERROR") else c[-1]
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in c) + " |")
    return "\n".join(out)


def as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


LEGEND = """\
ratio: Cairn ÷ Crossbar; (M) Cairn ÷ Mosquitto; (R) the trivial server's figure ÷ the fastest
router's; (C) Cairn ÷ the same clients against a trivial server; (F) the trivial server's p99 ÷
Crossbar's: the part of the latency no router can remove; (L) Cairn on its default config ÷
with its limits lifted (a lone client must not be held back). Lower is better for ms, MiB
and s, higher for events/s and publishes/s. result: pass/FAIL against the target (issues 9
and 46), info (no target), ERROR (a correctness check failed: see problems), - (no figure to
judge)."""


def disturbance_line(d: dict[str, Any]) -> str:
    text = (f"other programs used up to {d['max_other_cpu_pct']}% of a CPU during a measured "
            f"phase ({d['where']}); {d['phases_over_15_pct']} of {d['phases']} phases above 15%")
    if d["phases_over_15_pct"]:
        text += ": the machine was not quiet, rerun on a quiet one for figures to publish"
    return text


def machine_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    m, src = s["machine"], s["source"]
    dirty = " (with local changes under gateway/)" if src.get("gateway_dirty") else ""
    return [
        ("CPU", f"{m['cpu_model']}, {m['nproc']} cores ({m['usable_cpus']} usable)"),
        ("RAM", f"{m['mem_gib']} GiB"),
        ("kernel", f"Linux {m['kernel']} ({m['platform']})"),
        ("Python", f"{m['implementation']} {m['python']} (Cairn and Crossbar alike)"),
        ("autobahn", f"{m['autobahn']} (Cairn), {m.get('crossbar_autobahn')} (Crossbar)"),
        ("Crossbar.io", str(m.get("crossbar"))),
        ("Mosquitto", str(m.get("mosquitto"))),
        ("SQLite", m["sqlite"]),
        ("date", s["when"]),
        ("git commit", f"{src.get('commit')}{dirty}"),
        ("load average before / after", f"{fmt_load(m['loadavg_before'])} / "
                                         f"{fmt_load(m.get('loadavg_after'))}"),
        ("run", f"{'quick (--quick)' if s['quick'] else 'full'}, {s['total_s']:.0f} s"),
    ]


def fmt_load(load: Any) -> str:
    return " ".join(f"{x:.2f}" for x in load) if load else "-"


def findings(s: dict[str, Any]) -> list[str]:
    """Measured facts the table cannot show, for the caveats."""
    parts, out = s["parts"], []
    n = get(parts, "retained", "cairn", "retained")
    cb = get(parts, "retained", "crossbar", "prefix", "delivered_min")
    if cb is not None and n and cb < n:
        out.append(f"Crossbar delivered {cb} of {n:,} retained events to a prefix subscription "
                   "with get_retained (it keeps retained events on the exact topic only, one "
                   "per subscription), so only exact-topic subscriptions compare.")
    lean = get(parts, "retained", "mosquitto", "prefix", "last", "p50_ms")
    aio = get(parts, "retained", "mosquitto", "aiomqtt", "last", "p50_ms")
    nagle = get(parts, "retained", "mosquitto", "default_config", "prefix", "last", "p50_ms")
    if lean is not None and aio is not None:
        out.append(f"Mosquitto's {n:,} retained messages reached the lean MQTT client in "
                   f"{lean:.2f} ms (p50) and aiomqtt in {aio:.2f} ms: a full client library "
                   "would be the bottleneck, so the table uses the lean client.")
    if nagle is not None:
        out.append(f"With Mosquitto's default set_tcp_nodelay false, the same took {nagle:.2f} ms "
                   "(p50): the retained messages wait behind the small SUBACK for the "
                   "client's delayed ACK. The table's Mosquitto runs with set_tcp_nodelay "
                   "true, as Cairn's and Crossbar's sockets are.")
    busy = [f"{side} {r['case']} {SHORT[r['transport']]} ({r['lat_other_cpu_pct']}%)"
            for side in ("cairn", "crossbar")
            for r in get(parts, "pubsub", side, "results") or []
            if (r.get("lat_other_cpu_pct") or 0) > 15]
    if busy:
        out.append("Other programs used more than 15% of a CPU during these pub/sub latency "
                   f"phases: {', '.join(busy)}. On 2 cores that delays the router or the "
                   "clients by whole scheduler slices (ms), so those p99s say more about the "
                   "neighbours than about the router.")
    acked = get(parts, "retained", "cairn", "prefix", "subscribed", "p50_ms")
    last = get(parts, "retained", "cairn", "prefix", "last", "p50_ms")
    if acked is not None and last and acked > 0.5 * last:
        out.append(f"Cairn writes SUBSCRIBED for a get_retained subscription together with "
                   f"the retained events, by design (one outbox, so no live event can come "
                   f"between them): it arrives after {acked:.2f} ms of the {last:.2f} ms "
                   "(p50), where Crossbar and Mosquitto acknowledge first.")
    return out


HOW_MEASURED = """\
- **Servers** run one at a time on 127.0.0.1, each part on a freshly started server with a
  new data directory. Cairn: `cairn router`, realm `realm1`, the anonymous role may publish
  and subscribe, WebSocket at `/ws` and a RawSocket TCP listener, log level warning.
  Crossbar.io: from PyPI in its own venv (`python -m bench.crossbar --install`), one router
  worker, the same realm, role and transports, `--loglevel warn`. No event history except
  in the acknowledge part. Mosquitto 2: persistence off, `set_tcp_nodelay true`.
- **Clients** are lean hand-written WAMP/MQTT clients (`bench/wire.py`, `bench/store.py`,
  `bench/retained.py`): pre-serialized frames, only ids, sequence numbers and timestamps
  filled in; subscribers spread over several processes. Every figure is checked: each
  subscriber counts its events and checks their sequence numbers, every PUBLISHED answers
  its request, every retained event is decoded and matched to its topic after the timing.
  The *generator check* runs the same clients against a trivial fan-out server that
  coalesces its writes (`bench.wire.FakeBroker`, "fake-batch"): the clients' ceiling, which
  should be at least 1.5x the fastest router's figure; where it is not, that router's figure
  is partly the clients' limit (a lower bound for the router).
- **pub/sub**: one publisher, N subscribers on one topic. Throughput phase: the publisher
  sends batches of 50 PUBLISHes, never more than 1,000 ahead of the slowest subscriber;
  events/s = events received by all subscribers / (last delivery - first send). Latency
  phase: paced at the same rate for both servers (1,000/s, or half of Crossbar's measured
  capacity if less); publish->event p50/p99 over all subscribers' events (the send time
  travels in the event).
- **start-up**: from spawning the process until both the WebSocket and the RawSocket port
  accept a TCP connection, the median of every start in the run. **Idle RSS**: VmRSS summed
  over the server's process tree (Crossbar: controller + router worker) after {settle} s
  idle.
- **publish acknowledge**: PUBLISH(acknowledge=true) -> PUBLISHED, one in flight, paced at
  {ack_rate:.0f}/s for {ack_duration} s after 20 warm-up publishes, on a topic each server
  keeps history for (Cairn: a `[[realms.history]]` rule, so PUBLISHED waits for the fsynced
  SQLite commit; Crossbar: its in-memory event history), with no subscriber and with one.
- **get_retained**: {retained:,} topics with a retained event each; on a new connection
  (connecting not timed) SUBSCRIBE(prefix, get_retained) -> SUBSCRIBED and -> the last
  retained EVENT; Mosquitto: a new MQTT client SUBSCRIBEs `prefix/#` -> SUBACK and -> the
  last retained PUBLISH. Also one exact topic -> its EVENT, and all exact SUBSCRIBEs sent at
  once -> the last EVENT (what a Crossbar client has to do to get every value). Percentiles
  over few repeats: p99 is the slowest one.
- **idle sessions**: {sessions:,} sessions, each joined and subscribed to a topic of its own,
  opened from {session_procs} processes; RSS of the server's process tree before and
  {settle} s after the last SUBSCRIBED; a fresh server per transport.
- **durable publishes**: `python -m bench.store --only publish` (16 lean publisher sessions
  in 2 processes, each keeping {durable_window} acknowledged retained publishes in flight on
  its own history topic, over a store holding {durable_events:,} events, for
  {durable_duration} s); PUBLISHED only after the fsynced group commit.
- **footprint**: a fresh venv with `pip install .` (no test extras) vs Crossbar's venv (both
  `python3 -m venv`, interpreter not counted); Mosquitto: the Debian package's
  Installed-Size, without the shared libraries it links."""

CAVEATS = """\
- 2 CPU cores: clients and server share them, so every CPU-second a client spends is one the
  server does not get, for both servers alike. The other-CPU figures in
  `bench/results/summary.json` show how much else ran meanwhile.
- Crossbar runs a controller and a router worker process; more router workers (a cluster)
  are not configured. Cairn is one process.
- publish acknowledge is not like for like: Cairn's PUBLISHED comes after the event is on
  disk (fsync), Crossbar's after it is in memory.
- Retained events: Cairn keeps them in SQLite (surviving restarts), Crossbar and this
  Mosquitto in memory.
- Crossbar 26.10.1 with an event store logs a warning for every event it delivers on a
  subscription the store does not know (any topic without history), which halves its
  throughput; so the pub/sub part runs both servers without history, and the acknowledge
  part's subscriber subscribes the history's own URI (exact), which Crossbar stores quietly.
- The idle sessions subscribe a topic each, so per-subscription state counts too; 1,000
  sessions on one topic would cost less on both servers.
- The generator check runs on the same 2 cores as everything else; a router whose figure is
  close to the clients' ceiling is measured low, never high.
- p99 latency at 1,000 events/s is mostly not the router's: each event wakes the router and
  then the subscriber from idle, and on this VM those wake-ups vary by tenths of a ms. The
  *latency floor* rows run the same latency phase against the trivial server: its p99 is what
  no router can remove, and a p99 ratio can only be read against the floor's (F) ratio."""


INTRO = """Generated by `make bench` (`.venv/bin/python -m bench`, see `bench/__main__.py`);
the details of this run went to `bench/results/summary.json` (not committed). Issue 9's
targets: events/s 1->1 and 1->100 at least 3x Crossbar's, p99 latency at most half, idle RSS
at most a quarter, start-up under 1 s, durable publishes at least 20,000/s with 16
publishers. Issue 46's: events/s 1->1 at least a quarter of Mosquitto's, and Cairn on its
default config within 10 % of its limits lifted when a client is alone (the server CPU per
delivered event is shown for all three servers)."""


def wrap(text: str, first: str = "") -> str:
    return textwrap.fill(" ".join(text.split()), 94, initial_indent=first,
                         subsequent_indent="  " if first else "")


def bullets(items: list[str]) -> str:
    return "\n".join(wrap(item, "- ") for item in items)


def items(text: str) -> list[str]:
    """The bullets of a "- ..." list written in this file."""
    return text.removeprefix("- ").split("\n- ")


def markdown(s: dict[str, Any], rows: list[Row]) -> str:
    quick = ("\n> **Quick run** (`--quick`: short phases, few samples per figure): the "
             "figures are indicative only.\n> Regenerate with `make bench` on a quiet machine "
             "before quoting them.\n" if s["quick"] else "")
    lines = ["# Benchmarks: Cairn side by side with Crossbar.io and Mosquitto", "",
             wrap(INTRO), quick, "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine_rows(s)]
    lines += ["", "## Results", "", markdown_table(rows), "", LEGEND, "",
              wrap(disturbance_line(s["disturbance"]) + ".")]
    if s["errors"]:
        lines += ["", "Problems:", ""] + [f"- {e}" for e in s["errors"]]
    lines += ["", "## How measured", "", bullets(items(HOW_MEASURED.format(**s["settings"]))),
              "", "## Caveats", "", bullets(items(CAVEATS) + findings(s))]
    return "\n".join(lines) + "\n"
