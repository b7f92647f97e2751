"""A real Spark standalone cluster on 127.0.0.1: a master and N workers, each its own JVM,
started with the ``spark-class`` of the pip ``pyspark`` distribution (no download).

Used by the cluster tests (a session-scoped fixture) and by ``bench/spark_fleet.py``.
Readiness is the master's JSON status page listing every worker ALIVE, not a sleep; the
tests launch the daemons first and wait for them only where a driver needs the cluster,
so that they boot while other work runs.
The executors run :func:`python_without_cairn`: the driver's Python with ``-S`` (no site
packages, so neither Cairn nor PySpark are importable but what Spark itself puts on the
path), so the jobs must ship their own code, as on a cluster whose workers lack Cairn.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from harness import spark_cds
from harness.process import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
READY_TIMEOUT = 120.0  # seconds; two JVMs on a busy two-core machine can take a while
BASE_JVM = spark_cds.BASE_JVM  # the small jobs' JVM options (see there)
QUICK_JVM = f"{BASE_JVM} {spark_cds.jvm_options()}".strip()  # and the classes' archive


def python_without_cairn(directory: Path) -> str:
    """An executable that runs this interpreter without site-packages (``-S``): on the
    executors, Spark's own PYTHONPATH (pyspark.zip, py4j) is all there is."""
    path = directory / "python-without-cairn"
    path.write_text("#!/bin/sh\nCAIRN_WORKER_PYTHON=without-cairn; export CAIRN_WORKER_PYTHON\n"
                    f'exec "{sys.executable}" -S "$@"\n')
    path.chmod(0o755)
    return str(path)


@dataclass
class Cluster:
    directory: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    port: int = 0
    ui_port: int = 0
    processes: list[subprocess.Popen] = field(default_factory=list)
    worker_python: str = ""
    settings: dict[str, str] = field(default_factory=dict)  # more for its drivers' conf

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def conf(self) -> dict[str, str]:
        """What a driver of this cluster sets: loopback, the executors' Python."""
        return {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.pyspark.python": self.worker_python,
                "spark.executor.memory": self.memory, "spark.ui.enabled": "false",
                **self.settings}

    def conf_args(self) -> list[str]:
        return [arg for k, v in self.conf().items() for arg in ("--conf", f"{k}={v}")]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
        # the master and workers only hand out work: the quick JVM's options suit them too
        env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_NO_DAEMONIZE="1", SPARK_DAEMON_JAVA_OPTS=QUICK_JVM)
        return env

    def _start(self, name: str, args: list[str]) -> None:
        log = (self.directory / f"{name}.log").open("wb")
        self.processes.append(subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=log,
            stderr=subprocess.STDOUT, env=self._env(), start_new_session=True))

    def launch(self) -> Cluster:
        """Start the daemons without waiting for them (:meth:`wait_ready`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.worker_python = python_without_cairn(self.directory)
        self.port, self.ui_port = free_port(), free_port()
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        for n in range(self.workers):
            work = self.directory / f"worker-{n}"
            work.mkdir(exist_ok=True)
            self._start(f"worker-{n}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", str(free_port()), "--work-dir", str(work), self.master])
        return self

    def start(self) -> Cluster:
        self.launch().wait_ready()
        return self

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            for p in self.processes:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({p.returncode}); logs in "
                                       f"{self.directory}")
            with contextlib.suppress(OSError, ValueError):
                alive = [w for w in self.status().get("workers", [])
                         if w.get("state") == "ALIVE"]
                if len(alive) >= self.workers:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.workers} workers not ALIVE after "
                                   f"{READY_TIMEOUT:.0f} s; logs in {self.directory}")
            time.sleep(0.25)  # polling interval of the status page

    def stop(self) -> None:
        for p in reversed(self.processes):  # workers first, then the master
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.processes.clear()


@contextlib.contextmanager
def running(directory: Path, ready: bool = True, **kwargs) -> Iterator[Cluster]:
    """A cluster for the block, stopped after it; ``ready=False`` yields it launched but
    maybe still booting (call :meth:`Cluster.wait_ready` before a driver uses it)."""
    cluster = Cluster(directory, **kwargs)
    try:
        yield cluster.start() if ready else cluster.launch()
    finally:
        cluster.stop()
