"""What the router holds for its retained events: RSS of a router process whose
``max_retained_bytes`` (default 64 MiB) is filled, before and after subscribers of every
serializer fetch them (issue 31, finding N4).

    .venv/bin/python -m bench.retained_memory [--topics 1000] [--size 64000]

Steps, each followed by the router's RSS (``/proc/PID/status`` VmRSS) and its own account
of the retained bytes it holds (``/metrics``: ``cairn_retained_bytes``):

1. started, empty;
2. ``--topics`` acknowledged retained publications of ``--size`` bytes each on
   ``sensor.mem.tNNNNN`` (1,000 x 64,000 bytes: just under the 64 MiB bound), over
   RawSocket/MsgPack, 200 from each session (a session's share is a quarter of the bound);
3. for JSON, MsgPack and CBOR in turn, over WebSocket: one session subscribes to each topic
   (``exact``, get_retained) and receives every retained event, then leaves; another
   subscribes to ``sensor.mem`` (``prefix``) and does the same;
4. a second round of step 3 (what stays after the first round is what a cache keeps).

The figures go to stdout and ``bench/results/retained-memory.json``. Before issue 31 the
router kept an encoded copy of every payload per serializer and pattern kind (and of whole
messages per subscription): 76 -> 260 -> 1,100 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from autobahn.wamp.types import PublishOptions, SubscribeOptions

from harness.config import open_realm
from harness.process import RouterProcess
from harness.wamp_client import connect

REPO = Path(__file__).resolve().parent.parent
PREFIX = "sensor.mem"


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def retained_bytes(router: RouterProcess) -> float:
    """The router's own account of its retained bytes (``cairn_retained_bytes``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{router.port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("cairn_retained_bytes"):
                return float(line.split()[-1])
    return float("nan")


async def fill(router: RouterProcess, topics: int, size: int) -> None:
    blob = "x" * size
    acked = PublishOptions(acknowledge=True, retain=True)
    for start in range(0, topics, 200):
        session = await connect(router, "rawsocket-tcp", "msgpack")
        for first in range(start, min(start + 200, topics), 50):
            await asyncio.gather(*(session.publish(f"{PREFIX}.t{k:05d}", k, blob, options=acked)
                                   for k in range(first, min(first + 50, topics))))
        await session.leave()


async def fetch(router: RouterProcess, serializer: str, kind: str, topics: int) -> int:
    """Subscribe (``exact``: each topic; ``prefix``: all at once) with get_retained and wait
    for every retained event; returns how many arrived."""
    session = await connect(router, "websocket", serializer)
    got: set[str] = set()
    done = asyncio.get_running_loop().create_future()

    def on_event(k, blob, details=None):
        got.add(details.topic if details.topic else f"{PREFIX}.t{k:05d}")
        if len(got) == topics and not done.done():
            done.set_result(None)

    if kind == "prefix":
        await session.subscribe(on_event, PREFIX, options=SubscribeOptions(
            match="prefix", get_retained=True, details_arg="details"))
    else:
        for start in range(0, topics, 100):
            await asyncio.gather(*(session.subscribe(
                on_event, f"{PREFIX}.t{k:05d}",
                options=SubscribeOptions(get_retained=True, details_arg="details"))
                for k in range(start, min(start + 100, topics))))
    try:
        await asyncio.wait_for(done, 60)
    finally:
        if session.is_attached():
            await session.leave()
    return len(got)


async def run(topics: int, size: int, workdir: Path, router_toml: str = "") -> dict[str, Any]:
    router = RouterProcess(workdir, open_realm("realm1"), router_toml=router_toml).start()
    steps: list[dict[str, Any]] = []

    def step(name: str, **extra: Any) -> None:
        time.sleep(0.5)  # (the router frees what a session left once its close is handled)
        steps.append({"step": name, "rss_mib": round(rss_mib(router.pid), 1),
                      "retained_bytes": retained_bytes(router), **extra})
        print(f"{name:<32} RSS {steps[-1]['rss_mib']:>8.1f} MiB   router's retained bytes "
              f"{steps[-1]['retained_bytes'] / 2**20:>7.1f} MiB", flush=True)

    try:
        step("started")
        await fill(router, topics, size)
        step(f"{topics} x {size} B retained")
        for round_ in (1, 2):
            for serializer in ("json", "msgpack", "cbor"):
                for kind in ("exact", "prefix"):
                    n = await fetch(router, serializer, kind, topics)
                    step(f"round {round_}: {serializer} {kind}", received=n)
    finally:
        router.stop()
    return {"benchmark": "retained-memory", "topics": topics, "size": size, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64_000)
    parser.add_argument("--router-toml", default="",
                        help='more [router] keys, e.g. "send_buffer_limit = 1073741824"')
    parser.add_argument("--output", type=Path, default=REPO / "bench/results/retained-memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cairn-retained-memory-") as tmp:
        result = asyncio.run(run(args.topics, args.size, Path(tmp),
                                 args.router_toml.replace('\\n', '\n')))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
