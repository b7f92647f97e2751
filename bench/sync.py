"""Uploader benchmark: events/s that ``cairn sync`` drains from a large backlog to the
directory sink.

Run from the repository root::

    .venv/bin/python -m bench.sync [--events 1000000] [--batch-events 10000]

What it does:

1. **populate** (timed separately, not part of the result): a fresh store in a temporary
   directory is filled through ``gateway.store.Store`` itself with ``--events`` history
   rows on ``sensor.dev0000`` .. ``sensor.dev0099``, 10 events/s of wall time, kwargs
   ``{temperature, humidity}``, one boot with its start anchor, plus one retained-only
   publication per 100 events (they take seqs, as on a real gateway).
2. **drain**: ``Uploader.once()`` with a ``DirectorySink`` on the same disk, the default
   batch bounds (10,000 events / 8 MiB), exactly as ``cairn sync --once`` runs it. The
   time is split into reading the store (``HistoryReader.publications_after``), encoding
   (lean JSON Lines + bzip2 + sha256), writing (``DirectorySink.put``: temp file, fsync, rename,
   directory fsync, for data and manifest) and the rest (watermark, status file).
3. **check**: every landed batch is re-read (sha256, line count) and the seqs must be
   exactly the store's.

The table goes to stdout, the details to ``bench/results/sync.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pubsub import cpu_model
from cairn.base.clock_readings import Anchor
from cairn.formats.batch import decode_batch
from cairn.gateway.core.session import Sequence
from cairn.gateway.store import HistoryReader, Store, StoredPublication
from cairn.sync import uploader as uploader_module
from cairn.sync.sinks import DirectorySink
from cairn.sync.uploader import Uploader

RESULTS = Path(__file__).resolve().parent / "results" / "sync.json"
T0_MS = 1_795_000_000_000
BOOT = "3f1c2a9e-0000-4000-8000-00000000beef"


async def populate(db: Path, events: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    store = await Store.open(db)
    sequence = Sequence(store.next_seq, store.publication_ids)
    try:
        store.add_anchor(Anchor("start", BOOT, 5_000_000_000, T0_MS * 1_000_000, None, True))
        for i in range(events):
            wall_ms = T0_MS + i * 100 + rng.randrange(100)
            if i % 100 == 50:
                seq, publication = sequence.assign()
                store.append(StoredPublication(
                    seq=seq, publication=publication, realm="realm1",
                    topic=f"gateway.device.dev{i % 100:04d}.status", args=[],
                    kwargs={"state": "ok"}, wall_ms=wall_ms, boot_id=BOOT,
                    boottime_ns=5_000_000_000 + (wall_ms - T0_MS) * 1_000_000,
                    clock_synced=True, retain=True))
            topic = f"sensor.dev{rng.randrange(100):04d}"
            seq, publication = sequence.assign()
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=topic, args=[],
                kwargs={"temperature": round(rng.uniform(-5, 35), 1),
                        "humidity": round(rng.uniform(20, 95), 1)},
                wall_ms=wall_ms, boot_id=BOOT,
                boottime_ns=5_000_000_000 + (wall_ms - T0_MS) * 1_000_000, clock_synced=True,
                authid="modbus-1", authrole="device", details={"topic": topic},
                history_rule=0))
            if i % 20_000 == 19_999:
                await store.flush()
        await store.flush()
    finally:
        await store.close()
    return events


class Timer:
    """Wraps callables and adds up the time spent in each."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        return timed


def check(landing: Path) -> tuple[int, list[int]]:
    seqs: list[int] = []
    files = 0
    for path in sorted(landing.glob("*/*.manifest.json")):
        manifest = json.loads(path.read_text())
        data = (landing / manifest["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise AssertionError(f"{manifest['file']}: sha256 differs")
        rows = decode_batch(data, manifest)
        if len(rows) != manifest["count"]:
            raise AssertionError(f"{manifest['file']}: {len(rows)} lines")
        seqs += [row["seq"] for row in rows]
        files += 1
    return files, seqs


def machine() -> dict[str, Any]:
    model = cpu_model()
    # others may be running things on the machine: say how busy it was
    return {"cpu": model, "cpus": os.cpu_count(), "load_average_1_5_15": os.getloadavg(),
            "python": sys.version.split()[0],
            "platform": platform.platform()}


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def report(benchmark: str, rows: list[tuple[str, str]], load_at_start: tuple[float, ...],
           output: Path, **results: Any) -> None:
    """``rows`` to stdout as a :func:`table`, the machine's load at the start and now last;
    ``results`` to ``output`` as JSON, after the benchmark's name and the machine."""
    print(table([*rows, ("machine load (1 min avg)",
                         f"{load_at_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end, "
                         f"{os.cpu_count()} CPUs")]))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "benchmark": benchmark, "machine": machine(), "load_average_at_start": load_at_start,
        **results}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch-events", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    opts = parser.parse_args(argv)

    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-sync-", dir=opts.dir))
    try:
        db, landing = work / "data" / "cairn.db", work / "landing"
        started = time.perf_counter()
        asyncio.run(populate(db, opts.events))
        populate_s = time.perf_counter() - started
        store_bytes = sum(p.stat().st_size for p in db.parent.iterdir())

        timer = Timer()
        reader = HistoryReader(db)
        reader.publications_after = timer.wrap("read", reader.publications_after)
        sink = DirectorySink(landing)
        sink.put = timer.wrap("write", sink.put)
        uploader_module.encode_lean = timer.wrap("encode", uploader_module.encode_lean)
        uploader = Uploader("bench-gw", reader, sink, work / "data" / "sync-status.json",
                            batch_events=opts.batch_events)
        started = time.perf_counter()
        cpu_started = time.process_time()
        shipped = uploader.once()
        drain_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        expected = reader.highest_seq()
        reader.close()

        files, seqs = check(landing)
        landed_bytes = sum(p.stat().st_size for p in landing.rglob("*") if p.is_file())
        ok = shipped == opts.events and len(seqs) == len(set(seqs)) == opts.events \
            and max(seqs) <= expected
        other = drain_s - sum(timer.seconds.values())
        split = {**{k: round(v, 2) for k, v in timer.seconds.items()}, "other": round(other, 2)}
        rows = [
            ("events in the backlog", f"{opts.events:,}"),
            ("populate (Store, not timed)",
             f"{populate_s:.1f} s, store {store_bytes / 1e6:.0f} MB"),
            ("drain to directory sink", f"{drain_s:.1f} s"),
            ("events/s", f"{shipped / drain_s:,.0f}"),
            ("batches", f"{files} x {opts.batch_events:,} events"),
            ("landed (data + manifests)", f"{landed_bytes / 1e6:.1f} MB, "
                                          f"{landed_bytes / shipped:.0f} bytes/event"),
            ("MB/s written", f"{landed_bytes / 1e6 / drain_s:.1f}"),
            ("CPU", f"{cpu_s:.1f} s ({cpu_s / drain_s:.0%} of one core)"),
            ("time split", ", ".join(f"{k} {v:.1f} s ({v / drain_s:.0%})"
                                     for k, v in split.items())),
            ("check", "every seq landed exactly once, sha256 and counts match" if ok
             else "FAILED"),
        ]
        report("sync uploader, directory sink", rows, load_at_start, opts.output,
               settings={"events": opts.events, "batch_events": opts.batch_events,
                         "batch_bytes": uploader.batch_bytes},
               populate_s=round(populate_s, 2), store_bytes=store_bytes,
               drain_s=round(drain_s, 2), events_per_s=round(shipped / drain_s),
               cpu_s=round(cpu_s, 2), batches=files, landed_bytes=landed_bytes,
               bytes_per_event=round(landed_bytes / shipped, 1), split_s=split, ok=ok)
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
