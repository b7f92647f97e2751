"""``publication_batch``: the TEMP view a commit inserts its publications into, its trigger,
and the rows the writer thread builds for it (:class:`BatchRows`)."""

from __future__ import annotations

import functools
import json
import sqlite3
from typing import Any

from cairn.gateway.core.publication import Slot, StoredPublication
from cairn.gateway.store.state import Topics

# A batch of publications goes in as ONE statement: a multi-row INSERT into a TEMP view
# whose trigger (run by SQLite, per row, without the GIL) writes the history row and the
# retained slot. Without BEGIN it is its own transaction, so the commit and its fsync
# happen in the same sqlite3_step. Each statement the writer thread runs gives up the GIL
# and must win it back from the busy event loop (waking up at every release the loop
# makes): executemany costs that once per row, this once per commit.
_BATCH_COLUMNS = ("seq", "publication", "realm", "topic", "rule", "wall_ms", "boot_id",
                  "boottime_ns", "clock_synced", "authid", "authrole", "audience", "details",
                  "payload", "retain", "audience_key", "slot", "topic_id", "new_topic")
BATCH_SCHEMA = [
    f"CREATE TEMP VIEW publication_batch ({', '.join(_BATCH_COLUMNS)}) AS SELECT "
    + ", ".join(["NULL"] * len(_BATCH_COLUMNS)) + " WHERE 0",
    # slot: the newest publication of the batch for its retained slot; and a retried
    # older row must never replace a newer one (a seq damaged past reading: any does)
    """CREATE TEMP TRIGGER publication_batch_insert INSTEAD OF INSERT ON publication_batch
    BEGIN
      INSERT INTO publications (seq, publication, realm, topic, rule, wall_ms, boot_id,
          boottime_ns, clock_synced, authid, authrole, audience, details, payload, retain)
        SELECT NEW.seq, NEW.publication, NEW.realm, NEW.topic, NEW.rule, NEW.wall_ms,
          NEW.boot_id, NEW.boottime_ns, NEW.clock_synced, NEW.authid, NEW.authrole,
          NEW.audience, NEW.details, NEW.payload, NEW.retain
        WHERE NEW.rule IS NOT NULL;
      INSERT INTO history_scan (seq, topic, rule, wall_ms, clock_synced)
        SELECT NEW.seq, NEW.topic_id, NEW.rule, NEW.wall_ms, NEW.clock_synced
        WHERE NEW.rule IS NOT NULL;
      INSERT INTO topics (id, realm, topic) SELECT NEW.topic_id, NEW.realm, NEW.topic
        WHERE NEW.new_topic;
      INSERT INTO retained (realm, topic, audience_key, seq, publication, wall_ms, authid,
          authrole, audience, details, payload, boot_id, boottime_ns, clock_synced)
        SELECT NEW.realm, NEW.topic, NEW.audience_key, NEW.seq, NEW.publication, NEW.wall_ms,
          NEW.authid, NEW.authrole, NEW.audience, NEW.details, NEW.payload, NEW.boot_id,
          NEW.boottime_ns, NEW.clock_synced
        WHERE NEW.slot
        ON CONFLICT (realm, topic, audience_key) DO UPDATE SET seq = excluded.seq,
          publication = excluded.publication, wall_ms = excluded.wall_ms,
          authid = excluded.authid, authrole = excluded.authrole,
          audience = excluded.audience, details = excluded.details,
          payload = excluded.payload, boot_id = excluded.boot_id,
          boottime_ns = excluded.boottime_ns, clock_synced = excluded.clock_synced
        WHERE excluded.seq > retained.seq OR typeof(retained.seq) != 'integer';
    END""",
]
# Statements are padded with rows of NULLs (filtered out) to a power of two, so a dozen
# prepared statements serve every batch size; bigger batches take several statements.
MAX_BATCH_ROWS = 1024  # x 19 parameters: within SQLite's limit of 32,766


@functools.cache
def _batch_sql(rows: int) -> str:
    row = "(" + ",".join("?" * len(_BATCH_COLUMNS)) + ")"
    return (f"INSERT INTO publication_batch SELECT * FROM (VALUES {','.join([row] * rows)})"
            " WHERE column1 IS NOT NULL")


_NULL_ROW = (None,) * len(_BATCH_COLUMNS)


def insert_batch(db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """INSERT up to MAX_BATCH_ROWS ``rows`` into publication_batch in one statement."""
    if not rows:
        return
    size = 1 << (len(rows) - 1).bit_length()  # the next power of two
    values = [value for row in rows for value in row]
    values += _NULL_ROW * (size - len(rows))
    db.execute(_batch_sql(size), values)


class BatchRows:
    """Publications as rows of publication_batch, on the writer thread: a topic new to
    history gets its id here, and the usual details JSON comes from a cache."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self._details_json: dict[str, str] = {}  # topic -> '{"topic": topic}'

    def batch(self, pubs: list[StoredPublication], new_topics: dict[tuple[str, str], int]
              ) -> tuple[list[tuple[Any, ...]], dict[Slot, StoredPublication]]:
        """A row per history publication, and per retained slot the newest publication of
        the batch (a topic published 100 times in one batch is upserted once). A retained
        publication with no history goes to the retained table now (it has no other home);
        the slots of stored ones are returned, to be written back later. Topics stored for
        the first time get an id in ``new_topics``."""
        newest: dict[Slot, StoredPublication] = {}
        for p in pubs:
            if p.retain:
                other = newest.get(p.slot)
                if other is None or p.seq > other.seq:
                    newest[p.slot] = p
        slots = {key: p for key, p in newest.items() if p.history_rule is not None}
        direct = {id(p): key[2] for key, p in newest.items() if p.history_rule is None}
        rows = []
        for p in pubs:
            audience_key = direct.get(id(p))
            if p.history_rule is None and audience_key is None:
                continue  # retained only, and a newer one of its slot is in the batch
            rows.append(self.row(p, p.history_rule, audience_key, new_topics))
        return rows, slots

    def slots(self, slots: dict[Slot, StoredPublication]) -> list[tuple[Any, ...]]:
        """Rows that write retained slots only (no history row: rule NULL)."""
        return [self.row(p, None, key[2]) for key, p in slots.items()]

    def row(self, p: StoredPublication, rule: int | None, audience_key: str | None,
            new_topics: dict[tuple[str, str], int] | None = None) -> tuple[Any, ...]:
        """A row of publication_batch: a history row under ``rule`` (None: none), and the
        retained slot ``audience_key`` (None: none)."""
        topic_id, new = None, False
        if rule is not None:
            topic_id = self.topics.get(p.realm, p.topic)
            if topic_id is None:
                topic_id = new_topics.get((p.realm, p.topic))
                if topic_id is None:
                    topic_id = new_topics[(p.realm, p.topic)] = \
                        self.topics.next_id + len(new_topics)
                    new = True
        return (p.seq, p.publication, p.realm, p.topic, rule, p.wall_ms, p.boot_id,
                p.boottime_ns, int(p.clock_synced), p.authid, p.authrole,
                json.dumps(p.audience) if p.audience else None, self._details(p),
                p.payload(), int(p.retain), audience_key,
                int(audience_key is not None), topic_id, int(new))

    def _details(self, p: StoredPublication) -> str:
        """The details as JSON; the usual ``{"topic": topic}`` from a cache."""
        details = p.details
        if len(details) != 1 or details.get("topic") != p.topic:
            return json.dumps(details)
        text = self._details_json.get(p.topic)
        if text is None:
            if len(self._details_json) >= 10_000:
                self._details_json.clear()
            text = self._details_json[p.topic] = json.dumps(details)
        return text
