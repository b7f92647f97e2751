"""The batch format, the one contract between the edge uploader and the central Spark job.

A batch is ``<gateway_id>/<first_seq:012d>-<last_seq:012d>.jsonl.gz``: gzip of JSON Lines,
one history publication per line, in seq order, each line beginning with ``gateway_id``,
``timestamp`` and ``seq`` (readable at a glance), then the fields of :data:`ROW_FIELDS`
(:func:`row_of`), bytes as ``{"$bytes": base64}``; and beside
it a ``.manifest.json`` written last: schema, gateway_id, file, after_seq, first_seq,
last_seq, count, bytes, sha256, created, clock
anchors and gap records. The uploader writes it with :func:`data_name`,
:func:`encode_rows` and :func:`manifest_name`; the job reads it with :func:`parse_manifest`.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import TYPE_CHECKING, Any, NamedTuple

from cairn.gateway.clock import rfc3339

if TYPE_CHECKING:
    from cairn.gateway.publication import StoredPublication

SCHEMA_VERSION = 1  # of the manifest and the rows; a job refuses other versions
DATA_SUFFIX = ".jsonl.gz"
MANIFEST_SUFFIX = ".manifest.json"


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


def row_of(pub: StoredPublication) -> dict[str, Any]:
    """A history publication as a row of a batch (its fields are the publication's)."""
    return {name: getattr(pub, name) for name in _ROW_NAMES}


def data_name(gateway_id: str, first_seq: int, last_seq: int) -> str:
    return f"{gateway_id}/{first_seq:012d}-{last_seq:012d}{DATA_SUFFIX}"


def manifest_name(data: str) -> str:
    """``gw/000000000001-000000000100.jsonl.gz`` -> ``gw/...-000000000100.manifest.json``"""
    return data.removesuffix(DATA_SUFFIX) + MANIFEST_SUFFIX


def data_of(manifest: str) -> str:
    """The data file beside a manifest: the inverse of :func:`manifest_name`."""
    return manifest.removesuffix(MANIFEST_SUFFIX) + DATA_SUFFIX


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
    if schema != SCHEMA_VERSION:
        raise ManifestError(f"manifest schema {schema!r}; this job reads {SCHEMA_VERSION}")
    for key, kind in (("gateway_id", str), ("file", str), ("sha256", str), ("first_seq", int),
                      ("last_seq", int), ("count", int), ("bytes", int)):
        if not isinstance(m.get(key), kind) or isinstance(m.get(key), bool):
            raise ManifestError(f"manifest field {key!r} missing or not a {kind.__name__}")
    if m.get("after_seq") is not None and not isinstance(m["after_seq"], int):
        raise ManifestError("manifest field 'after_seq' is not an integer")
    for key in ("anchors", "gaps"):
        if not isinstance(m.get(key, []), list):
            raise ManifestError(f"manifest field {key!r} is not a list")
    if m["first_seq"] > m["last_seq"] or m["count"] < 1:
        raise ManifestError("manifest seq range or count makes no sense")
    return m
