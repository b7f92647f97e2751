"""The Spark session and what each job needs of it: the settings of
:data:`~cairn.central.spark.schemas.JOB_CONF`, and Cairn's code shipped to the executors as a zip
(workers of a cluster have Python and PySpark, not Cairn)."""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import Column, DataFrameReader, SparkSession
from pyspark.sql import functions as F

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


# Cairn's packages the executors import: central and the two it may import (formats, base;
# tests/test_architecture.py keeps it so), subpackages included. Workers of a cluster need
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


def ship_code(spark: SparkSession) -> None:
    """Make Cairn importable on the executors (once per SparkContext): addPyFile puts the
    zip on every executor's Python path, as ``--py-files`` would."""
    sc = spark.sparkContext
    name = os.path.basename(code_zip())
    if any(os.path.basename(p) == name for p in sc._python_includes):
        return
    sc.addPyFile(code_zip())
