"""Pub/sub benchmark for the Cairn router: throughput and publish->event latency.

Run from the repository root (``make bench`` does the same)::

    .venv/bin/python -m bench.pubsub [--duration 5] [--cases ws-json-100] [--profile]

It starts ``cairn router`` as a subprocess on free 127.0.0.1 ports (config in a temporary
directory, no history rules, so this measures the live path) and drives it with real WAMP
clients over real sockets (see :mod:`bench.wire`):

- one publisher (in this process, blocking socket, pre-serialized PUBLISH frames, no
  acknowledgement) and N subscriber sessions spread over ``--sub-procs`` processes;
- throughput phase: the publisher sends in batches as fast as the router takes them for
  ``--duration`` seconds, but never more than ``--window`` publications ahead of the slowest
  subscriber (the subscribers publish their counts in shared memory), so nothing queues
  without bound and the router never sees a slow consumer. Delivered events/s = events
  received by all subscribers / (last delivery - first send);
- latency phase: a paced run (``--lat-rate`` publications/s, capped at half the measured
  capacity so queueing does not dominate) for ``--lat-duration`` seconds; every event
  carries its send timestamp (``perf_counter_ns``, CLOCK_MONOTONIC) and subscribers record
  receive - send;
- generator check: the same client code against a trivial fan-out server
  (:class:`bench.wire.FakeBroker`) in its own process: "fake" writes one frame per event per
  subscriber as the router does, "fake-batch" coalesces them and shows the clients' ceiling.

Every subscriber checks the sequence numbers of what it receives; a case is marked not ok
when any subscriber missed, duplicated or reordered an event, or its connection dropped.
CPU use of the server, of the clients and of anything else on the machine is measured
during each throughput phase, so a disturbed run shows ("other" column).

The table goes to stdout, the details (with a machine description and the git commit) to
``bench/results/pubsub.json``. ``--profile`` samples the router with py-spy during each
throughput phase and lists the hot spots; ``--router-cmd`` runs the router under another
command (e.g. a wrapper that enables cProfile or traces GC pauses).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.wire import TOPIC, Publisher, SubscriberSession, serve_fake_broker
from cairn.gateway.shell.metrics import quantile
from harness.config import NO_READ_BUDGET, history_rule, open_realm
from harness.process import (
    CLK_TCK,
    free_port,
    process_cpu_seconds,
    wait_for_ports,
)
from harness.process import RouterProcess as HarnessRouterProcess

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
CTX = mp.get_context("fork")

# -- processes under test ----------------------------------------------------------------------


def machine_busy_seconds() -> tuple[float, float]:
    """(busy in processes incl. steal, busy in interrupts/softirqs) CPU seconds of the whole
    machine so far, from /proc/stat. Loopback TCP work often lands in softirq time."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + steal) / CLK_TCK, (irq + softirq) / CLK_TCK


class RouterProcess(HarnessRouterProcess):
    """``cairn router`` as benchmarked: the installed entry point (or ``command``), warnings
    only in its log, the embedded default limits (fair shares, no per-connection cap) or,
    with ``limits="lifted"``, a per-connection cap set far above any client (what the cap's
    bookkeeping costs: ~10 % of 1->1 ws/json), optionally a history rule or a traced
    garbage collector."""

    name = "cairn"

    def __init__(self, workdir: Path, command: str | None = None,
                 trace_gc: bool = False, history: tuple[str, str] | None = None,
                 limits: str = "default") -> None:
        """``history``: (uri, match) of a history rule, so those topics are stored."""
        realm = open_realm(allow=("publish", "subscribe"),
                           history=[history_rule(*history)] if history is not None else [])
        cairn = Path(sys.executable).parent / "cairn"
        cmd = [str(cairn)] if cairn.exists() else [sys.executable, "-m", "cairn.app.cli"]
        env: dict[str, str] = {}
        self.gc_log: Path | None = None
        if trace_gc:
            self.gc_log = workdir / "gc.log"
            cmd = [sys.executable, "-m", "bench.traced_router"]
            env["BENCH_GC_LOG"] = str(self.gc_log)
        if command:
            cmd = shlex.split(command)
        lifted = f"[router.limits]\n{NO_READ_BUDGET}" if limits == "lifted" else ""
        super().__init__(workdir, realm, env=env, log_level="warning", command=cmd,
                         router_toml=lifted)
        self.start()
        self.ws_port, self.rs_port = self.port, self.rawsocket_port

    def gc_pauses(self, start: float, end: float) -> list[float] | None:
        """GC pauses (ms) between two time.monotonic() readings, when traced."""
        if self.gc_log is None:
            return None
        pauses = []
        with contextlib.suppress(OSError), open(self.gc_log) as f:
            for line in f:
                when, _gen, ms = line.split()
                if start <= float(when) <= end:
                    pauses.append(float(ms))
        return pauses


def _fake_broker_main(ws_port: int, rs_port: int, batched: bool) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await serve_fake_broker(ws_port, rs_port, stop, batched)

    asyncio.run(main())


class FakeBrokerProcess:
    """The generator check's trivial fan-out server, in its own process like the router:
    "fake" writes one frame per event per subscriber like cairn, "fake-batch" coalesces."""

    def __init__(self, batched: bool) -> None:
        self.name = "fake-batch" if batched else "fake"
        self.ws_port, self.rs_port = free_port(), free_port()
        self.proc = CTX.Process(target=_fake_broker_main, daemon=True,
                                args=(self.ws_port, self.rs_port, batched))
        self.proc.start()
        self.pid = self.proc.pid
        try:
            wait_for_ports([self.ws_port, self.rs_port], self.proc.is_alive)
        except Exception:
            self.stop()
            raise

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def gc_pauses(self, start: float, end: float) -> list[float] | None:
        return None

    def stop(self) -> int | None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        return self.proc.exitcode


# -- subscriber processes ------------------------------------------------------------------------


CONNECT_CONCURRENCY = 16  # session handshakes in flight per subscriber process


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (hundreds of sessions per process)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _subscriber_main(transport: str, serializer: str, port: int, first: int, n: int,
                     counts: Any, lasts: Any, conn: Any, topic: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    raise_fd_limit()
    try:
        asyncio.run(_subscriber_async(transport, serializer, port, first, n, counts, lasts,
                                      conn, topic))
    except Exception as e:
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None


async def _subscriber_async(transport: str, serializer: str, port: int, first: int, n: int,
                            counts: Any, lasts: Any, conn: Any, topic: str) -> None:
    loop = asyncio.get_running_loop()
    sessions = [SubscriberSession(transport, serializer, port, first + i, counts, lasts,
                                  topic.format(i=first + i)) for i in range(n)]
    # a few handshakes at a time: hundreds of simultaneous connects overflow a server's
    # listen backlog (Twisted's is 50) and the retried SYNs then wait seconds
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def open_session(s: SubscriberSession) -> None:
        async with limit:
            await loop.create_connection(lambda: s, "127.0.0.1", port)
            await s.subscribed

    await asyncio.wait_for(asyncio.gather(*(open_session(s) for s in sessions)),
                           20 + n / 20)
    conn.send(("ready", n))
    done = loop.create_future()
    cpu0 = time.process_time()

    def on_command() -> None:
        nonlocal cpu0
        command, arg = conn.recv()
        latencies = array("q")
        for s in sessions:
            if s.latencies is not None:
                latencies.extend(s.latencies)
        stats = {"counts": [s.count for s in sessions], "gaps": [s.gaps for s in sessions],
                 "cpu": time.process_time() - cpu0, "latencies": latencies.tobytes(),
                 "lost": sum(s.closed.done() for s in sessions)}
        if command == "phase":
            for s in sessions:
                s.reset(latency=arg == "latency")
        cpu0 = time.process_time()
        conn.send(("stats", stats))
        if command == "stop":
            loop.remove_reader(conn.fileno())
            for s in sessions:
                s.close()
            done.set_result(None)

    loop.add_reader(conn.fileno(), on_command)
    await done
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(s.closed for s in sessions)), 2)


@dataclass
class PhaseStats:
    counts: list[int] = field(default_factory=list)
    gaps: list[int] = field(default_factory=list)
    cpu: float = 0.0
    latencies: array = field(default_factory=lambda: array("q"))
    lost: int = 0


class SubscriberGroup:
    """``n`` subscriber sessions spread over ``procs`` processes; session ``i`` subscribes
    to ``topic.format(i=i)``."""

    def __init__(self, transport: str, serializer: str, port: int, n: int, procs: int,
                 topic: str = TOPIC) -> None:
        self.n = n
        self.counts = CTX.RawArray("q", n)
        self.lasts = CTX.RawArray("q", n)
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.stopped = False
        procs = max(1, min(procs, n))
        first = 0
        for i in range(procs):
            size = n // procs + (1 if i < n % procs else 0)
            parent, child = CTX.Pipe()
            p = CTX.Process(target=_subscriber_main, daemon=True,
                            args=(transport, serializer, port, first, size, self.counts,
                                  self.lasts, child, topic))
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
            first += size

    def _recv(self, conn: Any, timeout: float) -> Any:
        if not conn.poll(timeout):
            raise RuntimeError("a subscriber process did not answer")
        kind, value = conn.recv()
        if kind == "error":
            raise RuntimeError(f"subscriber process failed: {value}")
        return value

    def wait_ready(self, timeout: float = 30) -> None:
        for conn in self.conns:
            self._recv(conn, timeout)

    def command(self, command: str, arg: str | None = None) -> PhaseStats:
        """Ends the current phase (and starts ``arg`` for "phase"); returns its stats."""
        self.stopped = self.stopped or command == "stop"
        for conn in self.conns:
            conn.send((command, arg))
        merged = PhaseStats()
        for conn in self.conns:
            stats = self._recv(conn, 30)
            merged.counts += stats["counts"]
            merged.gaps += stats["gaps"]
            merged.cpu += stats["cpu"]
            merged.latencies.frombytes(stats["latencies"])
            merged.lost += stats["lost"]
        return merged

    def close(self) -> None:
        for p in self.procs:
            p.join(3 if self.stopped else 0)
            if p.is_alive():
                p.terminate()
                p.join(3)
        for conn in self.conns:
            conn.close()


# -- driving a case ------------------------------------------------------------------------------


def wait_delivered(counts: Any, target: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while min(counts) < target:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def drive_throughput(pub: Publisher, group: SubscriberGroup, duration: float, window: int,
                     batch: int) -> dict[str, Any]:
    counts, frame = group.counts, pub.frame
    seq = stalls = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter_ns()
    deadline = t0 + int(duration * 1e9)
    sample_every = 500_000_000
    next_sample, samples = t0 + sample_every, [(t0, 0)]
    while True:
        now = time.perf_counter_ns()
        if now >= deadline:
            break
        if now >= next_sample:
            samples.append((now, sum(counts)))
            next_sample += sample_every
        if seq + batch - min(counts) > window:
            stalls += 1
            time.sleep(0.0002)
            continue
        pub.send(b"".join([frame(s, now) for s in range(seq, seq + batch)]))
        seq += batch
    send_end = time.perf_counter_ns()
    publisher_cpu = time.process_time() - cpu0
    delivered = wait_delivered(counts, seq, timeout=max(10.0, duration * 2))
    rates = [(c1 - c0) / ((t1 - t0_) / 1e9)
             for (t0_, c0), (t1, c1) in zip(samples, samples[1:], strict=False)]
    return {"sent": seq, "t0": t0, "send_end": send_end, "end": max(group.lasts),
            "all_delivered": delivered, "stalls": stalls, "publisher_cpu": publisher_cpu,
            "interval_rates": rates}


def drive_paced(pub: Publisher, group: SubscriberGroup, rate: float, duration: float,
                window: int) -> dict[str, Any]:
    counts = group.counts
    n = max(1, int(rate * duration))
    interval = 1e9 / rate
    cpu0 = time.process_time()
    start = time.perf_counter_ns() + 1_000_000
    for i in range(n):
        if i % 16 == 0 and i - min(counts) > window:
            wait_delivered(counts, i - window, timeout=10)
        delay = start + int(i * interval) - time.perf_counter_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        pub.send(pub.frame(i, time.perf_counter_ns()))
    end = time.perf_counter_ns()
    publisher_cpu = time.process_time() - cpu0
    delivered = wait_delivered(counts, n, timeout=10)
    return {"sent": n, "rate": n / ((end - start) / 1e9), "all_delivered": delivered,
            "publisher_cpu": publisher_cpu}


def check(stats: PhaseStats, sent: int, nsubs: int) -> list[str]:
    problems = []
    short = [c for c in stats.counts if c != sent]
    if short:
        problems.append(f"{len(short)}/{nsubs} subscribers received a count != {sent} "
                        f"(e.g. {short[:3]})")
    if sum(stats.gaps):
        problems.append(f"{sum(stats.gaps)} sequence gaps/reorders")
    if stats.lost:
        problems.append(f"{stats.lost} subscriber connections closed by the server")
    return problems


class Profiler:
    """``py-spy record`` of the server process while a throughput phase runs (optional)."""

    def __init__(self, pid: int, duration: float, out: Path) -> None:
        exe = Path(sys.executable).parent / "py-spy"
        self.out = out
        self.proc = subprocess.Popen(
            [str(exe), "record", "--pid", str(pid), "--duration", str(max(1, int(duration))),
             "--rate", "250", "--nonblocking", "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)  # let it attach

    def finish(self) -> dict[str, Any]:
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(5)
        return summarize_profile(self.out)


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function of the event-loop thread, from
    py-spy's raw (folded) output."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    total = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"error": f"no profile written to {path}"}
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        if "run_forever" not in stack:
            continue  # another thread (e.g. the SQLite worker), not the event loop
        total += count
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1]
                  + ")" if " (" in f else f for f in stack.split(";")]
        self_counts[frames[-1]] += count
        for f in set(frames):
            incl_counts[f] += count
    pct = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0)
    return {
        "samples": total,
        "file": str(path),
        "self_top": [(f, pct(c)) for f, c in self_counts.most_common(top)],
        "inclusive_top": [(f, pct(c)) for f, c in incl_counts.most_common(top + 10)],
    }


@dataclass
class Case:
    label: str
    transport: str
    serializer: str
    subscribers: int

    @property
    def id(self) -> str:
        short = {"websocket": "ws", "rawsocket": "rs"}[self.transport]
        return f"{short}-{self.serializer}-{self.subscribers}"


def run_case(server: Any, case: Case, opts: argparse.Namespace, duration: float,
             lat_duration: float, lat_rate: float | None = None,
             profile: bool = False) -> dict[str, Any]:
    port = server.ws_port if case.transport == "websocket" else server.rs_port
    result: dict[str, Any] = {
        "server": server.name, "case": case.label, "transport": case.transport,
        "serializer": case.serializer, "subscribers": case.subscribers, "problems": [],
    }
    group = SubscriberGroup(case.transport, case.serializer, port, case.subscribers,
                            opts.sub_procs)
    pub = None
    try:
        group.wait_ready()
        pub = Publisher(case.transport, case.serializer, port)
        # warm-up: a short throughput burst, then check it arrived
        group.command("phase", "warmup")
        warm = drive_throughput(pub, group, 0.3, opts.window, opts.batch)
        stats = group.command("phase", "throughput")
        result["problems"] += [f"warm-up: {p}" for p in check(stats, warm["sent"],
                                                               case.subscribers)]
        # throughput
        profiler = None
        if profile:
            opts.output.parent.mkdir(parents=True, exist_ok=True)
            out = (opts.output.parent
                   / f"profile-{server.name}-{case.transport}-{case.subscribers}.txt")
            profiler = Profiler(server.pid, duration, out)
        server_cpu0, busy0 = server.cpu_seconds(), machine_busy_seconds()
        wall0, mono0 = time.perf_counter(), time.monotonic()
        tp = drive_throughput(pub, group, duration, opts.window, opts.batch)
        server_cpu = server.cpu_seconds() - server_cpu0
        busy1 = machine_busy_seconds()
        busy, irq = busy1[0] - busy0[0], busy1[1] - busy0[1]
        cpu_wall = time.perf_counter() - wall0
        gc_tput = server.gc_pauses(mono0, time.monotonic())
        stats = group.command("phase", "latency")
        if profiler is not None:
            result["profile"] = profiler.finish()
        elapsed = (tp["end"] - tp["t0"]) / 1e9
        delivered = sum(stats.counts)
        result["problems"] += check(stats, tp["sent"], case.subscribers)
        client_cpu = stats.cpu + tp["publisher_cpu"]
        rates = sorted(tp["interval_rates"])
        result.update({
            "duration_s": round(elapsed, 3),
            "published": tp["sent"],
            "delivered": delivered,
            "expected": tp["sent"] * case.subscribers,
            "events_per_s": round(delivered / elapsed),
            "publishes_per_s": round(tp["sent"] / elapsed),
            "drain_ms": round((tp["end"] - tp["send_end"]) / 1e6, 1),
            "window_stalls": tp["stalls"],
            "server_cpu_pct": round(100 * server_cpu / cpu_wall),
            "server_cpu_us_per_event": (round(1e6 * server_cpu / delivered, 1) if delivered
                                        else None),
            "client_cpu_pct": round(100 * client_cpu / cpu_wall),
            # what other programs on the machine used meanwhile, and interrupt/softirq time
            "other_cpu_pct": round(100 * max(0.0, busy - server_cpu - client_cpu) / cpu_wall),
            "softirq_cpu_pct": round(100 * irq / cpu_wall),
            "interval_events_per_s": [round(r) for r in tp["interval_rates"]],
            "interval_spread_pct": (round(100 * (rates[-1] - rates[0]) / rates[len(rates) // 2])
                                    if len(rates) > 1 and rates[len(rates) // 2] else None),
            "subscriber_cpu_s": round(stats.cpu, 2),
            "publisher_cpu_s": round(tp["publisher_cpu"], 2),
            "profiled": profile,
        })
        # latency at a pace well under capacity
        capacity = tp["sent"] / elapsed
        rate = lat_rate or min(opts.lat_rate, max(10.0, 0.5 * capacity))
        server_cpu0, busy0 = server.cpu_seconds(), machine_busy_seconds()
        wall0, mono0 = time.perf_counter(), time.monotonic()
        lat = drive_paced(pub, group, rate, lat_duration, opts.window)
        stats = group.command("stop")
        wall = time.perf_counter() - wall0
        others = (machine_busy_seconds()[0] - busy0[0] - (server.cpu_seconds() - server_cpu0)
                  - stats.cpu - lat["publisher_cpu"])
        result["problems"] += [f"latency phase: {p}" for p in check(stats, lat["sent"],
                                                                     case.subscribers)]
        values = sorted(stats.latencies)
        result.update({
            "lat_rate_target": round(rate),
            "lat_rate": round(lat["rate"]),
            "lat_samples": len(values),
            "p50_ms": round(quantile(values, 0.50, math.nan) / 1e6, 3),
            "p99_ms": round(quantile(values, 0.99, math.nan) / 1e6, 3),
            "p999_ms": round(quantile(values, 0.999, math.nan) / 1e6, 3),
            "max_ms": round(values[-1] / 1e6, 3) if values else None,
            "lat_other_cpu_pct": round(100 * max(0.0, others) / wall),
        })
        gc_lat = server.gc_pauses(mono0, time.monotonic())
        if gc_tput is not None and gc_lat is not None:
            result["gc_pauses_over_1ms"] = {
                "throughput": {"count": len(gc_tput), "max_ms": max(gc_tput, default=0.0)},
                "latency": {"count": len(gc_lat), "max_ms": max(gc_lat, default=0.0),
                            "total_ms": round(sum(gc_lat), 1)},
            }
    except Exception as e:
        result["problems"].append(f"failed: {type(e).__name__}: {e}")
    finally:
        if pub is not None:
            pub.close()
        group.close()
    result["ok"] = not result["problems"]
    return result


# -- reporting ----------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, "unknown" where there is none."""
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return model


def machine() -> dict[str, Any]:
    model = cpu_model()
    mem = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        mem = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    import autobahn

    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "mem_gib": mem,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "autobahn": autobahn.__version__,
        "loadavg_before": os.getloadavg(),
    }


def source_version() -> dict[str, Any]:
    """The commit the router code comes from, and whether gateway/ has local changes."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=5, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    dirty = git("status", "--porcelain", "--", "gateway")
    return {"commit": git("rev-parse", "HEAD"),
            "gateway_dirty": None if dirty is None else bool(dirty)}


def results_start(benchmark: str, opts: Any) -> dict[str, Any]:
    """The head of a benchmark's JSON results (its name, when, the machine, its settings and
    the source's commit), with the machine in one line on stdout."""
    info = machine()
    print(f"machine: {info['nproc']} CPUs, {info['cpu_model']}, Python {info['python']}, "
          f"load {info['loadavg_before'][0]:.2f}")
    return {"benchmark": benchmark, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": info, "settings": {k: str(v) for k, v in vars(opts).items()},
            "source": source_version()}


def results_end(results: dict[str, Any], table_text: str, output: Path) -> None:
    """The table on stdout and the results as JSON in ``output``."""
    print(f"\n{table_text}")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {output}")


def fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def table(results: list[dict[str, Any]]) -> str:
    head = ("server", "case", "transport/serializer", "subs", "events/s", "pub/s", "p50 ms",
            "p99 ms", "lat @/s", "srv cpu", "srv µs/ev", "cli cpu", "other", "ok")
    rows = [head]
    for r in results:
        rows.append((
            r["server"], r["case"], f"{r['transport']}/{r['serializer']}",
            str(r["subscribers"]), fmt(r.get("events_per_s"), ","),
            fmt(r.get("publishes_per_s"), ","), fmt(r.get("p50_ms"), ".2f"),
            fmt(r.get("p99_ms"), ".2f"), fmt(r.get("lat_rate"), ","),
            fmt(r.get("server_cpu_pct"), "d") + "%", fmt(r.get("server_cpu_us_per_event"), ".1f"),
            fmt(r.get("client_cpu_pct"), "d") + "%",
            fmt(r.get("other_cpu_pct"), "d") + "%", "yes" if r["ok"] else "NO",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if j < 3 else c.rjust(w)
                               for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def generator_verdict(router: list[dict[str, Any]], fake: list[dict[str, Any]]) -> list[str]:
    notes = []
    for f in fake:
        r = next((r for r in router if (r["transport"], r["serializer"], r["subscribers"])
                  == (f["transport"], f["serializer"], f["subscribers"])), None)
        if r is None or not r.get("events_per_s") or not f.get("events_per_s"):
            continue
        ratio = f["events_per_s"] / r["events_per_s"]
        notes.append(
            f"{f['case']} {f['transport']}/{f['serializer']}: the same clients moved "
            f"{f['events_per_s']:,} events/s through {f['server']} vs {r['events_per_s']:,} "
            f"through cairn ({ratio:.1f}x); with cairn, cairn used {r['server_cpu_pct']}% of "
            f"a CPU and the clients {r['client_cpu_pct']}%")
    return notes


# -- main -----------------------------------------------------------------------------------------


# 1 publisher -> 1, 10 and 100 subscribers, WebSocket/JSON and RawSocket/MsgPack
ROUTER_CASES = [Case(f"1->{n}", transport, serializer, n) for n in (1, 10, 100)
                for transport, serializer in (("websocket", "json"), ("rawsocket", "msgpack"))]
CHECK_CASES = [  # (batched fake server?, case)
    (False, Case("1->1", "websocket", "json", 1)),
    (False, Case("1->1", "rawsocket", "msgpack", 1)),
    (False, Case("1->100", "websocket", "json", 100)),
    (True, Case("1->100", "websocket", "json", 100)),
]


def run_generator_check(opts: argparse.Namespace, cases: list[tuple[bool, Case]],
                        reference: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same clients against the trivial fan-out server; the latency phase runs at the
    rate the matching ``reference`` case (a router's) used."""
    results = []
    for batched in (False, True):
        todo = [c for b, c in cases if b == batched]
        if not todo:
            continue
        fake = FakeBrokerProcess(batched)
        try:
            for case in todo:
                same = next((r for r in reference
                             if (r["transport"], r["serializer"], r["subscribers"])
                             == (case.transport, case.serializer, case.subscribers)), {})
                print(f"  {fake.name} {case.label} {case.transport}/{case.serializer} ...",
                      end=" ", flush=True)
                r = run_case(fake, case, opts, opts.check_duration,
                             opts.lat_duration,
                             lat_rate=same.get("lat_rate_target"))
                results.append(r)
                print(f"{fmt(r.get('events_per_s'), ',')} events/s"
                      + ("" if r["ok"] else f"  PROBLEMS: {r['problems']}"), flush=True)
        finally:
            fake.stop()
    return results


def add_fanout_args(p: argparse.ArgumentParser) -> None:
    """--window, --batch and --sub-procs: how a fan-out case publishes and subscribes."""
    cpus = len(os.sched_getaffinity(0))
    p.add_argument("--window", type=int, default=1000,
                   help="max publications ahead of the slowest subscriber (default 1000)")
    p.add_argument("--batch", type=int, default=50,
                   help="PUBLISH frames per socket write in the throughput phase (default 50)")
    p.add_argument("--sub-procs", type=int, default=max(2, cpus // 2),
                   help="subscriber processes per case (default max(2, cpus/2))")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pubsub", description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=5.0,
                   help="seconds of the throughput phase per router case (default 5)")
    p.add_argument("--lat-duration", type=float, default=3.0,
                   help="seconds of the paced latency phase per case (default 3)")
    p.add_argument("--lat-rate", type=float, default=1000.0,
                   help="publications/s in the latency phase, capped at half the measured "
                        "capacity (default 1000)")
    p.add_argument("--check-duration", type=float, default=3.0,
                   help="seconds of each generator-check phase (default 3)")
    add_fanout_args(p)
    p.add_argument("--cases", metavar="IDS",
                   help="comma-separated subset of "
                        f"{', '.join(c.id for c in ROUTER_CASES)} (default: all)")
    p.add_argument("--no-check", action="store_true", help="skip the generator check")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the router during each throughput phase "
                        "(pip install py-spy; sampling is non-blocking, so time in C calls and "
                        "syscalls counts as the calling Python function's own time)")
    p.add_argument("--trace-gc", action="store_true",
                   help="run the router through bench.traced_router, which logs garbage "
                        "collections over 1 ms, and report them per phase")
    p.add_argument("--router-cmd", metavar="CMD",
                   help="command that runs the router, before 'router --config FILE' "
                        "(default: the venv's cairn), e.g. to run it under a tracer")
    p.add_argument("--limits", choices=("default", "lifted"), default="default",
                   help="the router's per-connection read limits: the embedded default's "
                        "(no cap), or a cap far above any client (default: default)")
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "pubsub.json")
    return p.parse_args(argv)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwind through the finally blocks that stop the router


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    wanted = set(opts.cases.split(",")) if opts.cases else None
    known = {c.id for c in ROUTER_CASES}
    if wanted and not wanted <= known:
        print(f"unknown case(s) {sorted(wanted - known)}; known: {sorted(known)}",
              file=sys.stderr)
        return 2

    def selected(case: Case) -> bool:
        return wanted is None or case.id in wanted

    info = machine()
    print(f"machine: {info['nproc']} CPUs ({info['usable_cpus']} usable), {info['cpu_model']}, "
          f"Python {info['python']}, autobahn {info['autobahn']}", flush=True)
    started = time.monotonic()
    router_results: list[dict[str, Any]] = []
    check_results: list[dict[str, Any]] = []
    router_problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cairn-bench-") as tmp:
        router = RouterProcess(Path(tmp), opts.router_cmd, opts.trace_gc, limits=opts.limits)
        try:
            for case in [c for c in ROUTER_CASES if selected(c)]:
                print(f"  cairn {case.label} {case.transport}/{case.serializer} ...",
                      end=" ", flush=True)
                r = run_case(router, case, opts, opts.duration, opts.lat_duration,
                             profile=opts.profile)
                router_results.append(r)
                print(f"{fmt(r.get('events_per_s'), ',')} events/s"
                      + ("" if r["ok"] else f"  PROBLEMS: {r['problems']}"), flush=True)
                if router.proc.poll() is not None:
                    router_problems.append(f"router exited with {router.proc.returncode}")
                    break
            router_problems += [line for line in router.log_lines()
                                if "slow consumer" in line or "aborted" in line
                                or "Traceback" in line or "ERROR" in line][:20]
        finally:
            code = router.stop()
            print(f"  router stopped (exit code {code})", flush=True)
    if not opts.no_check:
        check_results = run_generator_check(
            opts, [(b, c) for b, c in CHECK_CASES if selected(c)], router_results)
    total = time.monotonic() - started

    print()
    print(table(router_results + check_results))
    print()
    print("events/s: events received by all subscribers / (last delivery - first send); "
          "pub/s: PUBLISHes/s.")
    print("p50/p99: publish->event latency in a paced run at 'lat @/s' publications/s. "
          "srv/cli cpu: CPU")
    print("of the server process / of all client processes / of anything else on the machine "
          "during the")
    print("throughput phase (100% = one core). A large 'other' means the numbers are disturbed.")
    print("srv µs/ev: the server's CPU time in that phase per event delivered (what an event "
          "costs a Pi).")
    print("Spikes of 10 ms and more in p99/p99.9 (JSON) are usually full garbage collections in "
          "the router (--trace-gc).")
    busy = [r for r in router_results + check_results
            if max(r.get("other_cpu_pct") or 0, r.get("lat_other_cpu_pct") or 0) > 15]
    if busy:
        print(f"WARNING: other load on the machine during {len(busy)} case(s); "
              "rerun on a quiet machine")
    verdict = generator_verdict(router_results, check_results)
    if verdict:
        print("generator check:")
        for line in verdict:
            print(f"  {line}")
    if router_problems:
        print("router log / problems:")
        for line in router_problems:
            print(f"  {line}")
    for r in router_results:
        gcs = r.get("gc_pauses_over_1ms")
        if gcs:
            print(f"router GC pauses > 1 ms, {r['case']} {r['transport']}/{r['serializer']}: "
                  f"throughput phase {gcs['throughput']['count']} (max "
                  f"{gcs['throughput']['max_ms']:.1f} ms), latency phase "
                  f"{gcs['latency']['count']} (max {gcs['latency']['max_ms']:.1f} ms); "
                  f"latency p99 {r.get('p99_ms')} ms, max {r.get('max_ms')} ms")
    for r in router_results:
        if "profile" in r:
            print(f"router hot spots (py-spy, self time) {r['case']} "
                  f"{r['transport']}/{r['serializer']}:")
            for name, pct in r["profile"].get("self_top", [])[:10]:
                print(f"  {pct:5.1f}%  {name}")
    print(f"total {total:.0f} s")

    opts.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "pubsub",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "source": source_version(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "router": router_results,
        "generator_check": check_results,
        "generator_verdict": verdict,
        "router_problems": router_problems,
        "total_s": round(total, 1),
    }
    opts.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {opts.output}")
    ok = all(r["ok"] for r in router_results + check_results) and not router_problems
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
