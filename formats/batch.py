"""The batch format, the one contract between the edge uploader and the central Spark job.

A batch is a data file ``<gateway_id>/<first_seq:012d>-<last_seq:012d><suffix>`` and beside
it a ``.manifest.json`` written last: schema, gateway_id, file, after_seq, first_seq,
last_seq, count, bytes, sha256, created, clock anchors, gap records and (schema 2, optional)
the ``holes``: the seqs of first_seq..last_seq it holds no row for (publications not kept in
history, rows lost), as ``[offset from first_seq, how many]`` pairs, which let the job check
the batch by totals while it writes it (:func:`event_ranges`). Rows are the fields
of :data:`ROW_FIELDS` (:func:`row_of`), one history publication per line, in seq order,
bytes as ``{"$bytes": base64}``. Two schemas; the uploader writes the lean one:

- **1** (``.jsonl.gz``, :func:`encode_rows`): gzip of JSON Lines, each line the whole row
  behind ``gateway_id`` and an RFC 3339 ``timestamp``: ~450 bytes of JSON a reading.
- **2** (``.jsonl.bz2``, :func:`encode_lean`): bzip2 of JSON Lines of :data:`LEAN_FIELDS`,
  about a tenth of that. What the table can derive is left out: the gateway id (the
  manifest's), the realm and boot id (indexes into the manifest's ``realms`` and ``boots``),
  the publication id (the gateway's keyed permutation of the seq,
  :mod:`formats.publication_ids`, recomputed from the manifest's ``publication_key``; a row
  whose id is not that one, from before the key, carries it). seq, wall_ms and boottime -
  wall_ms are deltas from the line before (the first line's are whole), boottime in
  milliseconds (the table's ``boottime_ns`` is a whole millisecond). Fields that are null, and
  ``clock_synced`` when true, are left out. bzip2: its block sort finds the fields repeated
  line after line (half of gzip's bytes here), Spark reads it natively, and Python has it.

The uploader writes with :func:`encode_lean` and :func:`build_manifest` (which names the
data file, :func:`data_name`; its own name is :func:`manifest_name`); the job reads with
:func:`parse_manifest`, beside it (the Spark schemas derive from the fields here).
"""

from __future__ import annotations

import base64
import bz2
import gzip
import hashlib
import itertools
import json
from typing import Any, NamedTuple

from cairn.base.clock_readings import rfc3339

SCHEMA_VERSION = 2  # of the manifest and the rows the uploader writes
DATA_SUFFIXES = {1: ".jsonl.gz", 2: ".jsonl.bz2"}  # by schema; a job refuses other schemas
MANIFEST_SUFFIX = ".manifest.json"
# What the job reads of a batch at most. A line holds one publication, which the router
# bounds (max_message_size, 1 MiB by default; JSON escapes and base64 grow it by up to 6x);
# a manifest holds kilobytes of anchors and gaps. A landed file past these is refused
# unread: a gzip of 1 MiB holding one line of 1 GiB ran the job's heap out, every run.
MAX_LINE_BYTES = 32 * 1024 * 1024
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
# A batch with more holes than this leaves them out of its manifest (then checked line by
# line): a manifest of a thousand hole pairs would outweigh a minute's readings on the wire.
MAX_HOLES = 64


class RowField(NamedTuple):
    name: str
    type: str  # "long", "string", "boolean", or "json": any JSON value (Spark reads its text)
    required: bool  # never null (NOT NULL in the gateway's store)


# A line's fields after ``gateway_id`` (string, required) and ``timestamp`` (RFC 3339 of
# ``wall_ms``, for the eye), in the order they are written.
ROW_FIELDS = (
    RowField("seq", "long", True),
    RowField("publication", "long", True),
    RowField("realm", "string", True),
    RowField("topic", "string", True),
    RowField("wall_ms", "long", True),
    RowField("boot_id", "string", True),
    RowField("boottime_ns", "long", True),
    RowField("clock_synced", "boolean", True),
    RowField("authid", "string", False),
    RowField("authrole", "string", False),
    RowField("audience", "json", False),
    RowField("details", "json", False),
    RowField("args", "json", False),
    RowField("kwargs", "json", False),
)
_ROW_NAMES = tuple(f.name for f in ROW_FIELDS)


def row_of(pub: Any) -> dict[str, Any]:
    """A history publication as a row of a batch (its fields are the publication's: a
    gateway.core.publication.StoredPublication, or anything with :data:`ROW_FIELDS`)."""
    return {name: getattr(pub, name) for name in _ROW_NAMES}


def data_name(gateway_id: str, first_seq: int, last_seq: int,
              schema: int = SCHEMA_VERSION) -> str:
    return f"{gateway_id}/{first_seq:012d}-{last_seq:012d}{DATA_SUFFIXES[schema]}"


def is_data(name: str) -> bool:
    return name.endswith(tuple(DATA_SUFFIXES.values()))


def stem(name: str) -> str:
    """A batch file's name without its suffix (data or manifest)."""
    for suffix in (*DATA_SUFFIXES.values(), MANIFEST_SUFFIX):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def manifest_name(data: str) -> str:
    """``gw/000000000001-000000000100.jsonl.bz2`` -> ``gw/...-000000000100.manifest.json``"""
    return stem(data) + MANIFEST_SUFFIX


def data_of(manifest: str, schema: int = SCHEMA_VERSION) -> str:
    """The data file of ``schema`` beside a manifest: the inverse of :func:`manifest_name`."""
    return stem(manifest) + DATA_SUFFIXES[schema]


def data_candidates(manifest: str) -> list[str]:
    """Every data file a manifest of any schema can have beside it (for one that cannot be
    read: which file it vouched for is not known)."""
    return [data_of(manifest, schema) for schema in DATA_SUFFIXES]


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode_rows(gateway_id: str, rows: list[dict[str, Any]]) -> bytes:
    """JSON Lines, gzip (mtime 0, so the same rows always give the same bytes)."""
    encode = json.JSONEncoder(default=_json_default, separators=(",", ":")).encode
    lines = []
    second, prefix = None, ""
    for row in rows:
        ms = row["wall_ms"]
        if ms // 1000 != second:  # rfc3339(ms), formatting each second once
            second = ms // 1000
            prefix = rfc3339(second * 1000)[:-5]
        lines.append(encode({"gateway_id": gateway_id,
                             "timestamp": f"{prefix}.{ms % 1000:03d}Z", "seq": row["seq"],
                             **row}))
    lines.append("")
    return gzip.compress("\n".join(lines).encode(), compresslevel=6, mtime=0)


class LeanField(NamedTuple):
    key: str
    type: str  # as RowField's
    what: str  # how the row's field comes back from it


# A line of schema 2: its keys, each left out when null (``c`` when true, ``o`` and ``r``
# when 0). Short keys: bzip2 takes them for almost nothing, but Spark parses each one.
LEAN_FIELDS = (
    LeanField("s", "long", "seq: the delta from the line before (the first line: seq)"),
    LeanField("w", "long", "wall_ms: the same"),
    LeanField("b", "long", "boottime_ms - wall_ms: the same"),
    LeanField("o", "long", "boot_id: its index in the manifest's boots"),
    LeanField("r", "long", "realm: its index in the manifest's realms"),
    LeanField("p", "long", "publication, when not the one the publication_key gives"),
    LeanField("c", "boolean", "clock_synced, when false"),
    LeanField("t", "string", "topic"),
    LeanField("a", "string", "authid"),
    LeanField("ar", "string", "authrole"),
    LeanField("au", "json", "audience"),
    LeanField("d", "json", "details"),
    LeanField("g", "json", "args"),
    LeanField("k", "json", "kwargs"),
)
_PLAIN = {"t": "topic", "a": "authid", "ar": "authrole", "au": "audience", "d": "details",
          "g": "args", "k": "kwargs"}
NS_PER_MS = 1_000_000


def lean_header(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The manifest's ``boots`` and ``realms`` of ``rows``, in order of appearance."""
    return {"boots": list(dict.fromkeys(r["boot_id"] for r in rows)),
            "realms": list(dict.fromkeys(r["realm"] for r in rows))}


def encode_lean(rows: list[dict[str, Any]], key: bytes | None) -> bytes:
    """Schema 2's data file of ``rows`` (see the module docstring); ``key``: the gateway's
    publication id key (None: every row carries its publication id)."""
    from cairn.formats.publication_ids import PublicationIds

    ids = PublicationIds(key) if key is not None else None
    header = lean_header(rows)
    boots = {b: i for i, b in enumerate(header["boots"])}
    realms = {r: i for i, r in enumerate(header["realms"])}
    encode = json.JSONEncoder(default=_json_default, separators=(",", ":")).encode
    seq = wall = offset = 0
    lines = []
    for row in rows:
        boottime_ms = row["boottime_ns"] // NS_PER_MS
        line: dict[str, Any] = {"s": row["seq"] - seq, "w": row["wall_ms"] - wall,
                                "b": boottime_ms - row["wall_ms"] - offset}
        seq, wall, offset = row["seq"], row["wall_ms"], boottime_ms - row["wall_ms"]
        if boots[row["boot_id"]]:
            line["o"] = boots[row["boot_id"]]
        if realms[row["realm"]]:
            line["r"] = realms[row["realm"]]
        if ids is None or ids.of_seq(row["seq"]) != row["publication"]:
            line["p"] = row["publication"]
        if not row["clock_synced"]:
            line["c"] = False
        line.update((k, row[f]) for k, f in _PLAIN.items() if row[f] is not None)
        lines.append(encode(line))
    lines.append("")
    return bz2.compress("\n".join(lines).encode(), 9)


def decode_lean(data: bytes, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a schema 2 data file, as :func:`row_of` gave them (boottime_ns to the
    millisecond). The Spark job decodes the same in the JVM (``central.spark.lean``)."""
    from cairn.formats.publication_ids import PublicationIds

    key = manifest.get("publication_key")
    ids = PublicationIds(bytes.fromhex(key)) if key else None
    seq = wall = offset = 0
    rows = []
    for text in bz2.decompress(data).decode().splitlines():
        line = json.loads(text)
        seq, wall, offset = seq + line["s"], wall + line["w"], offset + line["b"]
        rows.append({
            "seq": seq,
            "publication": line["p"] if "p" in line else ids.of_seq(seq) if ids else None,
            "realm": manifest["realms"][line.get("r", 0)], "topic": line["t"],
            "wall_ms": wall, "boot_id": manifest["boots"][line.get("o", 0)],
            "boottime_ns": (wall + offset) * NS_PER_MS, "clock_synced": line.get("c", True),
            **{f: line.get(k) for k, f in _PLAIN.items() if k != "t"}})
    return [{name: row[name] for name in _ROW_NAMES} for row in rows]


def decode_batch(data: bytes, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a batch of either schema, each with its ``gateway_id`` (for tests and
    tools: the Spark job reads the files itself)."""
    if manifest["schema"] == 1:
        return [json.loads(line) for line in gzip.decompress(data).decode().splitlines()]
    return [{"gateway_id": manifest["gateway_id"], **row} for row in decode_lean(data, manifest)]


def holes_of(seqs: list[int]) -> list[list[int]] | None:
    """The manifest's ``holes`` of a batch holding ``seqs`` (ascending): [offset from the
    first, how many] for each run of seqs missing between two; None past MAX_HOLES."""
    holes = [[prev + 1 - seqs[0], seq - prev - 1]
             for prev, seq in itertools.pairwise(seqs) if seq > prev + 1]
    return holes if len(holes) <= MAX_HOLES else None


def event_ranges(m: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The seq ranges (first, last) a batch's rows fill exactly, by its (parsed) manifest:
    its whole range without a hole, or what its ``holes`` leave; None when not known (holes
    its manifest does not list)."""
    first, last = m["first_seq"], m["last_seq"]
    if m.get("holes") is None:
        return [(first, last)] if m["count"] == last - first + 1 else None
    ranges, start = [], first
    for offset, missing in m["holes"]:
        ranges.append((start, first + offset - 1))
        start = first + offset + missing
    return ranges + [(start, last)]


def build_manifest(gateway_id: str, rows: list[dict[str, Any]], data: bytes, after_seq: int,
                   anchors: list[dict[str, Any]], gaps: list[dict[str, Any]], created_ms: int,
                   key: bytes | None = None, schema: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The manifest of the data file ``data`` holding ``rows`` (in seq order, every history
    row after ``after_seq`` up to the last one): what :func:`parse_manifest` reads back.
    ``anchors`` and ``gaps`` are the store's records; the ones that concern this batch are
    picked here. ``key``: the store's publication id key (schema 2 leaves out the ids it
    gives)."""
    first, last = rows[0]["seq"], rows[-1]["seq"]
    boots = {row["boot_id"] for row in rows}
    manifest = {
        "schema": schema,
        "gateway_id": gateway_id,
        "file": data_name(gateway_id, first, last, schema),
        "after_seq": after_seq,
        "first_seq": first,
        "last_seq": last,
        "count": len(rows),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "created": rfc3339(created_ms),
        # every anchor of the boots in the batch (a later batch of the same boot repeats
        # them with any new ones), and anchors recorded inside the batch's seq range
        "anchors": [{**a, "clock_synced": bool(a["clock_synced"])} for a in anchors
                    if a["boot_id"] in boots or after_seq <= a["after_seq"] < last],
        "gaps": [g for g in gaps
                 if g["last_seq"] is not None and g["first_seq"] is not None
                 and g["last_seq"] > after_seq and g["first_seq"] <= last],
    }
    if schema == 2:
        manifest.update(lean_header(rows), publication_key=key.hex() if key else None,
                        holes=holes_of([row["seq"] for row in rows]))
    return manifest


class ManifestError(ValueError):
    pass


def parse_manifest(text: str) -> dict[str, Any]:
    try:
        m = json.loads(text)
    except ValueError as e:
        raise ManifestError(f"manifest is not JSON ({e})") from None
    if not isinstance(m, dict):
        raise ManifestError("manifest is not a JSON object")
    schema = m.get("schema")
    if schema not in DATA_SUFFIXES or isinstance(schema, bool):
        raise ManifestError(f"manifest schema {schema!r}; this job reads "
                            f"{', '.join(map(str, DATA_SUFFIXES))}")
    for key, spec in _MANIFEST_FIELDS.items():
        if not _fits(m.get(key), spec):
            raise ManifestError(f"manifest field {key!r} {_wanted(spec)}")
    for key, record in (("anchors", _ANCHOR_FIELDS), ("gaps", _GAP_FIELDS)):
        if not isinstance(m.get(key, []), list):
            raise ManifestError(f"manifest field {key!r} is not a list")
        for i, item in enumerate(m.get(key, [])):
            _check_record(item, record, f"{key}[{i}]")
    if m["first_seq"] > m["last_seq"]:
        raise ManifestError("manifest seq range makes no sense")
    if m.get("holes") is not None:
        _check_holes(m)
    if schema == 2:
        _check_lean(m)
    return m


# Bounds that keep the job's arithmetic inside a long (Spark's ANSI mode fails a whole run on
# one overflow): seqs are WAMP ids (below 2**53); wall clocks within 146 years of 1970 (in
# ns), boottime under 73 years. A line's times past them count as missing (central.spark.verify).
MAX_SEQ = (1 << 53) - 1
MAX_WALL_NS = 1 << 62
MAX_WALL_MS = MAX_WALL_NS // NS_PER_MS
MAX_BOOTTIME_NS = 1 << 61


class _Field(NamedTuple):
    kind: type
    optional: bool = False
    low: int = -(1 << 63)
    high: int = (1 << 63) - 1


_SEQ = _Field(int, False, 0, MAX_SEQ)
_MANIFEST_FIELDS = {
    "gateway_id": _Field(str), "file": _Field(str), "sha256": _Field(str),
    "first_seq": _SEQ, "last_seq": _SEQ, "count": _Field(int, False, 1, MAX_SEQ),
    "bytes": _Field(int, False, 0), "after_seq": _SEQ._replace(optional=True),
}
_ANCHOR_FIELDS = {
    "id": _Field(int, False, -MAX_SEQ, MAX_SEQ), "reason": _Field(str),
    "boot_id": _Field(str), "boottime_ns": _Field(int, False, 0, MAX_BOOTTIME_NS),
    "wall_ns": _Field(int, False, -MAX_WALL_NS, MAX_WALL_NS),
    "offset_before_ns": _Field(int, True, -MAX_WALL_NS, MAX_WALL_NS),
    "clock_synced": _Field(bool), "after_seq": _SEQ,
}
_GAP_FIELDS = {
    "id": _Field(int, False, -MAX_SEQ, MAX_SEQ), "realm": _Field(str, True),
    "rule": _Field(int, True, 0, MAX_SEQ), "first_seq": _SEQ._replace(optional=True),
    "last_seq": _SEQ._replace(optional=True), "count": _SEQ._replace(optional=True),
    "reason": _Field(str, True), "wall_ms": _Field(int, True, -MAX_WALL_MS, MAX_WALL_MS),
}


def _fits(value: Any, spec: _Field) -> bool:
    if value is None:
        return spec.optional
    if spec.kind is bool:  # (0 and 1 too: JSON from other writers)
        return isinstance(value, bool) or (type(value) is int and value in (0, 1))
    if spec.kind is int:
        return type(value) is int and spec.low <= value <= spec.high
    return isinstance(value, spec.kind)


def _wanted(spec: _Field) -> str:
    what = {str: "a string", bool: "a boolean"}.get(spec.kind, f"a whole number from "
                                                            f"{spec.low} to {spec.high}")
    return f"is missing or not {what}" if not spec.optional else f"is not {what}"


def _check_record(item: Any, fields: dict[str, _Field], where: str) -> None:
    """An anchor or gap record: the fields the job reads, of their kind and bounds."""
    if not isinstance(item, dict):
        raise ManifestError(f"manifest {where} is not a JSON object")
    for key, spec in fields.items():
        if not _fits(item.get(key), spec):
            raise ManifestError(f"manifest {where} field {key!r} {_wanted(spec)}")


def _check_holes(m: dict[str, Any]) -> None:
    span = m["last_seq"] - m["first_seq"] + 1
    holes = m["holes"]
    if not (isinstance(holes, list) and len(holes) <= MAX_HOLES and _holes_fit(holes, span)
            and span - sum(n for _, n in holes) == m["count"]):
        raise ManifestError("manifest field 'holes' is not holes of its seq range that leave "
                            "its count")


def _holes_fit(holes: list[Any], span: int) -> bool:
    """Pairs of whole numbers, each hole after the one before with a row between them, and
    inside the range (its first and last seqs are rows)."""
    start = 1  # the lowest offset the next hole may start at
    for pair in holes:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
                and pair[0] >= start and pair[1] >= 1 and pair[0] + pair[1] < span):
            return False
        start = pair[0] + pair[1] + 1
    return True


def _check_lean(m: dict[str, Any]) -> None:
    for key in ("boots", "realms"):
        if not isinstance(m.get(key), list) or not m[key] or \
                not all(isinstance(v, str) for v in m[key]):
            raise ManifestError(f"manifest field {key!r} is not a list of strings")
    key = m.get("publication_key")
    if key is not None and (not isinstance(key, str) or len(key) != 32
                            or not all(c in "0123456789abcdef" for c in key)):
        raise ManifestError("manifest field 'publication_key' is not 16 bytes in hex")
