"""The Spark session and what each job needs of it: the settings of
:data:`~cairn.central.spark.schemas.JOB_CONF`, and Cairn's code shipped to the executors as a zip
(workers of a cluster have Python and PySpark, not Cairn)."""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import Column, DataFrameReader, SparkSession
from pyspark.sql import functions as F

from cairn.central.plan import code_zip
from cairn.central.spark.schemas import JOB_CONF
from cairn.formats.batch import MAX_LINE_BYTES


def session(master: str = "local[*]", conf: dict[str, str] | None = None,
            app: str = "cairn") -> SparkSession:
    """A SparkSession on ``master`` (``local[*]``, ``spark://...``, ``yarn``, ``k8s://...``).
    Executors run ``spark.pyspark.python`` when given; local masters default to this
    interpreter, others to ``python3`` on the workers (which need no Cairn: it is shipped)."""
    settings = {**JOB_CONF, "spark.ui.showConsoleProgress": "false"}
    python = (conf or {}).get("spark.pyspark.python")
    if python:  # PySpark takes the executors' Python from the environment, not the conf
        os.environ["PYSPARK_PYTHON"] = python
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # 200 shuffle partitions are for clusters; on one machine a few per core do better
        cores = master.removeprefix("local").strip("[]").split(",")[0]
        cores = int(cores) if cores.isdigit() else os.cpu_count() or 1
        settings["spark.sql.shuffle.partitions"] = str(max(2, 2 * cores))
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def batch_reader(spark: SparkSession) -> DataFrameReader:
    """A reader of batches' lines: a short gzip is read as far as it goes, and a line
    longer than :data:`MAX_LINE_BYTES` is skipped by Hadoop's line reader as it decompresses
    (never held whole: the batch then has fewer lines than its manifest counts)."""
    return (spark.read.option("ignoreCorruptFiles", True)
            .option("mapreduce.input.linerecordreader.line.maxlength", MAX_LINE_BYTES))


def one_of(column: str, values: list[str]) -> Column:
    """``column IN (values)``, strings, as one SQL expression: ``Column.isin`` makes a JVM
    call per value (0.25 s for a thousand, several times in a run of a thousand batches).
    The values go in as hex, so no text of theirs is ever read as SQL."""
    if not values:
        return F.lit(False)
    listed = ", ".join(f"CAST(X'{v.encode().hex()}' AS STRING)" for v in values)
    return F.expr(f"`{column}` IN ({listed})")


def prepare(spark: SparkSession) -> None:
    for key, value in JOB_CONF.items():
        spark.conf.set(key, value)
    ship_code(spark)


def ship_code(spark: SparkSession) -> None:
    """Make Cairn importable on the executors (once per SparkContext): addPyFile puts the
    zip on every executor's Python path, as ``--py-files`` would."""
    sc = spark.sparkContext
    name = os.path.basename(code_zip())
    if any(os.path.basename(p) == name for p in sc._python_includes):
        return
    sc.addPyFile(code_zip())
