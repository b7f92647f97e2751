"""Runs that share a table: ingests take turns on its lock, reports read between them.

Races here are real: other processes (``cairn spark ingest`` with a Spark driver of its
own, a plain lock holder) against this one, the same table directory. This process's
side runs in a thread on the tests' session, and each step waits for what the other
side did (holds the lock, waits for it), not for a guessed time. Slow (each ``cairn``
process starts a JVM): ``pytest -m spark``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.central.table_lock import TableBusy, locked  # noqa: E402
from harness.spark_cluster import QUICK_JVM  # noqa: E402
from harness.waiting import blocking_until  # noqa: E402
from tests.spark.test_spark import clock_boots, events, keys, land  # noqa: E402

# ``cairn`` in a process of its own (its own Spark driver), as a user runs it
CAIRN = [sys.executable, "-c", "import sys; from cairn.app.cli import main; "
         "sys.exit(main(sys.argv[1:]))"]


def cairn(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CAIRN, *args], capture_output=True, text=True, timeout=timeout)


WAITING = "waiting for the lock"  # what a run logs when it finds the lock taken
# a ``cairn`` process's own Spark: one core, no UI, the JVM options of a short job
OWN_SPARK = ["--master", "local[1]", "--conf", "spark.ui.enabled=false",
             "--conf", f"spark.driver.extraJavaOptions={QUICK_JVM}"]

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HOLDER = textwrap.dedent("""
    import sys, time
    from cairn.central.table_lock import locked
    with locked(sys.argv[1], None, exclusive=True, wait=0, what="a test holder"):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes it
        open(sys.argv[2], "w").write(repr(time.time()))  # released right after this
""")


def hold_lock(table: Path, released: Path) -> subprocess.Popen:
    """Another process holding the table's exclusive lock until its stdin is closed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(table), str(released)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def in_thread(work: Callable[[], object]) -> Future:
    """``work`` started on a thread of its own (Spark calls from threads are fine)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(work)
    pool.shutdown(wait=False)
    return future


def logged(caplog: pytest.LogCaptureFixture, text: str) -> Callable[[], bool]:
    return lambda: any(text in record.getMessage() for record in caplog.records)


def test_an_ingest_gives_up_on_a_locked_table_naming_the_holder(spark, tmp_path):
    landing, table = tmp_path / "landing", tmp_path / "table"
    land(landing, "gw", events(range(1, 11)), 0)
    holder = hold_lock(table, tmp_path / "released")
    try:
        with pytest.raises(TableBusy, match=rf"a test holder \(pid {holder.pid} "):
            jobs.ingest(spark, str(landing), str(table), wait=0.5)
        assert not list(table.glob("date=*")) and not (table / "_batches").exists()
    finally:
        holder.kill()
        holder.wait()


def test_an_ingest_waits_for_the_lock_before_writing(spark, tmp_path, caplog):
    """The holder lets go only once the ingest said it waits."""
    landing, table, released = tmp_path / "landing", tmp_path / "table", tmp_path / "released"
    land(landing, "gw", events(range(1, 11)), 0)
    holder = hold_lock(table, released)
    ingest = in_thread(lambda: jobs.ingest(spark, str(landing), str(table), wait=120))
    blocking_until(lambda: ingest.done() or logged(caplog, WAITING)(), 300,
                   "the ingest to wait for the lock")
    holder.stdin.close()
    stats = ingest.result(timeout=300)
    holder.wait()
    assert stats.rows_added == 10
    written = [p.stat().st_mtime for p in table.rglob("*.parquet")]
    assert written and min(written) >= float(released.read_text())


def test_two_ingests_at_once_add_every_row_exactly_once(spark, tmp_path, caplog):
    """Two landing directories that overlap (gateway x's seqs 501..1000 in both), ingested
    into one table by another process (``cairn spark ingest``) and by this one, which
    starts while the other holds the table's lock."""
    one, two, table = tmp_path / "one", tmp_path / "two", tmp_path / "table"
    for lo in range(0, 1000, 100):
        land(one, "x", events(range(lo + 1, lo + 101)), lo)
    for lo in range(500, 1500, 100):
        land(two, "x", events(range(lo + 1, lo + 101)), lo)
        land(two, "y", events(range(lo + 1, lo + 101)), lo)
    other = subprocess.Popen([*CAIRN, "spark", "ingest", "--landing", str(one), "--table",
                              str(table), *OWN_SPARK], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    blocking_until(lambda: held_by(table, other), 600, "the other ingest to take the lock")
    jobs.ingest(spark, str(two), str(table), wait=600)
    _, err = other.communicate(timeout=600)
    assert other.returncode == 0, err[-2000:]
    assert logged(caplog, WAITING)()  # they did collide

    got = keys(spark, table)
    assert len(got) == len(set(got))  # no duplicates
    assert set(got) == ({("x", s) for s in range(1, 1501)} | {("y", s) for s in range(501, 1501)})


def held_by(table: Path, process: subprocess.Popen) -> bool:
    """Whether ``process`` holds the table's lock (a shared lock tried without waiting);
    fails if it ended first."""
    assert process.poll() is None, process.communicate()[1][-2000:]
    try:
        with locked(str(table), None, exclusive=False, wait=0, what="a probe"):
            return False
    except TableBusy as busy:
        return f"(pid {process.pid} " in str(busy)


def read_until(spark, table: Path, stop: threading.Event, scans: list[list[list]]) -> None:
    """A reader of the table, as a report reads it (under the shared lock), adding a scan
    to ``scans`` until ``stop`` is set and once more after."""
    files = jobs.Files(spark)
    qualified = files.qualify(str(table))
    while True:
        last = stop.is_set()
        with locked(qualified, files, exclusive=False, wait=600, what="a reader"):
            scans.append(state(spark, table))
        if last:
            return
        time.sleep(0.3)  # a reader's pause between scans


def test_a_reader_sees_the_table_before_or_after_an_ingest_never_between(spark, tmp_path,
                                                                         caplog):
    """The second ingest (another process) appends rows and re-bases rows of the first
    (rewriting the partitions they leave and enter); a reader scanning all the while sees
    the table as it was or as it ends up, never the rows appended but not re-based, nor a
    partition half swapped."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    second = tmp_path / "second"
    for n in range(6):
        rows1, rows2, anchors, _ = clock_boots(f"c{n}")
        land(landing, f"c{n}", rows1[:10], 0, anchors[:1])
        land(second, f"c{n}", rows1[10:] + rows2, 10, anchors)
    jobs.ingest(spark, str(landing), str(table))
    before = state(spark, table)
    stop, scans = threading.Event(), []
    reader = in_thread(lambda: read_until(spark, table, stop, scans))
    blocking_until(lambda: scans or reader.done(), 300, "the reader's first scan")
    assert scans, reader.result()
    shutil.copytree(second, landing, dirs_exist_ok=True)
    done = cairn("spark", "ingest", "--landing", str(landing), "--table", str(table),
                 *OWN_SPARK)
    stop.set()
    reader.result(timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    after = state(spark, table)
    assert after != before and "earlier rows re-based" in done.stdout
    assert {"before" if s == before else "after" if s == after else "between"
            for s in scans} == {"before", "after"}
    assert logged(caplog, WAITING)()  # it did try to read during the ingest


def state(spark, table: Path) -> list[list]:
    rows = spark.read.parquet(str(table)).select("gateway_id", "seq", "date").collect()
    return sorted([r.gateway_id, r.seq, str(r.date)] for r in rows)
