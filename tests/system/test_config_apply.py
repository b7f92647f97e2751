"""Configuration that cannot lock you out: a real router process, real config files and
their history, ``cairn config`` as a subprocess, autobahn sessions over real sockets.

The router runs under the test's own supervisor (as systemd's Restart= would restart it):
``cairn config --service signal`` reloads it with SIGHUP and restarts it with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import SubscribeOptions

from cairn.app.config_cli import Step, Systemd, component_steps
from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.ops.config_history import (
    KEEP,
    Change,
    History,
    RunningConfig,
    read_running,
    write_request,
)
from harness.config import EVERYTHING, permission, role, router_table, user
from harness.process import RouterProcess, free_port, lan_address
from harness.wamp_client import connect

COMMAND = [sys.executable, "-m", "cairn.app.cli"]
ADMIN_SECRET = "admin-ticket-0123456789"
VIEWER_SECRET = "viewer-ticket-0123456789"
READER_SECRET = "reader-ticket-0123456789"
GET = "cairn.admin.config.get"
ADMIN_USER = user("admin", "admin", secret=ADMIN_SECRET)
ADMIN_ROLE = role("admin", permission("cairn.admin", ["call"]), permission("", EVERYTHING))


def realm(extra_roles: str = "", anonymous: bool = True) -> str:
    """realm1: anonymous sessions may do anything (as the device's "local" role), the admin
    user may call the cairn.admin procedures, the viewer has a catch-all of its own."""
    return ('\n[[realms]]\nname = "realm1"\n'
            + ('anonymous_role = "local"\n' if anonymous else "")
            + role("local", permission("", EVERYTHING))
            + ADMIN_ROLE
            + role("viewer", permission("", ["call", "subscribe"]))
            + extra_roles
            + ADMIN_USER
            + user("viewer", "viewer", secret=VIEWER_SECRET))


def config_text(tmp_path: Path, port: int, rawsocket: tuple[str, ...] = (),
                extra_roles: str = "", anonymous: bool = True) -> str:
    return router_table(tmp_path / "data", f"127.0.0.1:{port}", rawsocket) + \
        realm(extra_roles, anonymous)


def cairn(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout)


def config_cmd(file: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return cairn("config", "--config", str(file), "--service", "signal", "--timeout", "20",
                 *args, timeout=timeout)


class Supervised:
    """The router process, started again whenever it exits (systemd's Restart=)."""

    def __init__(self, file: Path, port: int) -> None:
        self.router = RouterProcess(file.parent, config=file)
        self.router.port = port  # waited for at each start
        self.file = file
        self._watch: asyncio.Task | None = None

    async def __aenter__(self) -> Supervised:
        await asyncio.to_thread(self.router.start)
        self._watch = asyncio.create_task(self._restart_when_it_exits())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._watch is not None
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch
        if self.router.proc.poll() is None:
            self.router.kill()

    async def _restart_when_it_exits(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            if self.router.proc.poll() is not None:
                with contextlib.suppress(RuntimeError):
                    await asyncio.to_thread(self.router.start)

    @property
    def address(self) -> SimpleNamespace:
        return SimpleNamespace(port=self.router.port, ws_url=self.router.ws_url)


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def held_port() -> socket.socket:
    """A port something else listens on: a router cannot bind it."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    return taken


async def admin(address: SimpleNamespace):
    return await connect(address, authmethods=["ticket"], authid="admin", secret=ADMIN_SECRET)


@pytest.fixture
def good(tmp_path: Path):
    """A good config file, already marked as the last good one, on a free port."""
    port = free_port()
    file = tmp_path / "cairn.toml"
    text = config_text(tmp_path, port)
    file.write_text(text)
    History(file).mark_good(text)
    return SimpleNamespace(file=file, port=port, text=text)


# -- starting on a bad file ----------------------------------------------------------------


async def test_bad_file_with_a_last_good_runs_on_the_last_good_and_says_why(good):
    good.file.write_text(good.text.replace('log_level = "info"', 'log_level = "loud"'))
    async with Supervised(good.file, good.port) as router:
        session = await connect(router.address)
        status = await session.call("cairn.router.status")
        await session.leave()
        assert status["config"]["running"] == "last-good"
        assert status["config"]["file"] == str(good.file)
        problem = status["config"]["problem"]
        assert str(good.file) in problem and "router.log_level" in problem
        assert "'loud'" in problem
        assert "cairn_config_fallback 1" in metrics(good.port)
        await router.router.wait_for_line(r"ERROR .*router\.log_level.*last good")


async def test_listener_the_host_cannot_bind_falls_back_in_process(good, tmp_path):
    # an address this host does not have: the file validates, the router cannot start on it
    bad = config_text(tmp_path, good.port, rawsocket=("10.254.254.254:9",), anonymous=False)
    good.file.write_text(bad)
    async with Supervised(good.file, good.port) as router:
        assert "cairn_config_fallback 1" in metrics(good.port)
        session = await admin(router.address)
        status = await session.call("cairn.router.status")
        await session.leave()
        assert status["config"]["running"] == "last-good"
        assert "cannot start on it" in status["config"]["problem"]
        assert "10.254.254.254" in status["config"]["problem"]
        assert router.router.proc.poll() is None
        assert len([line for line in router.router.log_lines() if "listening:" in line]) == 1


async def test_the_health_record_names_the_fallback(good):
    good.file.write_text(good.text.replace('log_level = "info"', 'log_level = "loud"'))
    async with Supervised(good.file, good.port) as router:
        session = await connect(router.address)
        records: list[dict] = []
        await session.subscribe(lambda **record: records.append(record), HEALTH_TOPIC,
                                options=SubscribeOptions(get_retained=True))
        for _ in range(100):
            if records:
                break
            await asyncio.sleep(0.05)
        await session.leave()
    assert records[-1]["config"]["running"] == "last-good"
    assert "router.log_level" in records[-1]["config"]["problem"]


async def test_sighup_with_a_bad_file_keeps_the_running_config_and_says_why(good):
    async with Supervised(good.file, good.port) as router:
        session = await connect(router.address)
        good.file.write_text(good.text + "\n[router.bogus]\n")
        router.router.proc.send_signal(signal.SIGHUP)
        await router.router.wait_for_line(r"SIGHUP: keeping the running config")
        config = (await session.call("cairn.router.status"))["config"]
        assert (config["running"], config["problem"]) == \
            ("file", f"{good.file}: router.bogus: unknown key (allowed here: "
                     f"{config['problem'].split('allowed here: ')[1]}")
        good.file.write_text(good.text)  # fixed: the next SIGHUP clears the problem
        router.router.proc.send_signal(signal.SIGHUP)
        await router.router.wait_for_line(r"SIGHUP: reloaded")
        assert (await session.call("cairn.router.status"))["config"]["problem"] is None
        assert session.is_attached()
        await session.leave()


async def test_sighup_takes_a_fixed_file_while_on_the_last_good(good):
    good.file.write_text(good.text.replace('log_level = "info"', 'log_level = "loud"'))
    async with Supervised(good.file, good.port) as router:
        session = await connect(router.address)
        good.file.write_text(good.text + role("operator", permission("app.", ["call"])))
        router.router.proc.send_signal(signal.SIGHUP)
        await router.router.wait_for_line(r"SIGHUP: reloaded")
        config = (await session.call("cairn.router.status"))["config"]
        await session.leave()
        assert "cairn_config_fallback 0" in metrics(good.port)
    assert (config["running"], config["problem"]) == ("file", None)


def test_without_a_last_good_a_bad_file_still_exits_2(tmp_path):
    file = tmp_path / "cairn.toml"
    file.write_text(config_text(tmp_path, free_port()).replace('"info"', '"loud"'))
    result = cairn("router", "--config", str(file), timeout=20)
    assert result.returncode == 2, result.stderr
    assert f"{file}: router.log_level:" in result.stderr


async def test_doctor_names_the_problem_while_on_the_last_good(good):
    good.file.write_text(good.text + "\n[router.bogus]\n")
    async with Supervised(good.file, good.port):
        result = await asyncio.to_thread(cairn, "doctor", "--config", str(good.file))
    assert result.returncode == 1
    assert "FAIL  config" in result.stdout and "router.bogus" in result.stdout
    assert "runs on the last good configuration" in result.stdout


# -- cairn config apply ---------------------------------------------------------------------


def test_apply_of_an_invalid_file_is_refused_and_nothing_changes(good, tmp_path):
    bad = tmp_path / "new.toml"
    bad.write_text(good.text.replace('name = "admin"', 'name = ""'))
    result = config_cmd(good.file, "apply", str(bad), "--by", "olga")
    assert result.returncode == 2, result.stderr
    assert f"{good.file}: realms[0].roles[1].name: missing" in result.stderr
    assert good.file.read_text() == good.text
    [change] = History(good.file).changes()
    assert (change.state, change.by, change.action) == ("refused", "olga", None)
    assert "realms[0].roles[1].name" in change.reason


BAD_SYNC = '\n[sync]\nsink = "http://127.0.0.1:9/landing/{name}"\ninterval = "soon"\n'


def test_apply_of_a_file_whose_sync_section_is_bad_is_refused_and_nothing_changes(good, tmp_path):
    """The router does not read [sync], but cairn-sync would not start on it: a change is
    checked whole."""
    bad = tmp_path / "new.toml"
    bad.write_text(good.text + BAD_SYNC)
    result = config_cmd(good.file, "apply", str(bad), "--by", "olga")
    assert result.returncode == 2, result.stderr
    assert f"{good.file}: sync.interval: must be a positive number" in result.stderr
    assert good.file.read_text() == good.text
    [change] = History(good.file).changes()
    assert (change.state, change.action) == ("refused", None) and "sync.interval" in change.reason


async def test_reload_only_change_is_applied_without_dropping_a_session(good, tmp_path):
    async with Supervised(good.file, good.port) as router:
        pid = router.router.pid
        session = await connect(router.address)
        new = tmp_path / "new.toml"
        new.write_text(config_text(tmp_path, good.port, extra_roles=role(
            "operator", permission("app.", ["call"]))))
        result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new))
        assert result.returncode == 0, result.stderr
        assert session.is_attached()
        assert (await session.call("cairn.router.status"))["config"]["running"] == "file"
        await session.leave()
        assert router.router.pid == pid
    [change] = History(good.file).changes()
    assert (change.state, change.action) == ("good", "reload")
    assert History(good.file).last_good_text() == new.read_text() == good.file.read_text()


async def test_restart_change_is_applied_by_a_restart_and_marked_good(good, tmp_path):
    new = tmp_path / "new.toml"
    new.write_text(good.text.replace('log_level = "info"',
                                     'log_level = "info"\nmax_message_size = 65536'))
    async with Supervised(good.file, good.port) as router:
        pid = router.router.pid
        result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new))
        assert result.returncode == 0, result.stderr
        assert router.router.pid != pid
        session = await connect(router.address)
        config = (await session.call("cairn.router.status"))["config"]
        await session.leave()
    assert (config["running"], config["problem"]) == ("file", None)
    [change] = History(good.file).changes()
    assert (change.state, change.action) == ("good", "restart")
    assert History(good.file).last_good_text() == new.read_text()


async def test_mark_good_does_not_wait_for_a_change_being_applied(good, tmp_path):
    """The router's own ExecStartPost marks its config good while `cairn config apply` may
    hold the history (it restarted that router and waits for it): it must not wait, or the
    restart never ends; the change being applied decides the last good one."""
    good.file.write_text(good.text + role("operator", permission("app.", ["call"])))
    async with Supervised(good.file, good.port):
        with History(good.file).locked():
            done = await asyncio.to_thread(config_cmd, good.file, "mark-good", timeout=20)
        assert done.returncode == 0, done.stderr
        assert "a change is being applied" in done.stdout + done.stderr
        assert History(good.file).last_good_text() == good.text
        done = await asyncio.to_thread(config_cmd, good.file, "mark-good")
        assert done.returncode == 0, done.stderr
    assert History(good.file).last_good_text() == good.file.read_text()


async def test_rollback_puts_the_last_good_back_and_restarts(good, tmp_path):
    good.file.write_text(good.text + role("operator", permission("app.", ["call"])))
    async with Supervised(good.file, good.port) as router:
        result = await asyncio.to_thread(config_cmd, good.file, "rollback")
        assert result.returncode == 0, result.stderr
        assert good.file.read_text() == good.text
        session = await connect(router.address)
        config = (await session.call("cairn.router.status"))["config"]
        await session.leave()
    assert config["sha256"] == History(good.file).last_good_info()["sha256"]
    [change] = History(good.file).changes()
    assert (change.state, change.source) == ("good", "cairn config rollback")


def driver_beside(file: Path, name: str, router: str, realm: str = "realm1") -> None:
    """sensors/NAME.toml beside the config file, as the image keeps the drivers' configs."""
    (file.parent / "sensors").mkdir(exist_ok=True)
    (file.parent / "sensors" / f"{name}.toml").write_text(
        f'[driver]\nrouter = "{router}"\nrealm = "{realm}"\n')


LOCKOUTS = {  # (issue 45, C3) what each does to a driver joining anonymously on the socket
    "the anonymous role dropped": lambda text: text.replace('anonymous_role = "local"\n', ""),
    "the realm renamed": lambda text: text.replace('name = "realm1"', 'name = "realm2"'),
    "the socket listener dropped": lambda text: text.replace('rawsocket = ["unix:', '# ["'),
}


async def rolled_back(file: Path, port: int, new_text: str):
    """The change of ``file`` to ``new_text``, applied, refused and rolled back."""
    text = file.read_text()
    new = file.with_name("new.toml")
    new.write_text(new_text)
    async with Supervised(file, port):
        result = await asyncio.to_thread(config_cmd, file, "apply", str(new))
        assert result.returncode == 1, result.stdout + result.stderr
        assert file.read_text() == text
    [change] = History(file).changes()
    assert change.state == "rolled_back", change
    return change


@pytest.mark.parametrize("lockout", LOCKOUTS)
async def test_a_change_a_driver_can_no_longer_join_on_is_rolled_back_naming_it(tmp_path,
                                                                               lockout):
    port, sock = free_port(), tmp_path / "wamp.sock"
    file = tmp_path / "cairn.toml"
    text = config_text(tmp_path, port, rawsocket=(f"unix:{sock}",))
    assert 'rawsocket = ["unix:' in text
    file.write_text(text)
    History(file).mark_good(text)
    driver_beside(file, "porch", f"rawsocket+unix:{sock}")
    change = await rolled_back(file, port, LOCKOUTS[lockout](text))
    assert f"sensors/porch.toml cannot join (rawsocket+unix:{sock}, realm realm1)" in \
        change.reason, change.reason


async def test_a_driver_that_could_not_join_before_the_change_does_not_hold_it_back(good,
                                                                                   tmp_path):
    driver_beside(good.file, "broken", f"ws://127.0.0.1:{good.port}/ws", realm="nowhere")
    new = tmp_path / "new.toml"
    new.write_text(good.text + role("operator", permission("app.", ["call"])))
    async with Supervised(good.file, good.port):
        result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new))
        assert result.returncode == 0, result.stdout + result.stderr
    [change] = History(good.file).changes()
    assert change.state == "good", change


# the dashboard's page joins anonymously or signs in by ticket: an admin by key alone cannot
KEY_ONLY_REALM = ('\n[[realms]]\nname = "realm1"\n' + ADMIN_ROLE
                  + user("admin", "admin", pubkeys=["ab" * 32]))


async def test_a_change_that_leaves_the_dashboard_no_way_in_is_rolled_back_naming_it(tmp_path):
    port = free_port()
    file = tmp_path / "cairn.toml"
    table = router_table(tmp_path / "data", f"127.0.0.1:{port}")
    text = table + KEY_ONLY_REALM.replace('name = "realm1"\n',
                                          'name = "realm1"\nanonymous_role = "admin"\n')
    file.write_text(text)
    History(file).mark_good(text)
    change = await rolled_back(file, port, table + KEY_ONLY_REALM)
    assert f"the dashboard (ws://127.0.0.1:{port}/ws) gets into none of the realms: realm1: " \
        "wamp.error.no_auth_method" in change.reason, change.reason
    assert "no user of the realm has a secret to sign in with by ticket" in change.reason


async def test_a_realm_without_anonymous_access_where_users_sign_in_keeps_the_dashboard(good,
                                                                                         tmp_path):
    new = tmp_path / "new.toml"
    new.write_text(config_text(tmp_path, good.port, anonymous=False))
    async with Supervised(good.file, good.port):
        result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new))
        assert result.returncode == 0, result.stdout + result.stderr
    [change] = History(good.file).changes()
    assert change.state == "good", change


async def test_renaming_the_dashboard_s_default_realm_is_kept_and_says_how_to_open_it(good,
                                                                                      tmp_path):
    new = tmp_path / "new.toml"
    new.write_text(good.text.replace('name = "realm1"', 'name = "site"'))
    async with Supervised(good.file, good.port):
        result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new))
        assert result.returncode == 0, result.stdout + result.stderr
    assert "realm realm1 is gone, which the dashboard opens unless told otherwise: open it " \
        "with ?realm=site" in result.stderr, result.stderr


async def test_restart_change_that_fails_is_rolled_back_with_the_reason(good, tmp_path):
    with held_port() as taken:
        port = taken.getsockname()[1]
        new = tmp_path / "new.toml"
        new.write_text(config_text(tmp_path, good.port, rawsocket=(f"127.0.0.1:{port}",)))
        async with Supervised(good.file, good.port) as router:
            result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new),
                                             "--by", "olga")
            assert result.returncode == 1, result.stderr
            assert good.file.read_text() == good.text
            session = await connect(router.address)
            status = await session.call("cairn.router.status")
            await session.leave()
    assert status["config"] == {**status["config"], "running": "file", "problem": None}
    [change] = History(good.file).changes()
    assert (change.state, change.action, change.by) == ("rolled_back", "restart", "olga")
    assert "address already in use" in change.reason and str(port) in change.reason


def test_history_keeps_the_last_ten_and_who_made_them(good):
    for i in range(KEEP + 2):
        History(good.file).record(f"# {i}\n{good.text}", f"user{i}", "test", "reload")
    changes = History(good.file).changes()
    assert len(changes) == KEEP
    assert [c.by for c in changes[:2]] == [f"user{KEEP + 1}", f"user{KEEP}"]
    assert History(good.file).text(changes[0].id).startswith(f"# {KEEP + 1}\n")
    assert len(list((good.file.parent / "config-history").glob("[0-9]*.toml"))) == KEEP
    listed = config_cmd(good.file, "history").stdout.splitlines()
    assert len(listed) == KEEP and f"user{KEEP + 1}" in listed[0]



# -- the other components follow --------------------------------------------------------------

SYNC = '\n[sync]\nsink = "dir:/var/lib/cairn-sink"\n'
UPDATE = '\n[update]\nsource = "https://updates.example/cairn/{gateway_id}/"\n'


async def apply_over(good, tmp_path: Path, before: str, after: str
                     ) -> tuple[subprocess.CompletedProcess, Change]:
    """``after`` applied over a router (and components) running ``before``, a good one."""
    good.file.write_text(before)
    History(good.file).mark_good(before)
    new = tmp_path / "new.toml"
    new.write_text(after)
    async with Supervised(good.file, good.port):
        result = await asyncio.to_thread(config_cmd, good.file, "apply", str(new))
    [change] = History(good.file).changes()
    return result, change


async def test_sync_section_added_starts_cairn_sync(good, tmp_path):
    result, change = await apply_over(good, tmp_path, good.text, good.text + SYNC)
    assert result.returncode == 0, result.stderr
    assert "cairn-sync.service to be started by its supervisor ([sync] added)" in \
        result.stderr
    assert (change.state, change.action) == \
        ("good", "reload; cairn-sync.service to be started by its supervisor")


async def test_sync_section_changed_restarts_cairn_sync(good, tmp_path):
    result, change = await apply_over(good, tmp_path, good.text + SYNC,
                                      good.text + SYNC.replace("cairn-sink", "other-sink"))
    assert result.returncode == 0, result.stderr
    assert "cairn-sync.service to be restarted by its supervisor ([sync] changed)" in \
        result.stderr
    assert change.action == "reload; cairn-sync.service to be restarted by its supervisor"


async def test_sync_section_removed_stops_cairn_sync(good, tmp_path):
    result, change = await apply_over(good, tmp_path, good.text + SYNC, good.text)
    assert result.returncode == 0, result.stderr
    assert "cairn-sync.service to be stopped by its supervisor ([sync] removed)" in \
        result.stderr
    assert change.action == "reload; cairn-sync.service to be stopped by its supervisor"


async def test_sync_section_unchanged_leaves_cairn_sync_alone(good, tmp_path):
    operator = role("operator", permission("app.", ["call"]))
    result, change = await apply_over(good, tmp_path, good.text + SYNC,
                                      good.text + operator + SYNC)
    assert result.returncode == 0, result.stderr
    assert "cairn-sync" not in result.stderr
    assert (change.state, change.action) == ("good", "reload")


async def test_update_section_changed_restarts_the_update_pull(good, tmp_path):
    result, change = await apply_over(good, tmp_path, good.text + UPDATE,
                                      good.text + UPDATE.replace("updates.", "mirror."))
    assert result.returncode == 0, result.stderr
    assert "cairn-update-pull.service to be restarted by its supervisor ([update] changed)" \
        in result.stderr
    assert change.action == \
        "reload; cairn-update-pull.service to be restarted by its supervisor"


async def test_no_component_follows_a_change_that_is_rolled_back(good, tmp_path):
    with held_port() as taken:
        failing = config_text(tmp_path, good.port,
                              rawsocket=(f"127.0.0.1:{taken.getsockname()[1]}",))
        result, change = await apply_over(good, tmp_path, good.text, failing + SYNC)
    assert result.returncode == 1, result.stderr
    assert "cairn-sync" not in result.stderr
    assert (change.state, change.action) == ("rolled_back", "restart")


async def test_rollback_command_brings_the_components_back_to_the_last_good(good):
    good.file.write_text(good.text + SYNC)  # by hand, not applied: the last good has no [sync]
    async with Supervised(good.file, good.port):
        result = await asyncio.to_thread(config_cmd, good.file, "rollback")
    assert result.returncode == 0, result.stderr
    assert "cairn-sync.service to be stopped by its supervisor ([sync] removed)" in \
        result.stderr
    [change] = History(good.file).changes()
    assert change.action == "restart; cairn-sync.service to be stopped by its supervisor"


def fake_systemctl(tmp_path: Path, monkeypatch, code: int) -> Path:
    """A systemctl on PATH that records its arguments (systemd is not what is tested)."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "systemctl"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                      f'[ {code} = 0 ] || echo "Unit $3 not found." >&2\nexit {code}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    return calls


def test_systemd_restarts_a_component_without_blocking(tmp_path, monkeypatch):
    calls = fake_systemctl(tmp_path, monkeypatch, 0)
    assert Systemd().component("restart", "cairn-sync.service") == \
        "restarted cairn-sync.service"
    assert calls.read_text() == "--no-block restart cairn-sync.service\n"


def test_systemd_says_when_a_component_could_not_be_started(tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, 5)
    assert Systemd().component("start", "cairn-update-pull.service") == \
        "cairn-update-pull.service not started: Unit cairn-update-pull.service not found."


def test_a_new_data_directory_restarts_sync_but_not_the_update_pull():
    old = {"router": {"data_dir": "/var/lib/cairn"}, "sync": {"sink": "dir:/x"},
           "update": {"source": "https://u.example/"}}
    new = {**old, "router": {"data_dir": "/data/cairn"}}
    assert component_steps(old, new) == \
        [Step("restart", "cairn-sync.service", "router.data_dir changed")]


def test_a_new_gateway_id_restarts_the_update_pull_too():
    old = {"sync": {"sink": "dir:/x"}, "update": {"source": "https://u.example/{gateway_id}/"}}
    new = {**old, "sync": {"sink": "dir:/x", "gateway_id": "site-7"}}
    assert component_steps(old, new) == [
        Step("restart", "cairn-sync.service", "[sync] changed"),
        Step("restart", "cairn-update-pull.service", "sync.gateway_id changed")]


# -- over WAMP --------------------------------------------------------------------------------


def shown(text: str) -> str:
    """``text`` as cairn.admin.config.get shows it: the users' secrets redacted."""
    for secret in (ADMIN_SECRET, VIEWER_SECRET, READER_SECRET):
        text = text.replace(f'"{secret}"', '"<redacted>"')
    return text


async def test_admin_gets_and_applies_over_wamp_and_the_pending_request_is_carried_out(good):
    operator = role("operator", permission("app.", ["call"]))
    async with Supervised(good.file, good.port) as router:
        session = await admin(router.address)
        got = await session.call("cairn.admin.config.get")
        assert (got["text"], got["running"], got["file"]) == \
            (shown(good.text), "file", str(good.file))
        answer = await session.call("cairn.admin.config.apply", got["text"] + operator)
        assert answer == {"request": 1, "state": "pending", "action": "reload"}
        queue = good.file.parent / "data" / "config-requests" / "queue"
        # the secrets get did not show are the file's, as they were
        assert json.loads((queue / "0001.json").read_text())["text"] == good.text + operator
        assert good.file.read_text() == good.text  # the router does not write the config
        result = await asyncio.to_thread(config_cmd, good.file, "apply", "--pending")
        assert result.returncode == 0, result.stderr
        got = await session.call("cairn.admin.config.get")
        await session.leave()
    assert good.file.read_text() == good.text + operator
    assert got["text"] == shown(good.text + operator) and got["requests"] == []
    change = got["changes"][0]
    assert (change["state"], change["request"], change["by"]) == \
        ("good", 1, "root for admin@realm1 over WAMP")


async def test_invalid_text_over_wamp_is_refused_naming_file_key_and_problem(good):
    async with Supervised(good.file, good.port) as router:
        session = await admin(router.address)
        with pytest.raises(ApplicationError) as refused:
            await session.call("cairn.admin.config.apply", good.text + "\n[sync]\n[sync]\n")
        await session.leave()
    assert refused.value.error == "cairn.error.invalid_config"
    assert refused.value.kwargs["file"] == str(good.file)
    assert "invalid TOML" in refused.value.kwargs["problem"]
    assert not (good.file.parent / "data" / "config-requests").exists()


async def test_a_bad_sync_section_over_wamp_is_refused_naming_its_key(good):
    async with Supervised(good.file, good.port) as router:
        session = await admin(router.address)
        with pytest.raises(ApplicationError) as refused:
            await session.call("cairn.admin.config.apply", good.text + BAD_SYNC)
        await session.leave()
    assert refused.value.error == "cairn.error.invalid_config"
    assert refused.value.kwargs["key"] == "sync.interval"
    assert not (good.file.parent / "data" / "config-requests").exists()


async def test_a_role_granted_only_get_reads_the_file_without_any_secret(tmp_path):
    port, file = free_port(), tmp_path / "cairn.toml"
    reader = role("reader", permission(GET, ["call"], match="exact")) + \
        user("reader", "reader", secret=READER_SECRET)
    file.write_text(config_text(tmp_path, port, extra_roles=reader))
    async with Supervised(file, port) as router:
        session = await connect(router.address, authmethods=["ticket"], authid="reader",
                                secret=READER_SECRET)
        got = await session.call(GET)
        with pytest.raises(ApplicationError) as refused:
            await session.call("cairn.admin.config.apply", got["text"])
        await session.leave()
    assert got["text"] == shown(file.read_text())
    assert not [s for s in (ADMIN_SECRET, VIEWER_SECRET, READER_SECRET) if s in got["text"]]
    assert refused.value.error == "wamp.error.not_authorized"


async def test_a_redacted_secret_the_file_does_not_have_is_refused_naming_its_key(good):
    newcomer = user("newcomer", "viewer", secret="<redacted>")
    async with Supervised(good.file, good.port) as router:
        session = await admin(router.address)
        got = await session.call(GET)
        with pytest.raises(ApplicationError) as refused:
            await session.call("cairn.admin.config.apply", got["text"] + newcomer)
        await session.leave()
    assert refused.value.error == "cairn.error.invalid_config"
    assert refused.value.kwargs["key"] == "realms[0].users[2].secret"
    assert not (good.file.parent / "data" / "config-requests").exists()


# a change after which the admin could not apply another, and what the error names
REQUESTER_LOCKOUTS = {
    "realm renamed": ('name = "realm1"', 'name = "realm2"', "realm 'realm1'"),
    "user removed": (ADMIN_USER, "", "no user 'admin'"),
    "ticket removed": (ADMIN_USER, user("admin", "admin", pubkeys=["ab" * 32]), "no secret"),
    "role without apply": (ADMIN_ROLE, role("admin", permission(GET, ["call"], match="exact"),
                                            permission("", EVERYTHING)), "role 'admin'"),
}


@pytest.mark.parametrize("change", REQUESTER_LOCKOUTS)
async def test_a_change_that_locks_its_requester_out_is_refused_naming_why(good, change):
    old, new, named = REQUESTER_LOCKOUTS[change]
    assert old in good.text
    async with Supervised(good.file, good.port) as router:
        session = await admin(router.address)
        with pytest.raises(ApplicationError) as refused:
            await session.call("cairn.admin.config.apply", good.text.replace(old, new))
        await session.leave()
    assert refused.value.error == "cairn.error.would_lock_out"
    assert named in refused.value.args[0] and "cairn config apply FILE" in refused.value.args[0]
    assert not (good.file.parent / "data" / "config-requests").exists()


async def test_a_change_that_leaves_no_listener_its_requester_reaches_is_refused(tmp_path):
    lan, port, file = lan_address(), free_port(), tmp_path / "cairn.toml"
    text = config_text(tmp_path, port, anonymous=False)
    everywhere = text.replace(f'"127.0.0.1:{port}"', f'"0.0.0.0:{port}"')
    assert everywhere != text
    file.write_text(everywhere)
    History(file).mark_good(everywhere)
    async with Supervised(file, port):
        session = await connect(SimpleNamespace(port=port, ws_url=f"ws://{lan}:{port}/ws"),
                                host=lan, authmethods=["ticket"], authid="admin",
                                secret=ADMIN_SECRET)
        with pytest.raises(ApplicationError) as refused:
            await session.call("cairn.admin.config.apply", text)  # loopback only
        await session.leave()
    assert refused.value.error == "cairn.error.would_lock_out"
    assert f"you came from tcp4:{lan}:" in refused.value.args[0]
    assert not (tmp_path / "data" / "config-requests").exists()


@pytest.mark.parametrize("who", ["anonymous", "viewer"])
async def test_sessions_without_an_admin_permission_are_refused(good, who):
    async with Supervised(good.file, good.port) as router:
        if who == "anonymous":  # its role's catch-all permission does not reach cairn.admin
            session = await connect(router.address)
        else:
            session = await connect(router.address, authmethods=["ticket"], authid="viewer",
                                    secret=VIEWER_SECRET)
        for procedure, args in (("cairn.admin.config.get", ()),
                                ("cairn.admin.config.apply", (good.text,))):
            with pytest.raises(ApplicationError) as refused:
                await session.call(procedure, *args)
            assert refused.value.error == "wamp.error.not_authorized"
        await session.leave()
    assert not (good.file.parent / "data" / "config-requests").exists()


def test_history_files_are_json_with_who_when_and_how(good):
    change = History(good.file).record(good.text, "root with cairn config apply", "file x",
                                       "restart")
    data = json.loads((good.file.parent / "config-history" / "0001.json").read_text())
    assert data["by"] == "root with cairn config apply" and data["action"] == "restart"
    assert data["state"] == "pending" and data["at"].endswith("Z")
    assert data["id"] == change.id == 1


# -- the queue as root takes it (what the router, user cairn, left for it) ---------------------

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"


def request_fields(number: int, text: str, by: str = "olga over WAMP") -> dict:
    return {"id": number, "by": by, "at": "2026-01-01T00:00:00.000Z", "action": "reload",
            "boot_id": None, "text": text}


def queue_of(good) -> Path:
    queue = good.file.parent / "data" / "config-requests" / "queue"
    queue.mkdir(parents=True, exist_ok=True)
    return queue


def refused_of(good) -> Path:
    return good.file.parent / "data" / "config-requests" / "refused"


def history_texts(good) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in (good.file.parent / "config-history").glob("0*"))


def test_a_request_left_as_a_symlink_to_a_root_file_is_refused_and_never_read(good, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$the-root-password-hash:19000::::::\n")
    secret.chmod(0o600)
    (queue_of(good) / "0002.json").symlink_to(secret)
    result = config_cmd(good.file, "apply", "--pending")
    assert result.returncode == 2, result.stderr
    assert "the-root-password-hash" not in history_texts(good)
    assert (refused_of(good) / "0002.json").is_symlink()
    assert "symbolic link" in (refused_of(good) / "0002.json.reason").read_text()
    assert secret.read_text().startswith("root:") and History(good.file).changes() == []


def fifo(path: Path) -> None:
    os.mkfifo(path)


BAD_ENTRIES = {
    "a link to /dev/zero": ("0003.json", lambda p: p.symlink_to("/dev/zero"), "symbolic link"),
    "a FIFO": ("0003.json", fifo, "FIFO"),
    "a name that is not NNNN.json": ("1.json", lambda p: p.write_text(json.dumps(
        request_fields(1, "x"))), "name"),
    "invalid JSON": ("0003.json", lambda p: p.write_text("{not json"), "not JSON"),
    "an extra key": ("0003.json", lambda p: p.write_text(json.dumps(
        {**request_fields(3, "x"), "extra": 1})), "keys"),
    "an id that is text": ("0003.json", lambda p: p.write_text(json.dumps(
        {**request_fields(3, "x"), "id": "7"})), "id '7'"),
    "a negative id": ("0003.json", lambda p: p.write_text(json.dumps(
        {**request_fields(3, "x"), "id": -1})), "id -1"),
    "an oversize file": ("0003.json", lambda p: p.write_bytes(b" " * (2 << 20)),
                         "larger than"),
    "a file of another user": ("0003.json", lambda p: (p.write_text(json.dumps(
        request_fields(3, "x"))), os.chown(p, 987, 987)), "owned by uid 987"),
}


@pytest.mark.parametrize("case", BAD_ENTRIES)
def test_an_entry_root_cannot_carry_out_leaves_the_queue_for_refused_with_a_reason(good, case):
    name, make, reason = BAD_ENTRIES[case]
    make(queue_of(good) / name)
    result = config_cmd(good.file, "apply", "--pending", timeout=30)
    assert result.returncode == 2, result.stderr
    assert list(queue_of(good).iterdir()) == []  # nothing left to start the path unit again
    assert os.path.lexists(refused_of(good) / name)
    assert reason in (refused_of(good) / f"{name}.reason").read_text()
    assert reason in result.stderr and History(good.file).changes() == []


def test_a_request_that_does_not_validate_goes_to_refused_with_the_reason(good):
    write_request(good.file.parent / "data", "[router\n", "olga over WAMP", "reload")
    result = config_cmd(good.file, "apply", "--pending")
    assert result.returncode == 2, result.stderr
    assert list(queue_of(good).iterdir()) == []
    assert "invalid TOML" in (refused_of(good) / "0001.json.reason").read_text()
    assert json.loads((refused_of(good) / "0001.json").read_text())["text"] == "[router\n"


def test_a_requests_author_is_its_files_owner_not_what_it_says(good):
    data = good.file.parent / "data"
    write_request(data, "[router\n", "olga over WAMP", "reload")
    os.chown(data, 987, 987)
    os.chown(queue_of(good) / "0001.json", 987, 987)
    assert config_cmd(good.file, "apply", "--pending").returncode == 2
    assert History(good.file).changes()[0].by == "uid 987 for olga over WAMP"


def test_every_entry_of_the_queue_leaves_it_in_one_run(good):
    data = good.file.parent / "data"
    (queue_of(good) / "0001.json").symlink_to("/dev/zero")
    write_request(data, "[router\n", "olga over WAMP", "reload")
    (queue_of(good) / "0003.json").write_text("{")
    result = config_cmd(good.file, "apply", "--pending")
    assert result.returncode == 2
    assert sorted(p.name for p in refused_of(good).iterdir() if p.suffix == ".json") == \
        ["0001.json", "0002.json", "0003.json"]
    assert list(queue_of(good).iterdir()) == []


def test_the_path_unit_starts_the_applier_on_a_queue_not_empty_not_on_a_file_left():
    unit = (SYSTEMD / "cairn-config-apply.path").read_text()
    assert "DirectoryNotEmpty=/var/lib/cairn/config-requests/queue\n" in unit
    assert "PathExistsGlob=" not in unit.replace("Not PathExistsGlob=", "")


def test_a_router_state_that_is_a_link_is_not_read(good, tmp_path):
    data = good.file.parent / "data"
    data.mkdir(exist_ok=True)
    real = tmp_path / "state.json"
    real.write_text(json.dumps({"file": str(good.file), "pid": os.getpid()}))
    (data / "config-state.json").symlink_to(real)
    assert read_running(data) is None
    (data / "config-state.json").unlink()
    real.rename(data / "config-state.json")
    assert read_running(data).pid == os.getpid()


# -- whom --service signal signals -------------------------------------------------------------

STRANGERS = {  # processes a config-state.json may name that are not the file's router
    "another-program": ["sleep", "60"],
    "python-but-not-cairn": [sys.executable, "-c", "import time; time.sleep(60)", "router",
                             "--config", "{file}"],
    # (a stand-in cairn.app.cli that sleeps: the command line is a router's)
    "the-router-of-another-file": [sys.executable, "-m", "cairn.app.cli", "router", "--config",
                                   "other.toml"],
}
REFUSALS = {"another-program": "its program is", "python-but-not-cairn": "it is not cairn router",
            "the-router-of-another-file": "it is the router of other.toml, not of"}


def sleeping_cairn(folder: Path) -> dict[str, str]:
    """An environment whose ``python -m cairn.app.cli`` only sleeps."""
    for package in ("cairn", "cairn/app"):
        (folder / package).mkdir(parents=True, exist_ok=True)
        (folder / package / "__init__.py").write_text("")
    (folder / "cairn/app/cli.py").write_text("import time\ntime.sleep(60)\n")
    return {**os.environ, "PYTHONPATH": str(folder)}


@pytest.mark.parametrize("stranger", STRANGERS)
def test_signal_mode_signals_only_the_router_of_the_file(good, tmp_path, stranger):
    """What the router's user wrote as its pid is a claim: root checks the process first."""
    command = [arg.format(file=good.file) for arg in STRANGERS[stranger]]
    process = subprocess.Popen(command, cwd=tmp_path, env=sleeping_cairn(tmp_path / "fake"))
    try:
        data = good.file.parent / "data"
        data.mkdir(exist_ok=True)
        RunningConfig(str(good.file), pid=process.pid).save(data)
        new = tmp_path / "new.toml"
        new.write_text(good.text + role("operator", permission("app.", ["call"])))
        result = config_cmd(good.file, "apply", str(new))
        alive = process.poll() is None
    finally:
        process.kill()
        process.wait()
    assert alive, "root signalled a process that is not the router"
    assert result.returncode == 1
    assert f"SIGHUP not sent to pid {process.pid}" in result.stderr
    assert REFUSALS[stranger] in result.stderr
    assert History(good.file).changes()[0].state == "rolled_back"
    assert good.file.read_text() == good.text
