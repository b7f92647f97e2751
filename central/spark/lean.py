"""Reading schema 2 batches (:mod:`cairn.formats.batch`): the lean lines decoded, in the
JVM, into the lines of schema 1 (:data:`EVENT_SCHEMA <cairn.central.spark.schemas.EVENT_SCHEMA>`),
so every later step of the ingest is the same for both.

The deltas are summed over each file's lines in read order (a window per file: one task
reads a file top to bottom, so ``monotonically_increasing_id`` is that order; bzip2 is
splittable, but only a file over ``spark.sql.files.maxPartitionBytes``, 128 MB, is split,
and ``batch_bytes`` keeps batches far under it). The sums cost a shuffle of the lines that
schema 1 does not need. The manifest's boots, realms and publication key come in by a
broadcast join on the file."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cairn.central.spark.schemas import EVENT_SCHEMA, LEAN_SCHEMA
from cairn.central.spark.session import batch_reader
from cairn.formats.batch import NS_PER_MS
from cairn.formats.publication_ids import BITS, MULTIPLIERS, SHIFT

_MASK = (1 << BITS) - 1
_HALF = 27  # a 53-bit number as 26 high and 27 low bits: their products fit in a long


def _publication_steps(seq: str, k0: str, k1: str) -> list[tuple[str, str]]:
    """(SQL expression, alias) of each step to ``PublicationIds(key).of_seq(seq)``, k0 and k1
    the key's halves as there; the last step's is the id. A column per step, the next one's
    input by its alias (a lateral alias: one nested expression would double in size with
    each step, as each uses its input more than once). Text, so a plan of them costs one
    call into the JVM, not one per operator (~300: half a second of every ingest)."""
    low, middle = (1 << _HALF) - 1, (1 << (BITS - _HALF)) - 1
    steps: list[tuple[str, str]] = []

    def step(expression: str) -> str:
        steps.append((expression, f"_pid{len(steps)}"))
        return f"`{steps[-1][1]}`"

    def mulmod(x: str, c: int) -> str:
        """``x * c mod 2**53`` for ``0 <= x < 2**53`` in longs that cannot overflow (Spark's
        ANSI mode fails on overflow): of the partial products only the low 26 bits of the
        middle ones and the low one reach below 2**53."""
        cl, ch = c & low, c >> _HALF
        xl, xh = step(f"{x} & {low}"), step(f"shiftright({x}, {_HALF})")
        mid = step(f"({xl} * {ch} + {xh} * {cl}) & {middle}")
        return step(f"({xl} * {cl} + shiftleft({mid}, {_HALF})) & {_MASK}")

    def mix(x: str, c: int) -> str:
        y = mulmod(x, c)
        return step(f"{y} ^ shiftright({y}, {SHIFT})")

    c1, c2, c3 = MULTIPLIERS
    x = step(f"(({seq} & {_MASK}) + {k0}) & {_MASK}")
    x = step(f"({mix(x, c1)} + {k1}) & {_MASK}")
    step(f"{mix(mix(x, c2), c3)} + 1")
    return steps


def _items(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"{expression} AS `{alias}`" for expression, alias in pairs]


def with_publication(frame: DataFrame, seq: str, k0: str, k1: str, name: str) -> DataFrame:
    """``frame`` with column ``name``: ``PublicationIds(key).of_seq(seq)``, k0 and k1 the
    key's halves as there."""
    steps = _publication_steps(seq, k0, k1)
    *work, (last, _) = steps
    return frame.selectExpr("*", *_items([*work, (last, name)])).drop(*(a for _, a in work))


def key_halves(key: str | None) -> tuple[int | None, int | None]:
    if key is None:
        return None, None
    raw = bytes.fromhex(key)
    return (int.from_bytes(raw[:8], "big") & _MASK, int.from_bytes(raw[8:], "big") & _MASK)


def _headers(spark: SparkSession, batches: list[Any]) -> DataFrame:
    """(uri, gateway_id, boots, realms, k0, k1) of each batch, from its manifest."""
    return spark.createDataFrame(
        [(c.data_uri, c.manifest["gateway_id"], c.manifest["boots"], c.manifest["realms"],
          *key_halves(c.manifest.get("publication_key"))) for c in batches],
        "uri string, gateway_id string, boots array<string>, realms array<string>,"
        " k0 long, k1 long")


# a line's fields of EVENT_SCHEMA from its lean keys, the running sums (sum_s, sum_w,
# sum_b) and its batch's manifest (gateway_id, boots, realms, the id's last step `pid`)
_EVENT_COLUMNS = {
    "gateway_id": "gateway_id",
    "seq": "sum_s",
    "publication": "coalesce(p, pid)",
    "realm": "try_element_at(realms, CAST(coalesce(r, 0) + 1 AS INT))",
    "topic": "t",
    "wall_ms": "sum_w",
    "boot_id": "try_element_at(boots, CAST(coalesce(o, 0) + 1 AS INT))",
    "boottime_ns": f"try_multiply(try_add(sum_w, sum_b), {NS_PER_MS})",
    "clock_synced": "coalesce(c, true)",
    "authid": "a", "authrole": "ar", "audience": "au", "details": "d", "args": "g",
    "kwargs": "k",
}
# a delta's running sum over its file in read order; null on a line that lacks it (not an
# event), and from a sum past a long on (try_: Spark's ANSI mode fails the run on an
# overflow). The three share one window, so one sort.
_RUNNING = ("CASE WHEN {0} IS NOT NULL THEN try_sum({0}) OVER (PARTITION BY uri ORDER BY line "
            "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) END AS sum_{0}")


def parse_lean(spark: SparkSession, batches: list[Any]) -> DataFrame:
    """The lines of schema 2 ``batches`` as EVENT_SCHEMA columns with their file's ``uri``."""
    summed = (batch_reader(spark).schema(LEAN_SCHEMA).json([c.data_path for c in batches])
              .selectExpr("*", "_metadata.file_path AS uri",
                          "monotonically_increasing_id() AS line")
              .selectExpr("*", *(_RUNNING.format(d) for d in ("s", "w", "b"))))
    *work, (last, _) = _publication_steps("sum_s", "k0", "k1")
    fields = [f"{_EVENT_COLUMNS[f.name]} AS {f.name}" for f in EVENT_SCHEMA.fields]
    return (summed.join(F.broadcast(_headers(spark, batches)), "uri")
            .selectExpr(*_items([*work, (last, "pid")]), *fields, "uri")
            .selectExpr(*(f.name for f in EVENT_SCHEMA.fields), "uri"))
