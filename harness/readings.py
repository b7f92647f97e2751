"""Realistic temperature and humidity readings as batch rows (``batch_format.row_of``'s
fields), for the tests and the bench of the batch format: each sensor polled every 10 s
(its own phase, a few ms of jitter), values that drift by a tenth now and then, the ids
the gateway's keyed permutation gives, boottime in nanoseconds as the clock reads it, and
now and then a seq taken by a retained-only publication (not history: not in a batch)."""

from __future__ import annotations

import random
from typing import Any

from cairn.formats.publication_ids import PublicationIds

KEY = bytes(range(16))  # the gateway's publication id key
BOOT = "3f1c2a9e-5b7d-4e21-9c3a-8d2f6b1e0a47"
T0_MS = 1_795_000_000_000  # 2026-11-18
BOOTED_MS = T0_MS - 86_400_000  # a day before (boottime = wall - this, sub-ms digits too)


def readings(sensors: int, count: int, seed: int = 1, first_seq: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    ids = PublicationIds(KEY)
    phase = [rng.randrange(10_000) for _ in range(sensors)]
    values = [[rng.uniform(17, 23), rng.uniform(40, 60)] for _ in range(sensors)]
    polls = []
    for k in range(count // sensors + 1):
        polls += [(T0_MS + k * 10_000 + phase[s] + rng.randrange(40), s) for s in range(sensors)]
    rows, seq = [], first_seq - 1
    for wall_ms, s in sorted(polls)[:count]:
        seq += 1 if rng.random() > 0.002 else 2
        values[s][0] += rng.choice((-0.1, 0, 0, 0.1))
        values[s][1] = min(100.0, max(0.0, values[s][1] + rng.choice((-0.2, -0.1, 0, 0.1, 0.2))))
        topic = f"sensor.th-{s:03d}"
        rows.append({
            "seq": seq, "publication": ids.of_seq(seq), "realm": "realm1", "topic": topic,
            "wall_ms": wall_ms, "boot_id": BOOT,
            "boottime_ns": (wall_ms - BOOTED_MS) * 1_000_000 + rng.randrange(1_000_000),
            "clock_synced": True, "authid": "modbus-1", "authrole": "device",
            "audience": None, "details": {"topic": topic}, "args": [],
            "kwargs": {"temperature": round(values[s][0], 1),
                       "humidity": round(values[s][1], 1)}})
    return rows
