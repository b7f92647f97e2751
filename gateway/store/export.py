"""What ``cairn sync`` reads of the store (:class:`HistoryReader`): history in seq order, as
stored publications, or :class:`Damaged` for a row that cannot be decoded; clock anchors, gap
records and the synced watermark. The batch row itself is :mod:`cairn.formats.batch`'s."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.base.data_dir import read_sync_status
from cairn.gateway.core.publication import StoredPublication
from cairn.gateway.store.damage import Damage, Shape, Unreadable, decoded, readable_text, reading
from cairn.gateway.store.schema import ANCHOR, GAP, RAISE_META, STORED, read_meta, read_meta_int


@dataclass(frozen=True)
class Damaged:
    """A history row that cannot be decoded (a damaged page or payload): what is left of it
    (None for a value that is damaged too), and why (at most 200 characters)."""

    seq: int
    realm: str | None
    topic: str | None
    wall_ms: int | None
    why: str


def _publication(row: tuple[Any, ...]) -> StoredPublication | Damaged:
    try:
        return decoded(STORED, row, StoredPublication.from_row)
    except Unreadable as e:  # whatever the damage, this one row is lost, not the history
        seq, _, realm, topic, wall_ms = row[:5]
        return Damaged(seq, readable_text(realm), readable_text(topic),
                       wall_ms if type(wall_ms) is int else None, str(e)[:200])


class HistoryReader:
    """Blocking, read-mostly access for the uploader process (``cairn sync``), which runs
    beside the router: WAL lets it read while the router writes. Its only write is the
    synced watermark, a one-row upsert that waits its turn (``busy_timeout``)."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no store at {path} (has the router run with this "
                                    f"data_dir?)")
        self.path = path
        self.db = reading(sqlite3.connect(path, timeout=30, isolation_level=None))
        self.db.execute("PRAGMA busy_timeout = 30000")
        self.damage = Damage()  # anchors, gaps and meta values left out (history: Damaged)

    def close(self) -> None:
        self.db.close()

    def highest_seq(self) -> int:
        row = self.db.execute("SELECT MAX(seq) FROM publications").fetchone()
        return row[0] or 0

    def synced_seq(self) -> int:
        """The watermark; if it is damaged, the one the status file kept (else 0: batches
        sent again are harmless, the central job dedupes them)."""
        seq = read_meta_int(self.db, "synced_seq", self.damage)
        if seq is None:
            seq = (read_sync_status(self.path.parent) or {}).get("synced_seq")
        return seq if type(seq) is int else 0

    def publication_key(self) -> bytes | None:
        """The key of the stored publications' ids (formats.publication_ids); None when
        there is none (a store from before them) or it is damaged."""
        value = read_meta(self.db, "publication_key")
        try:
            key = bytes.fromhex(value) if isinstance(value, str) else None
        except ValueError:
            return None
        return key if key is not None and len(key) == 16 else None

    def set_synced_seq(self, seq: int) -> None:
        self.db.execute(RAISE_META, ("synced_seq", seq))

    def backlog(self, after_seq: int) -> int:
        return self.db.execute("SELECT COUNT(*) FROM publications WHERE seq > ?",
                               (after_seq,)).fetchone()[0]

    def publications_after(self, seq: int, limit: int) -> list[StoredPublication | Damaged]:
        """Up to ``limit`` history rows after ``seq``, in seq order."""
        rows = self.db.execute(
            f"SELECT {STORED.select} FROM publications WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit)).fetchall()
        return [_publication(row) for row in rows]

    def topic_after(self, seq: int, topic: str, limit: int) -> list[StoredPublication | Damaged]:
        """Up to ``limit`` history rows of ``topic`` after ``seq``, in seq order (walks the
        narrow history_scan, not the rows)."""
        rows = self.db.execute(
            f"SELECT {STORED.select} FROM publications WHERE seq IN (SELECT seq FROM history_scan"
            f" WHERE seq > ? AND topic IN (SELECT id FROM topics WHERE topic = ?)"
            f" ORDER BY seq LIMIT ?) ORDER BY seq", (seq, topic, limit)).fetchall()
        return [_publication(row) for row in rows]

    def anchors(self) -> list[dict[str, Any]]:
        return self._records("anchors", ANCHOR)

    def gaps(self) -> list[dict[str, Any]]:
        return self._records("gaps", GAP)

    def _records(self, table: str, shape: Shape) -> list[dict[str, Any]]:
        """The rows of ``table`` (anchors, gaps) as dicts, in id order, the damaged ones left
        out (logged once)."""
        records = []
        for row in self.db.execute(f"SELECT {shape.select} FROM {table} ORDER BY id"):
            fault = shape.fault(row)
            if fault is None:
                records.append(dict(zip(shape.columns, row, strict=True)))
            else:
                self.damage.found(table, f"id {row[0]}", fault)
        return records
