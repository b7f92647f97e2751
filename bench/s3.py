"""S3 sink benchmark (issue 48): bytes on the wire per reading through S3, headers counted,
beside the directory sink's; the upload rate of a backlog; and the time from a clock years
off to the first accepted PUT.

Run from the repository root::

    .venv/bin/python -m bench.s3 [--backlog 100000]

What it does, against rclone's ``serve s3`` on loopback (harness.s3_server) behind a
counting proxy (every byte each way, request and answer heads included):

1. **one-minute batches**: the reference deployment's minute (20 sensors, a reading every
   10 s: 120 readings), ten of them, a batch each (``batch_events = 120``), as an uploader
   that keeps up ships them;
2. **backlog**: ``--backlog`` readings in the store, drained by ``Uploader.once()`` at the
   default batch bounds (10,000 events / 8 MiB), to S3 and to a directory sink;
3. **clock years off**: an S3 sink whose wall clock is three years behind (the clock
   module's reading shifted in this process) puts 4 KiB: the refusal, the re-signed PUT
   and its acceptance, timed beside a PUT with the right clock and the next PUT (medians
   of five).

The store is filled as bench.sync fills it. The table goes to stdout, the details to
``bench/results/s3.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.sync import populate, report
from cairn.base import clock
from cairn.gateway.store import HistoryReader
from cairn.sync.sinks import DirectorySink
from cairn.sync.sinks.s3 import S3Config, S3Sink
from cairn.sync.sinks.sigv4 import Credentials
from cairn.sync.uploader import Uploader
from harness.s3_server import KEY, SECRET, FaultProxy, S3Server

RESULTS = Path(__file__).resolve().parent / "results" / "s3.json"
MINUTE = 120  # readings a minute: 20 sensors, one every 10 s
YEARS_OFF = 3


def s3_sink(endpoint: str, bucket: str) -> S3Sink:
    return S3Sink(S3Config(bucket, "fleet", endpoint, "us-east-1", "path",
                           Credentials(KEY, SECRET)))


def drain(work: Path, name: str, events: int, sink: Any, batch_events: int
          ) -> tuple[Uploader, float, int]:
    """A store of ``events`` readings drained into ``sink``: (uploader, seconds, shipped)."""
    db = work / name / "cairn.db"
    asyncio.run(populate(db, events))
    uploader = Uploader("bench-gw", HistoryReader(db), sink, db.parent / "sync-status.json",
                        batch_events=batch_events)
    started = time.perf_counter()
    shipped = uploader.once()
    seconds = time.perf_counter() - started
    uploader.reader.close()
    return uploader, seconds, shipped


def through_s3(work: Path, server: S3Server, name: str, events: int, batch_events: int
               ) -> dict[str, Any]:
    proxy = FaultProxy(server.port)
    try:
        server.bucket(name)
        uploader, seconds, shipped = drain(work, name, events, s3_sink(proxy.endpoint, name),
                                           batch_events)
    finally:
        proxy.close()
    bodies = sum(p.stat().st_size for p in (server.root / name).rglob("*") if p.is_file())
    wire = proxy.sent + proxy.received
    return {"events": shipped, "seconds": round(seconds, 2),
            "events_per_s": round(shipped / seconds), "requests": len(proxy.seen),
            "sent_bytes": proxy.sent, "received_bytes": proxy.received,
            "bodies_bytes": bodies, "budget_counted_bytes": uploader.status.bytes_sent,
            "wire_bytes_per_reading": round(wire / shipped, 2),
            "sent_bytes_per_reading": round(proxy.sent / shipped, 2),
            "heads_bytes_per_request": round((wire - bodies) / len(proxy.seen))}


def through_directory(work: Path, name: str, events: int, batch_events: int) -> dict[str, Any]:
    landing = work / f"{name}-landing"
    _, seconds, shipped = drain(work, name, events, DirectorySink(landing), batch_events)
    landed = sum(p.stat().st_size for p in landing.rglob("*") if p.is_file())
    return {"events": shipped, "seconds": round(seconds, 2),
            "events_per_s": round(shipped / seconds), "landed_bytes": landed,
            "bytes_per_reading": round(landed / shipped, 2)}


def clock_off(server: S3Server, tries: int = 5) -> dict[str, Any]:
    """Median seconds of one put with the wall clock right, of the first with it years
    behind (refused, re-signed, accepted) and of the next one (signed right at once)."""
    server.bucket("clock-bench")
    data = os.urandom(4096)
    real = clock.wall_ns
    right, first, later, offset = [], [], [], None
    for i in range(tries):
        sink = s3_sink(server.endpoint, "clock-bench")
        right.append(_timed(sink.put, f"bench-gw/right-{i}.bin", data))
        clock.wall_ns = lambda: real() - YEARS_OFF * 365 * 86400 * 10**9  # type: ignore
        try:
            wrong = s3_sink(server.endpoint, "clock-bench")
            first.append(_timed(wrong.put, f"bench-gw/wrong-{i}.bin", data))
            offset = (wrong.uplink_clock.view() or {}).get("offset_s")
            later.append(_timed(wrong.put, f"bench-gw/later-{i}.bin", data))
        finally:
            clock.wall_ns = real  # type: ignore[assignment]
    return {"years_off": YEARS_OFF, "tries": tries,
            "right_clock_put_s": round(statistics.median(right), 4),
            "first_accepted_put_s": round(statistics.median(first), 4),
            "later_put_s": round(statistics.median(later), 4), "offset_s": offset}


def _timed(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm") if
                        Path("/dev/shm").is_dir() else None,
                        help="work here (default: /dev/shm, so that both sinks are timed, "
                             "not a disk shared with others' fsyncs)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    opts = parser.parse_args(argv)

    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-s3-", dir=opts.dir))
    server = S3Server(work / "s3")
    try:
        minutes = opts.minutes * MINUTE
        results = {
            "minute_s3": through_s3(work, server, "minutes", minutes, MINUTE),
            "minute_dir": through_directory(work, "minutes-dir", minutes, MINUTE),
            "backlog_s3": through_s3(work, server, "backlog", opts.backlog, 10_000),
            "backlog_dir": through_directory(work, "backlog-dir", opts.backlog, 10_000),
            "clock": clock_off(server),
        }
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    m3, md, b3, bd, c = (results[k] for k in ("minute_s3", "minute_dir", "backlog_s3",
                                               "backlog_dir", "clock"))
    rows = [
        ("one-minute batches (120 readings)",
         f"S3 {m3['wire_bytes_per_reading']:.1f} B/reading on the wire "
         f"({m3['sent_bytes_per_reading']:.1f} sent), directory {md['bytes_per_reading']:.1f}"),
        ("  per request, heads both ways", f"{m3['heads_bytes_per_request']} B "
                                           f"({m3['requests']} PUTs)"),
        (f"backlog of {opts.backlog:,}",
         f"S3 {b3['wire_bytes_per_reading']:.2f} B/reading on the wire "
         f"({b3['sent_bytes_per_reading']:.2f} sent), directory {bd['bytes_per_reading']:.2f}"),
        ("  upload rate", f"S3 {b3['events_per_s']:,} events/s ({b3['seconds']} s), "
                          f"directory {bd['events_per_s']:,} events/s"),
        ("budget counts = bytes sent", f"{b3['budget_counted_bytes'] == b3['sent_bytes']} "
                                       f"({b3['budget_counted_bytes']:,} B)"),
        (f"clock {YEARS_OFF} years behind",
         f"first accepted PUT after {c['first_accepted_put_s'] * 1000:.1f} ms (refusal, "
         f"re-signed PUT), right clock {c['right_clock_put_s'] * 1000:.1f} ms, later PUTs "
         f"{c['later_put_s'] * 1000:.1f} ms; offset {c['offset_s']:+,.0f} s"),
    ]
    report("sync uploader, S3 sink (rclone serve s3 on loopback) and directory sink", rows,
           load_at_start, opts.output,
           settings={"backlog": opts.backlog, "minutes": opts.minutes, "dir": str(opts.dir),
                     "readings_per_minute": MINUTE}, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
