"""Durable publishes for the summary: :mod:`bench.store`'s measurement (acknowledged,
retained, fsynced before PUBLISHED) with 16 publishers, run as a subprocess with only its
``publish`` phase. A part of ``python -m bench`` (``--only durable``).

bench.store populates a history first (``--durable-events`` rows, so the publishes go into
a database that is not empty), keeps ``--durable-window`` publishes in flight per publisher,
and runs the same publisher processes against a trivial server that answers PUBLISHED at
once (its generator check: the clients' ceiling). Its own report goes to
``bench/results/store-durable.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from bench.pubsub import REPO, RESULTS_DIR

PUBLISHERS = 16


def run(opts: argparse.Namespace) -> dict[str, Any]:
    output = RESULTS_DIR / "store-durable.json"
    cmd = [sys.executable, "-m", "bench.store", "--only", "publish",
           "--publishers", str(PUBLISHERS), "--window", str(opts.durable_window),
           "--duration", str(opts.durable_duration), "--events", str(opts.durable_events),
           "--retained", "100", "--no-diagnose", "--output", str(output)]
    print(f"  cairn durable publishes, {PUBLISHERS} publishers x window "
          f"{opts.durable_window} (bench.store) ...", end=" ", flush=True)
    out: dict[str, Any] = {"command": " ".join(cmd[1:]), "publishers": PUBLISHERS,
                           "window": opts.durable_window}
    output.unlink(missing_ok=True)  # a run that fails must not report the last one's figures
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    try:
        report = json.loads(output.read_text())
    except (OSError, ValueError):
        report = {}
    if done.returncode != 0 or "error" in report:
        out["error"] = report.get("error") or done.stderr.strip()[-800:]
    for r in report.get("publish", []):
        if r.get("generator_check"):
            out["generator_per_s"] = r.get("per_s")
        elif r.get("publishers") == PUBLISHERS:
            out.update(per_s=r.get("per_s"), latency=r.get("latency"), cpu=r.get("cpu"),
                       errors=r.get("errors"), ok=r.get("ok"))
    out["fsync_4k"] = report.get("fsync_4k")
    out["filesystem"] = report.get("filesystem")
    out.setdefault("ok", False)
    print(f"{out.get('per_s') or 0:,}/s (clients alone: {out.get('generator_per_s') or 0:,}/s)"
          + ("" if out["ok"] else f"  PROBLEM: {out.get('error') or out.get('errors')}"),
          flush=True)
    return out
