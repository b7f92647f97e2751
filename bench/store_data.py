"""The history the store benchmark works on: its topics and devices, the readings, and a
store populated with them (written with ``gateway.store.Store`` itself, not through the
router)."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

from bench.measure import file_size
from cairn.gateway.core.session import Sequence
from cairn.gateway.store import Store, StoredPublication

HISTORY_PREFIX = "sensor"
DEVICES = 100
# a rarely published topic, evenly spread through history (0.02 %): a pattern subscription
# whose events are sparse, the hard case for walking seq
SPARSE_PREFIX, SPARSE_TOPIC, SPARSE_EVERY = "sensor.door", "sensor.door.front", 5000
RETAINED_PREFIX = "state"
SPACING_MS = 100  # wall time between consecutive history events: 10 events/s
PAGE = 100


def device_topic(k: int) -> str:
    return f"{HISTORY_PREFIX}.dev{k:04d}"


def reading(rng: random.Random) -> dict[str, float]:
    return {"temperature": round(rng.gauss(21.0, 3.0), 2),
            "humidity": round(rng.uniform(30.0, 70.0), 1)}


# -- 1. populate -------------------------------------------------------------------------------


async def populate(db_path: Path, events: int, retained: int, seed: int) -> dict[str, Any]:
    """Fill a new database through gateway.store.Store. Returns what the queries need: the
    publication ids of the events around the middle, and the wall-clock span."""
    rng = random.Random(seed)
    boot_id = str(uuid.UUID(int=rng.getrandbits(128)))
    now_ms = int(time.time() * 1000)
    first_ms = now_ms - 3_600_000 - events * SPACING_MS  # the newest event: an hour ago
    boottime0 = 3_600_000_000_000
    mid_lo, mid_hi = events // 2 - min(5000, events // 10), events // 2 + min(5000, events // 10)
    mid_pubs: list[int] = []  # publication ids of seq mid_lo+1 .. mid_hi+1
    sparse = 0
    t0 = time.perf_counter()
    store = await Store.open(db_path)
    sequence = Sequence(store.next_seq, store.publication_ids)
    chunk = 20_000
    try:
        for i in range(events):
            seq, publication = sequence.assign()
            wall_ms = first_ms + i * SPACING_MS + rng.randrange(SPACING_MS)
            if mid_lo <= i <= mid_hi:
                mid_pubs.append(publication)
            topic = device_topic(rng.randrange(DEVICES))
            if i % SPARSE_EVERY == SPARSE_EVERY // 2:
                topic = SPARSE_TOPIC
                sparse += 1
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=topic, args=[],
                kwargs=reading(rng), wall_ms=wall_ms, boot_id=boot_id,
                boottime_ns=boottime0 + (wall_ms - first_ms) * 1_000_000, clock_synced=True,
                authid="sensor-gw", authrole="anonymous", details={"topic": topic},
                history_rule=0))
            if (i + 1) % chunk == 0:
                await store.flush()
        await store.flush()
        history_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        for j in range(retained):
            seq, publication = sequence.assign()
            topic = f"{RETAINED_PREFIX}.dev{j:05d}"
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=topic,
                args=[], kwargs={"online": rng.random() < 0.95,
                                 "battery_v": round(rng.uniform(3.3, 4.2), 2),
                                 "rssi": rng.randrange(-90, -40), "fw": "1.4.2"},
                wall_ms=now_ms - rng.randrange(3_600_000), boot_id=boot_id,
                boottime_ns=boottime0, clock_synced=True, authid="sensor-gw",
                authrole="anonymous", details={"topic": topic}, retain=True))
            if (j + 1) % chunk == 0:
                await store.flush()
        await store.flush()
        retained_s = time.perf_counter() - t1
    finally:
        await store.close()
    total_s = time.perf_counter() - t0
    return {
        "events": events, "retained": retained, "history_s": round(history_s, 2),
        "retained_s": round(retained_s, 2), "total_s": round(total_s, 2),
        "events_per_s": round(events / history_s) if history_s else None,
        "db_bytes": file_size(db_path),
        "first_ms": first_ms, "last_ms": first_ms + (events - 1) * SPACING_MS,
        "mid_first_seq": mid_lo + 1, "mid_pubs": mid_pubs, "sparse_events": sparse,
    }
