"""The router as a real process (``python -m gateway.cli router``), for tests and soak runs
that kill, restart or re-clock it, and the free TCP port every harness asks for."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RouterProcess:
    """Writes a config, starts the router and waits until it listens."""

    def __init__(self, workdir: Path, realm_toml: str, env: dict[str, str] | None = None,
                 router_toml: str = "", host: str = "127.0.0.1", unix: bool = False,
                 nofile: int | None = None) -> None:
        """``host``: what the TCP listeners bind; ``unix``: a Unix socket listener too
        (``unix_path``); ``nofile``: the router's file descriptor limit (soft and hard)."""
        self.workdir = workdir
        self.port = free_port()
        self.rawsocket_port = free_port()
        self.config = workdir / "cairn.toml"
        self.data_dir = workdir / "data"
        self.unix_path = workdir / "wamp.sock"
        unix_listener = f', "unix:{self.unix_path}"' if unix else ""
        self.config.write_text(
            f'[router]\nlisten = "{host}:{self.port}"\n'
            f'rawsocket = ["{host}:{self.rawsocket_port}"{unix_listener}]\n'
            f'data_dir = "{self.data_dir}"\nlog_level = "info"\n{router_toml}\n{realm_toml}')
        self.nofile = nofile
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "router.log"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "cairn.db"

    def start(self, timeout: float = 15) -> RouterProcess:
        log = self.log.open("ab")
        nofile = self.nofile
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "router", "--config", str(self.config)],
            cwd=self.workdir, env=self.env, stdout=log, stderr=log,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile)))
            if nofile else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited with {self.proc.returncode}:\n"
                                   f"{self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.rawsocket_port), 0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"router did not listen within {timeout}s:\n{self.log.read_text()}")

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
