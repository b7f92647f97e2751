"""The central Spark jobs (``cairn spark ingest|report``) on a real local Spark.

One session for the whole test run (``spark`` in conftest.py: local[2], two shuffle
partitions, no UI): starting Spark costs ~15 s and its first action ~8 s. Batches are
built with the uploader's own ``build_batch``, so they are byte for byte what a gateway
ships. Run alone with ``pytest -m spark``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.central.spark.files import Files  # noqa: E402
from cairn.central.spark.landing import landed_manifests, read_manifests, read_with_spark  # noqa: E402
from cairn.central.spark.table import Table  # noqa: E402
from cairn.formats.batch import manifest_name, stem  # noqa: E402
from cairn.sync.uploader import Batch, build_batch  # noqa: E402
from tests.system.test_sync import run_flaky_upload  # noqa: E402

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


# -- building landed batches ----------------------------------------------------------------

def event(seq: int, wall_ms: int, *, boot: str = "boot-1", boottime_ns: int | None = None,
          synced: bool = True, topic: str = "sensor.a",
          kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"seq": seq, "publication": 1000 + seq, "realm": "realm1", "topic": topic,
            "wall_ms": wall_ms, "boot_id": boot,
            "boottime_ns": boottime_ns if boottime_ns is not None else seq * 10**9,
            "clock_synced": synced, "authid": "dev", "authrole": "device", "audience": None,
            "details": {"topic": topic}, "args": [],
            "kwargs": {"temperature": 20.0, "humidity": 50.0} if kwargs is None else kwargs}


def events(seqs: range | list[int], **kwargs: Any) -> list[dict[str, Any]]:
    return [event(s, T0_MS + s * 1000, **kwargs) for s in seqs]


def land(landing: Path, gateway: str, rows: list[dict[str, Any]], after_seq: int,
         anchors: list[dict[str, Any]] = (), gaps: list[dict[str, Any]] = (),
         manifest: bool = True) -> Batch:
    batch = build_batch(gateway, rows, after_seq, list(anchors), list(gaps))
    path = landing / batch.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(batch.data)
    if manifest:
        write_manifest(landing, batch)
    return batch


def write_manifest(landing: Path, batch: Batch) -> None:
    (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))


def utc(moment: datetime) -> datetime:
    """PySpark hands timestamps back as naive local times."""
    return moment.astimezone(UTC)


def keys(spark, table: Path) -> list[tuple[str, int]]:
    rows = spark.read.parquet(str(table)).select("gateway_id", "seq").collect()
    return sorted((r.gateway_id, r.seq) for r in rows)


# -- ingest ---------------------------------------------------------------------------------

def test_ingest_dedupes_quarantines_and_is_idempotent(spark, tmp_path):
    landing, table, quarantine = tmp_path / "landing", tmp_path / "table", tmp_path / "q"
    for lo in (0, 100, 200):
        land(landing, "gw-a", events(range(lo + 1, lo + 101)), lo)
    land(landing, "gw-a", events(range(1, 151)), 0)  # re-sent with other bounds: overlaps
    for lo in (0, 100):
        land(landing, "gw-b", events(range(lo + 1, lo + 101)), lo)
    truncated = land(landing, "gw-b", events(range(201, 301)), 200)
    (landing / truncated.name).write_bytes(truncated.data[: len(truncated.data) // 2])
    flipped = land(landing, "gw-b", events(range(301, 401)), 300)
    data = bytearray(flipped.data)
    data[len(data) // 2] ^= 0xFF
    (landing / flipped.name).write_bytes(bytes(data))
    garbled = land(landing, "gw-b", events(range(401, 501)), 400)
    (landing / manifest_name(garbled.name)).write_text('{"schema": 1, "gatew')
    land(landing, "gw-a", events(range(301, 401)), 300, manifest=False)  # waits for it

    stats = jobs.ingest(spark, str(landing), str(table), str(quarantine))

    assert stats.ingested == 6 and stats.waiting == 1
    reasons = dict(stats.quarantined)
    assert set(reasons) == {truncated.name, flipped.name, garbled.name}
    assert "truncated" in reasons[truncated.name]
    assert "sha256" in reasons[flipped.name]
    assert "not JSON" in reasons[garbled.name]
    assert (stats.rows_read, stats.rows_added, stats.duplicates) == (650, 500, 150)
    assert keys(spark, table) == ([("gw-a", s) for s in range(1, 301)]
                                  + [("gw-b", s) for s in range(1, 201)])
    for bad in (truncated, flipped):  # moved aside, both files, with the reason
        moved = quarantine / bad.name
        assert moved.exists() and not (landing / bad.name).exists()
        assert (quarantine / manifest_name(bad.name)).exists()
        note = json.loads(moved.with_name(stem(moved.name) + ".reason.json")
                          .read_text())
        assert note["reason"] == reasons[bad.name]

    row = spark.read.parquet(str(table)).where("gateway_id = 'gw-a' AND seq = 7").first()
    assert row.batch in {"gw-a/000000000001-000000000100.jsonl.bz2",
                         "gw-a/000000000001-000000000150.jsonl.bz2"}
    assert json.loads(row.kwargs) == {"temperature": 20.0, "humidity": 50.0}
    assert row.event_time == row.timestamp and row.time_estimated is False
    assert str(row.date) == "2026-11-20"

    again = jobs.ingest(spark, str(landing), str(table), str(quarantine))
    assert (again.already, again.ingested, again.rows_added, again.quarantined) == (6, 0, 0, [])
    assert len(keys(spark, table)) == 500  # its manifest landing later: the archive's test


def test_a_rerun_does_not_read_the_manifests_it_ingested(spark, tmp_path):
    """A manifest listed with the size and modification time it had when ingested is not
    read again: here one made garbage but left with both is still 'already'."""
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    batches = [land(landing, "g", events(range(lo + 1, lo + 11)), lo) for lo in (0, 10, 20)]
    jobs.ingest(spark, str(landing), table)
    manifest = landing / manifest_name(batches[0].name)
    listed = manifest.stat()
    manifest.write_bytes(b"x" * listed.st_size)
    os.utime(manifest, ns=(listed.st_atime_ns, listed.st_mtime_ns))

    again = jobs.ingest(spark, str(landing), table)

    assert (again.manifests, again.already, again.unread, again.quarantined) == (3, 3, 3, [])
    assert "3 already in the table (3 unchanged since, not read again)" in again.summary()


def test_manifests_read_in_the_driver_are_what_spark_reads_of_them(spark, tmp_path):
    """A local landing's manifests are read in the driver, others by a Spark job: the same
    text, size and modification time (a space in the path is URL-encoded in the URIs, a
    byte that is not UTF-8 comes back replaced)."""
    landing = tmp_path / "a landing"
    land(landing, "g", events(range(1, 11)), 0)
    odd = land(landing, "h", events(range(1, 6)), 0)
    (landing / manifest_name(odd.name)).write_bytes(b'{"gateway_id": "h\xff"}')
    files = Files(spark)
    listed = landed_manifests(spark, files, files.qualify(str(landing)),
                     Table(spark, files, files.qualify(str(tmp_path / "table"))))
    uris = sorted(u for u in listed.uris if u.endswith(".manifest.json"))

    in_driver = read_manifests(spark, files, uris, {})

    assert sorted(in_driver) == sorted(read_with_spark(spark, files, uris))
    assert len(in_driver) == 2 and '{"gateway_id": "h\ufffd"}' in {m.text for m in in_driver}


def test_a_manifest_touched_since_its_ingest_is_read_again(spark, tmp_path):
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    batches = [land(landing, "g", events(range(lo + 1, lo + 11)), lo) for lo in (0, 10)]
    jobs.ingest(spark, str(landing), table)
    rewritten = land(landing, "g", events(range(1, 11), topic="sensor.b"), 0)  # same name
    assert rewritten.name == batches[0].name

    again = jobs.ingest(spark, str(landing), table)

    assert (again.unread, again.already) == (1, 1)
    [(name, reason)] = again.quarantined
    assert name == rewritten.name
    assert reason.startswith("10 rows re-use seqs the table holds for other events")


def test_a_batch_run_does_not_read_the_manifests_streaming_ingested(spark, tmp_path):
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    for lo in (0, 10):
        land(landing, "g", events(range(lo + 1, lo + 11)), lo)
    jobs.ingest_stream(spark, str(landing), table, str(tmp_path / "checkpoint"))

    batch = jobs.ingest(spark, str(landing), table)

    assert (batch.manifests, batch.unread, batch.ingested) == (2, 2, 0)


def test_manifests_logged_without_their_size_and_time_are_read_again(spark, tmp_path):
    """Tables ingested before the log kept a manifest's size and time: nothing is skipped
    on trust, the manifests are read and their batches found by file and sha256."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    for lo in (0, 10):
        land(landing, "g", events(range(lo + 1, lo + 11)), lo)
    jobs.ingest(spark, str(landing), str(table))
    old = tmp_path / "old-log"
    (spark.read.parquet(str(table / "_batches")).drop("manifest_bytes", "manifest_mtime_ms")
     .write.parquet(str(old)))
    shutil.rmtree(table / "_batches")
    old.rename(table / "_batches")

    again = jobs.ingest(spark, str(landing), str(table))

    assert (again.manifests, again.unread, again.already, again.ingested) == (2, 0, 2, 0)


def test_a_rerun_with_an_archive_moves_what_earlier_runs_ingested(spark, tmp_path):
    landing, table, archive = tmp_path / "landing", str(tmp_path / "table"), tmp_path / "a"
    batch = land(landing, "g", events(range(1, 11)), 0)
    jobs.ingest(spark, str(landing), table)

    again = jobs.ingest(spark, str(landing), table, archive=str(archive))

    assert again.unread == 1 and landed_files(landing) == []
    assert landed_files(archive) == sorted([batch.name, manifest_name(batch.name)])


def test_batches_from_the_flaky_http_server_land_exactly_once(spark, tmp_path):
    landing, seqs, server, _ = run_flaky_upload(tmp_path, events=1500, failures=12)
    stats = jobs.ingest(spark, str(landing), str(tmp_path / "table"))
    assert stats.quarantined == [] and stats.rows_added == len(seqs)
    assert keys(spark, tmp_path / "table") == [("gw-test", s) for s in seqs]

    store = jobs.TableDir(spark, jobs.Files(spark), str(tmp_path / "table"))
    gaps, gateways = jobs.gap_report(spark, store, store.events())
    assert gaps.count() == 0  # the seqs retained-only publications took are no loss
    g = gateways.first()
    assert g.not_landed == 0 and g.not_history == seqs[-1] - seqs[0] + 1 - len(seqs) > 0


def test_streaming_ingests_only_what_landed_since_the_last_run(spark, tmp_path, monkeypatch):
    # compact the side tables every time (the table module reads it)
    monkeypatch.setattr("cairn.central.spark.table.COMPACT_FILES", 1)
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    checkpoint, quarantine = str(tmp_path / "checkpoint"), str(tmp_path / "q")
    for lo in (0, 100):
        land(landing, "gw-s", events(range(lo + 1, lo + 101)), lo)

    first = jobs.ingest_stream(spark, str(landing), table, checkpoint, quarantine)
    assert (first.manifests, first.rows_added) == (2, 200) and first.micro_batches >= 1

    land(landing, "gw-s", events(range(201, 301)), 200)
    bad = land(landing, "gw-s", events(range(301, 401)), 300)
    (landing / bad.name).write_bytes(bad.data[:-10])
    second = jobs.ingest_stream(spark, str(landing), table, checkpoint, quarantine)
    assert (second.manifests, second.ingested, second.rows_added) == (2, 1, 100)
    assert [name for name, _ in second.quarantined] == [bad.name]

    third = jobs.ingest_stream(spark, str(landing), table, checkpoint, quarantine)
    assert (third.manifests, third.rows_added) == (0, 0)
    assert keys(spark, tmp_path / "table") == [("gw-s", s) for s in range(1, 301)]
    log = spark.read.parquet(f"{table}/_batches")
    assert len(list((tmp_path / "table" / "_batches").glob("part-*"))) == 1
    assert sorted(r.status for r in log.distinct().collect()) == ["ingested"] * 3 + [
        "quarantined"]


def landed_files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_ingested_batches_move_to_the_archive_and_bad_ones_to_the_quarantine(
        spark, tmp_path, capsys, cairn_cli):
    landing, table = tmp_path / "landing", tmp_path / "table"
    archive, quarantine = tmp_path / "archive", tmp_path / "q"
    good = land(landing, "g", events(range(1, 11)), 0)
    bad = land(landing, "g", events(range(11, 21)), 10)
    (landing / bad.name).write_bytes(bad.data[:-10])
    waiting = land(landing, "h", events(range(1, 11)), 0, manifest=False)
    ingest = ["spark", "ingest", "--landing", str(landing), "--table", str(table),
              "--archive", str(archive), "--quarantine", str(quarantine), "--master", "local[2]"]
    assert cairn_cli(ingest) == 0

    assert landed_files(landing) == [waiting.name]
    assert landed_files(archive) == sorted([good.name, manifest_name(good.name)])
    assert bad.name in landed_files(quarantine)
    assert "1 batches ingested" in capsys.readouterr().out

    land(landing, "g", events(range(1, 11)), 0)  # the same batch landed again
    write_manifest(landing, waiting)
    assert cairn_cli(ingest) == 0
    assert "2 manifests: 1 batches ingested (1 in one pass), 1 already in the table" in (
        capsys.readouterr().out)
    assert landed_files(landing) == []
    assert len(landed_files(archive)) == 4 and keys(spark, table) == [
        *[("g", s) for s in range(1, 11)], *[("h", s) for s in range(1, 11)]]


def test_streaming_moves_ingested_batches_to_the_archive(spark, tmp_path):
    landing, table = tmp_path / "landing", str(tmp_path / "table")
    checkpoint, archive = str(tmp_path / "checkpoint"), tmp_path / "archive"
    land(landing, "gw-s", events(range(1, 101)), 0)
    first = jobs.ingest_stream(spark, str(landing), table, checkpoint, archive=str(archive))
    assert (first.ingested, landed_files(landing)) == (1, [])

    land(landing, "gw-s", events(range(101, 201)), 100)
    second = jobs.ingest_stream(spark, str(landing), table, checkpoint, archive=str(archive))
    assert (second.manifests, second.rows_added, landed_files(landing)) == (1, 100, [])
    assert len(landed_files(archive)) == 4
    assert keys(spark, tmp_path / "table") == [("gw-s", s) for s in range(1, 201)]


# -- time -------------------------------------------------------------------------------------

TRUE_START = datetime(2026, 11, 20, 0, 0, tzinfo=UTC)  # when boot 1 really began
HOUR_NS = 3600 * 10**9


def epoch_ns(moment: datetime) -> int:
    return int(moment.timestamp()) * 10**9


def clock_boots(gateway: str) -> tuple[list[dict], list[dict], list[dict], dict[int, datetime]]:
    """Two boots of one gateway whose clocks were wrong at first. Returns (rows of boot 1,
    rows of boot 2, all anchors, the true time of each seq).

    Boot 1 starts in 1970 (no RTC) and runs unsynchronized for three hours, an event every
    10 minutes; then NTP steps the clock (anchor "step", synchronized) and six more events
    come with a good clock. Boot 2 starts five hours ahead; someone sets it by hand after
    an hour (a step, still not synchronized)."""
    truth: dict[int, datetime] = {}
    rows1, rows2 = [], []
    base1 = epoch_ns(TRUE_START)  # true wall = base1 + boottime
    for k in range(19):  # seq 1..19 before the step, at boottime 5 s + k * 10 min
        b = 5 * 10**9 + k * 600 * 10**9
        rows1.append(event(k + 1, b // 10**6, boot="b1", boottime_ns=b, synced=False))
        truth[k + 1] = TRUE_START + timedelta(microseconds=b // 1000)
    step1_b = 5 * 10**9 + 3 * HOUR_NS + 30 * 10**9
    for k in range(6):  # seq 20..25 after the step, clock right
        b = step1_b + (k + 1) * 600 * 10**9
        rows1.append(event(20 + k, (base1 + b) // 10**6, boot="b1", boottime_ns=b))
        truth[20 + k] = TRUE_START + timedelta(microseconds=b // 1000)
    base2 = epoch_ns(datetime(2026, 11, 21, 8, 0, tzinfo=UTC))  # boot 2, true wall = base2 + b
    ahead = 5 * HOUR_NS
    step2_b = 7 * 10**9 + HOUR_NS
    for k in range(8):  # seq 26..33, every 15 min: 4 before the hand-set step, 4 after
        b = 7 * 10**9 + k * 900 * 10**9
        off = ahead if b < step2_b else 0
        rows2.append(event(26 + k, (base2 + b + off) // 10**6, boot="b2", boottime_ns=b,
                           synced=False))
        truth[26 + k] = datetime.fromtimestamp(0, UTC) + timedelta(
            microseconds=(base2 + b) // 1000)
    anchors = [
        {"id": 1, "reason": "start", "boot_id": "b1", "boottime_ns": 5 * 10**9,
         "wall_ns": 5 * 10**9, "offset_before_ns": None, "clock_synced": False, "after_seq": 0},
        {"id": 2, "reason": "step", "boot_id": "b1", "boottime_ns": step1_b,
         "wall_ns": base1 + step1_b, "offset_before_ns": 0, "clock_synced": True,
         "after_seq": 19},
        {"id": 3, "reason": "start", "boot_id": "b2", "boottime_ns": 7 * 10**9,
         "wall_ns": base2 + 7 * 10**9 + ahead, "offset_before_ns": None,
         "clock_synced": False, "after_seq": 25},
        {"id": 4, "reason": "step", "boot_id": "b2", "boottime_ns": step2_b,
         "wall_ns": base2 + step2_b, "offset_before_ns": base2 + ahead, "clock_synced": False,
         "after_seq": 29},
    ]
    return rows1, rows2, anchors, truth


def test_a_landing_whose_path_needs_url_encoding_is_ingested(spark, tmp_path):
    """Spark names files by URL-encoded URIs, the file system by plain paths: a landing
    under "a b%" finds each batch's data file and quarantines into the same place."""
    landing, table, quarantine = tmp_path / "a b%", tmp_path / "table", tmp_path / "q r"
    land(landing, "gw-a", events(range(1, 11)), 0)
    bad = land(landing, "gw-a", events(range(11, 21)), 10)
    (landing / bad.name).write_bytes(bad.data[:-3])
    (landing / "gw-a" / "nested").mkdir()  # not a batch, nor are the files in it
    land(landing / "gw-a" / "nested", "gw-a", events(range(21, 31)), 20)
    stats = jobs.ingest(spark, str(landing), str(table), str(quarantine))
    assert (stats.ingested, stats.rows_added, stats.waiting) == (1, 10, 0)
    assert [name for name, _ in stats.quarantined] == [bad.name]
    assert (quarantine / bad.name).exists() and not (landing / bad.name).exists()


def test_names_with_quotes_backslashes_and_sql_are_matched_as_themselves(spark):
    """The filter on a run's file names and gateways (one SQL expression, not a JVM call
    per name) reads a name only as a value, whatever it holds."""
    from cairn.central.spark.session import one_of

    names = ["gw'a/1.jsonl.bz2", "gw\\b/2", "é/3') OR (1=1", "gw-d"]
    frame = spark.createDataFrame([(n,) for n in [*names, "gw-e", "gw\\b/2x"]], "file string")
    assert sorted(r.file for r in frame.where(one_of("file", names)).collect()) == sorted(names)
    assert frame.where(one_of("file", [])).count() == 0


def test_a_fleet_of_a_thousand_gateways_lands_on_an_existing_table(spark, tmp_path):
    """One run with batches of 1,000 gateways into a table that holds rows of each: the
    anti-join looks up each gateway's seq range (it once built one OR per gateway, and the
    JVM's stack overflowed)."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    gateways = [f"g{g:04d}" for g in range(1000)]
    for gw in gateways:
        land(landing, gw, events(range(1, 3)), 0)
    jobs.ingest(spark, str(landing), str(table))
    for gw in gateways:
        land(landing, gw, events(range(2, 5)), 1)  # seq 2 again, 3 and 4 new
    stats = jobs.ingest(spark, str(landing), str(table))
    assert (stats.ingested, stats.rows_read, stats.rows_added) == (1000, 3000, 2000)
    assert keys(spark, table) == [(gw, s) for gw in gateways for s in range(1, 5)]


def test_schema_1_batches_are_plain_gzip_json_lines(tmp_path):
    """Schema 1's batch bytes are plain gzip JSON Lines (no Spark needed to check)."""
    batch = build_batch("gw", events(range(1, 4)), 0, [], [], schema=1)
    lines = gzip.decompress(batch.data).decode().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2, 3]


def test_an_interrupted_partition_rewrite_is_finished_by_the_next_run(spark, tmp_path):
    """A crash in the middle of swapping re-based partitions in: the journal (_SWAP) lets
    the next ingest finish the swap; staging without a journal is dropped."""
    table = tmp_path / "table"
    for path in ("date=2026-01-01/part-old.parquet", "date=2026-01-02/part-old.parquet",
                 "_staging/done/date=2026-01-01/part-new.parquet",
                 "_staging/unfinished/date=2026-01-03/part-x.parquet"):
        (table / path).parent.mkdir(parents=True, exist_ok=True)
        (table / path).write_text(path)
    (table / "_staging/done/date=2026-01-02").mkdir()  # every row left this partition
    (table / "_staging/done/_SWAP").write_text('["2026-01-01", "2026-01-02"]')

    jobs.TableDir(spark, jobs.Files(spark), jobs.Files(spark).qualify(str(table))).recover()

    assert sorted(str(p.relative_to(table)) for p in table.rglob("*.parquet")) == [
        "date=2026-01-01/part-new.parquet"]
    assert not (table / "date=2026-01-02").exists() and not list(table.glob("_staging/*"))


def test_an_interrupted_commit_of_staged_rows_is_finished_by_the_next_run(spark, tmp_path):
    """A crash while moving an append's staged files into the table: the journal (_COMMIT)
    lets the next ingest move the rest in, next to those already moved, and the side-table
    rows that came with them (the ingest log's among them: it holds a batch exactly when
    the table holds its rows)."""
    table = tmp_path / "table"
    for path in ("date=2026-01-01/part-a.parquet", "_staging/run/date=2026-01-01/part-b.parquet",
                 "_staging/run/date=2026-01-02/part-c.parquet", "_batches/part-l.parquet",
                 "_staging/run/_anchors/part-m.parquet", "_staging/run/_batches/part-n.parquet"):
        (table / path).parent.mkdir(parents=True, exist_ok=True)
        (table / path).write_text(path)
    (table / "_staging/run/_COMMIT").write_text("")

    jobs.TableDir(spark, jobs.Files(spark), jobs.Files(spark).qualify(str(table))).recover()

    assert sorted(str(p.relative_to(table)) for p in table.rglob("*.parquet")) == [
        "_anchors/part-m.parquet", "_batches/part-l.parquet", "_batches/part-n.parquet",
        "date=2026-01-01/part-a.parquet", "date=2026-01-01/part-b.parquet",
        "date=2026-01-02/part-c.parquet"]
    assert not list(table.glob("_staging/*"))


def test_batches_whose_seqs_are_known_are_read_checked_and_written_in_one_pass(
        spark, tmp_path):
    """Batches whose seqs are known (first..last without a hole, or the holes their manifest
    lists), alone in their range, take one read; a batch with holes its manifest does not
    list, and one overlapping rows of the table, are checked first."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    land(landing, "g1", events(range(1, 11)), 0)
    land(landing, "g2", events(range(1, 11)), 0)
    land(landing, "g3", events([1, 2, *range(4, 11)]), 0)  # seq 3 is no history event
    unlisted = land(landing, "g4", events([1, 2, *range(4, 11)]), 0, manifest=False)
    unlisted.manifest["holes"] = None  # as a gateway past MAX_HOLES writes it
    write_manifest(landing, unlisted)
    first = jobs.ingest(spark, str(landing), str(table))
    assert (first.ingested, first.one_pass, first.rows_added, first.quarantined) == (
        4, 3, 38, [])

    land(landing, "g1", events(range(6, 16)), 5)  # 6..10 again
    land(landing, "g2", events(range(11, 21)), 10)
    second = jobs.ingest(spark, str(landing), str(table))
    assert (second.ingested, second.one_pass, second.rows_added, second.duplicates) == (
        2, 1, 15, 5)
    rows = spark.read.parquet(str(table))
    assert rows.count() == rows.select("gateway_id", "seq").distinct().count() == 53


def test_a_batch_whose_rows_are_not_where_its_holes_say_is_checked_line_by_line(
        spark, tmp_path, caplog):
    """The holes only spare the job a read: rows in a listed hole (and a listed row missing)
    fail the one-pass totals, and the batch is checked and ingested as it is."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    batch = land(landing, "g", events([1, 2, 4, 5]), 0, manifest=False)  # seq 3 missing
    assert batch.manifest["holes"] == [[2, 1]]
    batch.manifest["holes"] = [[3, 1]]  # says seq 4 is
    write_manifest(landing, batch)

    stats = jobs.ingest(spark, str(landing), str(table))

    assert (stats.one_pass, stats.ingested, stats.rows_added, stats.quarantined) == (
        0, 1, 4, [])
    assert "not all what their manifests say: checking them one by one" in caplog.text
    assert keys(spark, table) == [("g", 1), ("g", 2), ("g", 4), ("g", 5)]
