"""The central job on S3 (issue 48): ``cairn spark ingest --landing s3a://...`` (and
``--archive``, ``--quarantine``, a table there) against the same rclone S3 server the
uploader lands in, through hadoop-aws 3.3.1 and its SDK bundle (harness.s3a_jars: taken
from PyPI's sagemaker-pyspark once, loaded by the tests' shared Spark session).

S3 has no rename. What the job's moves and its table lock do there, as tested here:

- **The archive and quarantine moves** are S3A's rename of a file: a server-side COPY, then
  a DELETE of the source (not atomic). The data file moves first, the manifest last, so a
  run that dies between the two steps of a move leaves a batch in both places; the next run
  finds its manifest in the ingest log ("already"), adds nothing and moves it again,
  overwriting the copy (tested). The job makes no directories there: S3A needs none, and
  rclone's server stores a directory marker as an empty file, under which no key fits.
- **The table lock** on an ``s3a://`` table is ``create(_lock, overwrite=false)``, which S3A
  makes a HEAD and then a PUT: a run that finds the lock waits (and names the holder), but
  two runs starting in the same instant can both take it (tested: the first half). A
  table in S3 is not tested here: Spark's committer makes directories (markers, see
  above), which rclone's server cannot hold. A conditional PUT
  (``If-None-Match: *``, honoured by AWS S3 since 2024 and MinIO) would close that race;
  hadoop-aws 3.3.1 does not send one and rclone's S3 server ignores it
  (tests/system/test_sync_s3.py: ``test_rclone_ignores_if_none_match``), so here the rule
  is the documented one: schedule one ingest at a time per table on S3.

rclone's ``serve s3`` (1.75.2) keeps its objects as files, and a directory marker (a key
ending in ``/``, which S3A writes for every ``mkdirs`` and wherever a delete or a move
empties a folder) as an empty file of that name, after which any key below it fails with
500 InternalError. The job makes no directories on S3A; the markers S3A writes by itself
are asserted where they appear.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.central.table_lock import TableBusy, locked  # noqa: E402
from cairn.formats.batch import manifest_name, stem  # noqa: E402
from cairn.sync.sinks.s3 import S3Config, S3Sink  # noqa: E402
from cairn.sync.sinks.sigv4 import Credentials  # noqa: E402
from harness import s3a_jars  # noqa: E402
from harness.s3_server import KEY, SECRET, S3Server  # noqa: E402
from tests.spark.test_spark import events, keys, land  # noqa: E402
from tests.system.test_sync import GATEWAY, fill_store, uploader_for  # noqa: E402

pytestmark = pytest.mark.spark

PREFIX = "landing"


@pytest.fixture(scope="module")
def s3(spark, tmp_path_factory):
    """The rclone S3 server, and the session's s3a:// file system pointed at it (a bucket
    per test: S3A keeps a file system per bucket, made with the settings of its first
    use)."""
    if s3a_jars.jars() is None:
        pytest.skip("no hadoop-aws jars (python -m harness.s3a_jars could not fetch them)")
    server = S3Server(tmp_path_factory.mktemp("s3a") / "root")
    conf = spark._jsc.hadoopConfiguration()
    for key, value in s3a_jars.hadoop_conf(server.endpoint, KEY, SECRET).items():
        conf.set(key, value)
    yield server
    server.close()


@pytest.fixture
def bucket(s3, request) -> tuple[str, Path]:
    return s3.bucket_for(request.node.name, prefix="c-")


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def table_rows(spark, table: str) -> list[tuple]:
    columns = [c for c in jobs.TABLE_COLUMNS if c != "ingested_at"]
    return sorted(tuple(r) for r in spark.read.parquet(table).select(*columns).collect())


def test_batches_the_uploader_put_in_s3_ingest_as_from_a_directory(spark, s3, bucket,
                                                                    tmp_path, cairn_cli,
                                                                    capsys):
    name, folder = bucket
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 1200, retained_every=50)
    sink = S3Sink(S3Config(name, PREFIX, s3.endpoint, "us-east-1", "path",
                           Credentials(KEY, SECRET)))
    uploader = uploader_for(data_dir, sink, batch_events=500)
    assert uploader.once() == 1200
    uploader.reader.close()

    from_s3, from_dir = str(tmp_path / "from-s3"), str(tmp_path / "from-dir")
    assert cairn_cli(["spark", "ingest", "--landing", f"s3a://{name}/{PREFIX}",
                      "--table", from_s3]) == 0
    assert "3 batches ingested" in capsys.readouterr().out
    # the same objects, read as the directory rclone keeps them in
    jobs.ingest(spark, str(folder / PREFIX), from_dir)
    assert keys(spark, Path(from_s3)) == [(GATEWAY, s) for s in seqs]
    assert table_rows(spark, from_s3) == table_rows(spark, from_dir)


def test_archive_and_quarantine_in_s3_and_a_move_cut_between_copy_and_delete(
        spark, s3, bucket, tmp_path, cairn_cli, capsys):
    name, folder = bucket
    landing, archive = folder / PREFIX, folder / "archive"  # where rclone keeps them
    staged = tmp_path / "staged"  # made here, then put in the bucket
    good = land(staged, "g", events(range(1, 11)), 0)
    bad = land(staged, "g", events(range(11, 21)), 10)
    (staged / bad.name).write_bytes(bad.data[:-10])
    waiting = land(staged, "g", events(range(21, 31)), 20, manifest=False)
    s3.put_tree(name, staged, PREFIX)
    good_files = {f: (staged / f).read_bytes() for f in (good.name, manifest_name(good.name))}
    table = str(tmp_path / "table")
    ingest = ["spark", "ingest", "--landing", f"s3a://{name}/{PREFIX}", "--table", table,
              "--archive", f"s3a://{name}/archive", "--quarantine", f"s3a://{name}/quarantine"]
    assert cairn_cli(ingest) == 0
    out = capsys.readouterr().out
    assert "1 batches ingested" in out and f"quarantined {bad.name}" in out

    assert files_under(landing) == [waiting.name]  # its folder not emptied: no marker
    assert files_under(archive) == sorted(good_files)
    assert all((archive / f).read_bytes() == data for f, data in good_files.items())
    quarantined = files_under(folder / "quarantine")
    assert bad.name in quarantined and manifest_name(bad.name) in quarantined
    note = json.loads((folder / "quarantine" / f"{stem(bad.name)}.reason.json").read_text())
    assert "truncated" in note["reason"]
    assert keys(spark, Path(table)) == [("g", s) for s in range(1, 11)]

    # a run that died between the COPY and the DELETE of good's move left it in both places
    for f, data in good_files.items():
        s3.put(name, f"{PREFIX}/{f}", data)
    s3.put(name, f"{PREFIX}/{manifest_name(waiting.name)}", json.dumps(waiting.manifest).encode())
    assert cairn_cli(ingest) == 0
    assert "2 manifests: 1 batches ingested (1 in one pass), 1 already in the table" in (
        capsys.readouterr().out)
    assert files_under(archive) == sorted([*good_files, waiting.name,
                                           manifest_name(waiting.name)])
    assert keys(spark, Path(table)) == [*[("g", s) for s in range(1, 11)],
                                        *[("g", s) for s in range(21, 31)]]
    # the move finished: the landing is empty but for the directory marker S3A puts where
    # a folder was emptied (the object "landing/g/"), which rclone keeps as an empty file
    # "g": a key under it then fails there (docs/sync-and-spark.md: Landing in S3)
    assert files_under(landing) == ["g"] and (landing / "g").stat().st_size == 0


def test_the_table_lock_in_s3_holds_off_a_run_that_finds_it(spark, s3, bucket):
    """S3A's create(overwrite=false) is a HEAD then a PUT: a run that finds the lock file
    waits and names its holder, and the holder's release deletes it. (Two runs starting
    in the same instant could both take it: one ingest at a time per table on S3.)"""
    name, folder = bucket
    files = jobs.Files(spark)
    table = f"s3a://{name}/table"
    with locked(table, files, exclusive=True, wait=5, what="an ingest of the first landing"):
        held = json.loads((folder / "table" / "_lock").read_text())
        assert held["what"] == "an ingest of the first landing"
        started = time.monotonic()
        with pytest.raises(TableBusy, match="locked by an ingest of the first landing"), \
                locked(table, files, exclusive=True, wait=1, what="a second ingest"):
            pass
        assert time.monotonic() - started >= 1
    assert not (folder / "table" / "_lock").exists()  # released
    # (S3A then marks the emptied folder with the object "table/", which rclone keeps as
    # an empty file: no later lock could be taken there, see the module's docstring)
    assert (folder / "table").is_file() and (folder / "table").stat().st_size == 0
