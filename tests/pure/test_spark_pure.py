"""The pure tier of the Spark jobs: the logic of the jobs that is plain Python over plain
values (``cairn.central.plan``: which anchor re-bases a boot, what data was lost, which batches
overlap, what is wrong with a batch given its totals; ``central.stats``: the one-line
summary), tested without a Spark session, in milliseconds, and without PySpark installed.
The end-to-end tests (tests/test_spark*.py) keep what needs Spark: the reads, the joins, the
commit protocol and crash recovery."""

from __future__ import annotations

import bz2
import gzip
import zipfile
import zlib
from typing import Any, NamedTuple

import pytest

from cairn.central import plan
from cairn.central.plan import (
    NOT_LANDED,
    REQUIRED,
    ROWS_PER_FILE,
    Candidate,
    anchor_changes,
    bytes_problem,
    code_zip,
    conf_pairs,
    lines_past,
    lines_problem,
    loss_intervals,
    minus,
    one_pass_batches,
    output_parts,
    overlapping_batches,
    reference_anchors,
    touched_ranges,
    triage,
)
from cairn.central.stats import IngestStats


def candidate(gateway: str, first: int, last: int, count: int | None = None,
              **manifest: Any) -> Candidate:
    name = f"{gateway}/{first}-{last}"
    return Candidate(name + ".manifest.json", name, {
        "gateway_id": gateway, "first_seq": first, "last_seq": last, "file": name,
        "count": last - first + 1 if count is None else count, **manifest},
        data_uri="file:/" + name)


# -- which anchor re-bases a boot ------------------------------------------------------------

def anchor(id_: int, *, boot: str = "b1", reason: str = "start", synced: bool = False,
           gateway: str = "g") -> dict[str, Any]:
    return {"gateway_id": gateway, "id": id_, "reason": reason, "boot_id": boot,
            "boottime_ns": id_ * 10**9, "wall_ns": 10**18 + id_, "offset_before_ns": None,
            "clock_synced": synced, "after_seq": id_ * 10}


def test_a_boot_is_re_based_on_its_first_synchronized_anchor():
    refs = reference_anchors([anchor(3, synced=True), anchor(1), anchor(2, synced=True),
                              anchor(4, reason="step")])
    assert refs[("g", "b1")]["id"] == 2


def test_failing_a_synchronized_anchor_the_last_step_re_bases_a_boot():
    refs = reference_anchors([anchor(5, reason="step"), anchor(1), anchor(3, reason="step")])
    assert refs[("g", "b1")]["id"] == 5


def test_a_boot_with_neither_keeps_its_raw_time():
    assert reference_anchors([anchor(1), anchor(2, boot="b2", synced=True)]) == {
        ("g", "b2"): anchor(2, boot="b2", synced=True)}


def manifest_anchor(id_: int, **kwargs: Any) -> dict[str, Any]:
    a = anchor(id_, **kwargs)
    del a["gateway_id"]
    return a


def test_new_anchors_move_only_the_reference_of_boots_the_table_has():
    known = [anchor(1), anchor(2, boot="b2", synced=True)]
    manifests = [{"gateway_id": "g", "anchors": [
        manifest_anchor(1), manifest_anchor(3, reason="step"),   # b1: no reference -> a step
        manifest_anchor(4, boot="b2", synced=True),              # b2: its first stays
        manifest_anchor(5, boot="b3", synced=True)],             # b3: new, no rows yet
        "gaps": [{"id": 7, "realm": "r", "rule": 1, "first_seq": 10, "last_seq": 12,
                  "count": 3, "reason": "full", "wall_ms": 99}]}]
    changes = anchor_changes(known, manifests)
    assert sorted(changes.new) == [("g", 3), ("g", 4), ("g", 5)]
    assert changes.new["g", 3] == anchor(3, reason="step")
    assert {boot: a["id"] for boot, a in changes.refs.items()} == {
        ("g", "b1"): 3, ("g", "b2"): 2, ("g", "b3"): 5}
    assert changes.moved == {("g", "b1")}
    assert changes.gaps == {("g", 7): ("g", 7, "r", 1, 10, 12, 3, "full", 99)}
    assert changes.frame is None  # a DataFrame only once _anchors made one


# -- what data was lost ----------------------------------------------------------------------

def test_seqs_no_batch_covers_are_lost_as_not_landed():
    batches = [("g", None, 1, 10), ("g", 10, 11, 20), ("g", 20, 31, 40), ("g", 45, 46, 50)]
    assert loss_intervals(batches, []) == [("g", 41, 45, NOT_LANDED)]


def test_seqs_a_batch_covers_but_lacks_are_not_loss():
    """A batch covers after_seq+1..last_seq: its first seq may come later (seqs of
    retained-only publications are never history)."""
    assert loss_intervals([("g", None, 1, 10), ("g", 10, 15, 20)], []) == []


def test_the_gateways_own_loss_records_are_cut_out_of_what_did_not_land():
    batches = [("g", None, 1, 10), ("g", 30, 31, 40), ("h", None, 5, 6)]
    gaps = [("g", 15, 17, "full"), ("g", 50, 60, "wear"), ("h", None, 3, "unknown")]
    assert loss_intervals(batches, gaps) == [
        ("g", 11, 14, NOT_LANDED), ("g", 15, 17, "dropped on the gateway: full"),
        ("g", 18, 30, NOT_LANDED), ("g", 50, 60, "dropped on the gateway: wear")]


@pytest.mark.parametrize(("span", "cut", "left"), [
    ((1, 10), (20, 30), [(1, 10)]),
    ((1, 10), (0, 0), [(1, 10)]),
    ((1, 10), (3, 5), [(1, 2), (6, 10)]),
    ((1, 10), (1, 5), [(6, 10)]),
    ((1, 10), (5, 10), [(1, 4)]),
    ((1, 10), (0, 11), []),
])
def test_minus(span, cut, left):
    assert minus(span, cut) == left


# -- which batches overlap -------------------------------------------------------------------

def test_only_batches_overlapping_another_are_deduped():
    """Batches of one run are deduped among themselves only when their seq ranges touch
    another's (of the same gateway): the others skip that shuffle."""
    good = [candidate("a", 1, 100), candidate("a", 101, 200), candidate("a", 150, 160),
            candidate("a", 201, 300), candidate("b", 1, 100), candidate("b", 50, 400),
            candidate("b", 401, 500), candidate("c", 1, 300), candidate("c", 2, 3),
            candidate("c", 250, 260)]
    assert overlapping_batches(good) == {"a/101-200", "a/150-160", "b/1-100", "b/50-400",
                                  "c/1-300", "c/2-3", "c/250-260"}


def test_one_pass_takes_batches_of_known_seqs_without_overlaps_or_logged_neighbours():
    plain, holed = candidate("a", 1, 10), candidate("a", 11, 20, count=9)
    listed = candidate("a", 21, 30, count=9, holes=[[4, 1]])
    shared1, shared2 = candidate("b", 1, 10), candidate("b", 5, 15)
    logged = candidate("c", 1, 10)
    sound = [plain, holed, listed, shared1, shared2, logged]
    assert one_pass_batches(sound, {logged.data_uri}) == [plain, listed]


def test_the_table_is_read_in_one_span_per_gateway_of_the_touching_batches():
    a1, a2, a3, b = (candidate("a", 1, 10), candidate("a", 50, 60), candidate("a", 100, 200),
                     candidate("b", 5, 6))
    touching = {a1.data_uri, a2.data_uri, b.data_uri}
    assert touched_ranges([a1, a2, a3, b], touching) == {"a": (1, 60), "b": (5, 6)}
    assert touched_ranges([a3], touching) == {}


def test_a_run_writes_files_of_about_rows_per_file_in_whole_waves():
    assert output_parts(batches=3, lines=10, parallelism=2) == 2
    assert output_parts(batches=1, lines=10, parallelism=8) == 1
    assert output_parts(batches=100, lines=3 * ROWS_PER_FILE, parallelism=2) == 4
    assert output_parts(batches=100, lines=0, parallelism=2) == 1


# -- what is wrong with a batch --------------------------------------------------------------

def test_a_manifest_is_checked_against_the_length_and_sha256_of_its_bytes():
    manifest = {"bytes": 10, "sha256": "ab" * 32}
    assert bytes_problem(manifest, 10, "ab" * 32) is None
    assert bytes_problem(manifest, None, None) == "Spark could not read the data file"
    assert bytes_problem(manifest, 9, "ab" * 32) == \
        "9 bytes, the manifest says 10 (truncated?)"
    assert bytes_problem(manifest, 10, "cd" * 32) == (
        "sha256 cdcdcdcdcdcdcdcd... differs from the manifest's abababababababab...")


class BadLine(NamedTuple):
    pos: int
    missing: list[str]


class Totals(NamedTuple):
    """A batch's row of the per-file checks (verify._line_problems)."""
    lines: int = 10
    incomplete: int = 0
    first_bad: BadLine | None = None
    top: int = 100
    first: int = 1
    last: int = 10
    seqs: int = 10
    gateways: tuple[str, ...] = ("g",)


MANIFEST = {"count": 10, "gateway_id": "g", "first_seq": 1, "last_seq": 10}


@pytest.mark.parametrize(("totals", "problem"), [
    (Totals(), None),
    (None, "0 lines, the manifest says 10"),
    (Totals(lines=7), "7 lines, the manifest says 10"),
    (Totals(incomplete=2, first_bad=BadLine(103, list(REQUIRED))),
     "2 lines are not events of the batch format: line 4 is not JSON"),
    (Totals(incomplete=1, first_bad=BadLine(100, ["seq", "topic"])),
     "1 lines are not events of the batch format: line 1 has no seq, topic"),
    (Totals(gateways=["g", "x", "a"]), "rows of gateway a, x in a batch of 'g'"),
    (Totals(first=2, last=11), "seqs 2..11, the manifest says 1..10"),
    (Totals(seqs=8), "2 lines repeat a seq of the batch"),
])
def test_a_batch_is_checked_against_its_manifest_by_its_totals(totals, problem):
    assert lines_problem(MANIFEST, totals) == problem


def test_a_manifest_vouches_only_for_the_file_beside_it_in_its_gateways_directory():
    done_ = candidate("g", 1, 10, sha256="s")
    changed = candidate("g", 11, 20, sha256="t", file="g/11-20")
    missing = candidate("g", 21, 30, sha256="t")
    elsewhere = candidate("g", 31, 40, sha256="t", file="g/11-20")
    foreign = candidate("g", 41, 50, sha256="t", gateway_id="h")
    candidates, already, rejected = triage(
        [done_, changed, missing, elsewhere, foreign], {("g/1-10", "s"), ("g/11-20", "s")},
        lambda c: c is not missing)
    assert candidates == [changed]  # the same file with other bytes: verified again
    assert already == [done_]
    assert [(c.name, reason) for c, reason in rejected] == [
        ("g/21-30", "the data file is missing"),
        ("g/31-40", "manifest of gateway 'g' names g/11-20"),
        ("g/41-50", "manifest of gateway 'h' names g/41-50")]


# -- the summary and the command line --------------------------------------------------------

def test_the_summary_names_only_what_happened():
    stats = IngestStats(manifests=3, ingested=2, already=1, rows_read=10, rows_added=8,
                        seconds=2.0)
    assert stats.summary() == (
        "3 manifests: 2 batches ingested, 1 already in the table, 0 quarantined; 10 rows "
        "read, 8 added (2 duplicates, 0 with estimated time); 2.0 s (5 rows/s)")


def test_the_summary_of_runs_added_up():
    total = IngestStats(micro_batches=2)
    total.add(IngestStats(manifests=2, ingested=1, one_pass=1, quarantined=[("g/1", "bad")],
                          rows_read=5, rows_added=5, rows_estimated=2,
                          phases={"write": 1.0}))
    total.add(IngestStats(manifests=4, already=4, unread=3, waiting=1, rows_rebased=7,
                          phases={"write": 0.5, "log": 0.25}))
    assert total.phases == {"write": 1.5, "log": 0.25}
    assert total.summary() == (
        "6 manifests: 1 batches ingested (1 in one pass), 4 already in the table (3 unchanged "
        "since, not read again), 1 quarantined, 1 data files waiting for their manifest; 5 "
        "rows read, 5 added (0 duplicates, 2 with estimated time); 7 earlier rows re-based on "
        "new clock anchors; 2 micro-batches; 0.0 s (0 rows/s)")


# -- a batch that expands past its manifest's count ------------------------------------------

LINE = b'{"s":1,"w":10000,"b":0,"t":"sensor.a","k":{"celsius":21.5}}\n'


def bomb(lines: int) -> bytes:
    """A gzip of ``lines`` normal lines, compressed as it is made (a bomb's 1,000:1)."""
    deflate, block = zlib.compressobj(9, zlib.DEFLATED, 31), LINE * 10_000
    chunks = [deflate.compress(block) for _ in range(lines // 10_000)]
    return b"".join([*chunks, deflate.compress(LINE * (lines % 10_000)), deflate.flush()])


def test_a_batch_is_read_no_further_than_the_line_past_its_manifests_count(monkeypatch):
    data = bomb(2_000_000)  # 120 MB of lines in ~0.3 MB
    read = []

    def counted(data: bytes, name: str):
        for chunk in decompressed(data, name):
            read.append(len(chunk))
            yield chunk

    decompressed = plan.decompressed
    monkeypatch.setattr(plan, "decompressed", counted)
    assert lines_past(data, "g/1-10.jsonl.gz", 10)
    assert sum(read) <= plan.STEP


def test_a_batch_of_as_many_lines_as_its_manifest_counts_is_not_past_it():
    assert not lines_past(gzip.compress(LINE * 10), "g/1-10.jsonl.gz", 10)
    assert not lines_past(bz2.compress(LINE * 10), "g/1-10.jsonl.bz2", 10)
    assert not lines_past(gzip.compress(LINE * 9 + LINE[:-1]), "g/1-10.jsonl.gz", 10)


def test_a_last_line_without_its_newline_is_a_line():
    assert lines_past(gzip.compress(LINE * 10 + LINE[:-1]), "g/1-10.jsonl.gz", 10)


def test_every_member_of_a_multi_member_file_is_counted():
    assert lines_past(gzip.compress(LINE * 6) + gzip.compress(LINE * 5), "g/1.jsonl.gz", 10)
    assert lines_past(bz2.compress(LINE * 6) + bz2.compress(LINE * 5), "g/1.jsonl.bz2", 10)
    assert not lines_past(bz2.compress(LINE * 5) * 2, "g/1.jsonl.bz2", 10)


def test_a_damaged_stream_is_counted_as_far_as_it_goes():
    whole = bomb(20_000)
    assert lines_past(whole[:len(whole) // 2], "g/1.jsonl.gz", 10)
    assert not lines_past(b"PK\x03\x04 not a gzip stream", "g/1.jsonl.gz", 10)


def test_conf_pairs():
    assert conf_pairs(None) == {}
    assert conf_pairs(["a=1", " b =x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in ("novalue", "=1"):
        with pytest.raises(ValueError, match="--conf wants KEY=VALUE"):
            conf_pairs([bad])


def test_the_code_shipped_to_executors_holds_the_spark_package(tmp_path):
    """Workers of a cluster import Cairn only from this zip (tests/spark/test_spark_cluster.py)."""
    with zipfile.ZipFile(code_zip(str(tmp_path))) as z:
        names = set(z.namelist())
    assert {"cairn/__init__.py", "cairn/central/__init__.py", "cairn/formats/batch.py",
            "cairn/central/spark/__init__.py", "cairn/central/spark/table.py",
            "cairn/central/spark/ingest.py", "cairn/base/__init__.py"} <= names
    # and nothing of the edge: central imports neither gateway, drivers nor sync
    assert not [n for n in names if n.startswith(("cairn/gateway", "cairn/drivers",
                                                  "cairn/sync", "cairn/app"))]
