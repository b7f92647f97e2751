"""Cairn side by side with Crossbar.io: the same pub/sub client workload against both.

Run from the repository root (Crossbar.io must be installed first, see :mod:`bench.crossbar`)::

    .venv/bin/python -m bench.crossbar --install      # once
    .venv/bin/python -m bench.compare [--duration 3] [--cases ws-json-1,rs-msgpack-1,ws-json-100]

One after the other (never both at once, so they do not compete for the CPUs), it starts
Crossbar.io and then Cairn on free 127.0.0.1 ports, measures for each

- start-up time: from spawning the process until both the WebSocket and the RawSocket port
  accept a connection (Crossbar also: until the first port accepts);
- idle RSS, summed over the server's process tree (/proc), ``--settle`` seconds after start-up
  and before any client connects, and RSS again after the workload;

and runs :func:`bench.pubsub.run_case` for every case (same lean multi-process clients, same
throughput phase and paced latency phase). Crossbar goes first so that Cairn's latency phase
can use the same publication rate as Crossbar's (capped at half of Crossbar's measured
capacity), and the p50/p99 compare like with like. The table of ratios Cairn/Crossbar goes to
stdout and the details to ``bench/results/compare.json``. The generator check (same clients
against a trivial server) is :mod:`bench.pubsub`'s job and is not repeated here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
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
    fmt,
    machine,
    run_case,
    source_version,
    table,
)

DEFAULT_CASES = "ws-json-1,rs-msgpack-1,ws-json-100"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    cpus = len(os.sched_getaffinity(0))
    p = argparse.ArgumentParser(prog="python -m bench.compare",
                                description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=3.0,
                   help="seconds of the throughput phase per case (default 3)")
    p.add_argument("--lat-duration", type=float, default=2.0,
                   help="seconds of the paced latency phase per case (default 2)")
    p.add_argument("--lat-rate", type=float, default=1000.0,
                   help="publications/s in the latency phase, capped at half of Crossbar's "
                        "measured capacity; Cairn runs at Crossbar's rate (default 1000)")
    p.add_argument("--window", type=int, default=1000,
                   help="max publications ahead of the slowest subscriber (default 1000)")
    p.add_argument("--batch", type=int, default=50,
                   help="PUBLISH frames per socket write in the throughput phase (default 50)")
    p.add_argument("--sub-procs", type=int, default=max(2, cpus // 2),
                   help="subscriber processes per case (default max(2, cpus/2))")
    p.add_argument("--cases", metavar="IDS", default=DEFAULT_CASES,
                   help=f"comma-separated subset of {', '.join(c.id for c in ROUTER_CASES)} "
                        f"(default {DEFAULT_CASES})")
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


def run_server(kind: str, cases: list[Case], opts: argparse.Namespace,
               lat_rates: dict[str, float | None]) -> dict[str, Any]:
    """Starts one server, measures start-up and idle RSS, runs the cases, stops it."""
    out: dict[str, Any] = {"server": kind, "results": [], "problems": []}
    with tempfile.TemporaryDirectory(prefix=f"cairn-bench-{kind}-") as tmp:
        t0 = time.monotonic()
        if kind == "crossbar":
            server: Any = CrossbarProcess(Path(tmp), crossbar_executable(opts.crossbar_venv),
                                          "sensor" if opts.crossbar_history else None)
            out["first_accept_s"] = round(server.first_accept_s, 3)
            out["startup_s"] = round(server.startup_s, 3)
        else:
            server = RouterProcess(Path(tmp), opts.router_cmd)
            out["startup_s"] = round(time.monotonic() - t0, 3)
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
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = []
    for i, row in enumerate(lines):
        text.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                              for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            text.append("  ".join("-" * w for w in widths))
    return "\n".join(text)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwind through the finally blocks that stop the servers


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    wanted = opts.cases.split(",")
    known = {c.id: c for c in ROUTER_CASES}
    if not set(wanted) <= set(known):
        print(f"unknown case(s) {sorted(set(wanted) - set(known))}; known: {sorted(known)}",
              file=sys.stderr)
        return 2
    cases = [known[w] for w in wanted]
    if not crossbar_executable(opts.crossbar_venv).exists():
        print(f"crossbar is not installed in {opts.crossbar_venv}; run "
              "'.venv/bin/python -m bench.crossbar --install'", file=sys.stderr)
        return 2
    info = machine()
    info["crossbar"] = crossbar_version(opts.crossbar_venv)
    print(f"machine: {info['nproc']} CPUs ({info['usable_cpus']} usable), {info['cpu_model']}, "
          f"Python {info['python']}; crossbar {info['crossbar']}", flush=True)
    started = time.monotonic()
    crossbar = run_server("crossbar", cases, opts, {})
    lat_rates = {c.id: r.get("lat_rate_target")
                 for c, r in zip(cases, crossbar["results"], strict=False)}
    cairn = run_server("cairn", cases, opts, lat_rates)
    total = time.monotonic() - started
    rows = compare_rows(cairn, crossbar)
    footprint = {"crossbar_venv_mib": round(venv_size_bytes(opts.crossbar_venv) / 2**20, 1),
                 "cairn_venv_mib_incl_dev_tools":
                     round(venv_size_bytes(REPO / ".venv") / 2**20, 1)}

    print()
    print(table(crossbar["results"] + cairn["results"]))
    print()
    print(ratio_table(rows, cairn, crossbar))
    print()
    print("events/s: events received by all subscribers / (last delivery - first send); p50/p99: "
          "publish->event")
    print("latency in a paced run at the same publications/s for both servers. RSS summed over "
          "each server's")
    print(f"process tree. venv size: crossbar {footprint['crossbar_venv_mib']} MiB, cairn "
          f"{footprint['cairn_venv_mib_incl_dev_tools']} MiB (includes dev tools, not a "
          "footprint).")
    for side in (crossbar, cairn):
        for line in side["problems"]:
            print(f"  {side['server']}: {line}")
    print(f"total {total:.0f} s")

    opts.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "compare",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "source": source_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "crossbar": crossbar,
        "cairn": cairn,
        "ratios": rows,
        "footprint": footprint,
        "total_s": round(total, 1),
    }
    opts.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {opts.output}")
    ok = (all(r["ok"] for r in rows) and len(rows) == len(cases)
          and not crossbar["problems"] and not cairn["problems"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
