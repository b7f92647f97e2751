"""The lean batch format (schema 2 of ``formats.batch``) in plain Python: what the
uploader writes comes back as the rows it was given, and costs a third of schema 1 or less.
Its reading by Spark, against schema 1's, is in test_spark_lean.py."""

from __future__ import annotations

import json
import re

import pytest

from cairn.formats.batch import (
    MAX_HOLES,
    ManifestError,
    decode_batch,
    encode_lean,
    encode_rows,
    event_ranges,
    parse_manifest,
)
from cairn.formats.publication_ids import PublicationIds
from cairn.sync.uploader import build_batch
from harness.readings import KEY, readings


def to_the_ms(row: dict) -> dict:
    return {**row, "boottime_ns": row["boottime_ns"] // 1_000_000 * 1_000_000}


def mixed_rows() -> list[dict]:
    """Two boots, two realms, an unsynchronized clock, nulls, an id from before the key."""
    rows = readings(3, 12, first_seq=500)
    rows[3] |= {"boot_id": "boot-2", "realm": "realm2", "clock_synced": False}
    rows[4] |= {"authid": None, "authrole": None, "args": None, "details": None,
                "audience": {"eligible_authrole": ["admin"]}}
    rows[5] |= {"publication": 12345}  # legacy: not what the key gives
    rows[6] |= {"wall_ms": rows[6]["wall_ms"] - 3_600_000}  # the clock stepped back
    return rows


def test_lean_rows_come_back_as_given_with_boottime_to_the_millisecond():
    rows = mixed_rows()
    batch = build_batch("gw-1", rows, 499, [], [], key=KEY)
    assert decode_batch(batch.data, batch.manifest) == [
        {"gateway_id": "gw-1", **to_the_ms(r)} for r in rows]
    assert batch.manifest["boots"] == [rows[0]["boot_id"], "boot-2"]
    assert batch.manifest["realms"] == ["realm1", "realm2"]


def test_only_ids_the_key_does_not_give_are_shipped():
    rows = mixed_rows()
    lines = [json.loads(line) for line in decode_lines(encode_lean(rows, KEY))]
    assert [line.get("p") for line in lines] == [12345 if i == 5 else None
                                                 for i in range(len(rows))]


def test_without_a_key_every_row_carries_its_id():
    rows = mixed_rows()
    batch = build_batch("gw-1", rows, 499, [], [], key=None)
    assert batch.manifest["publication_key"] is None
    assert [r["publication"] for r in decode_batch(batch.data, batch.manifest)] == [
        r["publication"] for r in rows]


def decode_lines(data: bytes) -> list[str]:
    import bz2

    return bz2.decompress(data).decode().splitlines()


@pytest.mark.parametrize("sensors", [20, 200])
def test_a_reading_costs_at_most_a_third_of_schema_1(sensors):
    rows = readings(sensors, 10_000)
    lean, full = len(encode_lean(rows, KEY)), len(encode_rows("gw-0001", rows))
    assert lean * 3 <= full and lean / len(rows) <= 4.0, (lean / len(rows), full / len(rows))


def test_the_readings_ids_are_the_gateways_permutation():
    """(So the test readings exercise the key: none of them carries its id.)"""
    ids = PublicationIds(KEY)
    assert all(r["publication"] == ids.of_seq(r["seq"]) for r in readings(5, 100))


def manifest_of(**changes) -> str:
    batch = build_batch("gw-1", readings(2, 4), 0, [], [], key=KEY)
    return json.dumps({**batch.manifest, **changes})


@pytest.mark.parametrize("schema", [0, 3, "2", True, None])
def test_a_manifest_of_an_unknown_schema_is_refused_naming_the_ones_read(schema):
    with pytest.raises(ManifestError, match=f"manifest schema {schema!r}; this job reads 1, 2"):
        parse_manifest(manifest_of(schema=schema))


@pytest.mark.parametrize("changes, problem", [
    ({"boots": []}, "'boots' is not a list of strings"),
    ({"realms": [1]}, "'realms' is not a list of strings"),
    ({"publication_key": "00ff"}, "'publication_key' is not 16 bytes in hex"),
])
def test_a_lean_manifest_without_what_its_rows_refer_to_is_refused(changes, problem):
    with pytest.raises(ManifestError, match=problem):
        parse_manifest(manifest_of(**changes))


def holed_manifest(seqs: list[int], **changes) -> dict:
    rows = readings(1, len(seqs))
    for row, seq in zip(rows, seqs, strict=True):
        row["seq"] = seq
    return {**build_batch("gw-1", rows, 0, [], [], key=KEY).manifest, **changes}


def test_the_manifest_lists_the_holes_between_a_batchs_seqs():
    m = holed_manifest([10, 11, 13, 14, 18, 19, 20])
    assert m["holes"] == [[2, 1], [5, 3]]  # [offset from first_seq, how many]
    assert event_ranges(parse_manifest(json.dumps(m))) == [(10, 11), (13, 14), (18, 20)]


def test_a_batch_without_holes_lists_none():
    m = holed_manifest([5, 6, 7])
    assert m["holes"] == [] and event_ranges(m) == [(5, 7)]


def test_a_batch_with_more_holes_than_a_manifest_may_list_leaves_them_out():
    """(Its seqs are then not known from the manifest: the job checks it line by line.)"""
    every_other = list(range(1, 2 * (MAX_HOLES + 2), 2))  # MAX_HOLES + 1 holes
    m = holed_manifest(every_other)
    assert m["holes"] is None and event_ranges(m) is None
    assert len(holed_manifest(every_other[:-1])["holes"]) == MAX_HOLES


@pytest.mark.parametrize("holes", [
    [[2, 2]],             # leaves 5 seqs of 10..16, not the 4 counted
    [[0, 3]],             # takes the first seq, which is a row
    [[4, 3]],             # takes the last seq
    [[1, 1], [2, 2]],     # holes with no row between them
    [[3, 1], [1, 2]],     # out of order
    [[1, True], [4, 2]],  # not a number
    [[1, 3, 0]],
    "[[1, 3]]",
    [[1, 1]] * (MAX_HOLES + 1),
])
def test_holes_that_are_not_the_holes_of_the_range_and_count_are_refused(holes):
    m = holed_manifest([10, 14, 15, 16], holes=holes)
    with pytest.raises(ManifestError, match="'holes' is not holes of its seq range"):
        parse_manifest(json.dumps(m))


ANCHOR = {"id": 1, "reason": "start", "boot_id": "b", "boottime_ns": 10**9,
          "wall_ns": 1_795_000_000 * 10**9, "offset_before_ns": None, "clock_synced": True,
          "after_seq": 0}
GAP = {"id": -7, "realm": "realm1", "rule": None, "first_seq": 7, "last_seq": 7, "count": 1,
       "reason": "damaged: not UTF-8", "wall_ms": 1_795_000_000_000}


@pytest.mark.parametrize("changes, problem", [
    ({"first_seq": 2**53}, "field 'first_seq' is missing or not a whole number from 0 to"),
    ({"count": 0}, "field 'count' is missing or not a whole number from 1 to"),
    ({"bytes": -1}, "field 'bytes' is missing or not a whole number from 0 to"),
    ({"after_seq": "0"}, "field 'after_seq' is not a whole number"),
    ({"anchors": [ANCHOR | {"wall_ns": 2**63}]}, "anchors[0] field 'wall_ns' is missing or"),
    ({"anchors": [ANCHOR, ANCHOR | {"boottime_ns": -1}]}, "anchors[1] field 'boottime_ns'"),
    ({"anchors": [ANCHOR | {"clock_synced": "yes"}]}, "anchors[0] field 'clock_synced' is "
                                                      "missing or not a boolean"),
    ({"gaps": [GAP | {"rule": -1}]}, "gaps[0] field 'rule' is not a whole number from 0"),
    ({"gaps": [GAP | {"wall_ms": 2**62}]}, "gaps[0] field 'wall_ms' is not a whole number"),
    ({"gaps": [GAP, 7]}, "gaps[1] is not a JSON object"),
])
def test_a_manifest_field_out_of_what_the_job_computes_with_is_refused(changes, problem):
    """Spark's ANSI mode fails the whole run on one overflow: numbers are bounded where
    they come in."""
    with pytest.raises(ManifestError, match=re.escape(problem)):
        parse_manifest(manifest_of(**changes))


def test_the_records_a_gateway_writes_are_read():
    m = parse_manifest(manifest_of(anchors=[ANCHOR, ANCHOR | {"clock_synced": 0}], gaps=[GAP]))
    assert m["gaps"] == [GAP]
