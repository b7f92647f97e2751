"""Environment knobs of the soak suite, with the defaults of a full run."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "soak"


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


SECONDS = _int("CAIRN_SOAK_SECONDS", 600)                    # mixed load duration
KILL_CYCLES = _int("CAIRN_SOAK_KILL_CYCLES", 20)             # SIGKILL/restart cycles
FUZZ_EXAMPLES = _int("CAIRN_SOAK_FUZZ_EXAMPLES", 20_000)     # per offline fuzz target
LIVE_FUZZ_EXAMPLES = _int("CAIRN_SOAK_LIVE_FUZZ_EXAMPLES", 2_000)  # per live transport
# Self-check of the growth assertions: a client that leaks a session and 100 kB of retained
# payload every second. With it set, the mixed-load test must fail.
INJECT_LEAK = os.environ.get("CAIRN_SOAK_INJECT_LEAK", "") not in ("", "0")
# Issue 19's hostile phase in the mixed load: slowloris, publish storm, subscription flood,
# alongside the well-behaved actors; CAIRN_SOAK_HOSTILE=0 leaves them out.
HOSTILE = os.environ.get("CAIRN_SOAK_HOSTILE", "1") not in ("", "0")
# Only these hostile neighbours (class names, comma-separated, e.g. "Storm,Lockout"): to
# tell which one a problem comes with. Empty: all of them.
HOSTILE_ONLY = {name for name in os.environ.get("CAIRN_SOAK_HOSTILE_ONLY", "").split(",")
                if name}
