"""A damaged card costs one reading, never the gateway (issue 31): rows damaged on a real
store file (bytes written with sqlite3, as a bad sector or a torn page leaves them) are left
out and counted by every read, the router starts and routes on, ``cairn sync`` ships what it
cannot read as gaps, ``cairn doctor`` names the damage and ``cairn repair`` writes a clean
store from every readable row.

The store every test damages is written once by a real router: retained events with and
without history, history on two rules (one pruned: a gap record), subscriptions kept with
their ids, a clock anchor."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.ops import maintenance as ops
from cairn.gateway.shell.server import Node
from cairn.gateway.store import inspect, writer
from cairn.sync.sinks import DirectorySink
from harness.config import history_rule, open_realm, router_table
from harness.process import RouterProcess
from harness.wamp_client import connect, retained_values
from tests.conftest import RunningRouter, start_router
from tests.system.test_ops import cairn, doctor_lines, write_config
from tests.system.test_sync import landed, uploader_for

REALM = open_realm(history=[history_rule("sensor"), history_rule("log", max_events=5)])
BAD = "CAST(x'73656e736f72ff2e61' AS TEXT)"  # "sensor\xff.a": not UTF-8
ACK = PublishOptions(acknowledge=True)
RETAIN = PublishOptions(acknowledge=True, retain=True)
TABLES = ("meta", "publications", "history_scan", "topics", "retained", "subscriptions",
          "anchors", "gaps")


def config(data_dir: Path) -> str:
    return router_table(data_dir, rawsocket=["127.0.0.1:0"]) + REALM


@contextlib.asynccontextmanager
async def running(data_dir: Path) -> AsyncIterator[tuple[Node, RunningRouter]]:
    node = await start_router(config(data_dir))
    try:
        yield node, RunningRouter(node, "")
    finally:
        await node.stop()


async def _write_store(data_dir: Path) -> None:
    async with running(data_dir) as (node, router):
        client = await connect(router)
        for topic in ("sensor.a", "sensor.b"):  # kept (history), each with its own id
            await client.subscribe(lambda *a, **k: None, topic)
        for topic in ("sensor.a", "sensor.b", "sensor.c", "state.x", "state.y"):
            await client.publish(topic, f"{topic} retained", options=RETAIN)
        for i in range(12):
            await client.publish(f"sensor.{'abc'[i % 3]}", i, options=ACK)
        for i in range(8):
            await client.publish(f"log.l{i % 2}", i, options=ACK)
        await node.stores.prune()  # the log rule keeps 5: a gap record
        await client.leave()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("pristine") / "data"
    asyncio.run(_write_store(data_dir))
    return data_dir


@pytest.fixture
def data(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(pristine, copy)
    return copy


def rows(db_path: Path, table: str, where: str = "") -> list[tuple[Any, ...]]:
    """A table's rows as stored (text that is not UTF-8 as bytes), rowid first."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        db.text_factory = bytes
        return db.execute(f"SELECT rowid, * FROM {table} {where} ORDER BY rowid").fetchall()


def write(db_path: Path, sql: str, *params: Any) -> None:
    with contextlib.closing(sqlite3.connect(db_path, timeout=30)) as db, db:
        db.execute(sql, params)


async def history(session: Any, uri: str) -> list[int]:
    """The publication ids of the history of the rule subscription on ``uri``."""
    sub = await session.call("wamp.subscription.lookup", uri, {"match": "prefix"})
    result = await session.call("wamp.subscription.get_events", sub, limit=1000)
    return [e["publication"] for e in result.results[0]]


async def retained(session: Any) -> dict[str, Any]:
    return {**await retained_values(session, "sensor"), **await retained_values(session, "state")}


async def routes(router: Any) -> bool:
    """A live event reaches a subscriber."""
    got: asyncio.Future = asyncio.get_running_loop().create_future()
    subscriber, publisher = await connect(router), await connect(router)
    await subscriber.subscribe(lambda v: got.done() or got.set_result(v), "live.t")
    await publisher.publish("live.t", "hello", options=ACK)
    return await asyncio.wait_for(got, 5) == "hello"


def pristine_history(pristine: Path, prefix: str) -> list[int]:
    return [row[2] for row in rows(pristine / "cairn.db", "publications",
                                   f"WHERE topic LIKE '{prefix}.%'")]


def pristine_retained(pristine: Path) -> dict[str, str]:
    """The retained values ``retained`` reads (not the router's own health record)."""
    return {row[2].decode(): f"{row[2].decode()} retained"
            for row in rows(pristine / "cairn.db", "retained")
            if row[2].decode().startswith(("sensor", "state"))}


# -- N1: text that is not UTF-8, in each of the columns a restart reads --------------------


@pytest.mark.parametrize(("table", "column", "where"), [
    ("retained", "topic", "topic = 'sensor.a'"),
    ("retained", "realm", "topic = 'sensor.a'"),
    ("subscriptions", "uri", "uri = 'sensor.a'"),
    ("topics", "topic", "topic = 'sensor.b'"),
])
async def test_a_text_value_that_is_not_utf8_costs_its_row_not_the_store(
        data, pristine, table, column, where):
    """It used to refuse the whole store at start ("Could not decode to UTF-8"): no
    history, no retained values, nothing stored until someone mended the file."""
    write(data / "cairn.db", f"UPDATE {table} SET {column} = {BAD} WHERE {where}")
    async with running(data) as (node, router):
        assert node.stores.error is None
        session = await connect(router)
        status = await session.call("cairn.router.status")
        metrics = await node.web.metrics()
        assert await routes(router)
        served = await retained(session)
        assert await history(session, "sensor") == pristine_history(pristine, "sensor")
        ids = {uri: await session.call("wamp.subscription.lookup", uri, {"match": match})
               for uri, match in (("sensor", "prefix"), ("log", "prefix"), ("sensor.b", "exact"))}
    assert status["store_damaged_rows"] == {table: 1}
    assert f'cairn_store_damaged_rows_total{{table="{table}"}} 1' in metrics
    expected = pristine_retained(pristine)
    if table == "retained":  # that topic has none until its next publication
        del expected["sensor.a"]
    assert served == expected
    kept = {row[3].decode(): row[1] for row in rows(pristine / "cairn.db", "subscriptions")}
    assert ids == {uri: kept[uri] for uri in ids}  # the others keep their ids


async def test_a_subscription_made_anew_for_a_damaged_one_keeps_its_new_id(data):
    """The router makes a damaged kept subscription anew; its row replaces the damaged one
    (an INSERT OR IGNORE kept the damaged row, and the id changed at every restart)."""
    write(data / "cairn.db", "UPDATE subscriptions SET created = CAST(x'ff' AS TEXT)"
                             " WHERE uri = 'sensor'")
    ids = []
    for _ in range(2):
        async with running(data) as (_, router):
            session = await connect(router)
            ids.append(await session.call("wamp.subscription.lookup", "sensor",
                                          {"match": "prefix"}))
    assert ids[0] is not None and ids[0] == ids[1]
    assert inspect(data / "cairn.db").clean


# -- N2: values that parse as nothing the router expects ---------------------------------


async def test_a_state_that_is_not_json_is_rebuilt_from_the_rows_and_no_seq_is_reused(
        data, pristine):
    """The router used to exit 1 at start (json.loads of the meta state)."""
    write(data / "cairn.db", "UPDATE meta SET value = 'not json {' WHERE key = 'state'")
    router = RouterProcess(data.parent, REALM).start()
    try:
        session = await connect(router)
        served = await retained(session)
        before = await history(session, "sensor")
        await session.publish("sensor.a", "new", options=ACK)
        after = await history(session, "sensor")
        log = await history(session, "log")
        status = await session.call("cairn.router.status")
        await session.leave()
    finally:
        assert router.stop() == 0
    assert served == pristine_retained(pristine)
    assert before == pristine_history(pristine, "sensor") and after[:-1] == before
    assert log == pristine_history(pristine, "log")
    # counted again from the rows: the pristine ones and the new reading, and this start's
    # health record if it was committed by then (it may wait up to a minute to share a commit)
    pristine_rows = len(rows(pristine / "cairn.db", "publications"))
    assert len(rows(data / "cairn.db", "publications")) == pristine_rows + 2
    assert status["store"]["events"] in (pristine_rows + 1, pristine_rows + 2)
    assert status["store_damaged_rows"] == {"meta": 1}
    seqs = [row[0] for row in rows(data / "cairn.db", "publications")]
    assert seqs[-1] > max(row[0] for row in rows(pristine / "cairn.db", "publications"))


async def test_a_retained_seq_holding_text_leaves_that_slot_out_until_its_next_value(
        data, pristine):
    """The router used to exit 1 at start (int() of the highest seq); and a slot whose seq
    is text could never be replaced (text sorts after every integer in SQLite)."""
    write(data / "cairn.db", "UPDATE retained SET seq = 'garbage' WHERE topic = 'state.x'")
    router = RouterProcess(data.parent, REALM).start()
    try:
        session = await connect(router)
        first = await retained(session)
        await session.publish("state.x", "newer", options=RETAIN)
        await session.leave()
        assert router.stop() == 0
        router.start()
        session = await connect(router)
        second = await retained(session)
        await session.leave()
    finally:
        router.stop()
    expected = pristine_retained(pristine)
    assert first == {k: v for k, v in expected.items() if k != "state.x"}
    assert second == {**expected, "state.x": "newer"}


async def test_damage_no_read_foresaw_leaves_the_router_routing_without_its_store(
        data, monkeypatch, caplog):
    """Whatever reading the file raises beyond the damage the reads leave out (a bug) used to
    make the router exit 1, and systemd start it again into the same failure."""
    def fails(*args: Any) -> None:
        raise KeyError("a case no read foresaw")

    monkeypatch.setattr(writer.StoreState, "load", fails)
    async with running(data) as (node, router):
        assert "a case no read foresaw" in node.stores.error
        assert await routes(router)
    assert "Traceback" in caplog.text


# -- N8: a history row with a topic that is not UTF-8 --------------------------------------


def damaged_history_row(db_path: Path) -> int:
    seq = rows(db_path, "publications", "WHERE topic = 'sensor.b'")[2][0]
    write(db_path, f"UPDATE publications SET topic = {BAD} WHERE seq = ?", seq)
    return seq


def test_sync_ships_a_history_row_with_a_damaged_topic_as_a_gap(data, tmp_path):
    """`cairn sync` used to die on it with an uncaught OperationalError, every run."""
    seq = damaged_history_row(data / "cairn.db")
    uploader = uploader_for(data, DirectorySink(tmp_path / "landing"))
    shipped = uploader.once()
    manifests, batch = landed(tmp_path / "landing")
    everything = [row[0] for row in rows(data / "cairn.db", "publications")]
    assert shipped == len(everything) - 1
    assert [r["seq"] for r in batch] == [s for s in everything if s != seq]
    [gap] = [g for m in manifests for g in m["gaps"] if g["reason"].startswith("damaged")]
    assert (gap["first_seq"], gap["last_seq"], gap["realm"]) == (seq, seq, "realm1")
    assert "topic holds text that is not UTF-8" in gap["reason"]


async def test_get_events_leaves_out_a_row_with_a_damaged_topic_and_counts_it(data, pristine):
    """Every page that held it used to answer cairn.error.internal."""
    async with running(data) as (node, router):
        session = await connect(router)
        seq = damaged_history_row(data / "cairn.db")  # while the router runs
        damaged = rows(data / "cairn.db", "publications", f"WHERE seq = {seq}")[0][2]
        for _ in range(2):  # read twice, counted once
            served = await history(session, "sensor")
        metrics = await node.web.metrics()
    assert served == [p for p in pristine_history(pristine, "sensor") if p != damaged]
    assert 'cairn_store_damaged_rows_total{table="publications"} 1' in metrics


# -- doctor, repair, backup, restore -------------------------------------------------------


async def test_doctor_names_the_damage_and_repair_writes_a_clean_store(data, pristine, tmp_path):
    seq = damaged_history_row(data / "cairn.db")
    write(data / "cairn.db", "UPDATE retained SET payload = x'c1' WHERE topic = 'state.y'")
    conf = write_config(tmp_path / "cairn.toml", data)
    report = cairn("doctor", "--config", str(conf))
    assert report.returncode == 1, report.stdout
    lines = dict(doctor_lines(report.stdout))["store rows"]
    stored = len(rows(data / "cairn.db", "publications"))  # readings and health records
    assert ("FAIL", f"publications: 1 of {stored} damaged, left out by the router (seq {seq}: topic"
                    f" holds text that is not UTF-8 (b'sensor\\xff.a'), not text)") in lines
    assert any(level == "FAIL" and detail.startswith(
                   f"retained: 1 of {len(rows(data / 'cairn.db', 'retained'))} damaged")
               and "topic state.y: FormatError" in detail for level, detail in lines)

    async with running(data):
        refused = cairn("repair", "--config", str(conf))
    assert refused.returncode == 1 and "in use by a running router: stop it first" in \
        refused.stderr
    damaged_bytes = (data / "cairn.db").read_bytes()
    done = cairn("repair", "--config", str(conf))
    assert done.returncode == 0, done.stderr
    assert "held 2 damaged rows (publications 1, retained 1)" in done.stdout
    [aside] = data.glob("cairn.db.damaged-*")  # one file: its WAL went into it
    assert aside.read_bytes() == damaged_bytes  # kept, not deleted
    assert inspect(data / "cairn.db").clean
    old, new = (rows(path, "publications") for path in (pristine / "cairn.db", data / "cairn.db"))
    assert new == [row for row in old if row[0] != seq]
    assert [r[3:7] for r in rows(data / "cairn.db", "gaps")][-1] == (None, seq, seq, 1)
    assert rows(data / "cairn.db", "subscriptions") == rows(pristine / "cairn.db",
                                                             "subscriptions")
    again = cairn("repair", "--config", str(conf))
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_backup_and_restore_say_that_what_they_copy_holds_damaged_rows(data, tmp_path):
    write(data / "cairn.db", f"UPDATE topics SET topic = {BAD} WHERE topic = 'sensor.c'")
    backup = ops.backup(data, tmp_path / "backup.db")
    assert backup["damage"] == "1 damaged row (topics 1)"
    said = []
    target = tmp_path / "other"
    target.mkdir()
    ops.restore(target, tmp_path / "backup.db",
                lambda line: said.append((line, (target / "cairn.db").exists())))
    assert said == [(f"{tmp_path / 'backup.db'} holds 1 damaged row (topics 1): the router "
                     f"will leave them out; `cairn repair` (router stopped) writes a clean "
                     f"store from the rest", False)]  # before anything was replaced


# -- the property: random damage in every table -------------------------------------------


def _flip(column: str, value: Any, rng: random.Random) -> bytes:
    """The bytes a column holds after one of them flipped, always past reading: a byte that
    is never UTF-8 in text, integers and NULL (each read back as text); a payload's first
    byte one msgpack never uses."""
    if column == "payload":
        return b"\xc1" + value[1:]
    raw = value if isinstance(value, bytes) else str(value if value is not None else "x").encode()
    at = rng.randrange(len(raw) or 1)
    return raw[:at] + bytes([0xF8 | rng.randrange(8)]) + raw[at + 1:]


def damage_at_random(db_path: Path, seed: int) -> dict[str, dict[int, str]]:
    """One to three rows of every table, one column each: {table: {rowid: column}}."""
    rng = random.Random(seed)
    done: dict[str, dict[int, str]] = {}
    with contextlib.closing(sqlite3.connect(db_path)) as db, db:
        db.text_factory = bytes
        for table in TABLES:
            info = [(c[1].decode(), c[2].decode(), c[5])
                    for c in db.execute(f"PRAGMA table_info({table})")]
            columns = [name for name, kind, key in info if not (key and kind == "INTEGER")]
            rowids = [r[0] for r in db.execute(f"SELECT rowid FROM {table}")]
            for rowid in rng.sample(rowids, min(len(rowids), rng.choice((1, 2, 3)))):
                column = rng.choice(columns)
                (value,) = db.execute(f"SELECT {column} FROM {table} WHERE rowid = ?",
                                      (rowid,)).fetchone()
                cast = "?" if column == "payload" else "CAST(? AS TEXT)"
                db.execute(f"UPDATE {table} SET {column} = {cast} WHERE rowid = ?",
                           (_flip(column, value, rng), rowid))
                done.setdefault(table, {})[rowid] = column
    return done


def reachable_topics(pristine: Path, damage: dict[str, dict[int, str]]) -> set[int]:
    """Topic ids get_events still finds: an intact topics row, or one the router names from
    a history row of it whose realm and topic are intact."""
    db = pristine / "cairn.db"
    scan = {row[1]: row[2] for row in rows(db, "history_scan")
            if damage.get("history_scan", {}).get(row[0]) != "topic"}
    named = {scan[row[0]] for row in rows(db, "publications") if row[0] in scan and
             damage.get("publications", {}).get(row[0]) not in ("realm", "topic")}
    return {row[1] for row in rows(db, "topics")
            if row[0] not in damage.get("topics", {}) or row[1] in named}


@pytest.mark.parametrize("seed", range(4))
async def test_random_damage_in_every_table_costs_the_damaged_rows_only(
        data, pristine, tmp_path, seed):
    """Bytes flipped in one to three rows of every table (seeded): the router starts, routes
    and serves every intact row; sync ships the intact rows and the rest as gaps; doctor
    counts every damaged row; repair writes a sound store of every readable row, from which
    the router serves all of history again."""
    db = data / "cairn.db"
    damage = damage_at_random(db, seed)
    old = {table: {row[0]: row for row in rows(pristine / "cairn.db", table)} for table in TABLES}
    intact = {table: {rowid: row for rowid, row in old[table].items()
                      if rowid not in damage.get(table, {})} for table in TABLES}
    scan_ok = {row[1] for row in intact["history_scan"].values()}
    topics = reachable_topics(pristine, damage)
    topic_of = {row[1]: row[2] for row in old["history_scan"].values()}
    readable_history = {row[2] for seq, row in intact["publications"].items()
                        if seq in scan_ok and topic_of[seq] in topics
                        and row[4] != HEALTH_TOPIC.encode()}  # read below: sensor and log

    # doctor finds every damaged row, by table
    assert inspect(db).damaged == Counter({t: len(d) for t, d in damage.items()})

    # the router starts on it (a copy: its writes mend some), routes, and serves every intact
    # retained value and history row
    routed = tmp_path / "routed"
    shutil.copytree(data, routed)
    async with running(routed) as (node, router):
        assert node.stores.error is None
        session = await connect(router)
        assert await routes(router)
        served = await retained(session)
        history_served = set(await history(session, "sensor") + await history(session, "log"))
    for row in intact["retained"].values():
        if row[2] != HEALTH_TOPIC.encode():  # the router's own, not read here
            assert served[row[2].decode()] == f"{row[2].decode()} retained"
    assert readable_history <= history_served <= {row[2] for row in old["publications"].values()}

    # sync ships every intact history row as it was, and the rest (what it cannot read) as gaps
    uploader_for(data, DirectorySink(tmp_path / "landing")).once()
    manifests, batch = landed(tmp_path / "landing")
    shipped = {r["seq"]: r for r in batch}
    lost = {g["first_seq"] for m in manifests for g in m["gaps"] if g["id"] < 0}
    for seq, row in intact["publications"].items():
        assert shipped[seq]["publication"] == row[2] and shipped[seq]["topic"] == row[4].decode()
    last = max(shipped)
    assert {seq for seq in old["publications"] if seq < last} <= set(shipped) | lost

    # repair: a sound store holding every readable row
    result = ops.repair(data)
    assert result["findings"].total == sum(len(d) for d in damage.values())
    with contextlib.closing(sqlite3.connect(db)) as new:
        assert new.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert inspect(db).clean
    for table in ("publications", "retained", "subscriptions", "anchors"):
        assert sorted(r[1:] for r in rows(db, table)) == \
            sorted(r[1:] for r in intact[table].values()), table
    assert {r[1:] for r in intact["gaps"].values()} <= {r[1:] for r in rows(db, "gaps")}

    # and serves every one of its history rows again, damaged index rows or not
    async with running(data) as (node, router):
        session = await connect(router)
        again = set(await history(session, "sensor") + await history(session, "log"))
        status = await session.call("cairn.router.status")
    assert again == {row[2] for row in intact["publications"].values()
                     if row[4] != HEALTH_TOPIC.encode()}  # sensor and log
    assert status["store_damaged_rows"] == {}
