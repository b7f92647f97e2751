"""Operations on a device, through the ``cairn`` command as an operator runs it: ``doctor``
on a healthy and on broken setups, ``backup`` while a router is under write load,
``restore`` (refused while the router runs), the data directory lock, refusing a store
written by a newer Cairn without touching it, and ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.server
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.core.session import Sequence
from cairn.gateway.ops import maintenance as ops
from cairn.gateway.shell.metrics import MessageCounters
from cairn.gateway.shell.metrics import render as render_metrics
from cairn.gateway.store import SCHEMA_VERSION, Store, StoredPublication
from harness.config import history_rule, open_realm
from harness.process import ROOT, RouterProcess, free_port
from harness.wamp_client import connect
from tests.system.test_sync import ScriptedServer

CAIRN = Path(sys.executable).with_name("cairn")
COMMAND = [str(CAIRN)] if CAIRN.exists() else [sys.executable, "-m", "cairn.app.cli"]

REALM = open_realm(history=[history_rule("sensor")])


def cairn(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def write_config(path: Path, data_dir: Path, extra: str = "") -> Path:
    path.write_text(f'[router]\nlisten = "127.0.0.1:{free_port()}"\ndata_dir = "{data_dir}"\n'
                    f"{REALM}\n{extra}")
    return path


def make_store(data_dir: Path, events: int = 500, note: int = 200) -> Path:
    """A store with ``events`` history rows, written through the Store API and closed
    (WAL checkpointed), as a router leaves it."""

    async def fill() -> None:
        store = await Store.open(data_dir / ops.DB_NAME)
        sequence = Sequence(store.next_seq, store.publication_ids)
        for _ in range(events):
            seq, publication = sequence.assign()
            store.append(StoredPublication(
                seq=seq, publication=publication, realm="realm1", topic=f"sensor.s{seq % 7}",
                args=[seq], kwargs={"temperature": 20.5, "note": "x" * note},
                wall_ms=1_700_000_000_000 + seq, boot_id="test", boottime_ns=seq,
                clock_synced=True, details={"topic": f"sensor.s{seq % 7}"}, history_rule=0,
                retain=True))
        await store.flush()
        await store.close()

    asyncio.run(fill())
    return data_dir / ops.DB_NAME


def workdir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def doctor_lines(output: str) -> dict[str, list[tuple[str, str]]]:
    """Report lines as {check: [(level, detail), ...]}."""
    checks: dict[str, list[tuple[str, str]]] = {}
    for line in output.splitlines():
        m = re.match(r"^(ok|warn|FAIL)\s{2,}(.+?)\s{2,}(.*)$", line)
        if m:
            checks.setdefault(m.group(2).strip(), []).append((m.group(1), m.group(3)))
    return checks


# -- doctor ----------------------------------------------------------------------------------


@pytest.fixture
def healthy(tmp_path: Path):
    """A working installation: config, a store, a serial port (a pty) and a sync sink."""
    data_dir = tmp_path / "data"
    make_store(data_dir)
    sink = tmp_path / "sink"
    sink.mkdir()
    main_fd, port_fd = os.openpty()
    port = os.ttyname(port_fd)
    config = write_config(
        tmp_path / "cairn.toml", data_dir,
        f'[[sensors]]\nid = "greenhouse-1"\nkind = "modbus"\nport = "{port}"\n\n'
        f'[sync]\nsink = "dir:{sink}"\n')
    yield config, data_dir, port, sink
    os.close(main_fd)
    os.close(port_fd)


def test_doctor_on_a_healthy_setup_exits_0_and_lists_every_check(healthy):
    config, data_dir, port, sink = healthy
    result = cairn("doctor", "--config", str(config))
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = doctor_lines(result.stdout)
    for name in ("config", "free space", "store", "serial device", "clock", "sync sink"):
        assert name in checks, f"doctor did not report {name!r}:\n{result.stdout}"
        assert all(level != "FAIL" for level, _ in checks[name])
    assert str(config) in checks["config"][0][1]
    assert "integrity ok" in checks["store"][0][1]
    assert port in checks["serial device"][0][1]
    assert str(sink) in checks["sync sink"][0][1]
    assert result.stdout.rstrip().endswith("cairn doctor: healthy")


def _bad_config(config: Path, data_dir: Path, port: str, sink: Path) -> str:
    config.write_text(config.read_text().replace('listen = "127.0.0.1:', 'listen = "nowhere'))
    return "router.listen"


def _corrupt_store(config: Path, data_dir: Path, port: str, sink: Path) -> str:
    """Garbage written into a copy of the store, over the pages after the header."""
    copy = data_dir.with_name("corrupt")
    shutil.copytree(data_dir, copy)
    db = copy / ops.DB_NAME
    with db.open("r+b") as f:
        f.seek(4096)
        f.write(os.urandom(4096 * 6))
    config.write_text(config.read_text().replace(f'data_dir = "{data_dir}"',
                                                 f'data_dir = "{copy}"'))
    return str(db)


def _missing_serial_device(config: Path, data_dir: Path, port: str, sink: Path) -> str:
    config.write_text(config.read_text().replace(port, "/dev/ttyUSB-cairn-unplugged"))
    return "/dev/ttyUSB-cairn-unplugged is missing"


def _unreachable_sink(config: Path, data_dir: Path, port: str, sink: Path) -> str:
    sink.rmdir()
    return f"{sink} is missing or not writable"


@pytest.mark.parametrize("breakage, check", [
    (_bad_config, "config"),
    (_corrupt_store, "store"),
    (_missing_serial_device, "serial device"),
    (_unreachable_sink, "sync sink"),
], ids=["bad-config", "corrupt-store", "missing-serial-device", "unreachable-sink"])
def test_doctor_on_a_broken_setup_exits_1_naming_the_problem(healthy, breakage, check):
    config, data_dir, port, sink = healthy
    expected = breakage(config, data_dir, port, sink)
    result = cairn("doctor", "--config", str(config))
    print(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [detail for level, detail in doctor_lines(result.stdout).get(check, [])
              if level == "FAIL"]
    assert failed, f"no FAIL line for {check!r}:\n{result.stdout}"
    assert any(expected in detail for detail in failed), failed
    assert re.search(r"cairn doctor: \d+ problem", result.stdout)


def test_doctor_fails_on_a_data_directory_on_a_read_only_filesystem(healthy, tmp_path):
    """What an SD card that has gone read-only looks like (root can write anywhere else)."""
    config, data_dir, port, sink = healthy
    readonly = tmp_path / "ro"
    readonly.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(readonly)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if os.geteuid() == 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        readonly.chmod(0o555)  # not root: permissions are enough
    try:
        config.write_text(config.read_text().replace(f'data_dir = "{data_dir}"',
                                                     f'data_dir = "{readonly}"'))
        result = cairn("doctor", "--config", str(config))
    finally:
        subprocess.run(["umount", "-l", str(readonly)], capture_output=True, check=False)
    print(result.stdout)
    assert result.returncode == 1, result.stdout
    failed = [d for level, d in doctor_lines(result.stdout).get("data directory", [])
              if level == "FAIL"]
    assert failed and f"{readonly} is not writable" in failed[0], result.stdout


def test_doctor_reports_an_unreachable_http_sink_without_failing(healthy):
    """Off-grid, an unreachable uplink is the normal case: the batches wait on the card.
    The doctor names it (a warning) but does not call the device broken for it."""
    config, data_dir, port, sink = healthy
    url = f"http://127.0.0.1:{free_port()}/cairn/{{name}}"
    config.write_text(config.read_text().replace(f'sink = "dir:{sink}"', f'sink = "{url}"'))
    result = cairn("doctor", "--config", str(config))
    print(result.stdout)
    warned = [d for level, d in doctor_lines(result.stdout).get("sync sink", [])
              if level == "warn"]
    assert warned and "unreachable" in warned[0], result.stdout
    assert result.returncode == 0


def endless_head(handler: http.server.BaseHTTPRequestHandler) -> None:
    """"HTTP/1.1 200 OK", then a header byte a second, never done."""
    with contextlib.suppress(OSError):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        while True:
            handler.wfile.write(b"X")
            handler.wfile.flush()
            time.sleep(1)


def endless_headers(handler: http.server.BaseHTTPRequestHandler) -> None:
    with contextlib.suppress(OSError):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 10_000)


def redirect_loop(handler: http.server.BaseHTTPRequestHandler) -> None:
    handler.send_response(302)
    handler.send_header("Location", handler.path + "x")
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def web_page(handler: http.server.BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html; charset=utf-8")
    handler.send_header("Content-Length", "1000")
    handler.end_headers()


@pytest.mark.parametrize("answer, expected", [
    (endless_head, "gave no whole answer within 5 s"),
    (endless_headers, "answers, but not as an HTTP server"),
    (redirect_loop, "answers with a redirect (HTTP 302 to "),
    (web_page, "answers with a web page (HTTP 200, text/html)"),
], ids=["head-a-byte-a-second", "endless-headers", "redirect-loop", "html-page"])
def test_doctor_names_a_hostile_sink_within_seconds(healthy, answer, expected):
    """Before: the byte-a-second head held the doctor forever, endless headers crashed it
    (exit 1, a traceback), and a redirect loop or a login page was "ok ... answers"."""
    config, data_dir, port, sink = healthy
    server = ScriptedServer(answer)
    try:
        config.write_text(config.read_text().replace(f'sink = "dir:{sink}"',
                                                     f'sink = "{server.url}/cairn/{{name}}"'))
        started = time.monotonic()
        result = cairn("doctor", "--config", str(config), timeout=30)
    finally:
        server.close()
    assert time.monotonic() - started < 15, result.stdout
    warned = [d for level, d in doctor_lines(result.stdout).get("sync sink", [])
              if level == "warn"]
    assert warned and expected in warned[0], result.stdout + result.stderr
    assert result.returncode == 0


# -- backup and restore ------------------------------------------------------------------------


async def _preload(router: RouterProcess, events: int) -> None:
    """Enough history that the online backup takes several steps."""
    session = await connect(router, "rawsocket-tcp", "msgpack")
    for i in range(events):
        session.publish(f"sensor.pre{i % 50}", i, "x" * 300)
        if i % 2000 == 1999:
            await session.publish("sensor.pre", i, options=PublishOptions(acknowledge=True))
    await session.publish("sensor.pre", -1, options=PublishOptions(acknowledge=True))
    await session.leave()


@pytest.mark.slow
async def test_backup_under_write_load_restores_to_a_consistent_store(tmp_path):
    # 20,000 publications preloaded from one session
    router = RouterProcess(workdir(tmp_path, "live"), REALM).start()
    acked: list[int] = []
    stop = asyncio.Event()

    async def publisher(k: int) -> None:
        session = await connect(router, "rawsocket-tcp", "msgpack")
        i = 0
        while not stop.is_set():
            pub = await session.publish(f"sensor.live{k}", i, options=PublishOptions(
                acknowledge=True, retain=True))
            acked.append(pub.id)
            i += 1
        await session.leave()

    backup_file = tmp_path / "backups" / "cairn.db"
    try:
        await _preload(router, 20_000)
        publishers = [asyncio.create_task(publisher(k)) for k in range(4)]
        await asyncio.sleep(0.5)
        acked_before = set(acked)
        proc = await asyncio.create_subprocess_exec(
            *COMMAND, "backup", "--config", str(router.config), str(backup_file),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        during = len(acked) - len(acked_before)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*publishers), 10)
    finally:
        router.stop()
    print(out.decode(), err.decode(), f"{during} publications acknowledged during the backup")
    assert proc.returncode == 0, err.decode()
    assert during > 0, "the load did not overlap the backup"
    assert len(acked_before) > 50

    with contextlib.closing(sqlite3.connect(f"file:{backup_file}?mode=ro", uri=True)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # one file
        stored = {row[0] for row in db.execute("SELECT publication FROM publications")}
        (last_seq,) = db.execute("SELECT MAX(seq) FROM publications").fetchone()
    missing = acked_before - stored
    assert not missing, f"{len(missing)} publications acknowledged before the backup started " \
                        f"are not in it"

    # restore into a fresh data directory, and a router runs on it
    restored = RouterProcess(workdir(tmp_path, "restored"), REALM)
    result = cairn("restore", "--config", str(restored.config), str(backup_file))
    assert result.returncode == 0, result.stderr
    restored.start()
    try:
        session = await connect(restored)
        sub_id = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        page = await session.call("wamp.subscription.get_events", sub_id, reverse=True,
                                  limit=1)
        newest = page.results[0][0]["publication"]
        assert newest in stored
        fresh = await session.publish("sensor.after", 1, options=PublishOptions(
            acknowledge=True))
        await session.leave()
    finally:
        restored.stop()
    with contextlib.closing(sqlite3.connect(restored.db_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        (seq,) = db.execute("SELECT seq FROM publications WHERE publication = ?",
                            (fresh.id,)).fetchone()
    assert seq > last_seq, "seq must carry on after the restored history, never repeat"


def test_backup_is_not_restarted_by_commits_between_its_steps(tmp_path, monkeypatch):
    """SQLite's online backup copies in steps and starts again from the first page whenever
    another connection commits between two steps. The router commits every few milliseconds
    under load (group commit), so a backup taken in steps of a store larger than one step
    never finishes on a Pi. Here a commit lands between every two steps."""
    data_dir = tmp_path / "data"
    db_path = make_store(data_dir, events=12_000, note=800)
    pages = sqlite3.connect(db_path).execute("PRAGMA page_count").fetchone()[0]
    writer = sqlite3.connect(db_path, isolation_level=None)
    calls = {"steps": 0}
    real_connect = sqlite3.connect

    class Interfering(sqlite3.Connection):
        def backup(self, target, *, pages=-1, progress=None, name="main", sleep=0.25):
            def step(status, remaining, total):
                calls["steps"] += 1
                if calls["steps"] > 500:
                    raise RuntimeError("the backup keeps starting over")
                writer.execute("UPDATE meta SET value = value WHERE key = 'highest_seq'")
                writer.execute("INSERT INTO gaps (count, reason, wall_ms) VALUES (0, 'x', 0)")
                if progress is not None:
                    progress(status, remaining, total)
            return super().backup(target, pages=pages, progress=step, name=name, sleep=sleep)

    def connect(*args, **kwargs):
        return real_connect(*args, factory=Interfering, **kwargs)

    assert pages > 2048, "the store must be larger than a couple of backup steps"
    monkeypatch.setattr(ops.sqlite3, "connect", connect)
    try:
        result = ops.backup(data_dir, tmp_path / "copy.db")
    finally:
        writer.close()
    assert result["events"] == 12_000
    assert calls["steps"] <= pages // 1024 + 2, f"{calls['steps']} steps for {pages} pages"


@pytest.mark.slow
async def test_restore_is_refused_while_the_router_runs_and_works_once_it_stopped(tmp_path):
    router = RouterProcess(workdir(tmp_path, "r"), REALM).start()
    backup_file = tmp_path / "b.db"
    try:
        session = await connect(router)
        before = await session.publish("sensor.t", 1, options=PublishOptions(acknowledge=True))
        assert cairn("backup", "--config", str(router.config),
                     str(backup_file)).returncode == 0
        after = await session.publish("sensor.t", 2, options=PublishOptions(acknowledge=True))
        await session.leave()
        digest = hashlib.sha256(router.db_path.read_bytes()).hexdigest()

        refused = cairn("restore", "--config", str(router.config), str(backup_file))
        assert refused.returncode == 1
        assert "in use by a running router" in refused.stderr, refused.stderr
        assert router.proc.poll() is None, "the running router was disturbed"
        assert hashlib.sha256(router.db_path.read_bytes()).hexdigest() == digest
    finally:
        assert router.stop() == 0

    done = cairn("restore", "--config", str(router.config), str(backup_file))
    assert done.returncode == 0, done.stderr
    router.start()
    try:
        session = await connect(router)
        sub_id = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        page = await session.call("wamp.subscription.get_events", sub_id)
        publications = [e["publication"] for e in page.results[0]]
        await session.leave()
    finally:
        router.stop()
    assert before.id in publications and after.id not in publications


def test_restore_refuses_a_damaged_backup_and_leaves_the_store_alone(tmp_path):
    data_dir = tmp_path / "data"
    db_path = make_store(data_dir)
    digest = hashlib.sha256(db_path.read_bytes()).hexdigest()
    damaged = tmp_path / "damaged.db"
    shutil.copyfile(db_path, damaged)
    with damaged.open("r+b") as f:
        f.seek(4096)
        f.write(os.urandom(4096 * 4))
    config = write_config(tmp_path / "cairn.toml", data_dir)
    result = cairn("restore", "--config", str(config), str(damaged))
    assert result.returncode == 1
    assert "malformed" in result.stderr or "damaged" in result.stderr, result.stderr
    assert hashlib.sha256(db_path.read_bytes()).hexdigest() == digest


@pytest.mark.slow
def test_a_second_router_on_the_same_data_directory_exits_1_with_a_clear_message(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        second = cairn("router", "--config", str(router.config), timeout=30)
        assert second.returncode == 1
        assert f"{router.data_dir} is in use by a running router" in second.stderr, \
            second.stderr
        assert router.proc.poll() is None
        with urllib.request.urlopen(f"http://127.0.0.1:{router.port}/status", timeout=5) as r:
            assert r.status == 200
    finally:
        assert router.stop() == 0


# -- upgrade and downgrade -----------------------------------------------------------------------


@pytest.mark.parametrize("journal_mode", ["wal", "delete"],
                         ids=["as-the-router-leaves-it", "as-a-backup-restores-it"])
def test_a_store_from_a_newer_cairn_is_refused_and_left_byte_for_byte(tmp_path, journal_mode):
    data_dir = tmp_path / "data"
    db_path = make_store(data_dir)
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        db.execute(f"PRAGMA journal_mode = {journal_mode}")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.commit()
    before = db_path.read_bytes()
    config = write_config(tmp_path / "cairn.toml", data_dir)
    started = time.monotonic()
    result = cairn("router", "--config", str(config), timeout=30)
    print(result.stderr)
    assert result.returncode == 1
    assert time.monotonic() - started < 20
    message = result.stderr
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "newer" in message and str(db_path) in message
    assert db_path.read_bytes() == before, "the refused store was modified"


def test_a_store_at_the_current_schema_opens_and_keeps_its_version(tmp_path):
    db_path = make_store(tmp_path / "data")
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        (count,) = db.execute("SELECT COUNT(*) FROM publications").fetchone()
    assert count == 500


# -- /metrics ----------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                     r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})? '
                     r'(-?[0-9.e+-]+|NaN|\+Inf|-Inf)$')


def parse_prometheus(text: str) -> dict[str, dict]:
    """Strict parse of the text exposition format 0.0.4: every family has HELP and TYPE
    before its samples, samples belong to the family announced last."""
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in families, f"{name} announced twice"
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name == current, f"TYPE for {name} without its HELP"
            assert kind in ("counter", "gauge", "summary", "histogram", "untyped"), line
            families[name]["type"] = kind
        elif line.startswith("#"):
            continue
        else:
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name = m.group(1)
            assert current is not None and name.startswith(current), \
                f"{name} outside its family ({current})"
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                     m.group(3) or ""))
            families[current]["samples"].append((name, labels, float(m.group(4))))
    return families


def _context_switches(pid: int) -> int:
    """How often any thread of the process has given up or lost the CPU so far."""
    return sum(int(line.split()[1])
               for task in Path(f"/proc/{pid}/task").iterdir()
               for line in (task / "status").read_text().splitlines()
               if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))


def _stored_rows(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT count(*) FROM publications WHERE topic != ?",
                            (HEALTH_TOPIC,)).fetchone()[0]  # not the router's own


@pytest.mark.slow
async def test_an_unacknowledged_publication_is_committed_without_anyone_asking(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        publisher = await connect(router, "rawsocket-tcp", "msgpack")
        publisher.publish("sensor.t", 1)
        deadline = time.monotonic() + 5
        while _stored_rows(router.db_path) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert _stored_rows(router.db_path) == 1
        await publisher.leave()
    finally:
        router.stop()


@pytest.mark.slow
async def test_an_idle_router_sleeps(tmp_path):
    """Nothing connected and nothing to write: no timer may wake the device (power)."""
    router = RouterProcess(tmp_path, REALM).start()
    try:
        publisher = await connect(router, "rawsocket-tcp", "msgpack")
        await publisher.publish("sensor.t", 1, options=PublishOptions(acknowledge=True))
        publisher.publish("sensor.t", 2)  # left for the batch timer to commit
        await publisher.leave()
        await asyncio.sleep(0.5)
        before = _context_switches(router.proc.pid)
        await asyncio.sleep(3)
        woke = _context_switches(router.proc.pid) - before
    finally:
        assert router.stop() == 0
    assert woke <= 2, f"the idle router woke up {woke} times in 3 s"


@pytest.mark.slow
def test_commit_latency_quantiles_are_nearest_rank_of_the_sorted_latencies():
    """They were read off the unsorted list of recent commits: the 'p99' was whichever
    commit happened to sit at that index."""
    text = render_metrics({}, MessageCounters(), [0.9, 0.1, 0.5, 0.3])
    assert 'cairn_group_commit_seconds{quantile="0.5"} 0.3' in text.splitlines()
    assert 'cairn_group_commit_seconds{quantile="0.99"} 0.9' in text.splitlines()


async def test_metrics_answer_in_prometheus_text_format_with_the_documented_metrics(tmp_path):
    sink = tmp_path / "sink"
    sink.mkdir()
    router = RouterProcess(tmp_path, REALM).start()
    router.config.write_text(router.config.read_text() + f'\n[sync]\nsink = "dir:{sink}"\n'
                                                          f'gateway_id = "test-gw"\n')
    try:
        subscriber = await connect(router)
        await subscriber.subscribe(lambda *a, **k: None, "sensor", options=SubscribeOptions(
            match="prefix"))
        publisher = await connect(router, "rawsocket-tcp", "msgpack")
        for i in range(20):
            await publisher.publish(f"sensor.m{i % 3}", i, options=PublishOptions(
                acknowledge=True, retain=True))
        synced = cairn("sync", "--config", str(router.config), "--once")
        assert synced.returncode == 0, synced.stderr
        await publisher.publish("sensor.m0", 99, options=PublishOptions(acknowledge=True))
        with urllib.request.urlopen(f"http://127.0.0.1:{router.port}/metrics", timeout=5) as r:
            content_type = r.headers["Content-Type"]
            text = r.read().decode()
        await publisher.leave()
        await subscriber.leave()
    finally:
        router.stop()
    print(text)
    assert content_type.startswith("text/plain; version=0.0.4")
    families = parse_prometheus(text)

    def value(name: str, family: str | None = None, **labels: str) -> float:
        for sample_name, sample_labels, v in families[family or name]["samples"]:
            if sample_name == name and sample_labels == labels:
                return v
        raise AssertionError(f"no sample {name}{labels} in:\n{text}")

    documented = {
        "cairn_sessions": "gauge", "cairn_messages_received_total": "counter",
        "cairn_messages_sent_total": "counter", "cairn_slow_consumer_disconnects_total": "counter",
        "cairn_store_bytes": "gauge", "cairn_history_events": "gauge",
        "cairn_history_first_seq": "gauge", "cairn_history_last_seq": "gauge",
        "cairn_group_commit_seconds": "summary", "cairn_sync_backlog_events": "gauge",
        "cairn_sync_synced_seq": "gauge", "cairn_sync_ok": "gauge",
        "cairn_clock_synchronized": "gauge", "cairn_clock_steps_total": "counter",
    }
    for name, kind in documented.items():
        assert name in families, f"{name} missing"
        assert families[name]["type"] == kind, (name, families[name]["type"])
    assert value("cairn_sessions", realm="realm1") == 2
    assert value("cairn_messages_received_total", type="PUBLISH") == 21
    assert value("cairn_messages_sent_total", type="PUBLISHED") == 21
    assert value("cairn_messages_sent_total", type="EVENT") == 21
    assert value("cairn_messages_received_total", type="HELLO") == 2
    assert value("cairn_slow_consumer_disconnects_total") == 0
    assert value("cairn_store_bytes") > 0
    assert value("cairn_history_events") == 21 + 1  # and the router's health record
    assert value("cairn_history_last_seq") - value("cairn_history_first_seq") == 21
    assert value("cairn_group_commit_seconds_count", "cairn_group_commit_seconds") > 0
    assert 0 <= value("cairn_group_commit_seconds", quantile="0.99") < 5
    assert value("cairn_sync_synced_seq") == value("cairn_history_last_seq") - 1
    assert value("cairn_sync_backlog_events") == 0  # as of the sync run
    assert value("cairn_sync_ok") == 1
    assert value("cairn_clock_synchronized") in (0, 1)
    assert value("cairn_clock_steps_total") == 0
