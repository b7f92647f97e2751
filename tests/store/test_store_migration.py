"""Schema migrations: a database written by an older Cairn is upgraded when the store opens,
and everything it held stays readable."""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from cairn.gateway.core.session import Sequence
from cairn.gateway.store import (
    LEGACY_SEQ_OF_PUBLICATION,
    MIGRATIONS,
    SCHEMA_VERSION,
    SchemaTooNew,
    Store,
    StoredPublication,
    discard_pre_migration_copies,
    pre_migration_copy,
    schema,
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
        legacy = LEGACY_SEQ_OF_PUBLICATION.format(legacy=70_001)
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


# -- a system update that migrated the store and was rolled back ----------------------------


def user_version(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


async def events(path: Path) -> int:
    store = await Store.open(path)
    try:
        return (await store.reader.summary("realm1"))["events"]
    finally:
        await store.close()


async def test_a_migration_keeps_a_copy_of_the_store_as_the_older_release_left_it(tmp_path):
    path = tmp_path / "cairn.db"
    write_v1_database(path)
    await (await Store.open(path)).close()
    copy = pre_migration_copy(path, 1)
    assert user_version(path) == SCHEMA_VERSION and user_version(copy) == 1
    with contextlib.closing(sqlite3.connect(copy)) as db:
        assert db.execute("SELECT seq FROM publications ORDER BY seq").fetchall() == \
            [(seq,) for seq, _ in OLD_ROWS]


async def test_after_a_rollback_the_older_release_takes_back_its_copy(tmp_path, monkeypatch):
    """This release stored two readings; a newer one (schema + 1) migrated the store, stored
    one more and was rolled back: this release starts on its copy, with its two readings,
    and the newer file is set aside, not lost."""
    path = tmp_path / "cairn.db"
    store = await Store.open(path)
    for _ in range(2):
        await store.append(new_publication(store))
    await store.close()

    with monkeypatch.context() as newer:
        newer.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        newer.setattr(schema, "MIGRATIONS", [*MIGRATIONS, "CREATE TABLE future (x)"])
        store = await Store.open(path)
        await store.append(new_publication(store))
        await store.close()
    assert user_version(path) == SCHEMA_VERSION + 1

    assert await events(path) == 2
    assert user_version(path) == SCHEMA_VERSION
    aside = tmp_path / f"cairn.db.schema-{SCHEMA_VERSION + 1}.rolled-back"
    assert user_version(aside) == SCHEMA_VERSION + 1
    with contextlib.closing(sqlite3.connect(aside)) as db:
        assert db.execute("SELECT COUNT(*) FROM publications").fetchone() == (3,)
    assert not pre_migration_copy(path, SCHEMA_VERSION).exists()


async def test_a_newer_store_without_a_copy_is_refused_untouched(tmp_path):
    path = tmp_path / "cairn.db"
    await (await Store.open(path)).close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(SchemaTooNew):
        await Store.open(path)
    assert path.read_bytes() == before


async def test_once_the_update_is_kept_its_copies_go_but_not_what_a_rollback_set_aside(
        tmp_path):
    path = tmp_path / "cairn.db"
    for name in ("cairn.db", "cairn.db.schema-2", "cairn.db.schema-4.rolled-back"):
        (tmp_path / name).write_bytes(b"x")
    assert discard_pre_migration_copies(path) == [tmp_path / "cairn.db.schema-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["cairn.db", "cairn.db.schema-4.rolled-back"]


# -- schema version 4: a retained slot keeps its boot and clock state ------------------------

NOT_UTF8 = b"\xff\xfeboot"


def write_v3_database(path: Path) -> None:
    """What Cairn with schema version 3 left behind: retained slots without boot or clock
    state, written back (the meta state covers them). state.a's history row is there,
    state.b has none (retained only), sensor.c's was pruned, state.d's has a boot id
    damaged past reading and state.e's row holds another publication."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        for migration in MIGRATIONS[:3]:
            if callable(migration):
                migration(db)
            else:
                db.executescript(migration)
        db.execute("PRAGMA user_version = 3")
        history = [(10, 1010, "state.a", "boot-1", 5_000_000_000, 1),
                   (12, 1012, "state.d", NOT_UTF8, 6_000_000_000, 1),
                   (13, 1099, "state.e", "boot-1", 7_000_000_000, 1),
                   (14, 1014, "sensor.x", "boot-2", 8_000_000_000, 0)]
        for seq, publication, topic, boot, boottime, synced in history:
            db.execute(
                "INSERT INTO publications (seq, publication, realm, topic, rule, wall_ms,"
                " boot_id, boottime_ns, clock_synced, details, payload, retain)"
                " VALUES (?, ?, 'realm1', ?, 0, ?, CAST(? AS TEXT), ?, ?, ?, ?, 1)",
                (seq, publication, topic, 1000 + seq, boot, boottime, synced,
                 f'{{"topic": "{topic}"}}', b"\x92\x90\xc0"))
        db.execute("INSERT INTO topics (realm, topic) SELECT DISTINCT realm, topic"
                   " FROM publications")
        db.execute("INSERT INTO history_scan SELECT p.seq, t.id, p.rule, p.wall_ms,"
                   " p.clock_synced FROM publications AS p JOIN topics AS t USING (realm, topic)")
        slots = [("state.a", 10, 1010), ("state.b", 11, 1011), ("sensor.c", 9, 1009),
                 ("state.d", 12, 1012), ("state.e", 13, 1013)]
        for topic, seq, publication in slots:
            db.execute("INSERT INTO retained (realm, topic, audience_key, seq, publication,"
                       " wall_ms, authid, details, payload) VALUES ('realm1', ?, '', ?, ?, ?,"
                       " 'sensor-1', ?, ?)",
                       (topic, seq, publication, 1000 + seq, f'{{"topic": "{topic}"}}',
                        b"\x92\x91\x01\xc0"))
        schema.put_meta(db, "highest_seq", "14")
        schema.put_meta(db, "state", schema.encode_state(14, Counter({("realm1", 0): 4})))


async def test_a_version_3_store_keeps_its_retained_slots_with_boot_and_clock_from_history(
        tmp_path):
    path = tmp_path / "cairn.db"
    write_v3_database(path)

    store = await Store.open(path)
    try:
        assert user_version(path) == SCHEMA_VERSION == 4
        assert user_version(pre_migration_copy(path, 3)) == 3
        assert [(p.topic, p.seq, p.publication, p.wall_ms, p.authid, p.args, p.boot_id,
                 p.boottime_ns, p.clock_synced)
                for p in await store.reader.load_retained()] == [
            ("sensor.c", 9, 1009, 1009, "sensor-1", [1], "", 0, False),  # no history row
            ("state.a", 10, 1010, 1010, "sensor-1", [1], "boot-1", 5_000_000_000, True),
            ("state.b", 11, 1011, 1011, "sensor-1", [1], "", 0, False),
            ("state.d", 12, 1012, 1012, "sensor-1", [1], "", 0, False),  # damaged: not taken
            ("state.e", 13, 1013, 1013, "sensor-1", [1], "", 0, False),  # not its publication
        ]
        assert not store.reader.damage.rows
        with contextlib.closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert db.execute("SELECT COUNT(*) FROM retained").fetchone() == (5,)

        fresh = new_publication(store)  # a slot written after the migration has them too
        fresh.retain, fresh.topic, fresh.details = True, "state.a", {"topic": "state.a"}
        await store.append(fresh)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT seq, boot_id, boottime_ns, clock_synced FROM retained"
                          " WHERE topic = 'state.a'").fetchone() == (fresh.seq, "boot", 2, 1)
