"""The central jobs' decisions in plain Python over plain values, no Spark: which batches a run
can check while it writes them and which overlap, what is wrong with a batch given its totals,
which anchor re-bases a boot, what data was lost, how many files a write makes, and which of
Cairn's code the executors are shipped. The jobs (central.spark) bring the totals from Spark
and carry the decisions out; this module imports no PySpark, so its tests run without it."""

from __future__ import annotations

import bz2
import math
import os
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cairn.formats.batch import ROW_FIELDS, event_ranges

if TYPE_CHECKING:  # formats.batch_signature needs cryptography, which executors need not have
    from cairn.formats.batch_signature import GatewayKeys

# -- files -----------------------------------------------------------------------------------

def name_of(path: str) -> str:
    """The last two parts of a path: ``gateway/file``, how batches are named in reports."""
    return "/".join(path.rstrip("/").split("/")[-2:])


# -- verify ----------------------------------------------------------------------------------

@dataclass
class Candidate:
    """A batch whose manifest parsed: its paths and what the manifest says."""
    manifest_path: str
    data_path: str
    manifest: dict[str, Any]
    data_uri: str = ""  # data_path as Spark's _metadata.file_path gives it (URL-encoded)

    @property
    def name(self) -> str:
        return name_of(self.data_path)


def bytes_problem(manifest: dict[str, Any], length: int | None,
                   sha256: str | None) -> str | None:
    if length is None or sha256 is None:
        return "Spark could not read the data file"
    if length != manifest["bytes"]:
        return f"{length} bytes, the manifest says {manifest['bytes']} (truncated?)"
    if sha256 != manifest["sha256"]:
        return (f"sha256 {sha256[:16]}... differs from the manifest's "
                f"{manifest['sha256'][:16]}...")
    return None


CHECKED_BYTES = 64 * 1024  # batches larger than this are counted before Spark parses them


STEP = 1 << 20  # bytes decompressed at a time while counting


def lines_past(data: bytes, name: str, count: int) -> bool:
    """Does the data file ``name`` (its compressed ``data``) hold more than ``count`` lines?
    Decompressed as a stream, and no further than the line past ``count``."""
    newlines, last = 0, b"\n"
    for chunk in decompressed(data, name):
        newlines += chunk.count(b"\n")
        if newlines > count:
            return True
        last = chunk[-1:] or last
    return newlines == count and last != b"\n"  # a last line without its newline


def decompressed(data: bytes, name: str) -> Iterator[bytes]:
    """The decompressed bytes of a data file (by its suffix), STEP at most at a time, every
    member of a multi-member file as Hadoop reads them; a damaged stream ends it."""
    if not name.endswith((".gz", ".bz2")):
        yield data
        return
    rest = data
    try:
        while rest:
            if name.endswith(".gz"):
                member = zlib.decompressobj(31)
                out = member.decompress(rest, STEP)
                while out:
                    yield out
                    out = member.decompress(member.unconsumed_tail, STEP)
            else:
                member = bz2.BZ2Decompressor()
                out = member.decompress(rest, STEP)
                while out:
                    yield out
                    out = b"" if member.eof or member.needs_input else \
                        member.decompress(b"", STEP)
            rest = member.unused_data if member.eof else b""
    except (OSError, EOFError, zlib.error):
        return


def lines_problem(manifest: dict[str, Any], batch: Any) -> str | None:
    """What is wrong with one batch's lines (``batch``: its row of the per-file checks)."""
    count, gateway_id = manifest["count"], manifest["gateway_id"]
    if batch is None or batch.lines != count:
        return f"{0 if batch is None else batch.lines} lines, the manifest says {count}"
    if batch.incomplete:
        bad = batch.first_bad
        what = ("is not JSON" if len(bad.missing) == len(REQUIRED)
                else f"has no {', '.join(bad.missing)}")
        return (f"{batch.incomplete} lines are not events of the batch format: "
                f"line {bad.pos - batch.top + 1} {what}")
    others = sorted(g for g in batch.gateways if g != gateway_id)
    if others:
        return f"rows of gateway {', '.join(others[:3])} in a batch of {gateway_id!r}"
    if batch.first != manifest["first_seq"] or batch.last != manifest["last_seq"]:
        return (f"seqs {batch.first}..{batch.last}, the manifest says "
                f"{manifest['first_seq']}..{manifest['last_seq']}")
    if batch.seqs != count:
        return f"{count - batch.seqs} lines repeat a seq of the batch"
    return None


def triage(parsed: list[Candidate], done: set[tuple[str, str]],
            landed: Callable[[Candidate], bool], keys: GatewayKeys | None = None,
            ) -> tuple[list[Candidate], list[Candidate], list[tuple[Candidate, str]]]:
    """(candidates, already, rejected with their reason) of the batches whose manifest
    parsed: ``done`` holds the (file, sha256) the table has; ``landed`` tells whether a batch's
    data file is there; ``keys``, when given, which keys may sign each gateway's batches."""
    candidates: list[Candidate] = []
    already: list[Candidate] = []
    rejected: list[tuple[Candidate, str]] = []
    for c in parsed:
        m = c.manifest
        if keys is not None and (not_vouched := keys.problem(m)):
            rejected.append((c, not_vouched))
        elif (m["file"], m["sha256"]) in done:
            already.append(c)
        elif m["file"] != c.name or not m["file"].startswith(m["gateway_id"] + "/"):
            # a manifest vouches only for the file beside it, in its own gateway's directory
            rejected.append((c, f"manifest of gateway {m['gateway_id']!r} names {m['file']}"))
        elif not landed(c):
            rejected.append((c, "the data file is missing"))
        else:
            candidates.append(c)
    return candidates, already, rejected


# -- dedupe ----------------------------------------------------------------------------------

def one_pass_batches(sound: list[Candidate], touching: set[str]) -> list[Candidate]:
    """The batches that can be checked while they are written (:func:`_write_one_pass`):
    which seqs each holds is known (no hole, or the holes its manifest lists), no other
    batch of this run overlapping, no row of the table in their range (nothing to dedupe or
    compare). The others are read and checked one by one first (:func:`check_lines`)."""
    shared = overlapping_batches(sound)
    return [c for c in sound if c.data_path not in shared and c.data_uri not in touching
            and event_ranges(c.manifest) is not None]


def touched_ranges(good: list[Candidate], touching: set[str]) -> dict[str, tuple[int, int]]:
    """{gateway: (lowest, highest seq)} over the ``good`` batches in ``touching``: where the
    table is read for the keys it holds (one span per gateway keeps the filter coarse)."""
    ranges: dict[str, tuple[int, int]] = {}
    for c in good:
        if c.data_uri not in touching:
            continue
        gw, m = c.manifest["gateway_id"], c.manifest
        lo, hi = ranges.get(gw, (m["first_seq"], m["last_seq"]))
        ranges[gw] = (min(lo, m["first_seq"]), max(hi, m["last_seq"]))
    return ranges


def overlapping_batches(good: list[Candidate]) -> set[str]:
    """The data paths of batches whose seq range overlaps another batch's of the same
    gateway in this run (they may hold the same (gateway_id, seq))."""
    by_gateway: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for c in good:
        by_gateway[c.manifest["gateway_id"]].append(
            (c.manifest["first_seq"], c.manifest["last_seq"], c.data_path))
    found: set[str] = set()
    for ranges in by_gateway.values():
        ranges.sort()
        reach, holder = None, None  # the furthest last_seq so far, and its batch
        for first, last, path in ranges:
            if reach is not None and first <= reach:
                found.update((path, holder))
            if reach is None or last > reach:
                reach, holder = last, path
    return found


# -- rebase ----------------------------------------------------------------------------------

def reference_anchors(anchors: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The anchor each boot's unsynchronized timestamps are re-based on: the boot's first
    anchor taken with a synchronized clock, or failing that the anchor of its last step
    (the wall clock someone set). Keyed by (gateway_id, boot_id); boots without either are
    absent, and their rows keep their raw time.

    A row with boottime ``b`` then gets ``corrected = anchor.wall_ns - (anchor.boottime_ns
    - b)``: CLOCK_BOOTTIME runs steadily through the whole boot, the wall clock does not."""
    boots: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for anchor in anchors:
        boots[anchor["gateway_id"], anchor["boot_id"]].append(anchor)
    refs = {}
    for key, items in boots.items():
        items.sort(key=lambda a: a["id"])
        synced = [a for a in items if a["clock_synced"]]
        steps = [a for a in items if a["reason"] == "step"]
        if synced:
            refs[key] = synced[0]
        elif steps:
            refs[key] = steps[-1]
    return refs


@dataclass
class Anchors:
    """What the good batches of a run bring besides rows."""
    new: dict[tuple[str, int], dict[str, Any]]  # clock anchors the table does not have yet
    refs: dict[tuple[str, str], dict[str, Any]]  # the reference anchor of each boot
    gaps: dict[tuple[str, int], tuple]           # loss records
    moved: set[tuple[str, str]]  # boots with rows in the table whose reference this run moved
    frame: Any = None  # refs as a Spark DataFrame, to join rows with (set by anchors_of)


def anchor_changes(known: list[dict[str, Any]],
                    manifests: list[dict[str, Any]]) -> Anchors:
    """The anchors and loss records of ``manifests`` the table does not have (``known``: the
    anchors it has, as rows of ANCHOR_SCHEMA), each boot's reference anchor with them, and
    the boots with rows in the table whose reference they move."""
    known_keys = {(a["gateway_id"], a["id"]) for a in known}
    new: dict[tuple[str, int], dict[str, Any]] = {}
    gaps: dict[tuple[str, int], tuple] = {}
    for m in manifests:
        gw = m["gateway_id"]
        for a in m.get("anchors", []):
            key = (gw, int(a["id"]))
            if key not in known_keys:
                new[key] = anchor_row(gw, a)
        for g in m.get("gaps", []):
            gaps[gw, int(g["id"])] = (gw, int(g["id"]), g.get("realm"), g.get("rule"),
                                      g.get("first_seq"), g.get("last_seq"), g.get("count"),
                                      g.get("reason"), g.get("wall_ms"))
    refs = reference_anchors(known + list(new.values()))
    before = reference_anchors(known)
    # only a boot the table has anchors of can have rows there: a batch carries every anchor
    # of its boots (the first, "start", taken before the boot's first row), and they are
    # committed with its rows
    known_boots = {(a["gateway_id"], a["boot_id"]) for a in known}
    moved = {boot for boot in {(a["gateway_id"], a["boot_id"]) for a in new.values()}
             if boot in known_boots and refs.get(boot) != before.get(boot)}
    return Anchors(new, refs, gaps, moved)


def anchor_row(gateway_id: str, a: dict[str, Any]) -> dict[str, Any]:
    """A manifest's anchor as a row of ANCHOR_SCHEMA."""
    return {"gateway_id": gateway_id, "id": int(a["id"]), "reason": str(a["reason"]),
            "boot_id": str(a["boot_id"]), "boottime_ns": int(a["boottime_ns"]),
            "wall_ns": int(a["wall_ns"]),
            "offset_before_ns": None if a.get("offset_before_ns") is None
            else int(a["offset_before_ns"]),
            "clock_synced": bool(a["clock_synced"]), "after_seq": int(a["after_seq"])}


# -- reports ---------------------------------------------------------------------------------

NOT_LANDED = "not landed"


def loss_intervals(batches: list[tuple[str, int | None, int, int]],
                   gaps: list[tuple[str, int | None, int | None, str | None]],
                   ) -> list[tuple[str, int, int, str]]:
    """Seq ranges lost per gateway: ranges no ingested batch covers (``batches``: (gateway_id,
    after_seq, first_seq, last_seq); a batch covers ``after_seq+1 .. last_seq``), and the
    gateways' own loss records (``gaps``: (gateway_id, first_seq, last_seq, reason)).
    Non-overlapping."""
    covered: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for gateway_id, after_seq, first_seq, last_seq in batches:
        start = first_seq if after_seq is None else after_seq + 1
        covered[gateway_id].append((start, last_seq))
    dropped: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for gateway_id, first_seq, last_seq, reason in gaps:
        if first_seq is not None and last_seq is not None:
            dropped[gateway_id].append((first_seq, last_seq,
                                        f"dropped on the gateway: {reason}"))
    result = []
    for gw in sorted(set(covered) | set(dropped)):
        holes = []
        spans = sorted(covered.get(gw, []))
        reach = None
        for start, end in spans:
            if reach is not None and start > reach + 1:
                holes.append((reach + 1, start - 1))
            reach = end if reach is None else max(reach, end)
        for lo, hi, reason in sorted(dropped.get(gw, [])):
            result.append((gw, lo, hi, reason))
            holes = [piece for a, b in holes for piece in minus((a, b), (lo, hi))]
        result += [(gw, a, b, NOT_LANDED) for a, b in holes]
    return sorted(result)


def minus(span: tuple[int, int], cut: tuple[int, int]) -> list[tuple[int, int]]:
    (a, b), (c, d) = span, cut
    if d < a or c > b:
        return [span]
    return [p for p in ((a, c - 1), (d + 1, b)) if p[0] <= p[1]]


# -- write -----------------------------------------------------------------------------------

ROWS_PER_FILE = 2_000_000     # aim for Parquet files of about this many rows


def output_parts(batches: int, lines: int, parallelism: int) -> int:
    """How many tasks write ``lines`` lines of ``batches`` batches: files of about
    :data:`ROWS_PER_FILE` rows, in whole waves of tasks, no more tasks than batches (gzip
    is not splittable: a batch is read by one task)."""
    waves = math.ceil(lines / ROWS_PER_FILE / parallelism)
    return max(1, min(batches, waves * parallelism))


# -- cli -------------------------------------------------------------------------------------

def conf_pairs(pairs: list[str] | None) -> dict[str, str]:
    conf = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf wants KEY=VALUE, not {pair!r}")
        conf[key.strip()] = value
    return conf


# -- session ---------------------------------------------------------------------------------

# Cairn's packages the executors import: central and the two it may import (formats, base;
# tests/pure/test_architecture.py keeps it so), subpackages included. Workers of a cluster need
# Python and PySpark, not Cairn: the job ships these itself.
SHIPPED_PACKAGES = ("central", "formats", "base")


def code_zip(directory: str | None = None) -> str:
    """A zip of :data:`SHIPPED_PACKAGES` (their ``.py`` files, under ``cairn/`` as installed),
    named by its content's hash so that a changed Cairn gets a new name (Spark refuses a
    second file of the same name)."""
    import hashlib
    import importlib.util
    import tempfile
    import zipfile

    # (path on disk, name in the zip): each package where it is installed (site-packages/cairn,
    # or the repository's folders in an editable install)
    sources = []
    for package in SHIPPED_PACKAGES:
        spec = importlib.util.find_spec(f"cairn.{package}")
        assert spec is not None and spec.submodule_search_locations, package
        top = list(spec.submodule_search_locations)[0]
        sources += [(os.path.join(folder, name),
                     f"cairn/{package}/{os.path.relpath(os.path.join(folder, name), top)}")
                    for folder, _, names in os.walk(top) for name in names
                    if name.endswith(".py")]
    sources.sort(key=lambda source: source[1])
    digest = hashlib.sha256()
    for path, name in sources:
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    target = os.path.join(directory or tempfile.gettempdir(),
                          f"cairn-{digest.hexdigest()[:16]}.zip")
    if not os.path.exists(target):  # write aside and rename: concurrent jobs share the name
        temp = f"{target}.{os.getpid()}.tmp"
        with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("cairn/__init__.py", "")  # zipimport finds regular packages only
            for path, name in sources:
                z.write(path, name)
        os.replace(temp, target)
    return target


# -- schemas ---------------------------------------------------------------------------------

# the fields every event has (NOT NULL in the gateway's store)
REQUIRED = ("gateway_id", *(f.name for f in ROW_FIELDS if f.required))
