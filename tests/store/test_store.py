"""The store on its own (gateway.store.Store on real SQLite files): publication ids computed
from seq, the state it keeps in memory and writes back now and then, and what it writes to
the card for a commit and for a prune."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import struct
import time
import weakref
from pathlib import Path

from cairn.formats.publication_ids import PublicationIds, new_key
from cairn.gateway.core.session import Sequence
from cairn.gateway.store import (
    PruneRule,
    Store,
    StoredPublication,
    StorePort,
    StoreReads,
    UnavailableStore,
)

BOOT = "7a9e4c2e-0d4b-4a43-9d0e-1f3b5f2c6a10"
T0 = 1_700_000_000_000


_sequences: weakref.WeakKeyDictionary[Store, Sequence] = weakref.WeakKeyDictionary()


def reading(store: Store, topic: str, value: float, retain: bool = True,
            rule: int | None = 0) -> StoredPublication:
    # seqs as the router hands them out: one Sequence per opened store, seeded from it
    sequence = _sequences.setdefault(store, Sequence(store.next_seq, store.publication_ids))
    seq, publication = sequence.assign()
    return StoredPublication(
        seq=seq, publication=publication, realm="realm1", topic=topic, args=None,
        kwargs={"temperature": value, "humidity": 50.0}, wall_ms=T0 + seq,
        boot_id=BOOT, boottime_ns=seq, clock_synced=True, authid="anonymous-1",
        authrole="anonymous", details={"topic": topic}, history_rule=rule, retain=retain)


def power_cut_copy(store: Store, into: Path) -> Path:
    """The files as a power cut would leave them: what is committed (database and WAL),
    without anything the store does at close."""
    into.mkdir()
    for suffix in ("", "-wal"):
        shutil.copyfile(f"{store.path}{suffix}", into / f"cairn.db{suffix}")
    return into / "cairn.db"


def wal_frames(path: Path) -> list[tuple[int, int]]:
    """(page number, database size after the commit or 0) of each frame in a WAL file."""
    wal = Path(f"{path}-wal").read_bytes()
    page_size = struct.unpack(">I", wal[8:12])[0]
    return [struct.unpack(">II", wal[offset:offset + 8])
            for offset in range(32, len(wal) - 23, 24 + page_size)]


# -- publication ids -----------------------------------------------------------------------


def test_a_publication_id_and_its_seq_give_each_other():
    ids = PublicationIds(new_key())
    for seq in (0, 1, 2, 1000, 2**31, 2**53 - 1):
        publication = ids.of_seq(seq)
        assert 1 <= publication <= 2**53
        assert ids.seq_of(publication) == seq


def test_publication_ids_never_repeat_and_look_random():
    ids = PublicationIds(new_key())
    values = [ids.of_seq(seq) for seq in range(1, 50_001)]
    assert len(set(values)) == len(values)
    for bit in (0, 26, 52):  # each bit set about half the time, not in runs
        share = sum(v >> bit & 1 for v in values) / len(values)
        assert 0.48 < share < 0.52, (bit, share)
    assert sorted(values) != values


def test_each_database_has_its_own_publication_ids():
    assert PublicationIds(new_key()).of_seq(1) != PublicationIds(new_key()).of_seq(1)


async def test_a_stored_publication_is_found_by_its_id_after_a_restart(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    pub = reading(store, "sensor.a", 21.5)
    await store.append(pub)
    await store.close()
    store = await Store.open(tmp_path / "cairn.db")
    try:
        assert await store.reader.seq_of_publication("realm1", pub.publication) == pub.seq
        assert await store.reader.seq_of_publication("realm2", pub.publication) is None
        assert await store.reader.seq_of_publication("realm1", pub.publication + 1) is None
    finally:
        await store.close()


# -- state written back now and then -------------------------------------------------------


async def test_retained_slots_not_yet_written_back_survive_a_power_cut(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    try:
        await store.append(reading(store, "sensor.a", 20.0))
        await store.append(reading(store, "sensor.a", 21.0))
        await store.append(reading(store, "state.x", 1.0, rule=None))  # no history
        copy = power_cut_copy(store, tmp_path / "cut")
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(copy)) as db:  # only the one without history
        assert db.execute("SELECT topic FROM retained").fetchall() == [("state.x",)]
    restarted = await Store.open(copy)
    try:
        retained = await restarted.reader.load_retained()
        assert [(p.topic, p.kwargs["temperature"]) for p in retained] == [("sensor.a", 21.0),
                                                                          ("state.x", 1.0)]
    finally:
        await restarted.close()


async def test_retained_slots_written_back_keep_their_boot_and_clock_state(tmp_path):
    """A clean restart reads the slots back from the retained table: each keeps its boot,
    CLOCK_BOOTTIME and clock state (as after a power cut, read from history), also when a
    newer publication replaced the slot's row."""
    store = await Store.open(tmp_path / "cairn.db")
    store.write_back_rows = 1
    try:
        await store.append(reading(store, "sensor.a", 20.0))
        await store.append(reading(store, "state.x", 1.0, rule=None))  # no history
        newer = reading(store, "sensor.a", 21.0)
        newer.clock_synced = False
        await store.append(newer)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "cairn.db")) as db:
        assert db.execute("SELECT topic, seq, boot_id, boottime_ns, clock_synced FROM retained"
                          " ORDER BY seq").fetchall() == [("state.x", 2, BOOT, 2, 1),
                                                          ("sensor.a", 3, BOOT, 3, 0)]
    restarted = await Store.open(tmp_path / "cairn.db")
    try:
        assert [(p.topic, p.boot_id, p.boottime_ns, p.clock_synced)
                for p in await restarted.reader.load_retained()] == \
            [("state.x", BOOT, 2, True), ("sensor.a", BOOT, 3, False)]
    finally:
        await restarted.close()


async def test_history_counts_survive_a_power_cut(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    try:
        for i in range(7):
            store.append(reading(store, f"sensor.{i % 3}", i))
        await store.flush()
        copy = power_cut_copy(store, tmp_path / "cut")
    finally:
        await store.close()
    restarted = await Store.open(copy)
    try:
        assert (await restarted.reader.summary("realm1"))["events"] == 7
        gaps = await restarted.prune([PruneRule("realm1", 0, 5, None)], 10**12, 0, True)
        assert [(g.count, g.reason) for g in gaps] == [(2, "max_events")]
    finally:
        await restarted.close()


async def test_the_state_is_written_back_after_write_back_rows(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    store.write_back_rows = 3
    try:
        for value in range(3):
            await store.append(reading(store, "sensor.a", value))
        with contextlib.closing(sqlite3.connect(store.path)) as db:
            assert db.execute("SELECT topic, seq FROM retained").fetchall() == [("sensor.a", 3)]
    finally:
        await store.close()


async def test_closing_writes_the_state_back(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    await store.append(reading(store, "sensor.a", 1.0))
    await store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "cairn.db")) as db:
        assert db.execute("SELECT topic FROM retained").fetchall() == [("sensor.a",)]


# -- what reaches the card -----------------------------------------------------------------


async def test_a_commit_of_ten_sensors_readings_writes_few_pages(tmp_path):
    """The wear benchmark's figure in miniature: a commit of ten readings of ten sensors on a
    history of thousands wrote 25 pages of 4 KiB before schema version 3."""
    store = await Store.open(tmp_path / "cairn.db")
    try:
        for i in range(20_000):
            store.append(reading(store, f"sensor.dev{i % 20:02d}", i))
        await store.flush()
        await store._writer.run(store._writer.db.execute, "PRAGMA wal_checkpoint(TRUNCATE)")
        for i in range(10):
            store.append(reading(store, f"sensor.dev{i:02d}", i))
        await store.flush()
        frames = wal_frames(store.path)
    finally:
        await store.close()
    assert sum(1 for _, commit in frames if commit) == 1
    assert len(frames) <= 10, frames  # pages of 1 KiB: about 7 today


async def test_pruning_with_nothing_to_drop_writes_nothing(tmp_path):
    store = await Store.open(tmp_path / "cairn.db")
    try:
        await store.append(reading(store, "sensor.a", 1.0))
        wal = Path(f"{store.path}-wal")
        before = wal.stat().st_size, wal.stat().st_mtime_ns
        gaps = await store.prune([PruneRule("realm1", 0, 100, 86_400_000)], 10**12, T0, True)
        assert gaps == []
        assert (wal.stat().st_size, wal.stat().st_mtime_ns) == before
    finally:
        await store.close()


async def ten_readings(tmp_path: Path) -> Store:
    store = await Store.open(tmp_path / "cairn.db")
    for i in range(10):  # seq 1..10, stamped T0 + seq ms
        store.append(reading(store, "sensor.a", i))
    await store.flush()
    return store



async def test_a_read_whose_caller_was_cancelled_holds_no_snapshot_of_the_store(tmp_path):
    """The caller is cancelled just after its answer came back (the health record's read, at
    a stop) and its task is kept (with its CancelledError, so its frames): the WAL still
    checkpoints to the end at once, not after a busy timeout at close, nor never while it
    runs."""
    store = await ten_readings(tmp_path)
    read = asyncio.create_task(store.reader.query("SELECT seq FROM publications", ()))
    await asyncio.sleep(0)  # the read is queued on the reader's thread
    time.sleep(0.2)  # which answers while this loop is held
    await asyncio.sleep(0)  # the answer is in; the reading task has not resumed yet
    read.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await read
    store.append(reading(store, "sensor.a", 11.0))
    await store.flush()
    with contextlib.closing(sqlite3.connect(store.path, timeout=0)) as other:
        busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    await store.close()
    assert read.cancelled() and busy == 0


async def test_max_events_drops_the_oldest_and_counts_them(tmp_path):
    store = await ten_readings(tmp_path)
    try:
        gaps = await store.prune([PruneRule("realm1", 0, 6, None)], 10**12, T0, True)
        left = await store.reader.summary("realm1")
    finally:
        await store.close()
    assert [(g.first_seq, g.last_seq, g.count, g.reason) for g in gaps] == \
        [(1, 4, 4, "max_events")]
    assert (left["events"], left["first_seq"], left["last_seq"]) == (6, 5, 10)


async def test_max_age_drops_what_is_older_in_receive_order(tmp_path):
    store = await ten_readings(tmp_path)
    try:
        gaps = await store.prune([PruneRule("realm1", 0, 100, 1000)], 10**12, T0 + 1005, True)
        left = await store.reader.summary("realm1")
    finally:
        await store.close()
    assert [(g.first_seq, g.last_seq, g.count, g.reason) for g in gaps] == \
        [(1, 4, 4, "max_age")]
    assert (left["events"], left["first_seq"]) == (6, 5)


async def test_max_events_is_kept_within_a_thousandth(tmp_path):
    """A full history is pruned a thousand events at a time, not for every few that come."""
    store = await Store.open(tmp_path / "cairn.db")
    try:
        for i in range(10_005):
            store.append(reading(store, "sensor.a", i, retain=False))
        await store.flush()
        rule = PruneRule("realm1", 0, 10_000, None)
        assert await store.prune([rule], 10**12, T0, True) == []
        for i in range(6):
            store.append(reading(store, "sensor.a", i, retain=False))
        await store.flush()
        (gap,) = await store.prune([rule], 10**12, T0, True)
        assert (gap.first_seq, gap.count) == (1, 11)
        assert (await store.reader.summary("realm1"))["events"] == 10_000
    finally:
        await store.close()


async def big_readings(tmp_path: Path, count: int) -> Store:
    """``count`` events of 64 KiB each."""
    store = await Store.open(tmp_path / "cairn.db")
    for _ in range(count):
        pub = reading(store, "sensor.big", 0.0, retain=False)
        pub.args = ["x" * 65536]
        store.append(pub)
    await store.flush()
    return store


async def test_max_store_bytes_drops_about_what_is_over_not_a_thousand_events(tmp_path):
    store = await big_readings(tmp_path, 200)
    try:
        (gap,) = await store.prune([PruneRule("realm1", 0, 10**6, None)], 8 * 2**20, T0, True)
        left = (await store.reader.summary("realm1"))["events"]
    finally:
        await store.close()
    assert gap.reason == "max_store_bytes"
    assert 100 <= left <= 8 * 16  # the bound holds about 120 such events


async def test_a_big_drop_gives_the_freed_space_back_to_the_filesystem(tmp_path):
    store = await big_readings(tmp_path, 200)
    try:
        before = store.path.stat().st_size
        await store.prune([PruneRule("realm1", 0, 10, None)], 10**12, T0, True)
    finally:
        await store.close()  # (the file is cut at the checkpoint)
    assert before > 12 * 2**20
    assert store.path.stat().st_size < 2 * 2**20


async def test_a_storm_on_a_history_topic_is_dropped_as_it_comes_not_at_the_next_prune(
        tmp_path):
    """A storm on a topic whose rule keeps 500 events grew the file to a GiB before the
    maintenance pass dropped it, and giving that back took minutes of a busy writer."""
    store = await Store.open(tmp_path / "cairn.db")
    store.bounds = [PruneRule("realm1", 0, 500, None)], 10**12
    try:
        for i in range(12_000):
            pub = reading(store, "storm.x", i, retain=False)
            pub.args = ["x" * 4096]
            store.append(pub, within=0 if i % 1000 == 999 else None)
            if i % 1000 == 999:
                await store.flush()
        events = (await store.reader.summary("realm1"))["events"]
        size = store.path.stat().st_size + store.path.with_name("cairn.db-wal").stat().st_size
    finally:
        await store.close()
    assert 500 <= events < 500 + 2 * store.prune_budget
    assert size < 25 * 2**20  # 12,000 such events take 50 MiB


async def test_a_big_prune_runs_in_transactions_of_its_budget_and_drops_it_all(tmp_path):
    """A storm's prune used to hold the writer for one long transaction, and every
    acknowledged publish waited for it; now commits get the writer between chunks."""
    store = await Store.open(tmp_path / "cairn.db")
    try:
        for i in range(5_100):
            store.append(reading(store, "sensor.a", i, retain=False))
        await store.flush()
        store.prune_budget = 2000
        gaps = await store.prune([PruneRule("realm1", 0, 100, None)], 10**12, T0, True)
        left = await store.reader.summary("realm1")
    finally:
        await store.close()
    assert [g.count for g in gaps] == [2000, 2000, 1000]
    assert [(g.first_seq, g.last_seq) for g in gaps] == [(1, 2000), (2001, 4000), (4001, 5000)]
    assert (left["events"], left["first_seq"]) == (100, 5001)


async def test_a_damaged_retained_row_is_left_out_and_the_others_come_back(tmp_path, caplog):
    """It used to stop the store from loading, so the router could not start."""
    store = await Store.open(tmp_path / "cairn.db")
    try:
        await store.append(reading(store, "state.x", 1.0, rule=None))
        await store.append(reading(store, "state.y", 2.0, rule=None))
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "cairn.db")) as db, db:
        db.execute("UPDATE retained SET payload = x'c1c1' WHERE topic = 'state.x'")
    restarted = await Store.open(tmp_path / "cairn.db")
    try:
        retained = await restarted.reader.load_retained()
    finally:
        await restarted.close()
    assert [(p.topic, p.kwargs["temperature"]) for p in retained] == [("state.y", 2.0)]
    assert "state.x" in caplog.text and "cannot be read" in caplog.text



def port_members(port: type) -> set[str]:
    return {name for name in [*vars(port), *port.__annotations__] if not name.startswith("_")}


def implements(obj: object, port: type) -> set[str]:
    """The members of ``port`` that ``obj`` lacks (what it inherits from ``port`` itself, a
    stub, does not count)."""
    own = [vars(obj), *(vars(k) for k in type(obj).__mro__ if k is not port and k is not object
                        and k.__module__ != "typing")]
    return {name for name in port_members(port) if not any(name in d for d in own)}


async def test_the_store_and_its_stand_in_have_every_member_of_the_port(tmp_path):
    """What the shell uses of a store (StorePort) is there whether the store opened or not."""
    assert {"append", "reader", "prune", "close", "congested", "on_drained"} <= \
        port_members(StorePort)
    store = await Store.open(tmp_path / "cairn.db")
    try:
        for obj in (store, UnavailableStore("disk full")):
            assert isinstance(obj, StorePort) and isinstance(obj.reader, StoreReads)
            assert implements(obj, StorePort) == set(), type(obj)
            assert implements(obj.reader, StoreReads) == set(), type(obj)
    finally:
        await store.close()
