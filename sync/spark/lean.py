"""Reading schema 2 batches (:mod:`cairn.sync.batch_format`): the lean lines decoded, in the
JVM, into the lines of schema 1 (:data:`EVENT_SCHEMA <cairn.sync.spark.schemas.EVENT_SCHEMA>`),
so every later step of the ingest is the same for both.

The deltas are summed over each file's lines in read order (a window per file: one task
reads a file top to bottom, so ``monotonically_increasing_id`` is that order; bzip2 is
splittable, but only a file over ``spark.sql.files.maxPartitionBytes``, 128 MB, is split,
and ``batch_bytes`` keeps batches far under it). The sums cost a shuffle of the lines that
schema 1 does not need. The manifest's boots, realms and publication key come in by a
broadcast join on the file."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from cairn.gateway.publication_ids import BITS, MULTIPLIERS, SHIFT
from cairn.sync.batch_format import NS_PER_MS
from cairn.sync.spark.schemas import EVENT_SCHEMA, LEAN_SCHEMA
from cairn.sync.spark.session import batch_reader

_MASK = (1 << BITS) - 1
_HALF = 27  # a 53-bit number as 26 high and 27 low bits: their products fit in a long


def _mulmod(x: Column, c: int) -> Column:
    """``x * c mod 2**53`` for ``0 <= x < 2**53`` in longs that cannot overflow (Spark's ANSI
    mode fails on overflow): of the product's partial products only the low 26 bits of the
    middle ones and the low one reach below 2**53."""
    lo_mask = (1 << _HALF) - 1
    xl, xh = x.bitwiseAND(lo_mask), F.shiftright(x, _HALF)
    cl, ch = c & lo_mask, c >> _HALF
    middle = (xl * ch + xh * cl).bitwiseAND((1 << (BITS - _HALF)) - 1)
    return (xl * cl + F.shiftleft(middle, _HALF)).bitwiseAND(_MASK)


def with_publication(frame: DataFrame, seq: str, k0: str, k1: str, name: str) -> DataFrame:
    """``frame`` with column ``name``: ``PublicationIds(key).of_seq(seq)``, k0 and k1 the
    key's halves as there. A column per step: each step uses its input more than once, so
    one nested expression would double in size with each."""
    c1, c2, c3 = MULTIPLIERS
    x = F.col("_step")

    def mix(frame: DataFrame, multiplier: int) -> DataFrame:
        frame = frame.withColumn("_step", _mulmod(x, multiplier))
        return frame.withColumn("_step", x.bitwiseXOR(F.shiftright(x, SHIFT)))

    frame = frame.withColumn("_step", (F.col(seq).bitwiseAND(_MASK) + F.col(k0))
                             .bitwiseAND(_MASK))
    frame = mix(frame, c1).withColumn("_step", (x + F.col(k1)).bitwiseAND(_MASK))
    return mix(mix(frame, c2), c3).withColumn(name, x + 1).drop("_step")


def _key_halves(key: str | None) -> tuple[int | None, int | None]:
    if key is None:
        return None, None
    raw = bytes.fromhex(key)
    return (int.from_bytes(raw[:8], "big") & _MASK, int.from_bytes(raw[8:], "big") & _MASK)


def _headers(spark: SparkSession, batches: list[Any]) -> DataFrame:
    """(uri, gateway_id, boots, realms, k0, k1) of each batch, from its manifest."""
    return spark.createDataFrame(
        [(c.data_uri, c.manifest["gateway_id"], c.manifest["boots"], c.manifest["realms"],
          *_key_halves(c.manifest.get("publication_key"))) for c in batches],
        "uri string, gateway_id string, boots array<string>, realms array<string>,"
        " k0 long, k1 long")


def _running(delta: str, order: Any) -> Column:
    """The running sum of a delta column; null on a line that lacks it (not an event)."""
    return F.when(F.col(delta).isNotNull(), F.sum(delta).over(order)).alias(f"sum_{delta}")


def parse_lean(spark: SparkSession, batches: list[Any]) -> DataFrame:
    """The lines of schema 2 ``batches`` as EVENT_SCHEMA columns with their file's ``uri``."""
    lines = (batch_reader(spark).schema(LEAN_SCHEMA).json([c.data_path for c in batches])
             .withColumn("uri", F.col("_metadata.file_path"))
             .withColumn("line", F.monotonically_increasing_id()))
    order = (Window.partitionBy("uri").orderBy("line")
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    summed = lines.select("*", *(_running(d, order) for d in ("s", "w", "b")))  # one sort
    decoded = with_publication(summed.join(F.broadcast(_headers(spark, batches)), "uri"),
                               "sum_s", "k0", "k1", "keyed")
    columns = {
        "gateway_id": F.col("gateway_id"),
        "seq": F.col("sum_s"),
        "publication": F.coalesce("p", "keyed"),
        "realm": F.try_element_at("realms", (F.coalesce("r", F.lit(0)) + 1).cast("int")),
        "topic": F.col("t"),
        "wall_ms": F.col("sum_w"),
        "boot_id": F.try_element_at("boots", (F.coalesce("o", F.lit(0)) + 1).cast("int")),
        "boottime_ns": (F.col("sum_w") + F.col("sum_b")) * NS_PER_MS,
        "clock_synced": F.coalesce("c", F.lit(True)),
        "authid": F.col("a"), "authrole": F.col("ar"), "audience": F.col("au"),
        "details": F.col("d"), "args": F.col("g"), "kwargs": F.col("k"),
    }
    return decoded.select(*[columns[f.name].alias(f.name) for f in EVENT_SCHEMA.fields], "uri")
