"""What ``cairn sync`` reads of the store (:class:`HistoryReader`): history in seq order, as
stored publications, or :class:`Damaged` for a row that cannot be decoded; clock anchors, gap
records and the synced watermark. The batch row itself is :mod:`cairn.sync.batch_format`'s."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.gateway.publication import StoredPublication
from cairn.gateway.store.schema import _RAISE_META, _STORED_ROW


@dataclass(frozen=True)
class Damaged:
    """A history row that cannot be decoded (a damaged page or payload): what is left of it,
    and why (``"ErrorType: message"``, at most 200 characters)."""

    seq: int
    realm: str
    topic: str
    wall_ms: int
    why: str


def _publication(row: tuple[Any, ...]) -> StoredPublication | Damaged:
    try:
        return StoredPublication.from_row(row)
    except Exception as e:  # whatever the damage, this one row is lost, not the history
        seq, _, realm, topic, wall_ms = row[:5]
        return Damaged(seq, realm, topic, wall_ms, f"{type(e).__name__}: {e}"[:200])


class HistoryReader:
    """Blocking, read-mostly access for the uploader process (``cairn sync``), which runs
    beside the router: WAL lets it read while the router writes. Its only write is the
    synced watermark, a one-row upsert that waits its turn (``busy_timeout``)."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no store at {path} (has the router run with this "
                                    f"data_dir?)")
        self.path = path
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA busy_timeout = 30000")

    def close(self) -> None:
        self.db.close()

    def highest_seq(self) -> int:
        row = self.db.execute("SELECT MAX(seq) FROM publications").fetchone()
        return row[0] or 0

    def synced_seq(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'synced_seq'").fetchone()
        return int(row[0]) if row else 0

    def set_synced_seq(self, seq: int) -> None:
        self.db.execute(_RAISE_META, ("synced_seq", seq))

    def backlog(self, after_seq: int) -> int:
        return self.db.execute("SELECT COUNT(*) FROM publications WHERE seq > ?",
                               (after_seq,)).fetchone()[0]

    def publications_after(self, seq: int, limit: int) -> list[StoredPublication | Damaged]:
        """Up to ``limit`` history rows after ``seq``, in seq order."""
        rows = self.db.execute(
            f"SELECT {_STORED_ROW} FROM publications WHERE seq > ? ORDER BY seq LIMIT ?",
            (seq, limit)).fetchall()
        return [_publication(row) for row in rows]

    def topic_after(self, seq: int, topic: str, limit: int) -> list[StoredPublication | Damaged]:
        """Up to ``limit`` history rows of ``topic`` after ``seq``, in seq order (walks the
        narrow history_scan, not the rows)."""
        rows = self.db.execute(
            f"SELECT {_STORED_ROW} FROM publications WHERE seq IN (SELECT seq FROM history_scan"
            f" WHERE seq > ? AND topic IN (SELECT id FROM topics WHERE topic = ?)"
            f" ORDER BY seq LIMIT ?) ORDER BY seq", (seq, topic, limit)).fetchall()
        return [_publication(row) for row in rows]

    def anchors(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT id, reason, boot_id, boottime_ns, wall_ns, offset_before_ns, clock_synced,"
            " after_seq FROM anchors ORDER BY id").fetchall()
        keys = ("id", "reason", "boot_id", "boottime_ns", "wall_ns", "offset_before_ns",
                "clock_synced", "after_seq")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def gaps(self) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT id, realm, rule, first_seq, last_seq, count, reason, wall_ms FROM gaps "
            "ORDER BY id").fetchall()
        keys = ("id", "realm", "rule", "first_seq", "last_seq", "count", "reason", "wall_ms")
        return [dict(zip(keys, row, strict=True)) for row in rows]
