"""Cairn side by side with Crossbar.io and Mosquitto, all of issue 9's figures in one run.

Run from the repository root (``make bench`` does the same)::

    .venv/bin/python -m bench [--quick] [--only pubsub,ack,...] [--no-docs]

Parts, each on freshly started servers, one server at a time (they never compete for the
CPUs); see each module's docstring for what exactly is measured and checked:

- ``pubsub`` (:mod:`bench.compare`): 1 publisher -> 1, 10, 100 subscribers, WebSocket/JSON
  and RawSocket/MsgPack: events/s and publish->event p50/p99 at the same paced rate; start-up
  time and idle RSS;
- ``check`` (:func:`bench.pubsub.run_generator_check`): the same clients against a trivial
  server that coalesces its writes ("fake-batch"), for every pub/sub case: the clients'
  ceiling, which must be well above the fastest router's figure (1.5x) or that figure is
  the clients';
- ``fanout``: the 1->1 and 1->10 cases again on Cairn with its limits lifted, and Mosquitto's
  1->N (:mod:`bench.mosquitto_pubsub`, MQTT QoS 0, the same window and batches): server CPU
  per delivered event for all three, Cairn's events/s against Mosquitto's and its default
  config against lifted (issue 46);
- ``ack`` (:mod:`bench.ack`): PUBLISH acknowledge=true -> PUBLISHED on a stored topic;
- ``retained`` (:mod:`bench.retained`): SUBSCRIBE get_retained over N retained topics, and
  Mosquitto's retained messages for ``prefix/#``;
- ``sessions`` (:mod:`bench.sessions`): RSS per 1,000 concurrent idle sessions;
- ``durable`` (:mod:`bench.durable`): acknowledged fsynced publishes/s, 16 publishers
  (:mod:`bench.store`);
- ``footprint`` (:mod:`bench.footprint`): installed size.

A full run takes about 5 minutes on 2 cores (the first one also builds Cairn's runtime venv
for the footprint, and installs Crossbar.io if it is missing); ``--quick`` about 2.

Output: one table (metric | Cairn | Crossbar | Mosquitto | ratio | target | result) on
stdout, everything in ``bench/results/summary.json``, and the table with the machine
description and how it was measured in ``docs/benchmarks.md`` (not with ``--only``).
Crossbar.io is installed into its cache venv first if missing (:mod:`bench.crossbar`).
Exit code 1 when a figure failed its correctness check (targets missed are results, not
errors); the other-CPU column of every part shows whether the machine was quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    ack,
    compare,
    durable,
    footprint,
    mosquitto_pubsub,
    report,
    retained,
    sessions,
    wear,
)
from bench.crossbar import CROSSBAR_VENV, crossbar_executable, crossbar_version, install_crossbar
from bench.pubsub import (
    REPO,
    RESULTS_DIR,
    machine,
    run_generator_check,
    source_version,
)

PARTS = ("pubsub", "check", "fanout", "ack", "retained", "sessions", "durable", "footprint")
# the clients' ceiling for every pub/sub case: the trivial server that coalesces its writes
# (routers may coalesce too, so the one-write-per-event variant is no ceiling)
CHECK_CASES = [(True, case) for case in compare.CASES]
DOCS = REPO / "docs" / "benchmarks.md"
# the options whose default --quick makes smaller: {option: (what it is, full, --quick)}
DEFAULTS = {"duration": ("s of each pub/sub throughput phase", 5.0, 1.0),
            "lat_duration": ("s of each paced latency phase", 5.0, 1.0),
            "check_duration": ("s of each generator-check phase", 3.0, 1.0),
            "ack_duration": ("s of each acknowledge case", 5.0, 1.0),
            "retained_repeats": ("prefix subscriptions", 20, 5),
            "retained_exact_repeats": ("exact-topic subscriptions", 100, 30),
            "durable_duration": ("s of the durable case", 5.0, 1.0),
            "durable_events": ("history rows in the store before the durable case",
                               100_000, 10_000),
            "settle": ("s idle before measuring RSS", 1.0, 0.5)}


def shown(value: float) -> str:
    """5.0 -> 5, 100000 -> 100,000 (as the help says a default)."""
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="short phases (a couple of minutes in all); figures are indicative")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated parts (default all: {','.join(PARTS)})")
    for name, (what, full, quick) in DEFAULTS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(full),
                       help=f"{what} ({shown(full)}; {shown(quick)})")
    p.add_argument("--ack-rate", type=float, default=200.0,
                   help="acknowledged publishes/s, one in flight (default 200)")
    p.add_argument("--retained", type=int, default=1000,
                   help="retained topics under the get_retained prefix (default 1,000)")
    p.add_argument("--retained-quiet", type=float, default=0.5,
                   help="s without a retained event after which a subscription is complete")
    p.add_argument("--sessions", type=int, default=1000,
                   help="concurrent idle sessions (default 1,000)")
    p.add_argument("--session-procs", type=int, default=4,
                   help="client processes the idle sessions are spread over (default 4)")
    p.add_argument("--durable-window", type=int, default=8,
                   help="acknowledged publishes in flight per durable publisher (default 8)")
    p.add_argument("--crossbar-venv", type=Path, default=CROSSBAR_VENV)
    p.add_argument("--router-cmd", metavar="CMD",
                   help="command that runs Cairn, before 'router --config FILE'")
    p.add_argument("--no-docs", action="store_true", help=f"do not write {DOCS.name}")
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "summary.json")
    opts = p.parse_args(argv)
    for name, (_, full, quick) in DEFAULTS.items():
        if getattr(opts, name) is None:
            setattr(opts, name, quick if opts.quick else full)
    opts.parts = opts.only.split(",")
    unknown = set(opts.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown part(s) {sorted(unknown)}; known: {','.join(PARTS)}")
    # bench.compare's own settings for the parts it runs
    opts.compare = compare.parse_args([
        "--duration", str(opts.duration), "--lat-duration", str(opts.lat_duration),
        "--settle", str(opts.settle), "--crossbar-venv", str(opts.crossbar_venv),
        *(["--router-cmd", opts.router_cmd] if opts.router_cmd else [])])
    opts.compare.check_duration = opts.check_duration
    return opts


# -- environment ------------------------------------------------------------------------------


def ensure_crossbar(venv: Path) -> bool:
    if crossbar_executable(venv).exists():
        return True
    print(f"installing Crossbar.io into {venv} (once) ...", flush=True)
    try:
        install_crossbar(venv)
        return True
    except (OSError, subprocess.SubprocessError) as e:
        print(f"  failed ({e}); the Crossbar columns stay empty", flush=True)
        return False


def command_output(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout or out.stderr).strip() or None


def describe_machine(opts: argparse.Namespace) -> dict[str, Any]:
    info = machine()
    mosquitto = command_output(["/usr/sbin/mosquitto", "-h"])
    info.update(
        kernel=platform.release(), sqlite=sqlite3.sqlite_version,
        crossbar=crossbar_version(opts.crossbar_venv),
        crossbar_autobahn=command_output([str(opts.crossbar_venv / "bin" / "python"), "-c",
                                          "import autobahn; print(autobahn.__version__)"]),
        mosquitto=mosquitto.splitlines()[0].removeprefix("mosquitto version ")
        if mosquitto else None,
        fd_limit=os.sysconf("SC_OPEN_MAX"))
    return info


# -- running the parts --------------------------------------------------------------------------


TITLES = {"pubsub": "pub/sub, start-up, idle RSS (bench.compare):",
          "check": "generator check (the same clients against a trivial server):",
          "fanout": "the 1->N path with limits lifted, and Mosquitto's (bench.mosquitto_pubsub):",
          "ack": "publish with acknowledge:", "retained": "get_retained:",
          "sessions": "idle sessions:", "durable": "durable publishes:",
          "footprint": "installed footprint:"}


def run_parts(opts: argparse.Namespace, servers: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The selected parts in order; a part that fails is reported and the others run."""
    parts: dict[str, Any] = {}
    failures: list[str] = []
    c, both = opts.compare, with_options(opts.compare, opts)
    steps: dict[str, Callable[[], Any]] = {
        "pubsub": lambda: compare.run_compare(c),
        "check": lambda: run_generator_check(
            c, CHECK_CASES, parts.get("pubsub", {}).get("cairn", {}).get("results", [])),
        "fanout": lambda: run_fanout(c),
        "ack": lambda: {kind: ack.run(kind, both) for kind in servers},
        "retained": lambda: {**{kind: retained.run_wamp(kind, both) for kind in servers},
                             "mosquitto": retained.run_mosquitto(both)},
        "sessions": lambda: {kind: sessions.run(kind, both) for kind in servers},
        "durable": lambda: durable.run(opts),
        "footprint": lambda: footprint.run(opts),
    }
    for name in [p for p in PARTS if p in opts.parts]:
        if name == "pubsub" and "crossbar" not in servers:
            failures.append("pubsub: skipped, Crossbar.io is not installed")
            continue
        print(TITLES[name], flush=True)
        try:
            parts[name] = steps[name]()
        except Exception as e:
            traceback.print_exc()
            failures.append(f"{name}: failed: {type(e).__name__}: {e}")
    return parts, failures


FANOUT_CASES = [case for case in compare.CASES if case.subscribers in (1, 10)]


def run_fanout(c: argparse.Namespace) -> dict[str, Any]:
    """Beside the pubsub part's Cairn (default config) and Crossbar: Cairn with its limits
    lifted, and Mosquitto's 1->N with the same window and batches (issue 46's figures)."""
    lifted = compare.run_server("cairn", FANOUT_CASES, c, {}, limits="lifted")
    _, brokered = mosquitto_pubsub.run(sorted({case.subscribers for case in FANOUT_CASES}),
                                       c.duration, c.window, c.batch)
    return {"cairn_lifted": lifted, "mosquitto": brokered}


def with_options(c: argparse.Namespace, opts: argparse.Namespace) -> argparse.Namespace:
    """bench.compare's settings (servers) plus this runner's (the parts' own)."""
    return argparse.Namespace(**{**vars(opts), **vars(c)})


def server_starts(parts: dict[str, Any]) -> dict[str, list[float]]:
    """Every start-up time measured in the run, per server."""
    starts: dict[str, list[float]] = {}

    def add(kind: str, value: Any) -> None:
        if isinstance(value, int | float):
            starts.setdefault(kind, []).append(value)

    for kind in ("cairn", "crossbar"):
        add(kind, parts.get("pubsub", {}).get(kind, {}).get("startup_s"))
        for part in ("ack", "retained"):
            add(kind, parts.get(part, {}).get(kind, {}).get("startup_s"))
        for case in parts.get("sessions", {}).get(kind, {}).get("cases", []):
            add(kind, case.get("startup_s"))
    return starts


def rows_of(parts: dict[str, Any]) -> list[report.Row]:
    rows: list[report.Row] = []
    pubsub = parts.get("pubsub", {})
    if pubsub:
        rows += report.pubsub_rows(pubsub)
    rows += report.server_rows(pubsub, server_starts(parts),
                               parts.get("retained", {}).get("mosquitto"))
    if "fanout" in parts:
        rows += report.fanout_rows(pubsub, parts["fanout"])
    if "ack" in parts:
        rows += report.ack_rows(parts["ack"])
    if "retained" in parts:
        rows += report.retained_rows(parts["retained"])
    if "sessions" in parts:
        rows += report.sessions_rows(parts["sessions"])
    if "durable" in parts:
        rows += report.durable_rows(parts["durable"])
    if "footprint" in parts:
        rows += report.footprint_rows(parts["footprint"])
    if "check" in parts:
        rows += report.check_rows(pubsub, parts["check"])
    return [r for r in rows if r.result == "ERROR"
            or any(v is not None for v in (r.cairn, r.crossbar, r.mosquitto, r.ratio))]


def disturbance(parts: dict[str, Any]) -> dict[str, Any]:
    """The most CPU other programs used during any measured phase (100 = one core)."""
    seen: list[tuple[int, str]] = []

    def add(value: Any, where: str) -> None:
        if isinstance(value, int):
            seen.append((value, where))

    for side in ("cairn", "crossbar"):
        for r in parts.get("pubsub", {}).get(side, {}).get("results", []):
            for key in ("other_cpu_pct", "lat_other_cpu_pct"):
                add(r.get(key), f"pub/sub {side} {r['case']} {r['transport']}")
        for r in parts.get("ack", {}).get(side, {}).get("cases", []):
            add(report.get(r, "load", "other_cpu_pct"), f"ack {side}")
        add(report.get(parts, "retained", side, "load", "other_cpu_pct"), f"retained {side}")
    for r in parts.get("check", []):
        add(r.get("other_cpu_pct"), f"check {r['server']} {r['case']} {r['transport']}")
    add(report.get(parts, "durable", "cpu", "other_cpu_pct"), "durable")
    worst = max(seen, default=(0, "-"))
    return {"max_other_cpu_pct": worst[0], "where": worst[1],
            "phases_over_15_pct": sum(1 for v, _ in seen if v > 15), "phases": len(seen)}


def errors(parts: dict[str, Any]) -> list[str]:
    """Problems beyond the table's rows: server logs, parts that failed outright."""
    out = []
    for side in ("cairn", "crossbar"):
        out += [f"pub/sub {side}: {p}" for p in report.get(parts, "pubsub", side, "problems")
                or []]
        out += [f"ack {side}: {p}" for p in report.get(parts, "ack", side, "problems") or []]
        if report.get(parts, "retained", side, "error"):
            out.append(f"retained {side}: {parts['retained'][side]['error']}")
        out += [f"retained {side} log: {p}"
                for p in report.get(parts, "retained", side, "log_problems") or []]
    if report.get(parts, "retained", "mosquitto", "error"):
        out.append(f"mosquitto: {parts['retained']['mosquitto']['error']}")
    out += [f"footprint: {p}" for p in report.get(parts, "footprint", "problems") or []]
    if report.get(parts, "durable", "error"):
        out.append(f"durable: {parts['durable']['error']}")
    return out


# -- main ---------------------------------------------------------------------------------------


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwind through the finally blocks that stop the servers


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    servers = ["crossbar", "cairn"] if ensure_crossbar(opts.crossbar_venv) else ["cairn"]
    info = describe_machine(opts)
    print(f"machine: {info['nproc']} CPUs, {info['cpu_model']}, {info['mem_gib']} GiB, "
          f"Linux {info['kernel']}, Python {info['python']}, load {info['loadavg_before']}",
          flush=True)
    started = time.monotonic()
    parts, failures = run_parts(opts, servers)
    info["loadavg_after"] = os.getloadavg()
    rows = rows_of(parts)
    summary = {
        "benchmark": "summary", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": opts.quick, "machine": info, "source": source_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()
                     if k != "compare"},
        "rows": report.as_dicts(rows), "disturbance": disturbance(parts),
        "errors": failures + errors(parts), "parts": parts,
        "total_s": round(time.monotonic() - started, 1),
    }
    print()
    print(report.text_table(rows))
    print()
    print(report.LEGEND)
    for line in summary["errors"]:
        print(f"  problem: {line}")
    print(report.disturbance_line(summary["disturbance"]))
    print(f"total {summary['total_s']:.0f} s")
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"wrote {opts.output}")
    if set(opts.parts) == set(PARTS) and not opts.no_docs:
        kept = wear.kept_sections(DOCS.read_text()) if DOCS.exists() else ""  # their own
        DOCS.write_text(report.markdown(summary, rows) + (f"\n{kept}" if kept else ""))
        print(f"wrote {DOCS.relative_to(REPO)}")
    failed = [r for r in rows if r.result == "ERROR"] or summary["errors"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
