"""The SD card's wear: bytes written to the data partition's block device per stored reading.

Run as root from the repository root::

    .venv/bin/python -m bench.wear [--sensors 20,200] [--duration 300] [--policies default,0s]

For each workload (N sensors, each publishing one acknowledged, retained reading with
``temperature`` and ``humidity`` to ``sensor.devNNN`` every ``--interval`` s, spread evenly)
and each commit policy:

1. a fresh ext4 filesystem of its own: a 512 MiB image, ``mkfs.ext4`` with its inode tables
   and journal initialized up front (the kernel's lazy init would write during the
   measurement), loop-mounted as the device image mounts its data partition (``noatime,
   commit=60``; ``--mounts noatime`` shows the file system's default commit interval,
   with a journal commit of ~12 KiB every 5 s the store writes);
2. ``cairn router`` with its working directory there, on the embedded default (only the HTTP
   port is a free one; a policy other than ``default`` sets ``commit_window`` on the
   ``sensor`` history rule), so the store is ``cairn-data/cairn.db`` on that filesystem;
3. a history is written with the store itself, then ``--warm-up`` readings are published
   through the router (its WAL file grows to its working size and is overwritten in place
   from then on), and the WAL is checkpointed from outside the router. By default the
   history is then just over the sensor rule's ``max_events`` and its 0.1 % slack, as on a
   device that has run for a week: the window prunes as such a device does (a little more
   often, since it starts at the point where a prune is due); ``--prefill`` sets another size;
4. the sensors join over the Unix socket as drivers do, and the window starts: for
   ``--duration`` s they publish on schedule; then the router is stopped (SIGTERM: its
   closing checkpoint is inside the window, so every page the window dirtied is counted at
   its final place too) and the filesystem is synced.

Per case: device bytes written per reading (``/sys/block/loopN/stat``, the ext4 journal
included), the router's own ``write_bytes`` per reading (``/proc/PID/io``), the router's
CPU %, PUBLISHED latency p50/p99, GB per year and years of life of 10 TB and 100 TB cards.
The window ends with a checkpoint a long-running router would do later, after more
rewrites of the same pages had coalesced, so the figures lean high, not low.

Output: a table on stdout, everything in ``bench/results/wear.json``. Not part of
``make test``; without root (mount, losetup) it says so and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pubsub import REPO, RESULTS_DIR, machine, source_version
from cairn.gateway.shell.metrics import quantile
from harness.process import free_port

IMAGE_MIB = 512
SECTOR = 512
YEAR_S = 365 * 86400
CARDS_TB = (10, 100)  # consumer (~300 P/E cycles x 32 GB) and high-endurance cards
OUTPUT = RESULTS_DIR / "wear.json"
EMBEDDED_LISTEN = 'listen = "127.0.0.1:8080"'
# as the image mounts its data partition (images/pi-gen/stage-cairn/01-appliance/00-run.sh)
MOUNT_OPTIONS = "noatime,commit=60"


# -- the filesystem under test ---------------------------------------------------------------


class LoopFilesystem:
    """An ext4 image of its own, loop-mounted noatime; counts what reaches its device."""

    def __init__(self, workdir: Path, options: str) -> None:
        self.image = workdir / "data.img"
        self.mount = workdir / "mnt"
        self.options = options
        self.device: str | None = None

    def __enter__(self) -> LoopFilesystem:
        with self.image.open("wb") as f:
            f.truncate(IMAGE_MIB * 2**20)
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
             str(self.image))
        self.mount.mkdir()
        self.device = _run("losetup", "--find", "--show", str(self.image)).strip()
        _run("mount", "-o", self.options, self.device, str(self.mount))
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            _run("umount", str(self.mount))
        except subprocess.CalledProcessError:  # still busy: detach it, do not leak it
            _run("umount", "--lazy", str(self.mount))
        if self.device:
            with contextlib.suppress(subprocess.CalledProcessError):
                _run("losetup", "-d", self.device)

    def written_bytes(self) -> int:
        """Sectors written to the block device since it was attached (field 7 of stat)."""
        name = Path(self.device or "").name
        fields = Path(f"/sys/block/{name}/stat").read_text().split()
        return int(fields[6]) * SECTOR


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def missing_privileges() -> str | None:
    if os.geteuid() != 0:
        return "the wear benchmark loop-mounts a filesystem: run it as root"
    for tool in ("mkfs.ext4", "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install e2fsprogs mount)"
    return None


# -- the router ------------------------------------------------------------------------------


def router_config(path: Path, policy: str) -> Path:
    """The embedded default with a free HTTP port; a policy other than ``default`` sets the
    sensor rule's ``commit_window``."""
    from cairn.gateway.core.config import EMBEDDED_TOML

    text = EMBEDDED_TOML.replace(EMBEDDED_LISTEN, f'listen = "127.0.0.1:{free_port()}"')
    if policy != "default":
        text = re.sub(r"^\s*commit_window = .*\n", "", text, flags=re.M)
        text = text.replace('max_age = "90d"', f'max_age = "90d"\n  commit_window = "{policy}"')
    path.write_text(text)
    return path


class Router:
    """``cairn router --config CONFIG`` in ``cwd``; its I/O and CPU read from /proc, also
    after it exits (read before it is reaped)."""

    def __init__(self, config: Path, cwd: Path, log: Path) -> None:
        self.config, self.cwd, self.log = config, cwd, log
        self.socket = cwd / "cairn-data" / "wamp.sock"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> Router:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cairn.app.cli", "router", "--config", str(self.config)],
                cwd=self.cwd, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the router exited: {self.log.read_text()[-2000:]}")
            if self.socket.exists():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"no {self.socket} after {timeout} s")

    @property
    def url(self) -> str:
        return f"rawsocket+unix:{self.socket}"

    def usage(self) -> dict[str, float]:
        assert self.proc is not None
        io = dict(line.split(": ") for line in
                  Path(f"/proc/{self.proc.pid}/io").read_text().splitlines())
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return {"write_bytes": int(io["write_bytes"]),
                "cpu_s": (int(stat[11]) + int(stat[12])) / ticks}

    def stop(self) -> dict[str, float]:
        """SIGTERM, wait for the exit, and return its usage as it exited."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        usage = self.usage()
        if self.proc.wait() != 0:
            raise RuntimeError(f"the router exited with {self.proc.returncode}: "
                               f"{self.log.read_text()[-2000:]}")
        return usage


# -- the sensors -----------------------------------------------------------------------------


def topic(i: int) -> str:
    return f"sensor.dev{i:03d}"


def reading(rng: random.Random) -> dict[str, float]:
    return {"temperature": round(rng.uniform(15, 30), 1), "humidity": round(rng.uniform(30, 80), 1)}


async def join(url: str, n: int) -> list[Any]:
    from cairn.drivers.runtime import open_session

    sessions = []
    for _ in range(n):
        sessions.append(await open_session(url, "realm1"))
    return sessions


async def leave(sessions: list[Any]) -> None:
    for s in sessions:
        with contextlib.suppress(Exception):
            s.leave()
    await asyncio.sleep(0.2)


async def prefill(db: Path, sensors: int, rows: int, interval: float) -> None:
    """A history of ``rows`` readings of the sensors, ``interval`` s apart each, up to now,
    written with the store itself as the router would have (the router is not running)."""
    from cairn.base import clock
    from cairn.gateway.core.session import Sequence
    from cairn.gateway.store import Store, StoredPublication

    store = await Store.open(db)
    sequence = Sequence(store.next_seq, store.publication_ids)
    rng = random.Random(1)
    now_ms, boot, boottime = clock.wall_ns() // 10**6, clock.boot_id(), clock.boottime_ns()
    step_ms = interval * 1000 / sensors
    try:
        for k in range(rows):
            seq, publication = sequence.assign()
            age_ms = int((rows - k) * step_ms)
            store.append(StoredPublication(
                seq, publication, "realm1", topic(k % sensors), None, reading(rng),
                now_ms - age_ms, boot, max(0, boottime - age_ms * 10**6), True,
                "anonymous-prefill", "anonymous", None, {"topic": topic(k % sensors)},
                history_rule=0, retain=True))
            if k % 50_000 == 49_999:
                await store.flush()
    finally:
        await store.close()


def at_the_bound(warm_up: int) -> int:
    """Rows to prefill so that after the warm-up the history is one over the embedded
    default's max_events and its slack: the first prune is due."""
    from cairn.gateway.core.config import load

    (rule,) = load(None).realms[0].history
    return rule.max_events + rule.max_events // 1000 + 1 - warm_up


async def warm_up(url: str, sensors: int, rows: int) -> None:
    """``rows`` readings through the router as fast as it takes them: unacknowledged, each
    5,000 followed by an acknowledged one."""
    from autobahn.wamp.types import PublishOptions

    (session,) = await join(url, 1)
    rng = random.Random(2)
    options = PublishOptions(retain=True)
    for start in range(0, rows, 5_000):
        for k in range(start, min(rows, start + 5_000)):
            session.publish(topic(k % sensors), options=options, **reading(rng))
        await session.publish(topic(0), options=PublishOptions(acknowledge=True, retain=True),
                              **reading(rng))
    await leave([session])


def checkpoint(db: Path) -> None:
    """Copy the WAL into the database from outside the router (PASSIVE: the router's next
    commit then starts the WAL over, writing it in place)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db, timeout=30)) as c:
        c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


async def publish_on_schedule(sessions: list[Any], interval: float,
                              duration: float) -> list[float]:
    """Sensor i publishes at i * interval / N + k * interval; returns PUBLISHED latencies
    (seconds) of the readings acknowledged."""
    from autobahn.wamp.types import PublishOptions

    n = len(sessions)
    latencies: list[float] = []
    options = PublishOptions(acknowledge=True, retain=True)
    start = time.monotonic() + 0.1

    async def sensor(i: int) -> None:
        rng = random.Random(i)
        due = start + i * interval / n
        in_flight = []
        while due < start + duration:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            in_flight.append(asyncio.create_task(acknowledged(i, rng)))
            due += interval
        await asyncio.gather(*in_flight)

    async def acknowledged(i: int, rng: random.Random) -> None:
        sent = time.monotonic()
        await sessions[i].publish(topic(i), options=options, **reading(rng))
        latencies.append(time.monotonic() - sent)

    await asyncio.gather(*(sensor(i) for i in range(n)))
    return latencies


# -- one case --------------------------------------------------------------------------------


def run_case(sensors: int, policy: str, mount: str,
             opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cairn-wear-") as tmp:
        workdir = Path(tmp)
        config = router_config(workdir / "cairn.toml", policy)
        with LoopFilesystem(workdir, mount) as fs:
            log = workdir / "router.log"
            db = fs.mount / "cairn-data" / "cairn.db"
            rows = opts.prefill if opts.prefill is not None else at_the_bound(opts.warm_up)
            asyncio.run(prefill(db, sensors, rows, opts.interval))
            router = Router(config, fs.mount, log).start()

            async def window() -> tuple[list[float], dict[str, Any], float]:
                await warm_up(router.url, sensors, opts.warm_up)
                sessions = await join(router.url, sensors)
                await asyncio.sleep(2)  # joins and their meta events settle
                checkpoint(db)
                os.sync()
                before = {**router.usage(), "device": fs.written_bytes(),
                          "t": time.monotonic()}
                latencies = await publish_on_schedule(sessions, opts.interval, opts.duration)
                await leave(sessions)
                return latencies, before, time.monotonic()

            latencies, before, ended = asyncio.run(window())
            os.sync()
            running = fs.written_bytes() - before["device"]
            after = router.stop()
            os.sync()
            device = fs.written_bytes() - before["device"]
            seconds = ended - before["t"]
            stored = _stored_rows(db)
    result = summarize(sensors, policy, opts, latencies, seconds, device,
                       after["write_bytes"] - before["write_bytes"],
                       after["cpu_s"] - before["cpu_s"], stored)
    result["device_bytes_at_stop"] = device - running  # the closing checkpoint and state
    result["mount"] = mount
    return result


def _stored_rows(db: Path) -> int:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return c.execute("SELECT COUNT(*) FROM publications").fetchone()[0]


def summarize(sensors: int, policy: str, opts: argparse.Namespace, latencies: list[float],
              seconds: float, device: int, written: int, cpu_s: float,
              stored: int) -> dict[str, Any]:
    readings = len(latencies)
    per_reading = device / readings if readings else None
    per_year = device / seconds * YEAR_S
    ordered = sorted(latencies)
    return {
        "sensors": sensors, "interval_s": opts.interval, "policy": policy,
        "readings": readings, "seconds": round(seconds, 1), "stored_rows": stored,
        "device_bytes": device, "device_bytes_per_reading": round(per_reading or 0),
        "router_write_bytes": written,
        "router_write_bytes_per_reading": round(written / readings) if readings else None,
        "router_cpu_percent": round(100 * cpu_s / seconds, 2),
        "published_p50_ms": round(1000 * quantile(ordered, 0.5, math.nan), 1),
        "published_p99_ms": round(1000 * quantile(ordered, 0.99, math.nan), 1),
        "gb_per_year": round(per_year / 1e9, 1),
        "card_years": {f"{tb}TB": round(tb * 1e12 / per_year, 1) for tb in CARDS_TB},
    }


# -- report ----------------------------------------------------------------------------------


HEAD = ("mount", "sensors", "policy", "readings", "device B/reading", "router B/reading",
        "CPU %", "PUBLISHED p50 ms", "p99 ms", "GB/year", "years of a 10 TB card", "100 TB")


def cells(r: dict[str, Any]) -> tuple[str, ...]:
    return (r.get("mount", "noatime"), str(r["sensors"]), r["policy"], f"{r['readings']:,}",
            f"{r['device_bytes_per_reading']:,}", f"{r['router_write_bytes_per_reading']:,}",
            f"{r['router_cpu_percent']:.1f}", f"{r['published_p50_ms']:,.1f}",
            f"{r['published_p99_ms']:,.1f}", f"{r['gb_per_year']:,.1f}",
            f"{r['card_years']['10TB']:,.1f}", f"{r['card_years']['100TB']:,.1f}")


def table(results: list[dict[str, Any]]) -> str:
    rows = [HEAD, *(cells(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEAD))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.wear", description=__doc__.split("\n")[0])
    p.add_argument("--sensors", default="20,200", help="comma-separated sensor counts")
    p.add_argument("--interval", type=float, default=10.0, help="s between a sensor's readings")
    p.add_argument("--duration", type=float, default=300.0, help="s of each measured window")
    p.add_argument("--prefill", type=int,
                   help="readings stored before the warm-up (default: enough for the history "
                        "to be at the sensor rule's max_events, so the window prunes)")
    p.add_argument("--warm-up", type=int, default=20_000,
                   help="readings published through the router before the window (its WAL "
                        "grows to its working size)")
    p.add_argument("--policies", default="default",
                   help="comma-separated: 'default' (the embedded default as shipped) or a "
                        "commit_window for the sensor rule, such as 0s or 5s")
    p.add_argument("--mounts", default=MOUNT_OPTIONS,
                   help=f"ext4 mount options, several separated by ';' (default {MOUNT_OPTIONS}, "
                        f"as the image mounts its data partition)")
    p.add_argument("--before", type=Path, metavar="JSON",
                   help="an earlier run's output, shown beside this one in the docs section")
    p.add_argument("--docs", action="store_true",
                   help=f"write the results into {DOCS.relative_to(REPO)} (its wear section)")
    p.add_argument("--output", type=Path, default=OUTPUT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    problem = missing_privileges()
    if problem:
        print(f"bench.wear: {problem}", file=sys.stderr)
        return 2
    results = []
    for mount in opts.mounts.split(";"):
        for sensors in (int(n) for n in opts.sensors.split(",")):
            for policy in opts.policies.split(","):
                print(f"  {mount}: {sensors} sensors / {opts.interval:g} s, policy {policy}: "
                      f"{opts.duration:g} s ...", end=" ", flush=True)
                result = run_case(sensors, policy, mount, opts)
                print(f"{result['device_bytes_per_reading']:,} device bytes per reading",
                      flush=True)
                results.append(result)
    print()
    print(table(results))
    run = {"machine": machine(), "source": source_version(), "results": results,
           "options": {k: str(v) for k, v in vars(opts).items()}}
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps(run, indent=2))
    print(f"\n{opts.output}")
    if opts.docs:
        before = json.loads(opts.before.read_text()) if opts.before else None
        write_docs_section(markdown(run, before))
        print(f"wrote the wear section of {DOCS.relative_to(REPO)}")
    return 0


# -- the section in docs/benchmarks.md (kept there when python -m bench rewrites the rest) --

DOCS = REPO / "docs" / "benchmarks.md"
WEAR = "bench.wear"
# the benchmarks whose sections python -m bench keeps (each writes its own, by its name)
KEPT_SECTIONS = (WEAR, "bench.driver_acks")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def write_docs_section(section: str, name: str = WEAR) -> None:
    text = DOCS.read_text() if DOCS.exists() else ""
    DOCS.write_text(replace_section(text, section, name))


def replace_section(text: str, section: str, name: str = WEAR) -> str:
    start, end = markers(name)
    block = f"{start}\n{section.strip()}\n{end}\n"
    if start in text:
        head, _, rest = text.partition(start)
        return head + block + rest.partition(end)[2].lstrip("\n")
    return text.rstrip("\n") + "\n\n" + block


def section_of(text: str, name: str = WEAR) -> str:
    """The ``name`` section of a docs file, markers included ('' when there is none)."""
    start, end = markers(name)
    if start not in text:
        return ""
    inner = text.partition(start)[2].partition(end)[0]
    return f"{start}{inner}{end}\n"


def kept_sections(text: str) -> str:
    """The sections of :data:`KEPT_SECTIONS` in ``text``, one after the other."""
    return "\n".join(filter(None, (section_of(text, name) for name in KEPT_SECTIONS)))


def markdown(run: dict[str, Any], before: dict[str, Any] | None) -> str:
    source, m = run["source"], run["machine"]
    lines = [
        "## SD card wear (`bench.wear`)",
        "",
        f"Run as root with `.venv/bin/python -m bench.wear --docs` (see its docstring; "
        f"commit {str(source.get('commit'))[:10]}, {m['cpu_model']}, {m['nproc']} cores). "
        f"Bytes written to the block device of a loop-mounted ext4 per acknowledged, retained "
        f"reading; N sensors, one reading each every {run['options']['interval']} s; history "
        f"at the embedded default's max_events bound (pruning); policy `default` is the "
        f"embedded default (`commit_window = \"5s\"` on `sensor`), `0s` a commit per reading.",
        "",
    ]
    if before:
        lines += ["Before (Cairn 0.1, commit "
                  f"{str(before['source'].get('commit'))[:10]}; measured then after a restart "
                  "on 100,000 readings, without pruning):", "", *markdown_table(before), ""]
        lines += ["After:", ""]
    lines += markdown_table(run)
    return "\n".join(lines) + "\n"


def markdown_table(run: dict[str, Any]) -> list[str]:
    return ["| " + " | ".join(HEAD) + " |", "|" + "---|" * 3 + "---:|" * 9,
            *("| " + " | ".join(cells(r)) + " |" for r in run["results"])]


if __name__ == "__main__":
    sys.exit(main())
