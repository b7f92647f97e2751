"""Servers as real processes, for tests, benchmarks and soak runs: the router
(``python -m cairn.app.cli router``, or another command that takes the same arguments) that
they kill, restart or re-clock, the free TCP port every harness asks for, and the readings
of a process's CPU time."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.config import router_table

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# How long a server process may take to listen. Waits return as soon as the thing waited for
# is there (or the process has exited), so a generous deadline costs a passing test nothing;
# a short one fails on a loaded machine: "router did not listen within 15 s" in a CI run
# with the image build beside it.
STARTUP_TIMEOUT = 180.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lan_address() -> str:
    """An address of this machine that is not loopback, to connect from as another machine
    on the LAN would (skips the test without one)."""
    import pytest  # here: the benches import this module without pytest's plugins

    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        try:
            with socket.socket() as s:
                s.bind((address, 0))
        except OSError:
            continue
        return address
    pytest.skip("this machine has no non-loopback address to connect from")


def wait_for_ports(ports: Sequence[int], alive: Callable[[], bool],
                   timeout: float = STARTUP_TIMEOUT,
                   host: str = "127.0.0.1") -> None:
    """Until something accepts connections on each port of ``host``; RuntimeError if
    ``alive()`` turns false (the server exited) or the time runs out."""
    deadline = time.monotonic() + timeout
    for port in ports:
        _wait_for(lambda p=port: socket.create_connection((host, p), timeout=0.5).close(),
                  alive, deadline, f"{host} port {port}")


def wait_for_unix_socket(path: Path, alive: Callable[[], bool],
                         timeout: float = STARTUP_TIMEOUT) -> None:
    """Until something accepts connections on the Unix socket ``path``."""
    def connect() -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(0.5)
            s.connect(str(path))

    _wait_for(connect, alive, time.monotonic() + timeout, str(path))


def _wait_for(connect: Callable[[], None], alive: Callable[[], bool], deadline: float,
              where: str) -> None:
    while True:
        if not alive():
            raise RuntimeError("the server process exited during startup")
        try:
            return connect()
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listening on {where}") from None
            time.sleep(0.05)


def loopback_of(host: str) -> str:
    """The address to reach a listener bound to ``host`` from this machine: loopback of its
    family for a wildcard (``[::]`` listens on IPv6 only, as asyncio binds it)."""
    host = host.strip("[]")
    return {"::": "::1", "0.0.0.0": "127.0.0.1", "": "127.0.0.1"}.get(host, host)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class LoggedProcess:
    """A server process whose output goes to ``log_path``."""

    log_path: Path

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_lines()[-lines:])


class RouterProcess(LoggedProcess):
    """Writes a config on free loopback ports (or takes ``config``, a file of the caller's),
    starts the router with its log in ``router.log`` and waits until it listens."""

    def __init__(self, workdir: Path, realm_toml: str = "", env: dict[str, str] | None = None,
                 router_toml: str = "", host: str = "127.0.0.1", unix: bool = False,
                 nofile: int | None = None, log_level: str = "info",
                 command: Sequence[str] | None = None, config: Path | None = None,
                 rawsocket_host: str | None = None) -> None:
        """``host``: what the TCP listeners bind (``rawsocket_host``, when given, the
        RawSocket one's: ``"[::]"`` for IPv6); ``unix``: a Unix socket listener too
        (``unix_path``); ``nofile``: the router's file descriptor limit (soft and hard);
        ``command``: what runs instead of ``python -m cairn.app.cli`` (an installed ``cairn``,
        another build's)."""
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.unix_path = workdir / "wamp.sock"
        self._unix = unix
        # each port is waited for where it listens: the router opens the HTTP one first, so
        # that one listening says nothing of the RawSocket one (CI's stop 42: a refused connect)
        self._rawsocket_at = loopback_of(rawsocket_host or host)
        self.port: int | None = None  # of a config the caller wrote: unknown, see its log
        self.rawsocket_port: int | None = None
        self._new_ports: Callable[[], None] | None = None  # our config, on other free ports
        if config is None:
            config = workdir / "cairn.toml"

            def new_ports() -> None:
                self.port, self.rawsocket_port = free_port(), free_port()
                rawsocket = [f"{rawsocket_host or host}:{self.rawsocket_port}"] + \
                    ([f"unix:{self.unix_path}"] if unix else [])
                config.write_text(router_table(self.data_dir, f"{host}:{self.port}",
                                               rawsocket, log_level, router_toml)
                                  + f"\n{realm_toml}")

            new_ports()
            self._new_ports = new_ports
        self.config = config
        self.nofile = nofile
        # PYTHONPATH as given first: a benchmark of another build's tree sets it
        path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
        self.env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        self.command = list(command or [sys.executable, "-m", "cairn.app.cli"])
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / "router.log"  # what it logs (stderr)
        self.stdout_path = workdir / "router.stdout"  # nothing, as a daemon should

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "cairn.db"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = STARTUP_TIMEOUT) -> RouterProcess:
        """Start it; wait until it listens (when its ports are known). When its first start
        finds a free port taken meanwhile (by another test run on the machine: free_port can
        only say what is free now), it starts again on other free ones."""
        first = self.proc is None
        for attempt in range(3):
            logged = len(self.log_lines())
            try:
                return self._start(timeout)
            except RuntimeError:
                taken = any("address already in use" in line
                            for line in self.log_lines()[logged:])
                if not (first and taken and self._new_ports) or attempt == 2:
                    raise
                self._new_ports()
        raise AssertionError("not reached")

    def _start(self, timeout: float) -> RouterProcess:
        nofile = self.nofile
        with self.log_path.open("ab") as log, self.stdout_path.open("ab") as stdout:
            self.proc = subprocess.Popen(
                [*self.command, "router", "--config", str(self.config)],
                cwd=self.workdir, env=self.env, stdout=stdout, stderr=log,
                stdin=subprocess.DEVNULL,
                preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
                if nofile else None)
        def alive() -> bool:
            return self.proc.poll() is None

        try:
            if self.port is not None:
                wait_for_ports([self.port], alive, timeout)
            if self.rawsocket_port is not None:
                wait_for_ports([self.rawsocket_port], alive, timeout, self._rawsocket_at)
            if self._unix:
                wait_for_unix_socket(self.unix_path, alive, timeout)
        except RuntimeError as e:
            exited = self.proc.poll()
            self.stop()
            why = f"router exited with {exited}" if exited is not None else \
                f"router did not listen within {timeout:g} s ({e})"
            raise RuntimeError(f"{why}:\n{self.log_tail(40)}") from None
        return self

    async def wait_for_line(self, pattern: str, timeout: float = 30) -> re.Match:
        """The first line of its log that ``pattern`` matches, once there is one."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_lines():
                found = re.search(pattern, line)
                if found:
                    return found
            if time.monotonic() > deadline or self.proc is None or \
                    self.proc.poll() is not None:
                raise AssertionError(f"no line matching {pattern!r} in:\n{self.log_tail(40)}")
            await asyncio.sleep(0.02)

    async def finish(self, timeout: float) -> int:
        """Its exit code, once it exits by itself."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router still runs after {timeout:g} s")
            await asyncio.sleep(0.02)
        return self.proc.returncode

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def kill(self) -> None:
        """SIGKILL: the closest a test gets to pulling the plug."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
