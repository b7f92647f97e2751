"""Schema migrations: a database written by an older Cairn is upgraded when the store opens,
and everything it held stays readable."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from cairn.gateway.core import Sequence
from cairn.gateway.store import (
    _LEGACY_SEQ_OF_PUBLICATION,
    MIGRATIONS,
    SCHEMA_VERSION,
    Store,
    StoredPublication,
)

# seqs spread over several 1,024-seq chunks of the version 2 index, publication ids random
OLD_ROWS = [(1, 7_777_777_777_001), (900, 3_141_592_653_589), (5_000, 2**53 - 5),
            (70_001, 1)]


def write_v1_database(path: Path) -> None:
    """What Cairn with schema version 1 left behind: history rows, a retained row and the
    highest seq in meta."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.executescript(MIGRATIONS[0])
        db.execute("PRAGMA user_version = 1")
        for seq, publication in OLD_ROWS:
            db.execute(
                "INSERT INTO publications (seq, publication, realm, topic, rule, wall_ms,"
                " boot_id, boottime_ns, clock_synced, details, payload)"
                " VALUES (?, ?, 'realm1', 'sensor.a', 0, 1000, 'boot', 1, 1, ?, ?)",
                (seq, publication, '{"topic": "sensor.a"}', b"\x92\x90\xc0"))
        db.execute("INSERT INTO retained (realm, topic, audience_key, seq, publication,"
                   " wall_ms, payload) VALUES ('realm1', 'state.a', '', 70002, 42, 1000, ?)",
                   (b"\x92\x90\xc0",))
        db.execute("INSERT INTO meta (key, value) VALUES ('highest_seq', '70003')")


def indexes(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'publications'")}


def new_publication(store: Store) -> StoredPublication:
    seq, publication = Sequence(store.next_seq, store.publication_ids).assign()
    return StoredPublication(
        seq=seq, publication=publication, realm="realm1", topic="sensor.a",
        args=[1], kwargs=None, wall_ms=2000, boot_id="boot", boottime_ns=2,
        clock_synced=True, details={"topic": "sensor.a"}, history_rule=0)


async def test_a_version_1_database_is_upgraded_at_start_up_and_keeps_working(tmp_path):
    path = tmp_path / "cairn.db"
    write_v1_database(path)
    assert "publications_publication" in indexes(path)

    store = await Store.open(path)
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert indexes(path) == {"publications_legacy_publication"}
        with contextlib.closing(sqlite3.connect(path)) as db:  # what queries walk
            assert db.execute("SELECT s.seq, t.realm, t.topic, s.rule FROM history_scan AS s"
                              " JOIN topics AS t ON t.id = s.topic ORDER BY s.seq").fetchall() \
                == [(seq, "realm1", "sensor.a", 0) for seq, _ in OLD_ROWS]
        assert store.next_seq == 70_004  # seq carries on, never reused

        for seq, publication in OLD_ROWS:  # the old rows are found by publication id
            assert await store.reader.seq_of_publication("realm1", publication) == seq
        assert await store.reader.seq_of_publication("realm2", OLD_ROWS[0][1]) is None
        assert await store.reader.seq_of_publication("realm1", 123) is None
        legacy = _LEGACY_SEQ_OF_PUBLICATION.format(legacy=70_001)
        plan = " ".join(row[-1] for row in await store.reader.query(
            f"EXPLAIN QUERY PLAN {legacy}", (5, "realm1")))
        assert "SEARCH p USING INDEX publications_legacy_publication (<expr>=? AND publication=?" \
            in plan, plan

        fresh = new_publication(store)
        await store.append(fresh)
        assert fresh.seq == 70_004
        assert await store.reader.seq_of_publication("realm1", fresh.publication) == 70_004
        assert [p.topic for p in await store.reader.load_retained()] == ["state.a"]
    finally:
        await store.close()

    store = await Store.open(path)  # opening an upgraded database again changes nothing
    try:
        assert store.next_seq == 70_005
        assert await store.reader.seq_of_publication("realm1", OLD_ROWS[2][1]) == OLD_ROWS[2][0]
        assert await store.reader.seq_of_publication("realm1", fresh.publication) == 70_004
        assert (await store.reader.summary("realm1"))["events"] == 5
    finally:
        await store.close()


async def test_a_new_database_gets_the_current_schema(tmp_path):
    path = tmp_path / "cairn.db"
    store = await Store.open(path)
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert indexes(path) == set()
