"""Durability: an acknowledged publication survives the router being killed mid-stream.

SIGKILL leaves the OS page cache alone, so it cannot show that fsync happened; it does show
that nothing acknowledged was only in the router's memory, that the database stays
consistent, and that seq ordering carries on after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core.session import Sequence
from cairn.gateway.store import PruneRule, StorageError, Store, StoredPublication
from harness.config import history_rule, open_realm
from harness.process import RouterProcess
from harness.wamp_client import connect, retained_values

pytestmark = pytest.mark.slow

REALM = open_realm(history=[history_rule("sensor")])

PUBLISHERS = 8


async def _publish_until_killed(router: RouterProcess, seconds: float,
                                at_least: int = 0) -> dict[int, tuple]:
    """Publishers stream acknowledged retained publications until the router is killed:
    after ``seconds``, and once ``at_least`` are acknowledged (a loaded machine acknowledges
    fewer a second; within a minute). Returns {publication id: (publisher, counter)} of
    every acknowledged one."""
    acked: dict[int, tuple[int, int]] = {}
    sessions = [await connect(router, "rawsocket-tcp", "msgpack") for _ in range(PUBLISHERS)]

    async def stream(k: int) -> None:
        for i in range(10**9):
            try:
                pub = await asyncio.wait_for(sessions[k].publish(
                    f"sensor.p{k}", i, options=PublishOptions(acknowledge=True, retain=True)), 5)
            except Exception:
                return
            acked[pub.id] = (k, i)

    tasks = [asyncio.create_task(stream(k)) for k in range(PUBLISHERS)]
    await asyncio.sleep(seconds)
    deadline = time.monotonic() + 60
    while len(acked) < at_least and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    router.kill()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    return acked


async def _all_history(session, sub_id: int) -> list[dict]:
    events: list[dict] = []
    kwargs: dict = {"limit": 1000}
    while True:
        result = await session.call("wamp.subscription.get_events", sub_id, **kwargs)
        page, more = result.results[0], result.kwresults["is_limit_reached"]
        events += page
        if not more:
            return events
        kwargs["after_publication"] = page[-1]["publication"]


async def test_every_acknowledged_publication_survives_sigkill_and_restart(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        acked = await _publish_until_killed(router, seconds=1.5, at_least=250)
        assert len(acked) > 200, f"too few acknowledged publications to mean anything: {len(acked)}"

        router.start()
        session = await connect(router)
        sub_id = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        history = await _all_history(session, sub_id)
        stored = {e["publication"] for e in history}
        missing = set(acked) - stored
        assert not missing, f"{len(missing)} acknowledged publications lost of {len(acked)}"

        # receive order is kept per publisher: counters increase along history
        for k in range(PUBLISHERS):
            counters = [e["args"][0] for e in history if e["details"]["topic"] == f"sensor.p{k}"]
            assert counters == sorted(counters)

        # each topic's retained value is at least the last acknowledged one
        retained = await retained_values(session)
        for k in range(PUBLISHERS):
            last_acked = max((i for p, i in acked.values() if p == k), default=-1)
            assert retained.get(f"sensor.p{k}", -1) >= last_acked
        await session.leave()
    finally:
        router.stop()
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_seq_keeps_increasing_across_restarts_even_after_the_newest_rows_are_gone(
        tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    runs: list[list[int]] = []
    try:
        for run in range(2):
            session = await connect(router)
            pubs = [await session.publish("sensor.x", i, options=PublishOptions(acknowledge=True))
                    for i in range(5)]
            runs.append([p.id for p in pubs])
            await session.leave()
            router.stop()
            if run == 0:  # lose the newest rows: their seqs must still never come back
                with contextlib.closing(sqlite3.connect(router.db_path)) as db:
                    db.execute("DELETE FROM publications WHERE seq > 2")
                    db.commit()
            router.start()
    finally:
        router.stop()
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        seq_of = dict(db.execute("SELECT publication, seq FROM publications"))
    first = [seq_of[p] for p in runs[0] if p in seq_of]
    second = [seq_of[p] for p in runs[1]]
    assert second == sorted(second)
    assert min(second) > 5 >= max(first)


async def test_pruning_the_newest_rows_records_their_seqs_first(tmp_path):
    """Commits do not write the highest seq (a page per commit); the transaction that
    deletes rows does, before a crash could lose it."""
    store = await Store.open(tmp_path / "cairn.db")
    sequence = Sequence(store.next_seq, store.publication_ids)
    try:
        for i in range(5):
            seq, publication = sequence.assign()
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic="sensor.x",
                args=[i], kwargs=None, wall_ms=1000, boot_id="boot", boottime_ns=1,
                clock_synced=True, details={"topic": "sensor.x"}, history_rule=0))
        await store.flush()
        gaps = await store.prune([PruneRule("realm1", 0, 0, None)], 10**12, 2000, True)
        assert [(g.first_seq, g.last_seq) for g in gaps] == [(1, 5)]
        with contextlib.closing(sqlite3.connect(tmp_path / "cairn.db")) as db:  # as if killed now
            assert db.execute("SELECT COUNT(*) FROM publications").fetchone() == (0,)
            assert db.execute(
                "SELECT value FROM meta WHERE key = 'highest_seq'").fetchone() == ("5",)
    finally:
        await store.close()


async def test_a_batch_the_store_cannot_encode_fails_its_waiters_and_storing_goes_on(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    sequence = Sequence(store.next_seq, store.publication_ids)
    try:
        def publication(args: list) -> StoredPublication:
            seq, publication = sequence.assign()
            return StoredPublication(
                seq=seq, publication=publication, realm="realm1",
                topic="sensor.a", args=args, kwargs=None, wall_ms=1, boot_id="boot",
                boottime_ns=1, clock_synced=True, details={"topic": "sensor.a"},
                history_rule=0, retain=True)

        with pytest.raises(StorageError):
            await asyncio.wait_for(store.append(publication([object()])), 5)
        await asyncio.wait_for(store.append(publication([2])), 5)
        assert store.failed_writes == 1
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "cairn.db")) as db:
        assert db.execute("SELECT count(*) FROM publications").fetchone() == (1,)
