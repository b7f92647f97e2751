"""Readings the store benchmarks take of the router process and the machine: latency
summaries, CPU per thread, bytes written (to files, to the block device), the file
system and its fsync time."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from bench.pubsub import (
    machine_busy_seconds,
)
from cairn.gateway.shell.metrics import quantile
from harness.process import CLK_TCK, process_cpu_seconds

# -- measuring helpers ------------------------------------------------------------------------


def latency_summary(ns: list[int]) -> dict[str, Any]:
    ms = [v / 1e6 for v in ns]
    return {"n": len(ms), "p50_ms": rounded(quantile(ms, 0.50)),
            "p99_ms": rounded(quantile(ms, 0.99)),
            "max_ms": rounded(max(ms) if ms else None),
            "mean_ms": rounded(sum(ms) / len(ms) if ms else None)}


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


_PF_KTHREAD = 0x00200000


def kernel_threads_cpu_seconds() -> float:
    """utime + stime of all kernel threads (writeback, the ext4 journal, ...): work our own
    fsyncs cause, kept apart from "other programs"."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[6]) & _PF_KTHREAD:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def thread_cpu_seconds(pid: int, tid: int) -> float:
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class CpuMeter:
    """CPU used during a phase by the router (and by its event-loop thread apart from its
    other threads, i.e. the SQLite workers), by the clients, by kernel threads and by
    anything else on the machine (100 = one core). A large "other" means other programs ran
    meanwhile and the numbers are disturbed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.router0 = process_cpu_seconds(pid)
        self.loop0 = thread_cpu_seconds(pid, pid)
        self.self0 = time.process_time()
        self.kernel0 = kernel_threads_cpu_seconds()
        self.busy0 = machine_busy_seconds()[0]
        self.wall0 = time.perf_counter()

    def stop(self, client_processes_s: float = 0.0) -> dict[str, int]:
        """``client_processes_s``: CPU seconds of client processes other than this one."""
        wall = time.perf_counter() - self.wall0
        busy = machine_busy_seconds()[0] - self.busy0
        router = process_cpu_seconds(self.pid) - self.router0
        loop = thread_cpu_seconds(self.pid, self.pid) - self.loop0
        me = time.process_time() - self.self0 + client_processes_s
        kernel = kernel_threads_cpu_seconds() - self.kernel0
        return {"router_cpu_pct": round(100 * router / wall),
                "router_loop_cpu_pct": round(100 * loop / wall),
                "client_cpu_pct": round(100 * me / wall),
                "kernel_threads_cpu_pct": round(100 * kernel / wall),
                "other_cpu_pct": round(100 * max(0.0, busy - router - me - kernel) / wall)}


def proc_io(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def file_bytes(io0: dict[str, int], io1: dict[str, int], socket_bytes: int) -> int:
    """Bytes the router handed to write system calls for files (the WAL, the database, its
    log): wchar less what it sent on sockets (= what the clients received). Unlike
    write_bytes it does not depend on how the kernel accounts dirtied page-cache memory (on
    kernels with large folios a 4 KiB write into a cached 64 KiB folio counts 64 KiB)."""
    return io1["wchar"] - io0["wchar"] - socket_bytes


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def db_files_size(db: Path) -> tuple[int, int]:
    return file_size(db), file_size(db.with_name(db.name + "-wal"))


def block_device_stat(path: Path) -> Path | None:
    """/sys/dev/block/MAJ:MIN/stat of the device holding ``path`` (or its parent disk)."""
    dev = path.stat().st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return stat if stat.exists() else None


def device_sectors_written(stat: Path | None) -> int | None:
    if stat is None:
        return None
    try:
        return int(stat.read_text().split()[6])  # sectors of 512 bytes, whatever the device
    except (OSError, IndexError, ValueError):
        return None


def filesystem_of(path: Path) -> dict[str, Any]:
    """The mount holding ``path`` (longest matching mount point in /proc/mounts)."""
    best: tuple[str, str, str] = ("", "?", "?")
    resolved = str(path.resolve())
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            device, mount, fstype = parts[0], parts[1], parts[2]
            if (resolved == mount or resolved.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) >= len(best[0]):
                best = (mount, device, fstype)
    return {"mount": best[0], "device": best[1], "fstype": best[2]}


def fsync_baseline(directory: Path, rounds: int = 100) -> dict[str, Any]:
    """4 KiB pwrite + fdatasync on the data directory's file system: the floor under every
    durable commit."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    times = []
    try:
        block = os.urandom(4096)
        for i in range(rounds):
            os.pwrite(fd, block, (i % 16) * 4096)
            t0 = time.perf_counter_ns()
            os.fdatasync(fd)
            times.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return latency_summary(times)


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} ms" if value < 100 else f"{value:,.0f} ms"
