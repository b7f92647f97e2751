"""The ``cairn`` console script, run as a subprocess: help, exit codes, config errors, and a
real router that logs one line per event and says GOODBYE to its clients on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config import open_realm, router_table
from harness.process import RouterProcess
from harness.wamp_client import connect

CAIRN = Path(sys.executable).with_name("cairn")
COMMAND = [str(CAIRN)] if CAIRN.exists() else [sys.executable, "-m", "cairn.app.cli"]
LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")

def write_config(tmp_path: Path, port: int = 0, rawsocket: tuple[str, ...] = (),
                 name: str = "cairn.toml") -> Path:
    path = tmp_path / name
    path.write_text(router_table(tmp_path / "data", f"127.0.0.1:{port}", rawsocket)
                    + open_realm())
    return path


def cairn(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``cairn ARGS`` to its end (a generous deadline: it returns when the command does, and
    a loaded machine took over 10 s to start one)."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def test_help_describes_the_commands():
    result = cairn("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: cairn")
    for word in ("router", "check-config", "WAMP router"):
        assert word in result.stdout


def test_version_names_the_installed_distribution():
    from importlib import metadata

    result = cairn("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"cairn {metadata.version('cairn')}"


def test_router_help_describes_its_options():
    result = cairn("router", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: cairn router")
    for word in ("--config FILE", "TOML config file", "--log-level", "debug,info,warning,error",
                 "ws://127.0.0.1:8080/ws", "realm1"):
        assert word in result.stdout, word


def test_check_config_help():
    result = cairn("check-config", "--help")
    assert result.returncode == 0
    assert "exit 0 if it is good" in result.stdout


def test_no_command_is_a_usage_error():
    result = cairn()
    assert result.returncode == 2
    assert result.stdout == ""
    assert "usage: cairn" in result.stderr and "router" in result.stderr


def test_unknown_command_is_a_usage_error():
    result = cairn("serve")
    assert result.returncode == 2
    assert "invalid choice: 'serve'" in result.stderr


def test_router_with_a_bad_config_exits_2_naming_file_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(write_config(tmp_path).read_text().replace('"127.0.0.1:0"', "8080"))
    result = cairn("router", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"cairn: bad config: {bad}: router.listen: expected a string, got int 8080")
    assert not (tmp_path / "data").exists(), "a bad config must not touch the data dir"


def test_router_with_a_missing_config_exits_2(tmp_path):
    result = cairn("router", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert f"{tmp_path / 'nope.toml'}: -: cannot read file" in result.stderr


def test_check_config_accepts_a_good_file(tmp_path):
    good = write_config(tmp_path, name="good.toml")
    result = cairn("check-config", str(good))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{good}: ok (1 realm(s))"


def test_check_config_without_a_file_checks_the_embedded_default():
    result = cairn("check-config")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "<embedded default>: ok (1 realm(s))"


def test_check_config_rejects_a_bad_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(write_config(tmp_path).read_text().replace('match = "prefix"',
                                                              'match = "glob"'))
    result = cairn("check-config", str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"{bad}: realms[0].roles[0].permissions[0].match: must be exact, prefix or " \
           f"wildcard, not 'glob'" in result.stderr


def test_check_config_checks_the_sections_sync_and_update_read(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(write_config(tmp_path).read_text()
                   + '\n[update]\nsource = "ftp://updates.example/"\n')
    result = cairn("check-config", str(bad))
    assert result.returncode == 2
    assert f"{bad}: update.source:" in result.stderr, result.stderr


# -- a real router process -----------------------------------------------------------------


@pytest.fixture
def start_router():
    started: list[RouterProcess] = []

    async def start(config: Path) -> RouterProcess:
        started.append(RouterProcess(config.parent, command=COMMAND, config=config).start())
        return started[-1]

    yield start
    for router in started:
        if router.proc.poll() is None:
            router.kill()


async def test_router_serves_logs_and_says_goodbye_on_sigterm(tmp_path, start_router):
    unix_path = tmp_path / "wamp.sock"
    router = await start_router(write_config(tmp_path, rawsocket=(f"unix:{unix_path}",)))
    found = await router.wait_for_line(r"listening: ws://127\.0\.0\.1:(\d+)/ws ")
    port = int(found.group(1))
    address = SimpleNamespace(port=port, ws_url=f"ws://127.0.0.1:{port}/ws",
                              unix_path=str(unix_path))

    ws = await connect(address, "websocket", "json")
    raw = await connect(address, "rawsocket-unix", "msgpack")
    got = asyncio.get_running_loop().create_future()
    await raw.subscribe(lambda x: got.set_result(x), "com.cli.topic")
    await raw.register(lambda a, b: a * b, "com.cli.mul")
    ws.publish("com.cli.topic", "hello")
    assert await asyncio.wait_for(got, 2) == "hello"
    assert await ws.call("com.cli.mul", 6, 7) == 42
    await router.wait_for_line(rf"session {ws.session_id} joined realm realm1")

    sent = time.monotonic()
    router.proc.send_signal(signal.SIGTERM)
    for session in (ws, raw):
        details = await asyncio.wait_for(session.left, 3)
        assert details.reason == "wamp.close.system_shutdown"
    assert await router.finish(timeout=3 - (time.monotonic() - sent)) == 0
    assert time.monotonic() - sent < 3

    assert router.stdout_path.read_bytes() == b""
    lines = router.log_lines()
    assert lines, "the router logged nothing"
    for line in lines:
        assert LOG_LINE.match(line), f"not a one-line log record: {line!r}"
    text = "\n".join(lines)
    assert "Traceback" not in text
    assert re.search(r"stopping: saying GOODBYE to 2 sessions", text)
    assert lines[-1].endswith("stopped")
    assert not unix_path.exists(), "the Unix socket is left behind"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_right_after_listening_stops_cleanly(tmp_path, start_router, sig):
    """The signal handlers are in place before "listening" is logged (they used to be set up
    after: a signal in between killed the router, or was lost when SIGINT was ignored)."""
    router = await start_router(write_config(tmp_path))
    await router.wait_for_line(r"listening: ")
    router.proc.send_signal(sig)
    assert await router.finish(timeout=3) == 0
    assert "stopping: saying GOODBYE to 0 sessions" in "\n".join(router.log_lines())


@pytest.mark.parametrize("which", ["listen", "rawsocket"])
def test_port_in_use_exits_1_with_a_clear_message(tmp_path, which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if which == "listen":
            config = write_config(tmp_path, port=port)
        else:
            config = write_config(tmp_path, rawsocket=(f"127.0.0.1:{port}",))
        result = cairn("router", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(error) == 1, result.stderr
    assert "cannot start" in error[0]
    assert "address already in use" in error[0]
    assert str(port) in error[0]


def test_data_dir_that_cannot_be_created_exits_1(tmp_path):
    (tmp_path / "afile").write_text("")
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace(str(tmp_path / "data"),
                                                 str(tmp_path / "afile" / "data")))
    result = cairn("router", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"^ERROR cairn: cannot start: .*afile", result.stderr, re.MULTILINE)
