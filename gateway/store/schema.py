"""The file's shape: the schema, its migrations, the connection settings and the small
SQL helpers every connection that writes shares (transactions, meta values, the highest seq).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from cairn.gateway.store.damage import Damage, Shape, describe, text

log = logging.getLogger("cairn.store")


SCHEMA_VERSION = 4
# What queries and pruning walk: per history row, in seq order, its topic (an id from
# ``topics``), rule and timestamp. A table, not an index: SQLite appends to a table's last
# page and starts a new one when it is full, but an index page that fills is split with its
# neighbours, so an index in seq order cost a commit of ten readings 2.7 pages, this table
# 1.2 (and a topic index one page per topic). ``topics`` holds each (realm, topic) once.
_HISTORY_SCAN = """
    CREATE TABLE topics (id INTEGER PRIMARY KEY, realm TEXT NOT NULL, topic TEXT NOT NULL,
                         UNIQUE (realm, topic));
    CREATE TABLE history_scan (seq INTEGER PRIMARY KEY, topic INTEGER NOT NULL,
                               rule INTEGER NOT NULL, wall_ms INTEGER NOT NULL,
                               clock_synced INTEGER NOT NULL);
"""


def encode_state(seq: int, counts: Counter[tuple[str, int]]) -> str:
    """The meta value ``state``: the seq the counts of rows per (realm, rule) are complete up
    to, and the counts (see :class:`~gateway.store.state._State`)."""
    return json.dumps({"seq": seq, "counts": [[r, i, n] for (r, i), n in counts.items()]})


def _version_3(db: sqlite3.Connection) -> None:
    """Fewer pages per commit: history_scan instead of four indexes. The topic index put
    each topic's newest entries on a page of their own (a commit of ten sensors' readings
    dirtied ten of its pages, and splits rewrote their neighbours); the publication, time
    and rule indexes a few more."""
    for statement in _HISTORY_SCAN.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT INTO topics (realm, topic) SELECT DISTINCT realm, topic FROM publications")
    db.execute("INSERT INTO history_scan SELECT p.seq, t.id, p.rule, p.wall_ms, p.clock_synced"
               " FROM publications AS p JOIN topics AS t USING (realm, topic)")
    for name in ("publications_topic", "publications_time", "publications_rule",
                 "publications_chunk_publication"):
        db.execute(f"DROP INDEX {name}")
    (top,) = db.execute("SELECT MAX(seq) FROM publications").fetchone()
    if top is not None:  # rows from before keep their random ids, found through this index,
        db.execute(  # which no new row enters
            "CREATE INDEX publications_legacy_publication ON publications"
            f" ((seq >> 10), publication) WHERE seq <= {int(top)}")
    put_meta(db, "legacy_publication_seq", int(top or 0))
    counts = Counter({(realm, rule): n for realm, rule, n in db.execute(
        "SELECT realm, rule, COUNT(*) FROM publications GROUP BY realm, rule")})
    put_meta(db, "state", encode_state(highest_seq(db), counts))  # retained: all there


# The columns of a retained slot that say when it was received by CLOCK_BOOTTIME and whether
# the clock was synchronized then, with their values for "not known" (a slot from schema 3
# whose history row is gone; StoredPublication.from_row reads them as before: boot "", 0, False).
# A slot's row grows by 45 to 47 bytes (a boot id of 36, boottime_ns in 6 or 8, 3 in its header).
_RETAINED_CLOCK = """
    ALTER TABLE retained ADD COLUMN boot_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE retained ADD COLUMN boottime_ns INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE retained ADD COLUMN clock_synced INTEGER NOT NULL DEFAULT 0;
"""


def _version_4(db: sqlite3.Connection) -> None:
    """A retained slot keeps its boot and clock state: before, a slot written back to the
    retained table came back at start with no boot, so its age was unknown and its clock
    counted as unsynchronized after any restart of the router. (ADD COLUMN rewrites no row:
    a row without them reads the defaults.) A slot takes them from its history row where
    history still has it, else keeps the defaults. Only a boot id that is text in UTF-8 is
    copied: a damaged one would make the slot unreadable."""
    for statement in _RETAINED_CLOCK.split(";"):
        if statement.strip():
            db.execute(statement)
    boots = [boot for (raw,) in db.execute(  # a handful: one per boot
        "SELECT DISTINCT CAST(p.boot_id AS BLOB) FROM retained AS r JOIN publications AS p"
        " ON p.seq = r.seq WHERE typeof(p.boot_id) = 'text'") if type(boot := text(raw)) is str]
    db.execute(
        "UPDATE retained SET (boot_id, boottime_ns, clock_synced) = (SELECT p.boot_id,"
        " p.boottime_ns, p.clock_synced FROM publications AS p WHERE p.seq = retained.seq)"
        " WHERE EXISTS (SELECT 1 FROM publications AS p WHERE p.seq = retained.seq"
        " AND p.publication = retained.publication AND p.realm = retained.realm"
        " AND p.topic = retained.topic AND p.boot_id IN (SELECT value FROM json_each(?))"
        " AND typeof(p.boottime_ns) = 'integer' AND typeof(p.clock_synced) = 'integer')",
        (json.dumps(boots),))


MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
    # version 1
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE publications (
        seq INTEGER PRIMARY KEY,
        publication INTEGER NOT NULL,
        realm TEXT NOT NULL,
        topic TEXT NOT NULL,
        rule INTEGER,                 -- index of the history rule that stored it
        wall_ms INTEGER NOT NULL,     -- wall clock on receipt (may be wrong, may jump)
        boot_id TEXT NOT NULL,
        boottime_ns INTEGER NOT NULL, -- CLOCK_BOOTTIME on receipt: monotonic within a boot
        clock_synced INTEGER NOT NULL,
        authid TEXT,
        authrole TEXT,
        audience TEXT,                -- JSON of the authid/authrole black/white lists, or NULL
        details TEXT,                 -- JSON: topic, and publisher when disclosed
        payload BLOB NOT NULL,        -- msgpack [args, kwargs]
        retain INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX publications_topic ON publications (realm, topic, seq);
    CREATE INDEX publications_publication ON publications (publication);
    CREATE INDEX publications_time ON publications (realm, wall_ms);
    CREATE INDEX publications_rule ON publications (rule, seq);
    CREATE TABLE retained (
        realm TEXT NOT NULL,
        topic TEXT NOT NULL,
        audience_key TEXT NOT NULL,   -- '' for the slot every subscriber is eligible for
        seq INTEGER NOT NULL,
        publication INTEGER NOT NULL,
        wall_ms INTEGER NOT NULL,
        authid TEXT,
        authrole TEXT,
        audience TEXT,
        details TEXT,
        payload BLOB NOT NULL,
        PRIMARY KEY (realm, topic, audience_key)
    );
    CREATE TABLE subscriptions (
        id INTEGER PRIMARY KEY,
        realm TEXT NOT NULL,
        uri TEXT NOT NULL,
        match TEXT NOT NULL,
        created TEXT NOT NULL,
        UNIQUE (realm, uri, match)
    );
    CREATE TABLE anchors (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        reason TEXT NOT NULL,
        boot_id TEXT NOT NULL,
        boottime_ns INTEGER NOT NULL,
        wall_ns INTEGER NOT NULL,
        offset_before_ns INTEGER,
        clock_synced INTEGER NOT NULL,
        after_seq INTEGER NOT NULL    -- the last seq assigned before the anchor
    );
    CREATE TABLE gaps (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        realm TEXT,
        rule INTEGER,
        first_seq INTEGER,
        last_seq INTEGER,
        count INTEGER NOT NULL,
        reason TEXT NOT NULL,
        wall_ms INTEGER NOT NULL
    );
    """,
    # version 2: the random-key index on publication put every new row on a random page of
    # a large index (about one 4 KiB page written per event, twice). Keyed by seq chunk
    # first, new rows all land in the few pages of the newest chunk.
    """
    DROP INDEX publications_publication;
    CREATE INDEX publications_chunk_publication ON publications ((seq >> 10), publication);
    """,
    _version_3,
    _version_4,
]


RAISE_META = ("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
               "DO UPDATE SET value = MAX(CAST(value AS INTEGER), excluded.value)")
_PUT_META = ("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) "
             "DO UPDATE SET value = excluded.value")
# Rows from before schema version 3 (random publication ids, seq up to {legacy}): probe each
# chunk of 1,024 seqs, newest first, on the partial (seq >> 10, publication) index (the
# expression and the bound must stay exactly the index's): ~1,000 seeks per million rows.
LEGACY_SEQ_OF_PUBLICATION = (
    "WITH RECURSIVE chunk(k) AS ("
    " SELECT MIN({legacy}, (SELECT MAX(seq) FROM publications)) >> 10"
    " UNION ALL SELECT k - 1 FROM chunk"
    " WHERE k > (SELECT MIN(seq) FROM publications) >> 10)"
    " SELECT p.seq FROM chunk CROSS JOIN publications AS p"
    " WHERE (p.seq >> 10) = chunk.k AND p.publication = ? AND +p.realm = ?"
    " AND p.seq <= {legacy} LIMIT 1")
_STORED_ROW = ("seq, publication, realm, topic, wall_ms, boot_id, boottime_ns, clock_synced,"
               " authid, authrole, audience, details, payload")
# What each read selects, and the kinds of its values (gateway.store.damage.Shape): a row
# that is not of its shape is damaged, left out and counted.
STORED = Shape.of(_STORED_ROW, "iissisiiSSSSb")  # StoredPublication.from_row
RETAINED = STORED  # the retained table has these columns too (from schema version 4 on)
PUBLICATION = Shape.of("seq, publication, realm, topic, rule, wall_ms, boot_id, boottime_ns,"
                       " clock_synced, authid, authrole, audience, details, payload, retain",
                       "iissIisiiSSSSbi")  # every column
SUBSCRIPTION = Shape.of("id, realm, uri, match, created", "issss")
TOPIC = Shape.of("id, realm, topic", "iss")
SCAN = Shape.of("seq, topic, rule, wall_ms, clock_synced", "iiiii")
ANCHOR = Shape.of("id, reason, boot_id, boottime_ns, wall_ns, offset_before_ns, clock_synced,"
                  " after_seq", "issiiIii")
GAP = Shape.of("id, realm, rule, first_seq, last_seq, count, reason, wall_ms", "iSIIIisi")


class SchemaTooNew(Exception):
    """The database was written by a newer Cairn; refuse rather than corrupt it."""


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
            db.execute("ROLLBACK")
        raise


def read_meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def put_meta(db: sqlite3.Connection, key: str, value: Any) -> None:
    db.execute(_PUT_META, (key, value))


def fetch_all(db: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
    return db.execute(sql, tuple(params)).fetchall()


def read_meta_int(db: sqlite3.Connection, key: str, damage: Damage | None = None) -> int | None:
    """An integer meta value (None: not there, or damaged: then reported to ``damage``)."""
    return int_value(key, read_meta(db, key), damage)


def int_value(key: str, value: Any, damage: Damage | None) -> int | None:
    if value is None:
        return None
    if type(value) is str:
        with contextlib.suppress(ValueError):
            return int(value)
    if damage is not None:
        damage.found("meta", f"key {key}", f"value holds {describe(value)}, not an integer")
    return None


# Where the highest seq ever handed out shows: seqs are never reused, even after the newest
# rows were pruned or the meta value is damaged (it is raised from the others then).
# (publications.seq is its rowid, an integer: MAX is one seek; the others are small tables)
_SEQ_BOUNDS = ("SELECT MAX(seq) FROM publications", *(
    f"SELECT MAX({column}) FROM {table} WHERE typeof({column}) = 'integer'"
    for table, column in (("retained", "seq"), ("gaps", "last_seq"), ("anchors", "after_seq"))))


def highest_seq(db: sqlite3.Connection, damage: Damage | None = None) -> int:
    values = [read_meta_int(db, key, damage) for key in ("highest_seq", "synced_seq")]
    values += [db.execute(sql).fetchone()[0] for sql in _SEQ_BOUNDS]
    return max((v for v in values if v is not None), default=0)


IN_TOPICS = "topic IN (SELECT value FROM json_each(?))"


PAGE_SIZE = 1024


def configure(db: sqlite3.Connection) -> None:
    # Both take effect on a new database only. Small pages: a commit writes whole pages to
    # the WAL, and most of a small commit's are the last, partly filled page of a table
    # (ten readings: 7 KiB of 1 KiB pages against 17 KiB of 4 KiB ones).
    db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    # Debian builds SQLite to overwrite every freed page with zeros, which writes each pruned
    # page a second time: FAST zeroes only what is being written anyway.
    db.execute("PRAGMA secure_delete = FAST")
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA wal_autocheckpoint = 4000")  # pages: fewer, larger checkpoints
    db.execute("PRAGMA journal_size_limit = 4194304")  # a WAL grown by a storm shrinks back


def pre_migration_copy(path: Path, version: int) -> Path:
    """Where a release that migrates the store keeps the file as schema ``version`` left it,
    until the system update that brought the release is kept (the health gate discards it):
    the older release, run again after a rollback, takes it back (``refuse_newer_schema``)."""
    return path.with_name(f"{path.name}.schema-{version}")


def discard_pre_migration_copies(path: Path) -> list[Path]:
    """The update that migrated the store is kept: the copies for going back are not needed
    (those a rollback set aside, ``*.rolled-back``, stay for a person to look at)."""
    gone = []
    for copy in path.parent.glob(f"{path.name}.schema-*"):
        if not copy.name.endswith((".rolled-back", "-wal", "-shm")):
            copy.unlink()
            gone.append(copy)
    return gone


def _move_store(source: Path, target: Path) -> None:
    """A store file with its WAL and shared-memory files (no connection has it open)."""
    for suffix in ("-wal", "-shm", ""):
        part = source.with_name(source.name + suffix)
        if part.exists():
            os.replace(part, target.with_name(target.name + suffix))


def refuse_newer_schema(path: Path) -> None:
    """Read the schema version without writing: even setting pragmas would change the file
    of a newer release. A newer release that migrated the store kept a copy of it as this
    release left it: after a rollback (a system update that was not kept) this release takes
    that copy back and sets the newer file aside, rather than refusing to start."""
    if not path.exists():
        return
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
    if version <= SCHEMA_VERSION:
        return
    copy = pre_migration_copy(path, SCHEMA_VERSION)
    if copy.exists():
        aside = path.with_name(f"{path.name}.schema-{version}.rolled-back")
        _move_store(path, aside)
        _move_store(copy, path)
        log.warning("%s had schema version %d, written by a newer release that was rolled "
                    "back: using the copy it kept before migrating (schema %d); the newer "
                    "file, with what that release stored, is kept as %s", path, version,
                    SCHEMA_VERSION, aside)
        return
    raise SchemaTooNew(
        f"{path} has schema version {version}, but this Cairn knows only up to "
        f"{SCHEMA_VERSION}: it was written by a newer release. Upgrade Cairn, or restore "
        f"a backup made by this release; refusing to start rather than corrupt it.")


def _keep_pre_migration_copy(db: sqlite3.Connection, path: Path, version: int) -> None:
    """A consistent copy (SQLite's online backup) of the store before it is migrated away
    from ``version``, for the release that wrote it to go back to."""
    copy = pre_migration_copy(path, version)
    tmp = copy.with_name(copy.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(tmp)) as out:
        db.backup(out)
    os.replace(tmp, copy)
    log.info("kept %s (schema %d) for a rollback until this release is kept", copy, version)


def migrate(db: sqlite3.Connection, path: Path) -> None:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if 0 < version < SCHEMA_VERSION:
        _keep_pre_migration_copy(db, path, version)
    for target in range(version + 1, SCHEMA_VERSION + 1):
        log.info("migrating %s to schema version %d", path, target)
        migration = MIGRATIONS[target - 1]
        with transaction(db):
            if callable(migration):
                migration(db)
            else:  # executescript() would COMMIT first; run statement by statement in ours
                for statement in migration.split(";"):
                    if statement.strip():
                        db.execute(statement)
            db.execute(f"PRAGMA user_version = {target}")
