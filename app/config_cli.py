"""``cairn config``: change the router's configuration without locking yourself out.

``apply`` validates a file (a bad one is refused: exit 2, nothing written), records it in the
history beside the config file (gateway.ops.config_history), writes it, has the router reload
(users, roles, permissions and the reloadable [router] keys changed) or restart (anything
else), and waits, bounded, until the router is ready on it. If it is not, the last good
configuration is put back and the router restarted on it: the change is recorded as rolled
back, with the router's own reason when it gave one (exit 1). Once the router is ready, the
other components whose sections changed follow (:data:`COMPONENTS`: cairn-sync is started,
restarted or stopped), and the change's action names them. ``apply --pending`` carries out
the requests the router took over WAMP (``cairn.admin.config.apply``): run as root by the
image's path unit when one appears, by hand elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from cairn.app import config_gate
from cairn.app.sections import check_whole
from cairn.base.console import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from cairn.drivers.config import DriverConfig
from cairn.gateway.core.config import Config, ConfigError, load, restart_needed
from cairn.gateway.ops.config_history import (
    Change,
    History,
    Queue,
    RunningConfig,
    atomic_write,
    digest,
    read_running,
)
from cairn.gateway.ops.maintenance import pid_alive, read_metrics
from cairn.gateway.shell.config_admin import validate

DEFAULT_CONFIG = "/etc/cairn/cairn.toml"
READY_TIMEOUT = 90.0  # s the router has to come back ready on a change
UNIT = "cairn-router.service"
DONE = {"start": "started", "restart": "restarted", "stop": "stopped"}


@dataclass(frozen=True)
class Component:
    """A process other than the router that reads its own section of the config file once,
    at its start: it runs while the section is there, and a change reaches it by a restart."""

    unit: str
    section: str
    also: tuple[tuple[str, str], ...] = ()  # (table, key) it reads beside its section

    def reads(self, document: dict[str, Any]) -> tuple[Any, ...]:
        return (document.get(self.section),
                *(_table(document, table).get(key) for table, key in self.also))


COMPONENTS = (
    # `cairn sync`: [sync], and the store in [router] data_dir
    Component("cairn-sync.service", "sync", (("router", "data_dir"),)),
    # `cairn update pull`: a long-running loop (Type=simple, no timer) that loads [update]
    # once, and [sync] gateway_id, which names its source's directory; without a source it
    # exits at once
    Component("cairn-update-pull.service", "update", (("sync", "gateway_id"),)),
)


@dataclass(frozen=True)
class Step:
    verb: str  # start | restart | stop
    unit: str
    why: str


def _table(document: dict[str, Any], name: str) -> dict[str, Any]:
    table = document.get(name)
    return table if isinstance(table, dict) else {}


def component_steps(old: dict[str, Any], new: dict[str, Any]) -> list[Step]:
    """What the components must do to run ``new``'s sections, having started on ``old``'s:
    a section added starts its component, one removed stops it, a change restarts it."""
    steps = []
    for c in COMPONENTS:
        was, now = c.section in old, c.section in new
        if was and not now:
            steps.append(Step("stop", c.unit, f"[{c.section}] removed"))
        elif now and not was:
            steps.append(Step("start", c.unit, f"[{c.section}] added"))
        elif now and c.reads(old) != c.reads(new):
            changed = [f"{t}.{k}" for t, k in c.also
                       if _table(old, t).get(k) != _table(new, t).get(k)]
            why = f"[{c.section}] changed" if old[c.section] != new[c.section] else \
                f"{changed[0]} changed"
            steps.append(Step("restart", c.unit, why))
    return steps


def document(text: str | None) -> dict[str, Any]:
    """The TOML document of ``text``; empty when there is none or it does not parse (its
    components could not have started on it)."""
    try:
        return tomllib.loads(text or "")
    except tomllib.TOMLDecodeError:
        return {}


class Service(Protocol):
    """How the router is told to reload or restart, and the other components to start,
    restart or stop (``component``: what was done, as the history says it)."""

    def reload(self) -> None: ...

    def restart(self) -> None: ...

    def component(self, verb: str, unit: str) -> str: ...


class Systemd:
    def __init__(self, unit: str = UNIT) -> None:
        self.unit = unit

    def reload(self) -> None:
        self._systemctl("reload")

    def restart(self) -> None:
        self._systemctl("restart")

    def component(self, verb: str, unit: str) -> str:
        # restart starts a unit that is not running: one whose section is there should run
        done = self._systemctl(verb, unit)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return f"{unit} not {DONE[verb]}: {why}"
        return f"{DONE[verb]} {unit}"

    def _systemctl(self, verb: str, unit: str | None = None) -> subprocess.CompletedProcess:
        # --no-block and no check: the applier waits for the router's own word that it is
        # ready on the file (its start, ExecStartPost included, is not waited for); one that
        # never is is rolled back
        return subprocess.run(["systemctl", "--no-block", verb, unit or self.unit],
                              capture_output=True, text=True, timeout=60)


class NotSignalled(Exception):
    """The router was not told: the pid it wrote is not a router of this file."""


class Signals:
    """A router under another supervisor (a container's, a test's): SIGHUP reloads it,
    SIGTERM stops it for the supervisor to start again. Its pid is the one in its
    config-state.json, which the router's user writes: root signals it only when that
    process is the router of this config file, run by that user (:func:`router_problem`),
    never whatever the file names."""

    def __init__(self, router: Callable[[], tuple[int, Path] | None], file: Path) -> None:
        self.router = router  # (pid, data directory) of the router that wrote its state
        self.file = file

    def reload(self) -> None:
        self._send(signal.SIGHUP)

    def restart(self) -> None:
        self._send(signal.SIGTERM)

    def component(self, verb: str, unit: str) -> str:
        # the other components' pids are not known here: their supervisor acts on the line
        return f"{unit} to be {DONE[verb]} by its supervisor"

    def _send(self, sig: signal.Signals) -> None:
        found = self.router()
        if found is None:
            return
        pid, data_dir = found
        problem = router_problem(pid, self.file, {0, _owner(data_dir)})
        if problem is not None:
            raise NotSignalled(f"{sig.name} not sent to pid {pid}, named in {data_dir}: "
                               f"{problem}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def router_problem(pid: int, file: Path, users: set[int]) -> str | None:
    """Why process ``pid`` is not the router of config ``file`` run by one of ``users``
    (None: it is): its program must be this interpreter, running ``cairn ... router
    --config FILE``. A pid that was reused, or that a compromised router wrote, fails."""
    proc = Path(f"/proc/{pid}")
    try:
        owner, exe = proc.stat().st_uid, os.readlink(proc / "exe")
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        cwd = os.readlink(proc / "cwd")
    except OSError as e:
        return f"cannot look at it: {e.strerror}"
    if owner not in users:
        return f"it runs as uid {owner}, not as the router's user"
    if os.path.realpath(exe) != os.path.realpath(sys.executable):
        return f"its program is {exe}, not {os.path.realpath(sys.executable)}"
    args = [a.decode(errors="replace") for a in argv if a]
    config = _router_config(args)
    if config is None:
        return f"it is not cairn router: {' '.join(args)[:200]!r}"
    if os.path.realpath(os.path.join(cwd, config)) != os.path.realpath(file):
        return f"it is the router of {config}, not of {file}"
    return None


def _router_config(args: list[str]) -> str | None:
    """The --config of ``python [-m cairn.app.cli | .../cairn] router --config FILE``."""
    rest = args[1:]
    if rest[:2] in (["-m", "cairn.app.cli"], ["-m", "cairn"]):
        rest = rest[2:]
    elif rest and Path(rest[0]).name == "cairn":
        rest = rest[1:]
    else:
        return None
    if "router" not in rest:
        return None
    after = rest[rest.index("router") + 1:]
    for i, arg in enumerate(after):
        if arg == "--config" and i + 1 < len(after):
            return after[i + 1]
        if arg.startswith("--config="):
            return arg.removeprefix("--config=")
    return None


def _owner(path: Path) -> int:
    try:
        return path.stat().st_uid
    except OSError:
        return 0


def default_by() -> str:
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user} with cairn config apply"


@dataclass
class Applier:
    file: Path
    service: Service
    timeout: float = READY_TIMEOUT
    say: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    # the drivers beside the file that joined before the change: they must after it
    must_join: list[tuple[str, DriverConfig]] = field(default_factory=list)
    # the realms the dashboard's page got into before the change: one must take it after
    dashboard_reached: list[str] = field(default_factory=list)

    @property
    def history(self) -> History:
        return History(self.file)

    # -- what the router runs --------------------------------------------------------------

    def data_dirs(self, *configs: Config | None) -> list[Path]:
        """Where the router may have written its state: the data directories of these
        configurations, the file's and the last good one's."""
        candidates = [*configs, self._load(self.file), self.history.last_good()]
        dirs = [c.router.data_dir for c in candidates if c is not None]
        return list(dict.fromkeys(dirs))

    def running(self, *configs: Config | None) -> RunningConfig | None:
        """The state of the router that is alive, if any."""
        found = self.running_in(*configs)
        return found[0] if found else None

    def running_in(self, *configs: Config | None) -> tuple[RunningConfig, Path] | None:
        """That state and the data directory it is in."""
        for data_dir in self.data_dirs(*configs):
            state = read_running(data_dir)
            if state is not None and pid_alive(state.pid):
                return state, data_dir
        return None

    def running_config(self, state: RunningConfig | None) -> Config | None:
        if state is None:
            return None
        if state.running == "last-good":
            return self.history.last_good()
        return self._load(self.file)

    @staticmethod
    def _load(path: Path) -> Config | None:
        try:
            return load(path)
        except ConfigError:
            return None

    def problem(self, config: Config, sha: str, before: tuple[Any, ...] | None
                ) -> tuple[bool, str | None]:
        """(decided, problem): ready on ``sha`` is (True, None); (True, why) when the router
        answered otherwise (it fell back, or refused the reload); (False, why) while it
        has not answered yet."""
        state = self.running(config)
        if state is None or (state.pid, state.started, state.seq) == before:
            return False, "the router did not answer (no fresh state in its data directory)"
        if state.running != "file" or state.sha256 != sha or state.problem:
            return True, state.problem or f"the router runs {state.running}, not this file"
        try:
            metrics = read_metrics(config.router.listen)
        except (urllib.error.URLError, OSError, ValueError) as e:
            return False, f"its /metrics did not answer: {getattr(e, 'reason', e)}"
        if metrics.get("cairn_store_available") != 1:
            return False, "the router runs without its store (cairn_store_available 0)"
        # undecided until the deadline: a driver's socket may take a moment to come back
        shut_out = config_gate.locked_out(self.must_join) or (
            config_gate.dashboard_shut_out(config) if self.dashboard_reached else None)
        return (False, shut_out) if shut_out else (True, None)

    def wait_ready(self, config: Config, sha: str, before: tuple[Any, ...] | None) -> str | None:
        deadline = time.monotonic() + self.timeout
        while True:
            decided, problem = self.problem(config, sha, before)
            if decided or time.monotonic() >= deadline:
                if not decided:
                    problem = f"not ready within {self.timeout:g} s: {problem}"
                return problem
            time.sleep(0.25)

    # -- changes ---------------------------------------------------------------------------

    def apply(self, text: str, by: str, source: str, request: int | None = None,
              refused: Callable[[str], None] | None = None) -> int:
        """``refused``, when given, is told why a text that does not validate is refused."""
        history = self.history
        with history.locked():
            try:
                new = validate(text, str(self.file), check_whole)
            except ConfigError as e:
                history.record(text, by, source, None, "refused", str(e), request)
                self.say(f"cairn config: refused, nothing changed: {e}")
                if refused is not None:
                    refused(str(e))
                return EXIT_USAGE
            state = self.running(new)
            old = self.running_config(state)
            action = "restart" if old is None or restart_needed(old, new) else "reload"
            self.must_join = config_gate.joining(config_gate.driver_configs(self.file.parent))
            self.dashboard_reached = config_gate.dashboard_realms(old if state else None)
            change = history.record(text, by, source, action, request=request)
            previous = self._text(self.file)
            atomic_write(self.file, text, like=self.file)
            self.say(f"cairn config: change {change.id} written to {self.file}; {action}ing "
                     f"the router")
            return self._settle(change, new, state, previous)

    def _settle(self, change: Change, new: Config, state: RunningConfig | None,
                previous: str | None) -> int:
        history = self.history
        before = (state.pid, state.started, state.seq) if state else None
        try:
            (self.service.reload if change.action == "reload" else self.service.restart)()
        except NotSignalled as e:
            problem: str | None = str(e)
        else:
            problem = self.wait_ready(new, change.sha256 or "", before)
        if problem is None:
            text = self._text(self.file) or ""
            history.mark_good(text, change.id)
            change = self.reach_components(change, previous, text)
            history.set_state(change, "good")
            self.say(f"cairn config: change {change.id} is running and marked good")
            default = config_gate.DASHBOARD_REALM
            if default in self.dashboard_reached and new.realm(default) is None:
                self.say(f"cairn config: realm {default} is gone, which the dashboard opens "
                         f"unless told otherwise: open it with ?realm={new.realms[0].name}")
            return EXIT_OK
        self.say(f"cairn config: change {change.id} failed: {problem}; rolling back")
        # the components never left ``previous``: they follow only what the rollback changes
        restored = self.restore(history.last_good_text() or previous, change, previous)
        history.set_state(restored[0], "rolled_back", problem if restored[1] is None
                          else f"{problem} (and the rollback: {restored[1]})")
        return EXIT_FAILURE

    def restore(self, text: str | None, change: Change, components_on: str | None
                ) -> tuple[Change, str | None]:
        """Put ``text`` (the last good configuration) back and restart the router on it,
        then the components that run ``components_on``; the change with what was done to
        them, and what went wrong, if anything."""
        if text is None:
            return change, "no last good configuration to go back to"
        state = self.running()
        atomic_write(self.file, text, like=self.file)
        try:
            self.service.restart()
        except NotSignalled as e:
            return change, str(e)
        config = self._load(self.file)
        if config is None:
            return change, "the last good configuration no longer loads"
        before = (state.pid, state.started, state.seq) if state else None
        problem = self.wait_ready(config, digest(text), before)
        self.say(f"cairn config: back on the last good configuration"
                 f"{'' if problem is None else f', but: {problem}'}")
        if problem is None:
            change = self.reach_components(change, components_on, text)
        return change, problem

    def reach_components(self, change: Change, old: str | None, new: str) -> Change:
        """Start, restart or stop the components whose sections differ between ``old``
        (what they started on) and ``new`` (what the router is ready on); the change's
        action names what was done."""
        done = []
        for step in component_steps(document(old), document(new)):
            done.append(self.service.component(step.verb, step.unit))
            self.say(f"cairn config: {done[-1]} ({step.why})")
        return replace(change, action="; ".join([change.action or "-", *done])) if done \
            else change

    def rollback(self, by: str) -> int:
        text = self.history.last_good_text()
        if text is None:
            self.say(f"cairn config: no last good configuration beside {self.file}")
            return EXIT_FAILURE
        with self.history.locked():
            change = self.history.record(text, by, "cairn config rollback", "restart")
            change, problem = self.restore(text, change, self._text(self.file))
            self.history.set_state(change, "good" if problem is None else "rolled_back",
                                   problem)
        return EXIT_OK if problem is None else EXIT_FAILURE

    def mark_good(self) -> int:
        """The router is ready on the file as it is: keep it as the last good one (the
        health gate of a boot calls this)."""
        text, config = self._text(self.file), self._load(self.file)
        if text is None or config is None:
            self.say(f"cairn config: {self.file} does not load: not marked good")
            return EXIT_FAILURE
        decided, problem = self.problem(config, digest(text), None)
        if problem is not None:
            self.say(f"cairn config: the router is not ready on {self.file}: {problem}")
            return EXIT_FAILURE
        try:
            with self.history.locked(wait=False):
                self._keep(text)
        except BlockingIOError:   # a change is being applied: it settles the last good one
            self.say("cairn config: a change is being applied; it decides the last good one")
            return EXIT_OK
        self.say(f"cairn config: {self.file} marked good")
        return EXIT_OK

    def _keep(self, text: str) -> None:
        change = next((c for c in self.history.changes() if c.sha256 == digest(text)), None)
        self.history.mark_good(text, change.id if change else None)
        if change is not None and change.state == "pending":
            self.history.set_state(change, "good")

    def apply_pending(self) -> int:
        """The requests taken over WAMP, oldest first. The queue is drained before any is
        carried out (a request that cannot be read or does not validate goes to refused/
        with its reason, never back into the queue); each change is recorded with its
        author, the request file's owner, for the one the router names."""
        worst = EXIT_OK
        for data_dir in self.data_dirs():
            queue = Queue(data_dir, self.say)
            for taken in queue.drain():
                code = self.apply(taken.request.text, taken.by,
                                  f"WAMP request {taken.request.id}", taken.request.id,
                                  lambda why, q=queue, t=taken: q.refuse(t.name, why, data=t.data))
                worst = max(worst, code)
            worst = max(worst, EXIT_USAGE if queue.refusals else EXIT_OK)
        return worst

    @staticmethod
    def _text(path: Path) -> str | None:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None


# -- the command -------------------------------------------------------------------------------


def add_commands(commands: Any) -> None:
    c = commands.add_parser(
        "config", help="see, change and roll back the router's configuration",
        description="Change the configuration safely: a change is validated (refused with "
                    "exit 2 if bad), recorded in config-history/ beside the file, applied by "
                    "a reload or a restart, and rolled back to the last good configuration "
                    "if the router is not ready on it in time (exit 1).")
    c.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG,
                   help=f"the router's config file (default {DEFAULT_CONFIG})")
    c.add_argument("--service", choices=["systemd", "signal"], default="systemd",
                   help="how the router is reloaded and restarted: systemd (cairn-router), "
                        "or signal: SIGHUP, and SIGTERM for its supervisor to restart it")
    c.add_argument("--timeout", type=float, default=READY_TIMEOUT, metavar="S",
                   help=f"seconds the router has to be ready on a change "
                        f"(default {READY_TIMEOUT:g})")
    verbs = c.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("get", help="print the config file")
    verbs.add_parser("history", help="the last changes: who, when, how, how it ended")
    a = verbs.add_parser("apply", help="validate, apply, and roll back if not ready")
    a.add_argument("file", metavar="FILE", nargs="?", help="the new configuration")
    a.add_argument("--by", metavar="WHO", help="who makes the change (default: your user)")
    a.add_argument("--pending", action="store_true",
                   help="carry out the requests taken over WAMP (cairn.admin.config.apply)")
    verbs.add_parser("mark-good", help="keep the file as the last good configuration "
                                       "(when the router is ready on it)")
    verbs.add_parser("rollback", help="put the last good configuration back and restart")


def main(args: argparse.Namespace) -> int:
    file = Path(args.config)
    applier = Applier(file, _service(args.service, file), args.timeout)
    if args.verb == "get":
        text = applier._text(file)
        if text is None:
            print(f"cairn config: cannot read {file}", file=sys.stderr)
            return EXIT_FAILURE
        sys.stdout.write(text)
        return EXIT_OK
    if args.verb == "history":
        _print_history(applier.history)
        return EXIT_OK
    if args.verb == "mark-good":
        return applier.mark_good()
    if args.verb == "rollback":
        return applier.rollback(default_by().replace("config apply", "config rollback"))
    return _apply(applier, args)


def _apply(applier: Applier, args: argparse.Namespace) -> int:
    if args.pending == bool(args.file):
        print("cairn config apply: give a FILE or --pending", file=sys.stderr)
        return EXIT_USAGE
    if args.pending:
        return applier.apply_pending()
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"cairn config: bad config: {args.file}: -: cannot read file: {e}",
              file=sys.stderr)
        return EXIT_USAGE
    return applier.apply(text, args.by or default_by(), f"file {args.file}")


def _service(name: str, file: Path) -> Service:
    if name == "systemd":
        return Systemd()

    def router() -> tuple[int, Path] | None:
        found = Applier(file, Systemd()).running_in()
        return (found[0].pid, found[1]) if found else None

    return Signals(router, file)


def _print_history(history: History) -> None:
    good = (history.last_good_info() or {}).get("change")
    for c in history.changes():
        mark = "  <- last good" if c.id == good else ""
        reason = f": {c.reason}" if c.reason else ""
        print(f"{c.id:4d}  {c.at}  {c.state:<11} {c.action or '-':<7} {c.by} ({c.source})"
              f"{reason}{mark}")

