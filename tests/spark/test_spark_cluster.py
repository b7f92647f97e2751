"""The central jobs on a real Spark standalone cluster: a master and a worker, each its own
JVM (``harness/spark_cluster.py``), bound to 127.0.0.1, torn down after the session.

``cairn spark ingest|report --master spark://...`` must give exactly what ``local[2]`` gives
from the same landing data. Both ingests and the report run through the command line's
``main()`` in a driver process of its own, which also asks the executors where they import
Cairn from, before and after the jobs: a Python without site-packages, so only the zip the
job ships. One application (a driver JVM and an executor JVM, the most expensive thing here)
serves all three commands; ``cairn spark`` making its own session from ``--master`` is
tests/spark/test_spark_concurrency.py's. Slow: ``pytest -m spark``.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from harness import spark_cluster  # noqa: E402
from harness.spark_cluster import QUICK_JVM  # noqa: E402
from tests.spark.test_spark import T0_MS, clock_boots, events, land  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPORTS = ("gaps", "gateways", "daily", "hourly", "clock_steps", "unsynced")
RUN_TIME = {"last_batch_ingested"}  # the time of the run, not of the data


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Launched, not waited for: its JVMs boot while the local reference runs (``both``
    asks for it first); one worker with one core is a whole cluster to ship code to. Its
    drivers take the local session's two shuffle partitions (200, the default, are tasks
    for the cores of a real cluster) and JVM options for short jobs."""
    quick = {"spark.sql.shuffle.partitions": "2", "spark.driver.extraJavaOptions": QUICK_JVM,
             "spark.executor.extraJavaOptions": QUICK_JVM}
    with spark_cluster.running(tmp_path_factory.mktemp("spark-cluster"), ready=False,
                               workers=1, memory="512m", settings=quick) as c:
        yield c


def land_waves(root: Path) -> tuple[Path, Path]:
    """Two waves of landed batches: the first with clocks not yet set; the second with the
    anchors that re-base rows of the first (a partition rewrite), an overlapping re-send,
    a gap, a gateway's own loss record and a truncated batch (quarantined)."""
    first, second = root / "wave1", root / "wave2"
    rows1, rows2, anchors, _ = clock_boots("c")
    land(first, "c", rows1[:10], 0, anchors[:1])
    land(first, "a", events(range(1, 201)), 0)
    land(first, "b", events(range(1, 101)), 0)
    land(second, "c", rows1[10:] + rows2, 10, anchors)
    land(second, "a", events(range(101, 301)), 100)  # overlaps the first wave's a batch
    land(second, "b", events(range(151, 201)), 150, gaps=[
        {"id": 1, "realm": "realm1", "rule": 0, "first_seq": 121, "last_seq": 130,
         "count": 10, "reason": "max_events", "wall_ms": T0_MS}])
    bad = land(second, "b", events(range(201, 251)), 200)
    (second / bad.name).write_bytes(bad.data[:-7])
    return first, second


def run_local(spark, landing: Path, waves: tuple[Path, Path], out: Path) -> None:
    """The reference: the same jobs on the tests' local[2] session."""
    for wave in waves:
        shutil.copytree(wave, landing, dirs_exist_ok=True)
        jobs.ingest(spark, str(landing), str(out / "table"), str(out / "quarantine"))
    jobs.report(spark, str(out / "table"), str(out / "reports"))


# The driver: where executors import Cairn from before and after the jobs ship it, around
# ``cairn spark ...`` commands run through the command line's main() in this process (they
# use the session made here: one application for all of them). Arguments: the master, its
# conf, the landing and the steps, each (a wave of landed batches to copy into the landing
# first, or null; a command).
DRIVER = textwrap.dedent("""
    import json, shutil, sys
    from cairn.app.cli import main
    from cairn.central import spark as jobs

    def where(_):
        import importlib.util, os
        spec = importlib.util.find_spec("cairn") and importlib.util.find_spec("cairn.central")
        return (os.environ.get("CAIRN_WORKER_PYTHON"), spec and spec.origin)

    spark = jobs.session(sys.argv[1], json.loads(sys.argv[2]), app="cairn-tests-driver")
    sc = spark.sparkContext
    before = sc.parallelize(range(4), 4).map(where).collect()
    for wave, command in json.loads(sys.argv[4]):
        if wave:
            shutil.copytree(wave, sys.argv[3], dirs_exist_ok=True)
        assert main(command) == 0, command
    after = sc.parallelize(range(4), 4).map(where).collect()
    print(json.dumps({"before": before, "after": after}))
    spark.stop()
""")


def run_cluster(cluster, landing: Path, waves: tuple[Path, Path],
                out: Path) -> tuple[str, dict]:
    """Both waves ingested and the report written on the cluster. Returns what the
    commands printed and where the executors imported Cairn from (``DRIVER``)."""
    table = ["--table", str(out / "table"), "--master", cluster.master, *cluster.conf_args()]
    ingest = ["spark", "ingest", "--landing", str(landing), "--quarantine",
              str(out / "quarantine"), *table]
    report = ["spark", "report", "--out", str(out / "reports"), *table]
    steps = [(str(waves[0]), ingest), (str(waves[1]), ingest), (None, report)]
    cluster.wait_ready()
    driven = subprocess.run([sys.executable, "-c", DRIVER, cluster.master,
                             json.dumps(cluster.conf()), str(landing), json.dumps(steps)],
                            capture_output=True, text=True, timeout=600)
    assert driven.returncode == 0, driven.stderr[-3000:]
    *printed, seen = driven.stdout.strip().splitlines()
    return "\n".join(printed), json.loads(seen)


@pytest.fixture(scope="module")
def both(cluster, spark, tmp_path_factory):
    """(local output, cluster output, what the cluster's commands printed, where the
    executors imported Cairn from)."""
    root = tmp_path_factory.mktemp("cluster-vs-local")
    waves = land_waves(root)
    run_local(spark, root / "landing-local", waves, root / "local")
    printed, seen = run_cluster(cluster, root / "landing-cluster", waves, root / "cluster")
    return root / "local", root / "cluster", printed, seen


def table_rows(spark, table: Path) -> list[tuple]:
    """Every column but ingested_at (the time of the run), sorted."""
    frame = spark.read.parquet(str(table)).drop("ingested_at")
    return sorted(tuple(r) for r in frame.collect())


def test_ingest_on_the_cluster_writes_the_same_rows_as_local(spark, both):
    local, on_cluster, printed, _ = both
    expected = table_rows(spark, local / "table")
    assert len(expected) == 33 + 300 + 150  # c: 33, a: 1..300, b: 1..100 and 151..200
    assert table_rows(spark, on_cluster / "table") == expected
    assert "earlier rows re-based" in printed  # the partition rewrite ran there too


def test_ingest_on_the_cluster_quarantines_what_local_quarantines(both):
    local, on_cluster, *_ = both

    def reasons(root: Path) -> dict[str, str]:
        return {p.name: json.loads(p.read_text())["reason"]
                for p in (root / "quarantine").rglob("*.reason.json")}

    assert reasons(on_cluster) == reasons(local) != {}


@pytest.mark.parametrize("name", REPORTS)
def test_report_on_the_cluster_is_the_same_as_local(both, name):
    local, on_cluster, *_ = both
    expected = csv_rows(local / "reports" / f"{name}.csv")
    assert len(expected) > 1  # a header and rows
    assert csv_rows(on_cluster / "reports" / f"{name}.csv") == expected


def csv_rows(path: Path) -> list[list[str]]:
    """The CSV's rows as text, without the columns that hold the time of the run."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    keep = [i for i, name in enumerate(rows[0]) if name not in RUN_TIME]
    return [[row[i] for i in keep] for row in rows]


def test_executors_import_cairn_only_from_the_zip_the_job_ships(both):
    seen = both[3]
    assert seen["before"] == [["without-cairn", None]] * 4
    zipped = Path(jobs.code_zip()).name
    assert all(python == "without-cairn" and f"{zipped}/cairn/central/__init__.py" in origin
               for python, origin in seen["after"])
