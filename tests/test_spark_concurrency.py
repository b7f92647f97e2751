"""Runs that share a table: ingests take turns on its lock, reports read between them.

Races here are real: other processes (``cairn spark ingest`` with a Spark driver of its
own, a reader with its own session, a plain lock holder) against the same table
directory. Slow (each process starts a JVM): ``pytest -m spark``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.sync import spark as jobs  # noqa: E402
from cairn.sync.table_lock import TableBusy  # noqa: E402
from tests.test_spark import clock_boots, events, keys, land  # noqa: E402
from tests.test_spark_cluster import CAIRN, cairn  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HOLDER = textwrap.dedent("""
    import sys, time
    from cairn.sync.table_lock import locked
    with locked(sys.argv[1], None, exclusive=True, wait=0, what="a test holder"):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
        open(sys.argv[3], "w").write(repr(time.time()))  # released right after this
""")


def hold_lock(table: Path, seconds: float, released: Path) -> subprocess.Popen:
    """Another process holding the table's exclusive lock for ``seconds``."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(table), str(seconds),
                               str(released)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_an_ingest_gives_up_on_a_locked_table_naming_the_holder(spark, tmp_path):
    landing, table = tmp_path / "landing", tmp_path / "table"
    land(landing, "gw", events(range(1, 11)), 0)
    holder = hold_lock(table, 60, tmp_path / "released")
    try:
        with pytest.raises(TableBusy, match=rf"a test holder \(pid {holder.pid} "):
            jobs.ingest(spark, str(landing), str(table), wait=0.5)
        assert not list(table.glob("date=*")) and not (table / "_batches").exists()
    finally:
        holder.kill()
        holder.wait()


def test_an_ingest_waits_for_the_lock_before_writing(spark, tmp_path):
    landing, table, released = tmp_path / "landing", tmp_path / "table", tmp_path / "released"
    land(landing, "gw", events(range(1, 11)), 0)
    holder = hold_lock(table, 3, released)
    stats = jobs.ingest(spark, str(landing), str(table), wait=120)
    holder.wait()
    assert stats.rows_added == 10
    written = [p.stat().st_mtime for p in table.rglob("*.parquet")]
    assert written and min(written) >= float(released.read_text())


def test_two_ingests_at_once_add_every_row_exactly_once(spark, tmp_path):
    """Two landing directories that overlap (gateway x's seqs 501..1000 in both), ingested
    into one table by two processes started together."""
    one, two, table = tmp_path / "one", tmp_path / "two", tmp_path / "table"
    for lo in range(0, 1000, 100):
        land(one, "x", events(range(lo + 1, lo + 101)), lo)
    for lo in range(500, 1500, 100):
        land(two, "x", events(range(lo + 1, lo + 101)), lo)
        land(two, "y", events(range(lo + 1, lo + 101)), lo)
    common = ["--table", str(table), "--master", "local[1]", "--conf",
              "spark.ui.enabled=false"]
    runs = [subprocess.Popen([*CAIRN, "spark", "ingest", "--landing",
                              str(landing), *common], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for landing in (one, two)]
    outputs = [run.communicate(timeout=900) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]

    got = keys(spark, table)
    assert len(got) == len(set(got))  # no duplicates
    assert set(got) == ({("x", s) for s in range(1, 1501)} | {("y", s) for s in range(501, 1501)})
    assert any("waiting for the lock" in err for _, err in outputs)  # they did collide


READER = textwrap.dedent("""
    import json, os, sys, time
    from cairn.sync import spark as jobs
    from cairn.sync.table_lock import locked
    table, record, stop = sys.argv[1:4]
    spark = jobs.session("local[1]", {"spark.ui.enabled": "false"}, app="reader")
    files = jobs.Files(spark)
    table = files.qualify(table)
    with open(record, "w") as out:
        print("reading", flush=True)
        while True:
            last = os.path.exists(stop)
            with locked(table, files, exclusive=False, wait=600, what="a reader"):
                rows = spark.read.parquet(table).select("gateway_id", "seq", "date").collect()
            out.write(json.dumps(sorted([r.gateway_id, r.seq, str(r.date)] for r in rows))
                      + "\\n")
            out.flush()
            if last:
                break
            time.sleep(0.3)  # a reader's pause between scans
    spark.stop()
""")


def test_a_reader_sees_the_table_before_or_after_an_ingest_never_between(spark, tmp_path):
    """The second ingest appends rows and re-bases rows of the first (rewriting the
    partitions they leave and enter); a reader scanning all the while sees the table as
    it was or as it ends up, never the rows appended but not re-based, nor a partition
    half swapped."""
    landing, table = tmp_path / "landing", tmp_path / "table"
    second = tmp_path / "second"
    for n in range(6):
        rows1, rows2, anchors, _ = clock_boots(f"c{n}")
        land(landing, f"c{n}", rows1[:10], 0, anchors[:1])
        land(second, f"c{n}", rows1[10:] + rows2, 10, anchors)
    jobs.ingest(spark, str(landing), str(table))
    before = state(spark, table)
    stop, record = tmp_path / "stop", tmp_path / "scans.jsonl"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(table), str(record),
                               str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    assert reader.stdout.readline().strip() == "reading"
    wait_for_scans(record, 1)
    shutil.copytree(second, landing, dirs_exist_ok=True)
    done = cairn("spark", "ingest", "--landing", str(landing), "--table", str(table),
                 "--master", "local[1]", "--conf", "spark.ui.enabled=false")
    stop.touch()
    _, reader_err = reader.communicate(timeout=600)
    assert done.returncode == 0 and reader.returncode == 0, (done.stderr[-2000:],
                                                            reader_err[-2000:])
    after = state(spark, table)
    assert after != before and "earlier rows re-based" in done.stdout
    scans = [json.loads(line) for line in record.read_text().splitlines()]
    assert {"before" if s == before else "after" if s == after else "between"
            for s in scans} == {"before", "after"}
    assert "waiting for the lock" in reader_err  # it did try to read during the ingest


def state(spark, table: Path) -> list[list]:
    rows = spark.read.parquet(str(table)).select("gateway_id", "seq", "date").collect()
    return sorted([r.gateway_id, r.seq, str(r.date)] for r in rows)


def wait_for_scans(record: Path, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not record.exists() or len(record.read_text().splitlines()) < n:
        assert time.monotonic() < deadline, "the reader made no scan"
        time.sleep(0.2)  # polling the reader's record file
