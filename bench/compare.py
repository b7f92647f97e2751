"""Cairn side by side with Crossbar.io: the same pub/sub client workload against both.

Run from the repository root (Crossbar.io must be installed first, see :mod:`bench.crossbar`)::

    .venv/bin/python -m bench.crossbar --install      # once
    .venv/bin/python -m bench.compare [--duration 3] [--cases ws-json-1,rs-msgpack-1,ws-json-100]

(``python -m bench`` runs this as one part of the whole side-by-side suite.)

One after the other (never both at once, so they do not compete for the CPUs), it starts
Crossbar.io and then Cairn on free 127.0.0.1 ports, measures for each

- start-up time: from spawning the process until both the WebSocket and the RawSocket port
  accept a connection (Crossbar also: until the first port accepts);
- idle RSS, summed over the server's process tree (/proc), ``--settle`` seconds after start-up
  and before any client connects, and RSS again after the workload;

and runs :func:`bench.pubsub.run_case` for every case (1 publisher -> 1, 10 and 100
subscribers over WebSocket/JSON and RawSocket/MsgPack; same lean multi-process clients, same
throughput phase and paced latency phase). Crossbar goes first so that Cairn's latency phase
can use the same publication rate as Crossbar's (capped at half of Crossbar's measured
capacity), and the p50/p99 compare like with like. The table of ratios Cairn/Crossbar goes to
stdout and the details to ``bench/results/compare.json``. The generator check (same clients
against a trivial server) is :mod:`bench.pubsub`'s job; ``python -m bench`` runs it with these
settings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.crossbar import (
    CROSSBAR_VENV,
    CrossbarProcess,
    crossbar_executable,
    crossbar_version,
    tree_rss,
    venv_size_bytes,
)
from bench.pubsub import (
    REPO,
    RESULTS_DIR,
    ROUTER_CASES,
    Case,
    RouterProcess,
    add_fanout_args,
    fmt,
    machine,
    machine_busy_seconds,
    run_case,
    source_version,
    table,
)
from bench.report import aligned

CASES = ROUTER_CASES
DEFAULT_CASES = ",".join(c.id for c in CASES)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare",
                                description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=3.0,
                   help="seconds of the throughput phase per case (default 3)")
    p.add_argument("--lat-duration", type=float, default=2.0,
                   help="seconds of the paced latency phase per case (default 2)")
    p.add_argument("--lat-rate", type=float, default=1000.0,
                   help="publications/s in the latency phase, capped at half of Crossbar's "
                        "measured capacity; Cairn runs at Crossbar's rate (default 1000)")
    add_fanout_args(p)
    p.add_argument("--cases", metavar="IDS", default=DEFAULT_CASES,
                   help=f"comma-separated subset of {DEFAULT_CASES} (default: all)")
    p.add_argument("--settle", type=float, default=1.0,
                   help="seconds to wait after start-up before measuring idle RSS (default 1)")
    p.add_argument("--router-cmd", metavar="CMD",
                   help="command that runs Cairn, before 'router --config FILE' "
                        "(default: the venv's cairn)")
    p.add_argument("--crossbar-venv", type=Path, default=CROSSBAR_VENV,
                   help=f"virtualenv holding crossbar (default {CROSSBAR_VENV})")
    p.add_argument("--crossbar-history", action="store_true",
                   help="give Crossbar an in-memory event history for the 'sensor' prefix "
                        "(crossbar 26.10.1 then logs a warning per delivered event on every "
                        "topic and loses about half its throughput; see bench.crossbar)")
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "compare.json")
    return p.parse_args(argv)


def start_server(kind: str, workdir: Path, opts: argparse.Namespace,
                 history: tuple[str, str] | None = None, limits: str = "default") -> Any:
    """Cairn's or Crossbar's process on free ports, with ``startup_s`` set (spawn -> both
    ports accept); ``history``: (uri, match) whose events the server stores; ``limits``:
    Cairn's (bench.pubsub.RouterProcess)."""
    t0 = time.monotonic()
    if kind == "crossbar":
        if history is None and opts.crossbar_history:
            history = ("sensor", "prefix")
        uri, match = history or (None, "prefix")
        server: Any = CrossbarProcess(workdir, crossbar_executable(opts.crossbar_venv), uri,
                                      history_match=match)
    else:
        server = RouterProcess(workdir, opts.router_cmd, history=history, limits=limits)
        server.startup_s = time.monotonic() - t0
    return server


@contextlib.contextmanager
def running_server(kind: str, opts: argparse.Namespace,
                   history: tuple[str, str] | None = None) -> Iterator[Any]:
    """:func:`start_server` in a temporary directory, stopped (and removed) on exit."""
    with tempfile.TemporaryDirectory(prefix=f"cairn-bench-{kind}-") as tmp:
        server = start_server(kind, Path(tmp), opts, history)
        try:
            yield server
        finally:
            server.stop()


class LoadMeter:
    """CPU of the server (its whole process tree), of this process (the clients) and of
    anything else on the machine during a phase, in % of one core: a large "other" means
    the figures were disturbed."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.server0, self.self0 = server.cpu_seconds(), time.process_time()
        self.busy0, self.wall0 = machine_busy_seconds()[0], time.perf_counter()

    def stop(self) -> dict[str, int]:
        wall = time.perf_counter() - self.wall0
        server = self.server.cpu_seconds() - self.server0
        me = time.process_time() - self.self0
        other = machine_busy_seconds()[0] - self.busy0 - server - me
        return {"server_cpu_pct": round(100 * server / wall),
                "client_cpu_pct": round(100 * me / wall),
                "other_cpu_pct": round(100 * max(0.0, other) / wall)}


def run_server(kind: str, cases: list[Case], opts: argparse.Namespace,
               lat_rates: dict[str, float | None], limits: str = "default") -> dict[str, Any]:
    """Starts one server, measures start-up and idle RSS, runs the cases, stops it."""
    out: dict[str, Any] = {"server": kind, "results": [], "problems": []}
    with tempfile.TemporaryDirectory(prefix=f"cairn-bench-{kind}-") as tmp:
        server = start_server(kind, Path(tmp), opts, limits=limits)
        out["startup_s"] = round(server.startup_s, 3)
        if kind == "crossbar":
            out["first_accept_s"] = round(server.first_accept_s, 3)
        try:
            time.sleep(opts.settle)
            out["idle_rss"] = tree_rss(server.pid)
            for case in cases:
                print(f"  {kind} {case.label} {case.transport}/{case.serializer} ...",
                      end=" ", flush=True)
                r = run_case(server, case, opts, opts.duration, opts.lat_duration,
                             lat_rate=lat_rates.get(case.id))
                out["results"].append(r)
                print(f"{fmt(r.get('events_per_s'), ',')} events/s, p50 "
                      f"{fmt(r.get('p50_ms'), '.2f')} ms, p99 {fmt(r.get('p99_ms'), '.2f')} ms "
                      f"@ {fmt(r.get('lat_rate'), ',')}/s"
                      + ("" if r["ok"] else f"  PROBLEMS: {r['problems']}"), flush=True)
                if server.proc.poll() is not None:
                    out["problems"].append(f"{kind} exited with {server.proc.returncode}")
                    break
            out["rss_after"] = tree_rss(server.pid)
            out["problems"] += [line for line in server.log_lines()
                                if "Traceback" in line or "ERROR" in line
                                or "slow consumer" in line or "aborted" in line][:20]
        finally:
            code = server.stop()
            print(f"  {kind} stopped (exit code {code})", flush=True)
    return out


def ratio(a: Any, b: Any) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 2)


def mib(rss: dict[str, Any] | None) -> float | None:
    return round(rss["rss_bytes"] / 2**20, 1) if rss else None


def compare_rows(cairn: dict[str, Any], crossbar: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in cairn["results"]:
        x = next((x for x in crossbar["results"]
                  if (x["transport"], x["serializer"], x["subscribers"])
                  == (c["transport"], c["serializer"], c["subscribers"])), {})
        rows.append({
            "case": f"{c['case']} {c['transport']}/{c['serializer']}",
            "events_per_s": (c.get("events_per_s"), x.get("events_per_s"),
                             ratio(c.get("events_per_s"), x.get("events_per_s"))),
            "p50_ms": (c.get("p50_ms"), x.get("p50_ms"), ratio(c.get("p50_ms"), x.get("p50_ms"))),
            "p99_ms": (c.get("p99_ms"), x.get("p99_ms"), ratio(c.get("p99_ms"), x.get("p99_ms"))),
            "lat_rate": (c.get("lat_rate"), x.get("lat_rate")),
            "ok": c["ok"] and bool(x) and x["ok"],
        })
    return rows


def ratio_table(rows: list[dict[str, Any]], cairn: dict[str, Any],
                crossbar: dict[str, Any]) -> str:
    head = ("metric", "cairn", "crossbar", "cairn/crossbar", "target")
    lines: list[tuple[str, ...]] = [head]
    for r in rows:
        for key, label, spec, target in (("events_per_s", "events/s", ",", ">= 3"),
                                         ("p50_ms", "p50 ms", ".2f", ""),
                                         ("p99_ms", "p99 ms", ".2f", "<= 0.5")):
            c, x, q = r[key]
            if key == "p50_ms":
                label += f" @ {fmt(r['lat_rate'][0], ',')}/s"
            lines.append((f"{r['case']} {label}" + ("" if r["ok"] else " (NOT OK)"),
                          fmt(c, spec), fmt(x, spec), fmt(q, ".2f"), target))
    lines.append(("start-up s (all ports accept)", fmt(cairn.get("startup_s"), ".2f"),
                  fmt(crossbar.get("startup_s"), ".2f"),
                  fmt(ratio(cairn.get("startup_s"), crossbar.get("startup_s")), ".2f"),
                  "cairn < 1 s"))
    ci, xi = mib(cairn.get("idle_rss")), mib(crossbar.get("idle_rss"))
    lines.append((f"idle RSS MiB ({cairn.get('idle_rss', {}).get('processes', '?')} vs "
                  f"{crossbar.get('idle_rss', {}).get('processes', '?')} processes)",
                  fmt(ci, ".1f"), fmt(xi, ".1f"), fmt(ratio(ci, xi), ".2f"), "<= 0.25"))
    ca, xa = mib(cairn.get("rss_after")), mib(crossbar.get("rss_after"))
    lines.append(("RSS MiB after the workload", fmt(ca, ".1f"), fmt(xa, ".1f"),
                  fmt(ratio(ca, xa), ".2f"), ""))
    return aligned(lines)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwind through the finally blocks that stop the servers


def run_compare(opts: argparse.Namespace) -> dict[str, Any]:
    """Crossbar, then Cairn, over the selected cases; the report (also what main writes)."""
    known = {c.id: c for c in CASES}
    cases = [known[w] for w in opts.cases.split(",")]
    info = machine()
    info["crossbar"] = crossbar_version(opts.crossbar_venv)
    print(f"machine: {info['nproc']} CPUs ({info['usable_cpus']} usable), {info['cpu_model']}, "
          f"Python {info['python']}; crossbar {info['crossbar']}", flush=True)
    started = time.monotonic()
    crossbar = run_server("crossbar", cases, opts, {})
    lat_rates = {c.id: r.get("lat_rate_target")
                 for c, r in zip(cases, crossbar["results"], strict=False)}
    cairn = run_server("cairn", cases, opts, lat_rates)
    rows = compare_rows(cairn, crossbar)
    return {
        "benchmark": "compare",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "source": source_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "crossbar": crossbar,
        "cairn": cairn,
        "ratios": rows,
        "footprint": {"crossbar_venv_mib": round(venv_size_bytes(opts.crossbar_venv) / 2**20, 1),
                      "cairn_venv_mib_incl_dev_tools":
                          round(venv_size_bytes(REPO / ".venv") / 2**20, 1)},
        "total_s": round(time.monotonic() - started, 1),
        "ok": (all(r["ok"] for r in rows) and len(rows) == len(cases)
               and not crossbar["problems"] and not cairn["problems"]),
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    unknown = set(opts.cases.split(",")) - {c.id for c in CASES}
    if unknown:
        print(f"unknown case(s) {sorted(unknown)}; known: {DEFAULT_CASES}", file=sys.stderr)
        return 2
    if not crossbar_executable(opts.crossbar_venv).exists():
        print(f"crossbar is not installed in {opts.crossbar_venv}; run "
              "'.venv/bin/python -m bench.crossbar --install'", file=sys.stderr)
        return 2
    report = run_compare(opts)
    crossbar, cairn, footprint = report["crossbar"], report["cairn"], report["footprint"]
    print()
    print(table(crossbar["results"] + cairn["results"]))
    print()
    print(ratio_table(report["ratios"], cairn, crossbar))
    print()
    print("events/s: events received by all subscribers / (last delivery - first send); p50/p99: "
          "publish->event")
    print("latency in a paced run at the same publications/s for both servers. RSS summed over "
          "each server's")
    print(f"process tree. venv size: crossbar {footprint['crossbar_venv_mib']} MiB, cairn "
          f"{footprint['cairn_venv_mib_incl_dev_tools']} MiB (includes dev tools, not a "
          "footprint; python -m bench measures a runtime-only one).")
    for side in (crossbar, cairn):
        for line in side["problems"]:
            print(f"  {side['server']}: {line}")
    print(f"total {report['total_s']:.0f} s")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {opts.output}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
