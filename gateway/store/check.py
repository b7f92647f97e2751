"""A store file read row by row, as the router reads it (the shapes and decoders of
:mod:`.damage`), for the operations: what is damaged (:func:`inspect`, for ``cairn doctor``,
``backup`` and ``restore``), and a clean store written from every row that can be read
(:func:`rewrite`, for ``cairn repair``)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.base.data_dir import read_sync_status
from cairn.gateway.core.publication import StoredPublication
from cairn.gateway.store.damage import Shape, Unreadable, decoded, readable_text, reading
from cairn.gateway.store.schema import (
    ANCHOR,
    GAP,
    PUBLICATION,
    SCAN,
    SCHEMA_VERSION,
    SUBSCRIPTION,
    TOPIC,
    configure,
    encode_state,
    highest_seq,
    migrate,
    put_meta,
    transaction,
)
from cairn.gateway.store.state import decode_state

EXAMPLES = 3  # damaged rows named per table


def _publication(row: Sequence[Any]) -> StoredPublication:
    (seq, publication, realm, topic, _, wall_ms, boot_id, boottime_ns, synced, authid, authrole,
     audience, details, payload, _) = row
    return StoredPublication.from_row((seq, publication, realm, topic, wall_ms, boot_id,
                                       boottime_ns, synced, authid, authrole, audience,
                                       details, payload))


def _retained_slot(row: Sequence[Any]) -> StoredPublication:
    (realm, topic, _, seq, publication, wall_ms, authid, authrole, audience, details,
     payload, boot_id, boottime_ns, synced) = row
    return StoredPublication.from_row((seq, publication, realm, topic, wall_ms, boot_id,
                                       boottime_ns, synced, authid, authrole, audience,
                                       details, payload))


def _meta_value(row: Sequence[Any]) -> Any:
    key, value = row
    if key == "state":
        return decode_state(value)
    if key == "publication_key" and len(bytes.fromhex(value)) != 16:
        raise ValueError("not a key of 16 bytes")
    if key in ("highest_seq", "synced_seq", "legacy_publication_seq"):
        return int(value)
    return value


def _same(row: Sequence[Any]) -> Sequence[Any]:
    return row  # its shape is all there is to check


@dataclass(frozen=True)
class _Table:
    name: str
    shape: Shape  # every column, in the order they are copied
    decode: Callable[[Sequence[Any]], Any]  # what the router makes of a row
    where: Callable[[int, Sequence[Any]], str]  # how a row (rowid, row) is named in reports


_RETAINED = Shape.of("realm, topic, audience_key, seq, publication, wall_ms, authid, authrole,"
                     " audience, details, payload, boot_id, boottime_ns, clock_synced",
                     "sssiiiSSSSbsii")


def _named(column: str) -> Callable[[int, Sequence[Any]], str]:
    """A row named by its first column: ``"seq 12"``."""
    return lambda rowid, row: f"{column} {row[0]}"


def _retained_row(rowid: int, row: Sequence[Any]) -> str:
    return f"rowid {rowid}" + (f", topic {row[1]}" if type(row[1]) is str else "")


# In the order a rewrite needs them: topics before the history that names them.
TABLES = (
    _Table("meta", Shape.of("key, value", "ss"), _meta_value, _named("key")),
    _Table("topics", TOPIC, _same, _named("id")),
    _Table("publications", PUBLICATION, _publication, _named("seq")),
    _Table("history_scan", SCAN, _same, _named("seq")),
    _Table("retained", _RETAINED, _retained_slot, _retained_row),
    _Table("subscriptions", SUBSCRIPTION, _same, _named("id")),
    _Table("anchors", ANCHOR, _same, _named("id")),
    _Table("gaps", GAP, _same, _named("id")),
)


@dataclass
class Findings:
    """What reading every row found: rows read and damaged ones by table, a few of those
    named (``"seq 12: topic holds text that is not UTF-8 (...)"``), and the tables whose
    reading stopped early (a damaged page: SQLite's error)."""

    rows: Counter[str] = field(default_factory=Counter)
    damaged: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.damaged.values())

    @property
    def clean(self) -> bool:
        return not self.total and not self.stopped

    def summary(self) -> str:
        """``"3 damaged rows (publications 2, retained 1)"``, and the tables cut short."""
        parts = []
        if self.total:
            parts.append(f"{self.total} damaged row{'s' * (self.total != 1)} (" + ", ".join(
                f"{table} {n}" for table, n in self.damaged.items()) + ")")
        parts += [f"{table} could be read only in part ({why})"
                  for table, why in self.stopped.items()]
        return "; ".join(parts) or "no damaged rows"

    def _found(self, table: str, where: str, why: str) -> None:
        self.damaged[table] += 1
        named = self.examples.setdefault(table, [])
        if len(named) < EXAMPLES:
            named.append(f"{where}: {why}")


def _rows(db: sqlite3.Connection, findings: Findings
          ) -> Iterator[tuple[_Table, Sequence[Any], Any, str | None]]:
    """Every row of every table, in TABLES' order: (table, row, what the router makes of
    it, None) or, for a damaged one (counted in ``findings``), (table, row, None, why)."""
    present = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    for table in TABLES:
        if table.name not in present:  # (topics, history_scan: from schema version 3 on)
            continue
        try:
            cursor = db.execute(f"SELECT rowid, {table.shape.select} FROM {table.name}"
                                f" ORDER BY rowid")
            for rowid, *row in cursor:
                findings.rows[table.name] += 1
                try:
                    value = decoded(table.shape, row, table.decode)
                except Unreadable as e:
                    findings._found(table.name, table.where(rowid, row), str(e))
                    yield table, row, None, str(e)
                else:
                    yield table, row, value, None
        except sqlite3.DatabaseError as e:  # a damaged page: what came before it is had
            findings.stopped[table.name] = str(e)


def _open(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise FileNotFoundError(f"no store at {path}")
    return reading(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30))


def inspect(path: Path) -> Findings:
    """Read every row of the store at ``path`` as the router would (read-only)."""
    findings = Findings()
    with contextlib.closing(_open(path)) as db:
        for _ in _rows(db, findings):
            pass
    return findings


@dataclass
class Rewritten:
    findings: Findings  # of the damaged store
    kept: Counter[str]  # rows written, by table
    gaps: int  # gap records written for the history rows left out


def rewrite(source: Path, target: Path) -> Rewritten:
    """Write a new store at ``target`` from every row of ``source`` that can be read,
    keeping seqs, publication ids, subscription ids and the ids of anchors and gaps (the
    central job knows them). Topics and history_scan are built again from the history
    rows; each run of history rows left out becomes a gap record ("damaged: ..."), so
    ``cairn sync`` ships the loss. The router must be stopped."""
    findings, kept = Findings(), Counter[str]()
    target.unlink(missing_ok=True)
    with contextlib.closing(_open(source)) as old, \
            contextlib.closing(sqlite3.connect(target, isolation_level=None)) as new:
        version = old.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise ValueError(f"{source} has schema version {version}, this Cairn writes "
                             f"{SCHEMA_VERSION}: start the router of this release once, so it "
                             f"migrates it, then repair")
        configure(new)
        migrate(new, target)
        with transaction(new):
            lost, meta = _copy(old, new, findings, kept)
            _finish(old, new, source, lost, meta)
        check = new.execute("PRAGMA integrity_check").fetchone()[0]
        if check != "ok":
            raise RuntimeError(f"the new store failed its integrity check: {check}")
        new.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        new.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
    return Rewritten(findings, kept, len(lost))


def repair(path: Path) -> tuple[Rewritten, Path]:
    """Rewrite the store at ``path`` (:func:`rewrite`, router stopped) and put the new one
    in its place; the damaged one is kept beside it (returned), not deleted. At every step
    a store is at ``path``, the old or the new one: the old one's WAL is checkpointed into
    it first, so that it is one file, linked to its new name before it is replaced."""
    partial = path.with_name(f".{path.name}.repair")
    try:
        done = rewrite(path, partial)
        with contextlib.closing(sqlite3.connect(path)) as db:  # the last connection: the
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # WAL goes when it closes
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.link(path, aside)
        except OSError:  # a file system without hard links
            shutil.copy2(path, aside)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return done, aside


_INSERTS = {
    "publications": f"INSERT INTO publications ({PUBLICATION.select}) VALUES "
                    f"({','.join('?' * len(PUBLICATION.columns))})",
    "history_scan": "INSERT INTO history_scan (seq, topic, rule, wall_ms, clock_synced)"
                    " VALUES (?,?,?,?,?)",
    "topics": "INSERT INTO topics (id, realm, topic) VALUES (?,?,?)",
    "retained": f"INSERT INTO retained ({_RETAINED.select}) VALUES "
                f"({','.join('?' * len(_RETAINED.columns))})",
    "subscriptions": f"INSERT INTO subscriptions ({SUBSCRIPTION.select}) VALUES (?,?,?,?,?)",
    "anchors": f"INSERT INTO anchors ({ANCHOR.select}) VALUES (?,?,?,?,?,?,?,?)",
    "gaps": f"INSERT INTO gaps ({GAP.select}) VALUES (?,?,?,?,?,?,?,?)",
}


def _copy(old: sqlite3.Connection, new: sqlite3.Connection, findings: Findings,
          kept: Counter[str]) -> tuple[list[list[Any]], dict[str, tuple[str, Any]]]:
    """Every readable row into ``new`` but meta's; the history rows left out, as runs of
    rows with no readable one between ([first seq, last seq, count, realm, why]), and the
    readable meta values ({key: (value, decoded)}), for _finish."""
    meta: dict[str, tuple[str, Any]] = {}
    topics: dict[tuple[str, str], int] = {}
    pending: dict[str, list[Sequence[Any]]] = {name: [] for name in _INSERTS}
    lost: list[list[Any]] = []
    in_run = False  # the last history row was left out
    next_topic = 1 + (old.execute("SELECT MAX(id) FROM topics").fetchone()[0] or 0)

    def put(table: str, row: Sequence[Any]) -> None:
        pending[table].append(row)
        kept[table] += 1
        if len(pending[table]) >= 5000:
            new.executemany(_INSERTS[table], pending[table])
            pending[table] = []

    for table, row, value, why in _rows(old, findings):
        if table.name == "publications":
            seq, _, realm, topic, rule, wall_ms, _, _, synced = row[:9]
            if why is not None:
                if in_run and lost[-1][3] == readable_text(realm):
                    lost[-1][1:3] = seq, lost[-1][2] + 1
                else:
                    lost.append([seq, seq, 1, readable_text(realm), why])
                in_run = True
                continue
            in_run = False
            topic_id = topics.get((realm, topic))
            if topic_id is None:  # its topics row was damaged
                topic_id = topics[(realm, topic)] = next_topic
                next_topic += 1
                put("topics", (topic_id, realm, topic))
            put("publications", row)
            if rule is not None:
                put("history_scan", (seq, topic_id, rule, wall_ms, synced))
        elif why is not None or table.name == "history_scan":
            continue  # (history_scan: built again from the history rows)
        elif table.name == "meta":
            meta[row[0]] = row[1], value
        else:
            if table.name == "topics":
                topics[(row[1], row[2])] = row[0]
            put(table.name, row)
    for table_name, rows in pending.items():
        new.executemany(_INSERTS[table_name], rows)
    return lost, meta


_LEGACY_BOUND = re.compile(r"seq\s*<=\s*(\d+)")


def _finish(old: sqlite3.Connection, new: sqlite3.Connection, source: Path,
            lost: list[list[Any]], meta: dict[str, tuple[str, Any]]) -> None:
    """The meta values, gap records for ``lost``, the ids AUTOINCREMENT never hands out
    again, and the index of publications from before schema 3."""
    for key, (value, _) in meta.items():
        if key not in ("state", "highest_seq", "synced_seq"):
            put_meta(new, key, value)
    synced = meta.get("synced_seq", (None, None))[1]
    if synced is None:  # the uploader's status file keeps it too
        synced = (read_sync_status(source.parent) or {}).get("synced_seq")
    if type(synced) is int:
        put_meta(new, "synced_seq", synced)
    put_meta(new, "highest_seq", max(highest_seq(old), highest_seq(new)))
    for (sql,) in old.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND"
                              " name = 'publications_legacy_publication'"):
        new.execute(sql)
        if "legacy_publication_seq" not in meta and (bound := _LEGACY_BOUND.search(sql)):
            put_meta(new, "legacy_publication_seq", int(bound.group(1)))
    now = int(time.time() * 1000)
    new.executemany(
        "INSERT INTO gaps (realm, rule, first_seq, last_seq, count, reason, wall_ms)"
        " VALUES (?, NULL, ?, ?, ?, ?, ?)",
        [(realm, first, last, count, f"damaged: {why}"[:200], now)
         for first, last, count, realm, why in lost])
    for name, seq in old.execute("SELECT name, seq FROM sqlite_sequence"):
        if type(name) is str and type(seq) is int:
            new.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = ?",
                        (seq, name))
            new.execute("INSERT INTO sqlite_sequence (name, seq) SELECT ?, ? WHERE NOT EXISTS"
                        " (SELECT 1 FROM sqlite_sequence WHERE name = ?)", (name, seq, name))
    # the state: the counts up to the seq the old one was complete to (the retained table
    # holds the slots up to there; newer ones the router reads from history, as before)
    seq = meta["state"][1][0] if "state" in meta else 0
    counts = Counter({(realm, rule): n for realm, rule, n in new.execute(
        "SELECT t.realm, s.rule, COUNT(*) FROM history_scan AS s JOIN topics AS t"
        " ON t.id = s.topic WHERE s.seq <= ? GROUP BY t.realm, s.rule", (seq,))})
    put_meta(new, "state", encode_state(seq, counts))
