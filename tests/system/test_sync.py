"""The edge uploader (``cairn sync``): history after the watermark -> batch files + manifests
-> a directory or an HTTP server -> watermark.

The store is filled either by the real router (in-process, publications from an autobahn
client) or directly through ``gateway.store.Store``. The HTTP sink is tested against a local
server (``http.server`` in a thread) that fails at random, with a seeded generator and a
bounded number of failures: it refuses connections, answers too late, answers 500, or drops
the connection in the middle of an upload. Whatever it does, every event lands.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import itertools
import json
import random
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.base.clock_readings import Anchor, rfc3339
from cairn.base.data_dir import read_sync_status
from cairn.formats.batch import MANIFEST_SUFFIX, ROW_FIELDS, row_of
from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.core.session import Sequence
from cairn.gateway.store import HistoryReader, Store, StoredPublication
from cairn.sync.sinks import DirectorySink, HttpSink, SinkError
from cairn.sync.uploader import Uploader
from harness.config import history_rule, open_realm, router_table
from harness.landing import landed
from harness.s3_server import FaultProxy
from harness.waiting import blocking_until, until
from harness.wamp_client import connect
from tests.conftest import RunningRouter, start_router

GATEWAY = "gw-test"
T0_MS = 1_795_000_000_000  # 2026-11-18T11:06:40Z
BOOT = "6a1f0c1e-0000-4000-8000-000000000001"

def router_config(unix_path: Path, data_dir: Path) -> str:
    return (router_table(data_dir, rawsocket=["127.0.0.1:0", f"unix:{unix_path}"])
            + open_realm(history=[history_rule("sensor")]))


# -- building an edge store ----------------------------------------------------------------

async def _fill(path: Path, events: int, retained_every: int, first_index: int) -> list[int]:
    store = await Store.open(path)
    sequence = Sequence(store.next_seq, store.publication_ids)
    seqs = []
    try:
        if store.next_seq == 1:
            store.add_anchor(Anchor("start", BOOT, 5_000_000_000, T0_MS * 1_000_000, None, True))
        for i in range(first_index, first_index + events):
            if retained_every and i % retained_every == 0:
                # a retained-only status publication: takes a seq, is not history
                seq, publication = sequence.assign()
                store.append(StoredPublication(
                    seq=seq, publication=publication, realm="realm1",
                    topic="gateway.device.d1.status", args=[], kwargs={"state": "ok"},
                    wall_ms=T0_MS + i * 1000, boot_id=BOOT,
                    boottime_ns=5_000_000_000 + i * 10**9, clock_synced=True, retain=True))
            seq, publication = sequence.assign()
            seqs.append(seq)
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=f"sensor.dev{i % 4}",
                args=[i], kwargs={"temperature": 20 + (i % 10) / 10, "humidity": 50.0 + i % 7,
                                  "raw": bytes([i % 256, 0xFF])},
                wall_ms=T0_MS + i * 1000, boot_id=BOOT, boottime_ns=5_000_000_000 + i * 10**9,
                clock_synced=True, authid="sensor-1", authrole="device",
                details={"topic": f"sensor.dev{i % 4}"}, history_rule=0))
            if i % 1000 == 999:
                await store.flush()
        await store.flush()
    finally:
        await store.close()
    return seqs


def fill_store(data_dir: Path, events: int, retained_every: int = 0,
               first_index: int = 0) -> list[int]:
    """Append ``events`` history publications (and a retained-only one every
    ``retained_every``) to the store in ``data_dir``; returns the history seqs."""
    return asyncio.run(_fill(data_dir / "cairn.db", events, retained_every, first_index))


def status_of(data_dir: Path) -> dict[str, Any]:
    return json.loads((data_dir / "sync-status.json").read_text())


class RecordingSink(DirectorySink):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.names: list[str] = []

    def put(self, name: str, data: bytes) -> None:
        self.names.append(name)
        super().put(name, data)


def uploader_for(data_dir: Path, sink: Any, batch_events: int = 1000, **kwargs: Any) -> Uploader:
    return Uploader(GATEWAY, HistoryReader(data_dir / "cairn.db"), sink,
                    data_dir / "sync-status.json", batch_events=batch_events, **kwargs)


# -- directory sink ------------------------------------------------------------------------

def test_directory_sink_writes_batches_manifests_and_advances_the_watermark(tmp_path):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    seqs = fill_store(data_dir, 2500, retained_every=100)
    uploader = uploader_for(data_dir, DirectorySink(landing))
    assert uploader.status.synced_seq == 0

    assert uploader.once() == 2500

    manifests, rows = landed(landing)
    assert [(m["first_seq"], m["count"]) for m in manifests] == [
        (seqs[0], 1000), (seqs[1000], 1000), (seqs[2000], 500)]
    assert sorted(r["seq"] for r in rows) == seqs  # every event once
    for m in manifests:
        assert m["schema"] == 2 and m["gateway_id"] == GATEWAY
        assert m["file"] == f"{GATEWAY}/{m['first_seq']:012d}-{m['last_seq']:012d}.jsonl.bz2"
        assert [a["reason"] for a in m["anchors"]] == ["start"]
        assert m["anchors"][0]["clock_synced"] is True
    # the batches tile the seq space: each starts right after the previous one's watermark
    assert [m["after_seq"] for m in manifests] == [0] + [m["last_seq"] for m in manifests[:-1]]
    assert not list(landing.rglob(".*"))  # no temporary files left behind

    first = rows[0]
    assert first["gateway_id"] == GATEWAY and first["topic"] == "sensor.dev0"
    assert rfc3339(first["wall_ms"]) == "2026-11-18T11:06:40.000Z"
    assert first["kwargs"]["raw"] == {"$bytes": base64.b64encode(bytes([0, 0xFF])).decode()}
    assert first["boot_id"] == BOOT and first["clock_synced"] is True
    assert first["authid"] == "sensor-1" and first["details"] == {"topic": "sensor.dev0"}

    reader = HistoryReader(data_dir / "cairn.db")
    assert reader.synced_seq() == seqs[-1]  # the store knows what is synced
    reader.close()
    status = status_of(data_dir)
    assert status["synced_seq"] == seqs[-1] and status["backlog"] == 0
    assert status["state"] == "ok" and status["last_error"] is None
    assert status["last_success"] and status["events"] == 2500 and status["batches"] == 3

    assert uploader.once() == 0  # nothing new: nothing sent
    assert status_of(data_dir)["state"] == "idle"


def test_an_idle_uploader_rewrites_its_status_only_when_it_changed(tmp_path):
    """Each rewrite is a new file on the card: an idle check every minute must not be one."""
    data_dir = tmp_path / "data"
    fill_store(data_dir, 10)
    stop = threading.Event()

    def upload() -> None:  # the reader's SQLite connection belongs to this thread
        uploader_for(data_dir, DirectorySink(tmp_path / "landing")).run(0.02, stop=stop)

    worker = threading.Thread(target=upload)
    worker.start()
    deadline = time.monotonic() + 10
    while not (data_dir / "sync-status.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the first batch and its status
    written = (data_dir / "sync-status.json").stat().st_mtime_ns
    time.sleep(0.5)  # ~25 idle checks
    stop.set()
    worker.join(10)
    assert status_of(data_dir)["synced_seq"] > 0
    assert (data_dir / "sync-status.json").stat().st_mtime_ns == written


def test_batch_bytes_bound_splits_batches(tmp_path):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    seqs = fill_store(data_dir, 1200)
    uploader_for(data_dir, DirectorySink(landing), batch_events=1000,
                 batch_bytes=2000).once()
    manifests, rows = landed(landing)
    assert len(manifests) > 3
    assert all(m["bytes"] + len(json.dumps(m, separators=(",", ":"))) <= 2000 for m in manifests)
    assert sorted(r["seq"] for r in rows) == seqs


def test_resumes_after_restart_and_never_resends_confirmed_batches(tmp_path):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    fill_store(data_dir, 1500)
    sink = RecordingSink(landing)
    first = uploader_for(data_dir, sink)
    first.once()
    sent_before = list(sink.names)
    watermark = first.status.synced_seq
    first.reader.close()

    more = fill_store(data_dir, 700, first_index=1500)  # the router stored more meanwhile
    sink.names.clear()
    second = uploader_for(data_dir, sink)  # a new process
    assert second.status.synced_seq == watermark
    assert second.once() == 700
    assert not set(sink.names) & set(sent_before)
    manifests, rows = landed(landing)
    assert manifests[-1]["after_seq"] == watermark and manifests[-1]["first_seq"] == more[0]
    assert len(rows) == 2200 and len({r["seq"] for r in rows}) == 2200


def _write_config(path: Path, data_dir: Path, sink: str, extra: str = "") -> Path:
    path.write_text(f'[router]\ndata_dir = "{data_dir}"\n\n[sync]\nsink = "{sink}"\n'
                    f'gateway_id = "{GATEWAY}"\n{extra}')
    return path


def test_sync_once_exit_codes(tmp_path, capsys, cairn_cli):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    seqs = fill_store(data_dir, 300)
    good = _write_config(tmp_path / "good.toml", data_dir, f"dir:{landing}")
    assert cairn_cli(["sync", "--config", str(good), "--once"]) == 0
    assert len(landed(landing)[1]) == 300
    assert status_of(data_dir)["synced_seq"] == seqs[-1]

    fill_store(data_dir, 10, first_index=300)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    broken = _write_config(tmp_path / "broken.toml", data_dir, f"dir:{blocker}")
    assert cairn_cli(["sync", "--config", str(broken), "--once"]) == 1
    status = status_of(data_dir)
    assert status["state"] == "retrying" and "cannot write" in status["last_error"]
    assert status["backlog"] == 10 and status["synced_seq"] == seqs[-1]

    bad = _write_config(tmp_path / "bad.toml", data_dir, "ftp://nope")
    assert cairn_cli(["sync", "--config", str(bad), "--once"]) == 2
    assert "sync.sink" in capsys.readouterr().err
    bad_id = _write_config(tmp_path / "bad-id.toml", data_dir, f"dir:{landing}")
    bad_id.write_text(bad_id.read_text().replace(GATEWAY, "../escape"))
    assert cairn_cli(["sync", "--config", str(bad_id), "--once"]) == 2
    assert "sync.gateway_id" in capsys.readouterr().err


async def test_router_history_lands_while_the_router_runs(tmp_path):
    """The real path: publications through the router's store, read beside it (WAL)."""
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    node = await start_router(router_config(unix_path=tmp_path / "wamp.sock",
                                                  data_dir=data_dir))
    router = RunningRouter(node, str(tmp_path / "wamp.sock"))
    await until(lambda: node.router.realms["realm1"].retention.newest(HEALTH_TOPIC, "exact"),
                what="the router's health record made at start (seq 1; it ships too)")
    session = await connect(router, "rawsocket-tcp", "msgpack")
    try:
        acked = PublishOptions(acknowledge=True)
        for i in range(40):
            await session.publish("sensor.greenhouse", temperature=20 + i / 10,
                                  humidity=55.0, options=acked)
            if i % 10 == 0:  # retained-only: takes a seq, is not history
                await session.publish("gateway.device.d1.status", "ok",
                                      options=PublishOptions(acknowledge=True, retain=True))
        # the uploader blocks: it gets a thread of its own (SQLite objects stay in theirs)
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1) as thread:
            sink = RecordingSink(landing)
            uploader = await loop.run_in_executor(
                thread, lambda: uploader_for(data_dir, sink, batch_events=25))
            assert await loop.run_in_executor(thread, uploader.once) == 1 + 40
            for i in range(5):
                await session.publish("sensor.greenhouse", temperature=30 + i, options=acked)
            sink.names.clear()
            assert await loop.run_in_executor(thread, uploader.once) == 5
            assert len(sink.names) == 2  # one new batch: its data and its manifest
            await loop.run_in_executor(thread, uploader.reader.close)
    finally:
        await session.leave()
        await node.stop()

    manifests, rows = landed(landing)
    assert [m["count"] for m in manifests] == [25, 16, 5]
    assert rows[0]["topic"] == HEALTH_TOPIC
    rows = rows[1:]
    assert [r["kwargs"]["temperature"] for r in rows] == (
        [20 + i / 10 for i in range(40)] + [30 + i for i in range(5)])
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == 45
    assert seqs[-1] - seqs[0] + 1 == 45 + 4  # four retained-only seqs in between
    assert {r["topic"] for r in rows} == {"sensor.greenhouse"}
    assert all(m["anchors"] and m["anchors"][0]["reason"] == "start" for m in manifests)
    assert [m["after_seq"] for m in manifests[1:]] == [m["last_seq"] for m in manifests[:-1]]


# -- an HTTP server that fails at random ---------------------------------------------------

@dataclass
class FlakyServer:
    """PUT /<path> stores the body under ``root/<path>`` (temp then rename, like HDFS
    CREATE). Until ``failures`` failures have been served it fails each request with
    probability ``rate``, in one of the ``MODES``; then it recovers for good."""

    root: Path
    seed: int = 7
    failures: int = 0
    rate: float = 0.5
    token: str | None = None
    basic: tuple[str, str] | None = None
    stall: float = 1.0  # how long a "timeout" answer takes (beyond the client's timeout)
    MODES = ("refuse", "timeout", "error500", "die")
    served: dict[str, int] = field(default_factory=dict)
    authorizations: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._closed = False
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/landing"

    # -- life ----------------------------------------------------------------------------

    def start(self) -> FlakyServer:
        server = self
        if self._closed:
            return self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                server._handle(self)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.daemon_threads = True
        thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self, final: bool = True) -> None:
        self._closed = self._closed or final
        if self._httpd is not None:
            httpd, self._httpd = self._httpd, None
            httpd.shutdown()
            httpd.server_close()

    def _outage(self, seconds: float) -> None:
        """Close the listening socket (connections are refused), then listen again."""
        def run() -> None:
            self.stop(final=False)
            time.sleep(seconds)
            self.start()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- one request ---------------------------------------------------------------------

    def _decide(self) -> str:
        with self._lock:
            mode = "ok"
            if self.failures > 0 and self._random.random() < self.rate:
                self.failures -= 1
                mode = self._random.choice(self.MODES)
            self.served[mode] = self.served.get(mode, 0) + 1
            return mode

    def _authorized(self, handler: http.server.BaseHTTPRequestHandler) -> bool:
        header = handler.headers.get("Authorization", "")
        self.authorizations.append(header)
        if self.token is not None:
            return header == f"Bearer {self.token}"
        if self.basic is not None:
            pair = base64.b64encode(":".join(self.basic).encode()).decode()
            return header == f"Basic {pair}"
        return True

    def _handle(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers["Content-Length"])
        mode = self._decide()
        if mode == "refuse":  # this connection dies; the next ones are refused for a while
            self._outage(0.3)
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "die":  # read part of the upload, then drop the connection
            handler.rfile.read(length // 2)
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        body = handler.rfile.read(length)
        if not self._authorized(handler):
            handler.send_error(401, "bad credentials")
            return
        if mode == "error500":
            handler.send_error(500, "injected failure")
            return
        relative = handler.path.split("?")[0].removeprefix("/landing/")
        target = self.root / relative
        assert ".." not in relative and target.resolve().is_relative_to(self.root.resolve())
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.{threading.get_ident()}.part")
        temp.write_bytes(body)
        temp.replace(target)
        with self._lock:
            self.stored.append(relative)
        if mode == "timeout":  # stored, but the answer comes after the client gave up
            time.sleep(self.stall)
        with contextlib.suppress(OSError):
            handler.send_response(201)
            handler.send_header("Content-Length", "0")
            handler.end_headers()


@contextlib.contextmanager
def uploading(data_dir: Path, sink: Any, interval: float, max_backoff: float = 600.0,
              batch_events: int = 200, **kwargs: Any) -> Iterator[threading.Thread]:
    """The uploader's long-running mode, as the systemd unit runs it, in a thread (its
    SQLite connection stays there); stopped on leaving. ``kwargs``: the Uploader's."""
    stop = threading.Event()

    def upload() -> None:
        uploader = uploader_for(data_dir, sink, batch_events=batch_events, **kwargs)
        try:
            uploader.run(interval=interval, max_backoff=max_backoff, stop=stop)
        finally:
            uploader.reader.close()

    worker = threading.Thread(target=upload, daemon=True)
    worker.start()
    try:
        yield worker
    finally:
        stop.set()
        worker.join(10)


def until_synced(data_dir: Path, last_seq: int, worker: threading.Thread,
                 timeout: float = 60.0) -> float:
    """Wait until the store's watermark reaches ``last_seq``; the seconds it took."""
    reader = HistoryReader(data_dir / "cairn.db")
    started = time.monotonic()
    try:
        while reader.synced_seq() < last_seq:
            assert time.monotonic() - started < timeout, f"stuck: {status_of(data_dir)}"
            assert worker.is_alive(), "the uploader died"
            time.sleep(0.01)
    finally:
        reader.close()
    return time.monotonic() - started


def run_flaky_upload(tmp_path: Path, events: int = 3000, seed: int = 7, failures: int = 24
                     ) -> tuple[Path, list[int], FlakyServer, Path]:
    """Fill a store, upload it through a FlakyServer with a bearer token until the
    watermark reaches the end. Returns (landing dir, history seqs, server, data dir)."""
    data_dir, landing = tmp_path / "data", tmp_path / "http-landing"
    seqs = fill_store(data_dir, events, retained_every=97)
    server = FlakyServer(landing, seed=seed, failures=failures, rate=0.5, token="t0ken",
                         stall=0.6).start()
    sink = HttpSink(server.url, token="t0ken", timeout=0.3)
    try:
        with uploading(data_dir, sink, interval=0.05, max_backoff=0.05) as worker:
            until_synced(data_dir, seqs[-1], worker)
    finally:
        server.stop()
    return landing, seqs, server, data_dir


def test_flaky_http_server_every_event_lands(tmp_path):
    landing, seqs, server, data_dir = run_flaky_upload(tmp_path)
    assert server.failures == 0  # the failure budget was spent...
    assert all(server.served.get(mode) for mode in FlakyServer.MODES), server.served
    manifests, rows = landed(landing)
    landed_seqs = [r["seq"] for r in rows]
    assert set(landed_seqs) == set(seqs)  # ...and nothing was lost
    assert len(landed_seqs) >= len(seqs)  # (a batch may land twice)
    assert set(server.authorizations) == {"Bearer t0ken"}
    status = status_of(data_dir)
    assert status["synced_seq"] == seqs[-1] and status["backlog"] == 0
    assert status["state"] == "ok"


def test_http_basic_auth_and_failure_status(tmp_path):
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 50)
    server = FlakyServer(tmp_path / "landing", basic=("edge", "pa:ss")).start()
    try:
        wrong = uploader_for(data_dir, HttpSink(server.url, username="edge", password="nope",
                                                timeout=2))
        with pytest.raises(SinkError, match="401"):
            wrong.once()
        status = status_of(data_dir)
        assert status["state"] == "retrying" and "401" in status["last_error"]
        assert status["backlog"] == 50 and wrong.reader.synced_seq() == 0
        right = uploader_for(data_dir, HttpSink(server.url, username="edge", password="pa:ss",
                                                timeout=2))
        assert right.once() == 50
    finally:
        server.stop()
    expected = "Basic " + base64.b64encode(b"edge:pa:ss").decode()
    assert server.authorizations[-2:] == [expected, expected]
    assert sorted(r["seq"] for r in landed(tmp_path / "landing")[1]) == seqs
    assert status_of(data_dir)["last_error"] is None


def test_bandwidth_cap_slows_the_upload_measurably(tmp_path):
    data_dir = tmp_path / "data"
    fill_store(data_dir, 2000)
    server = FlakyServer(tmp_path / "landing").start()
    try:
        fast = uploader_for(data_dir, HttpSink(server.url, timeout=5), batch_events=500)
        started = time.monotonic()
        fast.once()
        uncapped = time.monotonic() - started
        total = sum((tmp_path / "landing" / name).stat().st_size for name in server.stored)

        # as if nothing had been sent: send it all again
        fast.reader.db.execute("UPDATE meta SET value = '0' WHERE key = 'synced_seq'")
        # bytes/s: the whole upload should take 1 s, or 5 times the uncapped one on a busy
        # machine (a cap is a rate; an upload slow for other reasons is not slowed further)
        expected = max(1.0, 5 * uncapped)
        cap = int(total / expected)
        slow = uploader_for(data_dir, HttpSink(server.url, timeout=5, bandwidth=cap),
                            batch_events=500)
        assert slow.status.synced_seq == 0
        started = time.monotonic()
        slow.once()
        capped = time.monotonic() - started
    finally:
        server.stop()
    assert capped >= 0.7 * expected, (capped, total)  # less the first quarter-second burst
    assert capped > 3 * uncapped, (capped, uncapped)


def test_a_batch_row_has_the_fields_the_central_job_reads(tmp_path):
    """ROW_FIELDS is the row's one definition: what row_of writes, in that order, and what the
    Spark job's schema and required fields say (read, not run: no Spark starts here)."""
    data_dir = tmp_path / "data"
    fill_store(data_dir, 1)
    [pub] = HistoryReader(data_dir / "cairn.db").publications_after(0, 10)
    assert list(row_of(pub)) == [f.name for f in ROW_FIELDS]
    spark = pytest.importorskip("cairn.central.spark", exc_type=ImportError)
    spark_types = {"long": "bigint", "string": "string", "boolean": "boolean", "json": "string"}
    assert [(f.name, f.dataType.simpleString()) for f in spark.EVENT_SCHEMA.fields] == [
        ("gateway_id", "string"), *((f.name, spark_types[f.type]) for f in ROW_FIELDS)]
    assert ("gateway_id", *(f.name for f in ROW_FIELDS if f.required)) == spark.REQUIRED


def damage_payload(db_path: Path, seq: int) -> None:
    """What a bad sector or a torn page leaves: a payload that is no msgpack any more."""
    db = sqlite3.connect(db_path)
    with db:
        db.execute("UPDATE publications SET payload = x'c1c1' WHERE seq = ?", (seq,))
    db.close()


def test_a_damaged_history_row_ships_as_a_gap_and_sync_goes_on(tmp_path):
    """It used to crash `cairn sync` on every run, while its status file said "ok"."""
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 30)
    damage_payload(data_dir / "cairn.db", seqs[10])
    uploader = uploader_for(data_dir, DirectorySink(tmp_path / "landing"))
    assert uploader.once() == 29
    manifests, rows = landed(tmp_path / "landing")
    assert sorted(r["seq"] for r in rows) == [s for s in seqs if s != seqs[10]]
    [gap] = [g for m in manifests for g in m["gaps"]]
    assert (gap["first_seq"], gap["last_seq"]) == (seqs[10], seqs[10])
    assert gap["reason"].startswith("damaged: ")
    status = status_of(data_dir)
    assert status["synced_seq"] == seqs[-1] and status["damaged_rows"] == 1
    assert status["last_damaged"]["first_seq"] == seqs[10]


def test_damaged_rows_at_the_end_of_the_backlog_wait_for_the_next_good_row(tmp_path):
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 10)
    damage_payload(data_dir / "cairn.db", seqs[-1])
    uploader = uploader_for(data_dir, DirectorySink(tmp_path / "landing"))
    assert uploader.once() == 9
    assert uploader.reader.synced_seq() == seqs[-2]
    more = fill_store(data_dir, 1, first_index=10)
    assert uploader.once() == 1
    manifests, _ = landed(tmp_path / "landing")
    assert [g["first_seq"] for m in manifests for g in m["gaps"]] == [seqs[-1]]
    assert uploader.reader.synced_seq() == more[-1]


# -- hostile or broken HTTP sinks (issue 19) -------------------------------------------------


@dataclass
class ScriptedServer:
    """An HTTP server in a thread that answers every PUT with ``answer(handler)`` and keeps
    what it was sent: (path, Authorization header)."""

    answer: Any
    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests.append((self.path, self.headers.get("Authorization")))
                server.answer(self)

            do_HEAD = do_PUT  # cairn doctor's look at the sink

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def stored(handler: http.server.BaseHTTPRequestHandler) -> None:
    handler.send_response(201)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def redirect_to(url: str):
    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(307)
        handler.send_header("Location", url + handler.path)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return answer


def manifests_refused(handler: http.server.BaseHTTPRequestHandler) -> None:
    """Takes every data file, answers 503 to every manifest."""
    if handler.path.endswith(MANIFEST_SUFFIX):
        handler.send_error(503, "manifests are not taken today")
    else:
        stored(handler)


def test_a_sink_that_refuses_every_manifest_gets_no_more_than_the_days_budget(tmp_path):
    """The attack: 200 to the data PUT, 503 to the manifest's: 6,083,344 bytes in 60 s
    against a 1,000,000-byte day, budget_used 0 (issue 45, B1). Every PUT counts as it is
    sent, its head too; past the budget nothing but health records goes."""
    data_dir = tmp_path / "data"
    fill_store(data_dir, 3000)
    server = ScriptedServer(manifests_refused)
    proxy = FaultProxy(server.httpd.server_address[1])   # counts what reaches the sink
    daily = 20_000
    sink = HttpSink(proxy.endpoint + "/landing", timeout=5)
    try:
        with uploading(data_dir, sink, interval=0.05, max_backoff=0.05,
                       daily_bytes=daily) as worker:
            blocking_until(lambda: worker.is_alive() and (read_sync_status(data_dir) or {}).get(
                "health_only"), timeout=30, what="the budget to be spent")
    finally:
        proxy.close()
        server.close()
    status = status_of(data_dir)
    assert status["synced_seq"] == 0 and status["budget_bytes"] == daily
    assert status["bytes_sent"] == status["budget_used"] == proxy.sent
    assert daily * 0.9 < proxy.sent < daily + 1000   # bodies within it; the last heads over


def test_a_redirect_to_another_host_gets_neither_the_token_nor_the_batch(tmp_path):
    """The attack: the sink (or whoever answers for it) redirected each PUT elsewhere; the
    bearer token followed, and the watermark advanced on what the other host answered."""
    fill_store(tmp_path / "data", 20)
    elsewhere = ScriptedServer(stored)
    sink_server = ScriptedServer(redirect_to(elsewhere.url.replace("127.0.0.1", "localhost")))
    try:
        uploader = uploader_for(tmp_path / "data", HttpSink(sink_server.url + "/landing",
                                                            token="s3cret", timeout=5))
        with pytest.raises(SinkError, match="not the sink's host: refused"):
            uploader.once()
    finally:
        sink_server.close()
        elsewhere.close()
    assert elsewhere.requests == []
    assert uploader.reader.synced_seq() == 0
    assert "sync.redirect_hosts" in status_of(tmp_path / "data")["last_error"]


def test_a_redirect_to_a_listed_host_delivers_the_batch_without_the_token(tmp_path):
    """WebHDFS: the namenode hands a CREATE to a datanode with a 307."""
    seqs = fill_store(tmp_path / "data", 20)
    datanode = ScriptedServer(stored)
    namenode = ScriptedServer(redirect_to(datanode.url.replace("127.0.0.1", "localhost")))
    try:
        uploader = uploader_for(tmp_path / "data", HttpSink(
            namenode.url + "/landing", token="s3cret", timeout=5,
            redirect_hosts=("localhost",)))
        assert uploader.once() == len(seqs)
    finally:
        namenode.close()
        datanode.close()
    assert {auth for _, auth in namenode.requests} == {"Bearer s3cret"}
    assert datanode.requests and {auth for _, auth in datanode.requests} == {None}


def test_a_redirect_from_https_to_http_is_refused():
    sink = HttpSink("https://sink.example/landing/{name}", token="s3cret",
                    redirect_hosts=("sink.example",))
    with pytest.raises(SinkError, match="from https to http://sink.example/x: refused"):
        sink._follow("https://sink.example/landing/b1", "http://sink.example/x", "b1")


def upload_refused(tmp_path: Path, answer: Callable[[http.server.BaseHTTPRequestHandler], None],
                   timeout: float, refusal: str) -> tuple[Uploader, float]:
    """20 stored readings uploaded once to a sink whose every PUT ``answer`` answers, with
    [sync] timeout = ``timeout``: the SinkError matching ``refusal`` it ends in; (the
    uploader, the seconds its once() took)."""
    fill_store(tmp_path / "data", 20)
    server = ScriptedServer(answer)
    try:
        uploader = uploader_for(tmp_path / "data", HttpSink(server.url, timeout=timeout))
        started = time.monotonic()
        with pytest.raises(SinkError, match=refusal):
            uploader.once()
        return uploader, time.monotonic() - started
    finally:
        server.close()


def test_a_sink_answering_a_byte_at_a_time_is_cut_at_the_timeout(tmp_path):
    """The attack: a slow-drip answer held each PUT 40 s at timeout = 5 (a timeout per read)."""
    def drip(handler: http.server.BaseHTTPRequestHandler) -> None:
        with contextlib.suppress(OSError):
            for byte in b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n":
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(0.3)  # 44 bytes: 13 s in all

    uploader, took = upload_refused(tmp_path, drip, timeout=1, refusal="no answer within 1 s")
    assert took < 4, f"the PUT was held {took:.1f} s at timeout = 1"
    assert uploader.reader.synced_seq() == 0


def test_a_2xx_whose_head_never_ends_is_no_delivery(tmp_path):
    """The attack (N11): "HTTP/1.1 200 OK", then a header byte a second; the deadline cut
    the head, and what was read of it counted as a 2xx: the watermark moved."""
    def endless_head(handler: http.server.BaseHTTPRequestHandler) -> None:
        with contextlib.suppress(OSError):
            handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for byte in itertools.cycle(b"X-Slow: a"):
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(1)

    uploader, _ = upload_refused(tmp_path, endless_head, timeout=1,
                                 refusal="no answer within 1 s")
    assert uploader.reader.synced_seq() == 0


def test_a_2xx_whose_head_the_sink_cut_short_is_no_delivery(tmp_path):
    def torn(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 201 Created\r\nContent-Len")
        handler.close_connection = True

    uploader, _ = upload_refused(tmp_path, torn, timeout=5,
                                 refusal="ended in the middle of its head")
    assert uploader.reader.synced_seq() == 0


def test_the_sink_url_is_shown_and_logged_without_its_credentials(tmp_path, caplog):
    fill_store(tmp_path / "data", 20)
    server = ScriptedServer(lambda handler: handler.send_error(503, "busy"))
    url = server.url.replace("http://", "http://edge:pa55@") + "/landing?sig=abc123&x"
    try:
        uploader = uploader_for(tmp_path / "data", HttpSink(url, timeout=5))
        with pytest.raises(SinkError, match="503"):
            uploader.once()
    finally:
        server.close()
    status = status_of(tmp_path / "data")
    assert status["sink"] == server.url.replace("http://", "http://***@") + \
        "/landing?sig=***&x"
    text = json.dumps(status) + caplog.text
    assert "pa55" not in text and "abc123" not in text


async def test_the_router_status_shows_the_redacted_sink_to_any_caller(tmp_path):
    data_dir = tmp_path / "data"
    await _fill(data_dir / "cairn.db", 5, 0, 0)
    uploader = uploader_for(data_dir, HttpSink("https://edge:pa55@hdfs.example/in?token=abc123"))
    uploader._write_status(force=True)
    uploader.reader.close()
    node = await start_router(router_config(unix_path=tmp_path / "wamp.sock",
                                                  data_dir=data_dir))
    try:
        session = await connect(RunningRouter(node, str(tmp_path / "wamp.sock")))
        status = await session.call("cairn.router.status")
        await session.leave()
    finally:
        await node.stop()
    assert status["sync"]["sink"] == "https://***@hdfs.example/in?token=***"
    assert "pa55" not in json.dumps(status) and "abc123" not in json.dumps(status)
