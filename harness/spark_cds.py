"""A class-data-sharing archive of a Spark JVM's classes, for the tests' short-lived JVMs.

A Spark JVM loads and verifies some 23,000 classes by the end of its first ingest; the tests
start a dozen such JVMs (a local session per worker; a cluster's master, worker, driver and
executor; ``cairn spark`` processes). The JDK can map the classes one run loaded from an
archive instead (AppCDS: ``-XX:ArchiveClassesAtExit`` writes it, ``-XX:SharedArchiveFile``
uses it; 16,000 of those classes came from it, the rest are generated at run time).
Measured on two cores: a session's start and its first ingest took 16.4 CPU-s without the
archive and 11.4 with it.

The archive is only good for the JDK and the class path that wrote it (the JVM checks both
and, on a mismatch, runs without it), so its name carries this ``pyspark``'s place and
version and the ``java`` binary's. :func:`build` writes it once into
``~/.cache/cairn/spark-cds/`` (``make test`` asks for it; a new clone's virtualenv is a new
class path, so a new archive: ~40 s, and archives unused for two weeks are deleted);
:func:`jvm_options` names it when it is there.

    .venv/bin/python -m harness.spark_cds    # build it unless it is there
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cairn" / "spark-cds"


# For the JVMs of the tests' small jobs (the tests' session, their drivers and executors):
# the client compiler only (no C2 compiler threads taking the cores from the job) and the
# serial collector. On two busy cores a cluster driver's session and a short job took a
# third less CPU and wall time (tests/conftest.py's ``spark`` has the figures of its own).
# The archive is made with these options, and used with them (harness.spark_cluster).
BASE_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def archive_path() -> Path | None:
    """Where the archive of this pyspark and this JDK is (or goes); None without a JDK."""
    import pyspark

    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")
                        if os.environ.get("JAVA_HOME") else None)
    if java is None:
        return None
    java = os.path.realpath(java)
    stat = os.stat(java)
    key = "\0".join((os.path.dirname(os.path.realpath(pyspark.__file__)), pyspark.__version__,
                     java, str(stat.st_size), str(stat.st_mtime_ns)))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return CACHE / f"spark-{pyspark.__version__}-{digest}.jsa"


def jvm_options() -> str:
    """``-XX:SharedArchiveFile=...`` when the archive is built, else nothing."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.exists() else ""


# What the archive's run loads: a session, and an ingest and a report of batches of both
# schemas (with an overlapping re-send and a loss record), as the tests do.
WORKLOAD = """
import json, sys
from pathlib import Path
from pyspark import SparkContext
from cairn.central import spark as jobs
from cairn.formats.batch import manifest_name
from cairn.sync.uploader import build_batch
from harness.readings import KEY, readings

root = Path(sys.argv[2])
rows = readings(4, 200)
gap = {"id": 1, "realm": "realm1", "rule": 0, "first_seq": rows[150]["seq"],
       "last_seq": rows[150]["seq"], "count": 1, "reason": "max_events",
       "wall_ms": rows[150]["wall_ms"]}
for gateway, schema in (("one", 1), ("two", 2)):
    for part, after in ((rows[:120], 0), (rows[100:], rows[99]["seq"])):
        batch = build_batch(gateway, part, after, [], [gap], key=KEY, schema=schema)
        path = root / "landing" / batch.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(batch.data)
        (root / "landing" / manifest_name(batch.name)).write_text(json.dumps(batch.manifest))
spark = jobs.session("local[2]", {"spark.ui.enabled": "false",
                                  "spark.driver.extraJavaOptions": sys.argv[1]}, app="cds")
jobs.ingest(spark, str(root / "landing"), str(root / "table"), str(root / "q"))
jobs.report(spark, str(root / "table"), str(root / "reports"))
gateway = SparkContext._gateway
spark.stop()
gateway.proc.stdin.close()  # the JVM exits when its stdin closes, writing the archive
gateway.proc.wait(timeout=300)
"""


def build() -> Path | None:
    """Write the archive unless it is there (a run of :data:`WORKLOAD` in a JVM of its own,
    ~40 s); returns its path, or None without a JDK or when the JVM wrote none."""
    path = archive_path()
    if path is None or path.exists():
        return path
    _forget_old(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [sys.executable, "-c", WORKLOAD, f"{BASE_JVM} -XX:ArchiveClassesAtExit={temp}",
             work], capture_output=True, text=True, timeout=900,
            cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0 or not temp.exists():
        temp.unlink(missing_ok=True)
        print(f"harness.spark_cds: no archive written (exit {done.returncode}); the Spark "
              f"tests run without it:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    os.replace(temp, path)  # whole or not at all: other JVMs may be starting
    print(f"harness.spark_cds: {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return path


def _forget_old(folder: Path, days: float = 14) -> None:
    """Delete archives not used for ``days`` (a JVM that maps one reads it: its atime, or
    its mtime where atimes are not kept)."""
    import time

    for old in folder.glob("*.jsa"):
        seen = max(old.stat().st_atime, old.stat().st_mtime)
        if time.time() - seen > days * 86400:
            old.unlink(missing_ok=True)


if __name__ == "__main__":
    build()
