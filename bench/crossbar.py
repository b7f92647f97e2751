"""Crossbar.io as the comparison anchor for the benchmarks.

Crossbar.io is installed from PyPI into its own virtualenv under a cache directory (it pulls
in ~150 packages, 375 MB, and must not share Cairn's venv)::

    .venv/bin/python -m bench.crossbar --install

(the same as ``python3 -m venv DIR && DIR/bin/pip install crossbar 'numpy<2'``; the cache
directory is ``$CAIRN_BENCH_CACHE`` or ``~/.cache/cairn-bench``).

:class:`CrossbarProcess` writes a node configuration equivalent to the one :mod:`bench.pubsub`
gives Cairn (one router worker, ``realm1``, the anonymous role allowed everything, a
WebSocket transport at ``/ws`` with JSON and MsgPack, a RawSocket transport, an in-memory
event history for the ``sensor`` prefix only on request, see :func:`node_config`) on free
127.0.0.1 ports, runs ``crossbar start`` as a subprocess and offers the same interface as
:class:`bench.pubsub.RouterProcess` (``name``,
``ws_port``, ``rs_port``, ``pid``, ``proc``, ``cpu_seconds()``, ``gc_pauses()``, ``stop()``),
so :func:`bench.pubsub.run_case` drives it unchanged. Crossbar runs a controller process
and a router worker process; CPU and RSS are summed over the whole process tree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.process import LoggedProcess, free_port, process_cpu_seconds, wait_for_ports

CACHE_DIR = Path(os.environ.get("CAIRN_BENCH_CACHE",
                                Path.home() / ".cache" / "cairn-bench"))
CROSSBAR_VENV = CACHE_DIR / "crossbar-venv"


def crossbar_executable(venv: Path = CROSSBAR_VENV) -> Path:
    return venv / "bin" / "crossbar"


def install_crossbar(venv: Path = CROSSBAR_VENV, version: str | None = None) -> Path:
    """Creates ``venv`` with the system python3 and pip-installs crossbar into it."""
    exe = crossbar_executable(venv)
    if exe.exists():
        return exe
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    pip = str(venv / "bin" / "pip")
    subprocess.run([pip, "install", "-q", "-U", "pip"], check=True)
    # numpy<2: crossbar 26.10.1 pulls numpy 2.x, but bjdata's extension (imported by
    # autobahn's serializers in every worker) is built against numpy 1.x and prints an
    # "_ARRAY_API not found" traceback at each worker start with numpy 2
    subprocess.run([pip, "install", f"crossbar=={version}" if version else "crossbar",
                    "numpy<2"], check=True)
    return exe


def crossbar_version(venv: Path = CROSSBAR_VENV) -> str | None:
    try:
        out = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import crossbar; print(crossbar.__version__)"],
                             capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def venv_size_bytes(venv: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(venv):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def node_config(ws_port: int, rs_port: int, history_prefix: str | None = None,
                history_limit: int = 1000, history_match: str = "prefix") -> dict[str, Any]:
    """A Crossbar node config matching bench.pubsub.ROUTER_TOML; with ``history_prefix``,
    also an in-memory event history for that URI (``history_match``: prefix or exact).

    Caution (crossbar 26.10.1, router/broker.py + router/realmstore.py): once a realm has a
    ``store``, the broker calls ``store_event_history`` for every event delivered to every
    subscriber, also on topics without history, and the memory store logs an "INTERNAL
    WARNING: subscription ... not in event store" line for each one; the router worker's
    log lines go through the controller process, so both burn CPU and throughput drops by
    about half. The live pub/sub comparison therefore runs without a store, like Cairn's;
    where history is wanted, subscribers use the history's own URI and match, which is the
    subscription the store knows, so nothing is logged.
    """
    endpoint = {"type": "tcp", "interface": "127.0.0.1"}
    config: dict[str, Any] = {
        "version": 2,
        "controller": {},
        "workers": [{
            "type": "router",
            "realms": [{
                "name": "realm1",
                "roles": [{
                    "name": "anonymous",
                    "permissions": [{
                        "uri": "", "match": "prefix",
                        "allow": {"call": True, "register": True, "publish": True,
                                  "subscribe": True},
                        "disclose": {"caller": False, "publisher": False},
                        "cache": True,
                    }],
                }],
            }],
            "transports": [
                {
                    "type": "web",
                    "endpoint": {**endpoint, "port": ws_port},
                    "paths": {
                        "ws": {"type": "websocket", "serializers": ["json", "msgpack"]},
                    },
                },
                {
                    "type": "rawsocket",
                    "endpoint": {**endpoint, "port": rs_port},
                    "serializers": ["msgpack", "json"],
                },
            ],
        }],
    }
    if history_prefix is not None:
        config["workers"][0]["realms"][0]["store"] = {
            "type": "memory",
            "limit": history_limit,
            "event-history": [{"uri": history_prefix, "match": history_match,
                               "limit": history_limit}],
        }
    return config


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (VmRSS, /proc)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_rss(pid: int) -> dict[str, Any]:
    pids = process_tree(pid)
    per = {p: rss_bytes(p) for p in pids}
    return {"processes": len(pids), "rss_bytes": sum(per.values()),
            "per_process_mib": [round(v / 2**20, 1) for v in per.values()]}


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for p in process_tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += process_cpu_seconds(p)
    return total


class CrossbarProcess(LoggedProcess):
    """``crossbar start --cbdir DIR`` on free loopback ports, output to a log file."""

    name = "crossbar"

    def __init__(self, workdir: Path, executable: Path | None = None,
                 history_prefix: str | None = None, timeout: float = 60,
                 history_match: str = "prefix") -> None:
        exe = executable or crossbar_executable()
        if not exe.exists():
            raise RuntimeError(f"crossbar not found at {exe}; install it with "
                               "'python -m bench.crossbar --install'")
        self.ws_port, self.rs_port = free_port(), free_port()
        self.cbdir = workdir / ".crossbar"
        self.cbdir.mkdir(parents=True, exist_ok=True)
        (self.cbdir / "config.json").write_text(
            json.dumps(node_config(self.ws_port, self.rs_port, history_prefix,
                                   history_match=history_match), indent=2))
        self.log_path = workdir / "crossbar.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(exe), "start", "--cbdir", str(self.cbdir), "--loglevel", "warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=workdir, start_new_session=True)
        self.pid = self.proc.pid
        try:
            wait_for_ports([self.ws_port], lambda: self.proc.poll() is None, timeout)
            self.first_accept_s = time.monotonic() - t0
            wait_for_ports([self.rs_port], lambda: self.proc.poll() is None, timeout)
            self.startup_s = time.monotonic() - t0
        except Exception:
            self.stop()
            raise RuntimeError(f"crossbar did not start:\n{self.log_tail()}") from None

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def rss(self) -> dict[str, Any]:
        return tree_rss(self.pid)

    def gc_pauses(self, start: float, end: float) -> list[float] | None:
        return None

    def stop(self) -> int | None:
        """SIGTERM to the controller (it stops its workers), then SIGKILL to whatever of
        the process group is left."""
        tree = process_tree(self.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for p in tree[1:]:  # workers that outlived the controller
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        self._log.close()
        return self.proc.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.crossbar",
                                description="install Crossbar.io for the benchmarks / "
                                            "check that it starts")
    p.add_argument("--install", action="store_true",
                   help=f"create {CROSSBAR_VENV} and pip install crossbar into it")
    p.add_argument("--version", help="crossbar version to install (default: latest)")
    opts = p.parse_args(argv)
    if opts.install:
        install_crossbar(version=opts.version)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cairn-bench-crossbar-") as tmp:
        cb = CrossbarProcess(Path(tmp))
        try:
            time.sleep(1.0)
            rss = cb.rss()
            print(f"crossbar {crossbar_version()}: first accept {cb.first_accept_s:.2f} s, "
                  f"all ports {cb.startup_s:.2f} s, idle RSS {rss['rss_bytes'] / 2**20:.0f} MiB "
                  f"in {rss['processes']} processes {rss['per_process_mib']}")
        finally:
            print(f"stopped (exit code {cb.stop()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
