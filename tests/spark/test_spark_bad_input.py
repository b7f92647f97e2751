"""Bad input at fleet scale: batches that pass their own manifest's checksum but must not
reach the table. Each is quarantined with a reason that says what is wrong, and the rows
already in the table are left exactly as they were. Local[2] (``spark`` in conftest.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
import zlib
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.central.plan import CHECKED_BYTES  # noqa: E402
from cairn.formats.batch import (  # noqa: E402
    MAX_LINE_BYTES,
    MAX_MANIFEST_BYTES,
    encode_rows,
    manifest_name,
)
from cairn.sync.uploader import build_batch  # noqa: E402
from tests.spark.test_spark import T0_MS, event, events, land, write_manifest  # noqa: E402

pytestmark = pytest.mark.spark


def snapshot(table: Path) -> dict[str, tuple[int, int]]:
    """Every event file of the table: (size, mtime in ns)."""
    return {str(p.relative_to(table)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in table.glob("date=*/*.parquet")}


@pytest.fixture(scope="module")
def ingested_once(spark, tmp_path_factory) -> Path:
    """A landing and a table holding gw-a's seqs 1..100, ingested once for the module."""
    root = tmp_path_factory.mktemp("ingested")
    land(root / "landing", "gw-a", events(range(1, 101)), 0)
    jobs.ingest(spark, str(root / "landing"), str(root / "table"), str(root / "q"))
    return root


@pytest.fixture
def ingested(ingested_once, tmp_path):
    """A copy of ``ingested_once`` of this test's own (times kept, so its manifest is one
    the table's log has seen); returns (landing, table, quarantine, files)."""
    shutil.copytree(ingested_once, tmp_path, dirs_exist_ok=True)
    landing, table, quarantine = tmp_path / "landing", tmp_path / "table", tmp_path / "q"
    return landing, table, quarantine, snapshot(table)


def ingest_bad(spark, ingested) -> dict[str, str]:
    """Ingest what landed since; the table's files must be untouched. Returns the reasons."""
    landing, table, quarantine, before = ingested
    stats = jobs.ingest(spark, str(landing), str(table), str(quarantine))
    assert stats.rows_added == 0 and snapshot(table) == before
    return dict(stats.quarantined)


def land_batch(landing: Path, batch) -> None:
    (landing / batch.name).parent.mkdir(parents=True, exist_ok=True)
    (landing / batch.name).write_bytes(batch.data)
    (landing / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))


def land_bytes(landing: Path, gateway: str, rows: list, data: bytes, after: int) -> str:
    batch = build_batch(gateway, rows, after, [], [], data, schema=1)  # data: schema 1's
    land_batch(landing, batch)
    return batch.name


def test_rows_of_another_gateway_inside_a_batch_are_quarantined(spark, ingested):
    """gw-b's batch (its own directory, manifest and checksum) whose middle rows say they
    are gw-a's: first and last lines alone would pass."""
    rows = events(range(101, 111))
    lines = (gzip.decompress(encode_rows("gw-b", rows[:1]))
             + gzip.decompress(encode_rows("gw-a", rows[1:-1]))
             + gzip.decompress(encode_rows("gw-b", rows[-1:])))
    name = land_bytes(ingested[0], "gw-b", rows, gzip.compress(lines, mtime=0), 100)
    assert ingest_bad(spark, ingested) == {name: "rows of gateway gw-a in a batch of 'gw-b'"}


def test_a_manifest_naming_another_gateways_file_is_quarantined(spark, ingested):
    landing = ingested[0]
    batch = build_batch("gw-a", events(range(101, 111)), 100, [], [])
    target = landing / "gw-b" / batch.name.split("/")[1]  # gw-a's batch in gw-b's directory
    target.parent.mkdir(parents=True)
    target.write_bytes(batch.data)
    (landing / manifest_name(f"gw-b/{target.name}")).write_text(json.dumps(batch.manifest))
    reasons = ingest_bad(spark, ingested)
    assert reasons == {f"gw-b/{target.name}": f"manifest of gateway 'gw-a' names {batch.name}"}


def test_a_batch_reusing_ingested_seqs_for_other_events_is_quarantined(spark, ingested):
    """gw-a's store was reset: seqs 91..110 again, the first ten of them other events."""
    landing = ingested[0]
    rows = [dict(r, wall_ms=r["wall_ms"] + 86_400_000, boot_id="boot-2")
            for r in events(range(91, 111))]
    name = land(landing, "gw-a", rows, 90).name
    reason = ingest_bad(spark, ingested)[name]
    assert reason.startswith("10 rows re-use seqs the table holds for other events "
                             "(first: seq 91)")


def test_a_re_sent_batch_with_the_same_events_is_not_a_conflict(spark, ingested):
    landing, table, quarantine, _ = ingested
    land(landing, "gw-a", events(range(91, 111)), 90)  # 91..100 again, the same events
    stats = jobs.ingest(spark, str(landing), str(table), str(quarantine))
    assert (stats.quarantined, stats.rows_added, stats.duplicates) == ([], 10, 10)


def test_a_batch_of_a_newer_schema_is_quarantined_with_its_version(spark, ingested):
    landing, _, quarantine, _ = ingested
    batch = land(landing, "gw-a", events(range(101, 111)), 100)
    newer = dict(json.loads((landing / manifest_name(batch.name)).read_text()), schema=3)
    (landing / manifest_name(batch.name)).write_text(json.dumps(newer))
    assert ingest_bad(spark, ingested) == {batch.name: "manifest schema 3; this job reads 1, 2"}
    assert (quarantine / batch.name).read_bytes() == batch.data  # nothing lost: set aside


def test_a_batch_with_its_lines_out_of_seq_order_is_ingested_whole(spark, ingested):
    landing, table, quarantine, _ = ingested
    rows = events(range(101, 111))
    shuffled = rows[:1] + rows[5:9] + rows[1:5] + rows[9:]
    land_bytes(landing, "gw-a", rows, encode_rows("gw-a", shuffled), 100)
    stats = jobs.ingest(spark, str(landing), str(table), str(quarantine))
    assert (stats.quarantined, stats.rows_added) == ([], 10)
    assert sorted(r.seq for r in spark.read.parquet(str(table)).where("seq > 100")
                  .collect()) == list(range(101, 111))


def test_a_seq_twice_in_a_batch_is_quarantined(spark, ingested):
    """105 twice and 106 missing: the line count and the range are right."""
    rows = events(range(101, 111))
    name = land_bytes(ingested[0], "gw-a", rows,
                      encode_rows("gw-a", rows[:5] + rows[4:5] + rows[6:]), 100)
    assert ingest_bad(spark, ingested) == {name: "1 lines repeat a seq of the batch"}


def test_a_seq_twice_in_a_batch_with_a_hole_is_quarantined(spark, ingested):
    rows = events([*range(101, 103), *range(104, 112)])  # 103 was never stored
    name = land_bytes(ingested[0], "gw-a", rows,
                      encode_rows("gw-a", rows[:5] + rows[4:5] + rows[6:]), 100)
    assert ingest_bad(spark, ingested) == {name: "1 lines repeat a seq of the batch"}


def test_a_batch_with_fewer_lines_than_its_manifest_counts_is_quarantined(spark, ingested):
    rows = events(range(101, 111))
    name = land_bytes(ingested[0], "gw-a", rows, encode_rows("gw-a", rows[:9]), 100)
    assert ingest_bad(spark, ingested) == {name: "9 lines, the manifest says 10"}


def test_a_small_batch_whose_manifest_counts_ten_billion_rows_is_quarantined(spark, ingested):
    """Its range and count agree, so its seqs look known: the lines are counted before the
    job works out which seqs they should be (ten billion of them failed the whole run)."""
    rows = [event(seq, T0_MS + i * 1000, boottime_ns=i * 10**9)
            for i, seq in enumerate([*range(101, 110), 100 + 10**10])]
    batch = land(ingested[0], "gw-a", rows, 100, manifest=False)
    batch.manifest.update(count=10**10, holes=None)
    write_manifest(ingested[0], batch)
    assert ingest_bad(spark, ingested) == {batch.name: "10 lines, the manifest says 10000000000"}


@pytest.mark.parametrize("schema, field, value", [
    (1, "wall_ms", 2**62),          # a valid long, but its microseconds are not
    (1, "boottime_ns", -1),
    (2, "boottime_ns", 2**62),      # the lean line's sum past a long in nanoseconds
    (2, "wall_ms", -(2**62)),
])
def test_a_line_whose_time_is_out_of_bounds_is_not_an_event(spark, ingested, schema, field,
                                                            value):
    """(Spark's ANSI mode fails a whole run on one overflow: one batch stopped every run.)"""
    rows = events(range(101, 111))
    if schema == 1:  # (the timestamp beside wall_ms is for the eye: the job reads wall_ms)
        lines = [json.loads(line) for line in gzip.decompress(encode_rows("gw-a", rows))
                 .splitlines()]
        lines[3][field] = value
        data = gzip.compress(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        batch = build_batch("gw-a", rows, 100, [], [], data, schema=1)
    else:
        rows[3][field] = value
        batch = build_batch("gw-a", rows, 100, [], [])
    land_batch(ingested[0], batch)
    assert ingest_bad(spark, ingested) == {batch.name: (
        f"1 lines are not events of the batch format: line 4 has no {field}")}


@pytest.mark.parametrize("record, problem", [
    ({"anchors": ["start"]}, "manifest anchors[0] is not a JSON object"),
    ({"anchors": [{"id": 1}]}, "manifest anchors[0] field 'reason' is missing or not a string"),
    ({"gaps": [{"id": 1, "count": "ten"}]}, "manifest gaps[0] field 'count' is not a whole"),
])
def test_a_manifest_with_a_record_the_job_cannot_read_is_quarantined(spark, ingested, record,
                                                                    problem):
    rows = events(range(101, 111))
    batch = build_batch("gw-a", rows, 100, [], [])
    batch.manifest.update(record)
    land_batch(ingested[0], batch)
    [(name, reason)] = ingest_bad(spark, ingested).items()
    assert name == batch.name and reason.startswith(problem)


def test_a_batch_that_is_not_gzip_is_quarantined_even_with_its_checksum(spark, ingested):
    rows = events(range(101, 111))
    name = land_bytes(ingested[0], "gw-a", rows, b"PK\x03\x04 not a gzip stream", 100)
    assert ingest_bad(spark, ingested) == {name: "0 lines, the manifest says 10"}


def land_lines(ingested, replace: dict[int, bytes]) -> str:
    """A batch of gw-a, seqs 101..110, whose lines ``replace`` changes (index: new line),
    with a manifest that vouches for the changed bytes."""
    rows = events(range(101, 111))
    lines = gzip.decompress(encode_rows("gw-a", rows)).splitlines(keepends=True)
    for index, line in replace.items():
        lines[index] = line
    return land_bytes(ingested[0], "gw-a", rows, gzip.compress(b"".join(lines), mtime=0), 100)


def test_lines_that_are_not_whole_events_are_quarantined_with_the_first_one(spark, ingested):
    name = land_lines(ingested, {4: b'{"seq": 105, "gateway_id": "gw-a", "topic": "t"}\n',
                                 6: b'{"seq": 107}\n'})
    assert ingest_bad(spark, ingested) == {
        name: "2 lines are not events of the batch format: line 5 has no publication, realm, "
              "wall_ms, boot_id, boottime_ns, clock_synced"}


def test_a_line_that_is_not_json_is_quarantined(spark, ingested):
    name = land_lines(ingested, {2: b'seq=103 temperature=20.5\n'})
    assert ingest_bad(spark, ingested) == {
        name: "1 lines are not events of the batch format: line 3 is not JSON"}


def test_a_large_landing_is_ingested_a_chunk_of_batches_at_a_time(spark, tmp_path):
    """Chunks of two batches over three gateways' directories: every row once, the
    overlapping re-send in a later chunk than the rows it repeats dropped as duplicates."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    for gw in ("g1", "g2", "g3"):
        for lo in (0, 10):
            land(landing, gw, events(range(lo + 1, lo + 11)), lo)
    land(landing, "g3", events(range(5, 16)), 4)  # a re-send overlapping both
    stats = jobs.ingest(spark, str(landing), str(table), chunk=2)
    assert (stats.manifests, stats.ingested, stats.rows_added) == (7, 7, 60)
    got = spark.read.parquet(str(table)).select("gateway_id", "seq").collect()
    assert sorted((r.gateway_id, r.seq) for r in got) == [
        (gw, s) for gw in ("g1", "g2", "g3") for s in range(1, 21)]


def test_a_manifest_whose_gateway_id_climbs_out_keeps_its_batch_in_the_quarantine(
        spark, ingested, tmp_path):
    """The quarantine is named after the landing directory, never after what the manifest
    says: ``../..`` once moved the batch and wrote its note outside it."""
    landing, _, quarantine, _ = ingested
    batch = land(landing, "gw-x", events(range(1, 11)), 0)
    manifest = landing / manifest_name(batch.name)
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()),
                                        gateway_id="../../escaped")))
    assert list(ingest_bad(spark, ingested)) == [batch.name]
    assert not (tmp_path / "escaped").exists()
    assert sorted(p.name for p in (quarantine / "gw-x").iterdir()
                  if not p.name.startswith(".")) == [
        Path(batch.name).name, Path(manifest_name(batch.name)).name,
        Path(batch.name.replace(".jsonl.bz2", ".reason.json")).name]


def padded(line: bytes, size: int) -> bytes:
    """An event's JSON line grown to ``size`` bytes by a field the reader ignores."""
    return line[:-2] + b',"pad":"' + b"x" * (size - len(line) - 9) + b'"}\n'


def test_a_line_longer_than_a_line_may_be_is_quarantined_without_being_held(spark, ingested):
    """A gzip of a few KiB whose one line decompresses past MAX_LINE_BYTES (a 1 GiB one ran
    the heap out): skipped as it is read, so the batch is a line short."""
    line = gzip.decompress(encode_rows("gw-a", events([101])))
    name = land_lines(ingested, {0: padded(line, MAX_LINE_BYTES + 1)})
    assert ingest_bad(spark, ingested) == {name: "9 lines, the manifest says 10"}


def test_a_batch_that_expands_past_its_manifests_count_is_quarantined_unparsed(spark, ingested):
    """A bomb of well-formed lines: a batch just over CHECKED_BYTES whose manifest counts 10
    lines, holding those 10 lines repeated (~170:1 in gzip, 1,848:1 in bzip2). Spark
    parsed and cached every one of them before counting (0.93 GiB of them: 48 s)."""
    rows = events(range(101, 111))
    lines = gzip.decompress(encode_rows("gw-a", rows))
    deflate, parts = zlib.compressobj(9, zlib.DEFLATED, 31), []
    while sum(map(len, parts)) <= CHECKED_BYTES:
        parts.append(deflate.compress(lines * 1000))
    name = land_bytes(ingested[0], "gw-a", rows, b"".join(parts) + deflate.flush(), 100)
    assert ingest_bad(spark, ingested) == {
        name: "more lines than the 10 its manifest counts (not read past line 11)"}


def land_oversized_manifest(landing: Path) -> str:
    """A batch whose manifest is one byte over MAX_MANIFEST_BYTES; returns its name."""
    batch = land(landing, "gw-a", events(range(101, 111)), 100)
    text = json.dumps(batch.manifest).encode()
    (landing / manifest_name(batch.name)).write_bytes(padded(text + b"\n",
                                                             MAX_MANIFEST_BYTES + 1))
    return batch.name


NOT_READ = (f"manifest of {MAX_MANIFEST_BYTES + 1} bytes, over the {MAX_MANIFEST_BYTES} a "
            "manifest may have: not read")


def test_a_manifest_over_the_size_a_manifest_may_have_is_quarantined_unread(spark, ingested):
    name = land_oversized_manifest(ingested[0])
    assert ingest_bad(spark, ingested) == {name: NOT_READ}


def test_a_streaming_ingest_quarantines_an_oversized_manifest_unread(spark, ingested, tmp_path):
    landing, table, quarantine, before = ingested
    name = land_oversized_manifest(landing)
    stats = jobs.ingest_stream(spark, str(landing), str(table), str(tmp_path / "checkpoint"),
                               str(quarantine))
    assert stats.rows_added == 0 and snapshot(table) == before
    assert dict(stats.quarantined) == {name: NOT_READ}
