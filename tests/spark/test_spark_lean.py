"""Schema 2 batches (the lean format) on a real local Spark: the same readings shipped in
schema 1 and in schema 2 make the same table, and the job recomputes the publication ids
exactly as the gateway made them. Run alone with ``pytest -m spark``."""

from __future__ import annotations

import bz2
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.central.spark.lean import key_halves, with_publication  # noqa: E402
from cairn.formats.batch import manifest_name  # noqa: E402
from cairn.formats.publication_ids import PublicationIds  # noqa: E402
from cairn.sync.uploader import build_batch  # noqa: E402
from harness.readings import BOOT, BOOTED_MS, KEY, T0_MS, readings  # noqa: E402

pytestmark = pytest.mark.spark

UNSYNCED = "boot-unsynced"
STEP_AT = 150  # the unsynchronized boot's clock is set right at its 150th row


def anchors(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The synced boot's start; the other's start at 1970 and its step to the truth."""
    first = next(r for r in rows if r["boot_id"] == UNSYNCED)
    step = [r for r in rows if r["boot_id"] == UNSYNCED][STEP_AT]
    return [
        {"id": 1, "reason": "start", "boot_id": BOOT, "boottime_ns": 10**9,
         "wall_ns": (BOOTED_MS * 10**6) + 10**9 + 123, "offset_before_ns": None,
         "clock_synced": True, "after_seq": 0},
        {"id": 2, "reason": "start", "boot_id": UNSYNCED, "boottime_ns": first["boottime_ns"],
         "wall_ns": first["wall_ms"] * 10**6, "offset_before_ns": None,
         "clock_synced": False, "after_seq": first["seq"] - 1},
        {"id": 3, "reason": "step", "boot_id": UNSYNCED, "boottime_ns": step["boottime_ns"],
         "wall_ns": T0_MS * 10**6 + 987_654_321, "offset_before_ns": 0,
         "clock_synced": True, "after_seq": step["seq"] - 1}]


def fleet_rows(whole_ms: bool) -> list[dict[str, Any]]:
    """Readings of 20 sensors, a later boot whose clock started at 1970 (re-based centrally),
    a second realm, a row with a pre-key publication id."""
    rows = readings(20, 600)
    for i, r in enumerate(rows[300:], 300):
        r |= {"boot_id": UNSYNCED, "boottime_ns": r["boottime_ns"] % 10**12}
        if i < 300 + STEP_AT:
            r |= {"clock_synced": False, "wall_ms": r["wall_ms"] - T0_MS + 86_400_000}
    rows[7] |= {"realm": "realm2", "authid": None, "args": None}
    rows[8] |= {"publication": 42}
    if whole_ms:
        for r in rows:
            r["boottime_ns"] -= r["boottime_ns"] % 1_000_000
    return rows


def ship(tmp_path: Path, name: str, rows: list[dict[str, Any]], schema: int) -> list[Any]:
    """Land ``rows`` in batches of 100 in ``schema``, ingest them; the table's rows by seq."""
    landing, table = tmp_path / f"{name}-landing", tmp_path / f"{name}-table"
    after = 0
    for start in range(0, len(rows), 100):
        chunk = rows[start:start + 100]
        batch = build_batch("gw-1", chunk, after, anchors(rows), [], key=KEY, schema=schema)
        (landing / batch.name).parent.mkdir(parents=True, exist_ok=True)
        (landing / batch.name).write_bytes(batch.data)
        (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))
        after = chunk[-1]["seq"]
    stats = jobs.ingest(spark_session(), str(landing), str(table), str(tmp_path / "q"))
    assert stats.quarantined == [] and stats.rows_added == len(rows)
    return (spark_session().read.parquet(str(table)).drop("batch", "ingested_at")
            .orderBy("seq").collect())


_SESSION: list[Any] = []


def spark_session() -> Any:
    return _SESSION[0]


@pytest.fixture(autouse=True)
def _session(spark):
    _SESSION[:] = [spark]


def test_readings_shipped_in_either_schema_make_the_same_table(tmp_path):
    rows = fleet_rows(whole_ms=True)
    full, lean = ship(tmp_path, "v1", rows, 1), ship(tmp_path, "v2", rows, 2)
    assert [r.asDict() for r in lean] == [r.asDict() for r in full]
    assert sum(r.time_estimated for r in full) == STEP_AT  # the re-based rows are there
    assert {r.realm for r in full} == {"realm1", "realm2"}


def test_boottime_below_the_millisecond_is_all_schema_2_leaves_out(tmp_path):
    rows = fleet_rows(whole_ms=False)
    full, lean = ship(tmp_path, "v1", rows, 1), ship(tmp_path, "v2", rows, 2)
    for old, new in zip(full, lean, strict=True):
        old, new = old.asDict(), new.asDict()
        assert new.pop("boottime_ns") == old.pop("boottime_ns") // 10**6 * 10**6
        moved = abs((new.pop("event_time") - old.pop("event_time")).total_seconds())
        assert moved < 0.001 if old["time_estimated"] else moved == 0
        assert new == old


def test_spark_computes_the_publication_ids_the_gateway_gave():
    rng = random.Random(7)
    for key in (KEY, bytes(16), b"\xff" * 16, rng.randbytes(16)):
        seqs = [0, 1, 2, 2**31, 2**53 - 1, *(rng.randrange(2**53) for _ in range(200))]
        k0, k1 = key_halves(key.hex())
        frame = spark_session().createDataFrame([(s, k0, k1) for s in seqs],
                                                "seq long, k0 long, k1 long")
        got = with_publication(frame, "seq", "k0", "k1", "p").collect()
        ids = PublicationIds(key)
        assert {r.seq: r.p for r in got} == {s: ids.of_seq(s) for s in seqs}


def test_a_lean_line_that_is_not_an_event_quarantines_its_batch_naming_the_line(tmp_path):
    rows = readings(2, 10)
    batch = build_batch("gw-1", rows, 0, [], [], key=KEY)
    lines = bz2.decompress(batch.data).splitlines(keepends=True)
    lines[2] = b'{"t":"sensor.x"}\n'  # no deltas: no seq, wall_ms or boottime
    batch = build_batch("gw-1", rows, 0, [], [], bz2.compress(b"".join(lines)), key=KEY)
    landing = tmp_path / "landing"
    (landing / batch.name).parent.mkdir(parents=True)
    (landing / batch.name).write_bytes(batch.data)
    (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))
    stats = jobs.ingest(spark_session(), str(landing), str(tmp_path / "t"), str(tmp_path / "q"))
    assert stats.rows_added == 0 and stats.quarantined == [(batch.name, (
        "1 lines are not events of the batch format: line 3 has no seq, publication, "
        "wall_ms, boottime_ns"))]
    assert (tmp_path / "q" / batch.name).read_bytes() == batch.data  # nothing lost


def test_batches_of_both_schemas_ingest_together(tmp_path):
    """An upgraded gateway's backlog: schema 1 batches, then schema 2 ones, in one run."""
    rows = fleet_rows(whole_ms=True)
    both, alone = tmp_path / "both", tmp_path / "v2"
    after = 0
    for start in range(0, len(rows), 100):
        chunk = rows[start:start + 100]
        batch = build_batch("gw-1", chunk, after, anchors(rows), [], key=KEY,
                            schema=1 if start < 300 else 2)
        (both / batch.name).parent.mkdir(parents=True, exist_ok=True)
        (both / batch.name).write_bytes(batch.data)
        (both / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))
        after = chunk[-1]["seq"]
    stats = jobs.ingest(spark_session(), str(both), str(tmp_path / "t"), str(tmp_path / "q"))
    assert stats.quarantined == [] and stats.rows_added == len(rows)
    table = (spark_session().read.parquet(str(tmp_path / "t")).drop("batch", "ingested_at")
             .orderBy("seq").collect())
    assert [r.asDict() for r in table] == [r.asDict() for r in ship(alone, "v2", rows, 2)]
