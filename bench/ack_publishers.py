"""Durable publishes for the store benchmark: lean publisher sessions (pre-serialized
msgpack PUBLISH frames, acknowledge and retain) in several processes, their PUBLISHED/s
and latency, and the generator check against a server that acknowledges at once."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import struct
import time
from array import array
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from bench.measure import CpuMeter, file_bytes, latency_summary, proc_io
from bench.pubsub import (
    CTX,
    FakeBrokerProcess,
    Profiler,
)
from bench.store_data import device_topic, reading
from bench.wire import check_rs_reply, rs_frame, rs_handshake, split_rs
from harness.wamp import (
    ERROR,
    HELLO,
    PUBLISHED,
    WELCOME,
)

# -- 5. durable publishes ---------------------------------------------------------------------


class AckPublisher(asyncio.Protocol):
    """A lean publisher session for the durable case: pre-serialized acknowledged retained
    PUBLISH frames on one topic (only the 8-byte request id changes), ``window`` in flight.
    Counts the PUBLISHED received in [measure_ns, end_ns] and their latencies; stops sending
    at ``end_ns`` and is done when nothing is left in flight."""

    options: dict[str, Any] = {"acknowledge": True, "retain": True}

    def __init__(self, topic: str, window: int, payloads: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        self.welcome: asyncio.Future = loop.create_future()
        self.done: asyncio.Future = loop.create_future()
        self.window = window
        options = msgpack.packb(self.options)
        # fixarray(6), PUBLISH, uint64 request | options, topic, args [], kwargs
        tails = [options + msgpack.packb(topic) + b"\x90" + p for p in payloads]
        self.frames = [(struct.pack("!L", 3 + 8 + len(t)) + b"\x96\x10\xcf", t) for t in tails]
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.handshaken = False
        self.sent: dict[int, int] = {}
        self.next_request = 0
        self.measure_ns = self.end_ns = 2**63
        self.started = False
        self.count = 0
        self.rx_bytes = 0  # received from measure_ns on
        self.latencies = array("q")
        self.errors: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.get_extra_info("socket").setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.write(rs_handshake("msgpack"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionError(f"router closed the connection ({exc})"))
        if self.sent:
            self.errors.append(f"connection lost with {len(self.sent)} in flight ({exc})")
        self._finish()

    def start(self, measure_ns: int, end_ns: int) -> None:
        self.measure_ns, self.end_ns, self.started = measure_ns, end_ns, True
        self._send_publishes(time.perf_counter_ns())

    def _send_publishes(self, now: int) -> None:
        if now >= self.end_ns:
            if not self.sent:
                self._finish()
            return
        out = []
        while len(self.sent) < self.window:
            self.next_request += 1
            request = self.next_request
            head, tail = self.frames[request % len(self.frames)]
            out += (head, request.to_bytes(8, "big"), tail)
            self.sent[request] = time.perf_counter_ns()
        self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if now >= self.measure_ns:
            self.rx_bytes += len(data)
        buf = self.buf + data if self.buf else data
        if not self.handshaken:
            if len(buf) < 4:
                self.buf = buf
                return
            check_rs_reply(buf[:4], "msgpack")
            self.handshaken, buf = True, buf[4:]
            self.transport.write(rs_frame(msgpack.packb(
                [HELLO, "realm1", {"roles": {"publisher": {}}}])))
        frames, self.buf = split_rs(buf)
        for kind, payload in frames:
            if kind == 1:  # ping
                self.transport.write(rs_frame(payload, 2))
            elif kind == 0:
                self._message(msgpack.unpackb(payload, raw=False), now)
        if self.started:
            self._send_publishes(now)

    def _message(self, msg: list[Any], now: int) -> None:
        if msg[0] == PUBLISHED:
            t0 = self.sent.pop(msg[1])
            if self.measure_ns <= now <= self.end_ns:
                self.count += 1
                self.latencies.append(now - t0)
        elif msg[0] == WELCOME:
            self.welcome.set_result(msg[1])
        elif msg[0] == ERROR:
            self.sent.pop(msg[2], None)
            if len(self.errors) < 5:
                self.errors.append(f"{msg[4]}: {msg[5:]!r:.200}")
        else:
            self.errors.append(f"unexpected {msg!r:.200}")
            if not self.welcome.done():
                self.welcome.set_exception(ConnectionError(f"router said {msg!r:.200}"))
            self.transport.close()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


def _payloads(seed: int, n: int = 64) -> list[bytes]:
    rng = random.Random(seed)
    return [msgpack.packb(reading(rng)) for _ in range(n)]


async def _publisher_async(port: int, topics: list[str], window: int, seed: int,
                           conn: Any) -> None:
    loop = asyncio.get_running_loop()
    sessions = []
    for topic in topics:
        _, session = await loop.create_connection(
            lambda t=topic: AckPublisher(t, window, _payloads(seed)), "127.0.0.1", port)
        await asyncio.wait_for(session.welcome, 10)
        sessions.append(session)
    conn.send("ready")
    measure_ns, end_ns = await loop.run_in_executor(None, conn.recv)
    for session in sessions:
        session.start(measure_ns, end_ns)
    wait_s = (end_ns - time.perf_counter_ns()) / 1e9 + 30
    cpu0 = None
    while time.perf_counter_ns() < measure_ns:
        await asyncio.sleep(0.01)
    cpu0 = time.process_time()
    await asyncio.wait_for(asyncio.gather(*(s.done for s in sessions)), wait_s)
    cpu = time.process_time() - cpu0
    latencies = array("q")
    for s in sessions:
        latencies.extend(s.latencies)
        s.transport.close()
    conn.send({"count": sum(s.count for s in sessions), "latencies": latencies.tobytes(),
               "rx_bytes": sum(s.rx_bytes for s in sessions),
               "errors": [e for s in sessions for e in s.errors][:5], "cpu_s": cpu})


def _publisher_main(port: int, topics: list[str], window: int, seed: int, conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    try:
        asyncio.run(_publisher_async(port, topics, window, seed, conn))
    except BaseException as e:  # report, never hang the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})


def _recv(conn: Any, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError("a publisher process did not answer")
    reply = conn.recv()
    if isinstance(reply, dict) and "error" in reply:
        raise RuntimeError(f"publisher process failed: {reply['error']}")
    return reply


def run_publishers(port: int, publishers: int, window: int, warmup: float, duration: float,
                   procs: int, seed: int,
                   on_start: Callable[[], Any] | None = None) -> tuple[dict[str, Any], Any]:
    """``publishers`` lean sessions spread over ``procs`` processes (blocking: run it in a
    thread). ``on_start`` is called when the measured interval begins; its result is returned
    with the merged results."""
    procs = max(1, min(procs, publishers))
    workers = []
    for p in range(procs):
        topics = [device_topic(k) for k in range(p, publishers, procs)]
        parent, child = CTX.Pipe()
        proc = CTX.Process(target=_publisher_main, daemon=True,
                           args=(port, topics, window, seed + p, child))
        proc.start()
        workers.append((proc, parent))
    try:
        for _, conn in workers:
            _recv(conn, 30)
        measure_ns = time.perf_counter_ns() + int((0.05 + warmup) * 1e9)
        end_ns = measure_ns + int(duration * 1e9)
        for _, conn in workers:
            conn.send((measure_ns, end_ns))
        time.sleep(max(0.0, (measure_ns - time.perf_counter_ns()) / 1e9))
        started = on_start() if on_start is not None else None
        replies = [_recv(conn, duration + warmup + 60) for _, conn in workers]
    finally:
        for proc, _ in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    latencies = array("q")
    for r in replies:
        latencies.frombytes(r["latencies"])
    published = sum(r["count"] for r in replies)
    result = {"published": published, "per_s": round(published / duration),
              "latency": latency_summary(list(latencies)),
              "errors": [e for r in replies for e in r["errors"]][:5],
              "client_cpu_s": sum(r["cpu_s"] for r in replies), "client_procs": procs,
              "rx_bytes": sum(r["rx_bytes"] for r in replies)}
    return result, started


async def bench_publish(port: int, pid: int, publishers: int, duration: float, window: int,
                        warmup: float, procs: int, seed: int,
                        profile: Path | None = None) -> dict[str, Any]:
    """Durable publishes through the router: PUBLISHED/s, latency, router CPU per thread
    and bytes written, over the measured interval (py-spy'd into ``profile`` if given)."""
    state: dict[str, Any] = {}

    def started() -> None:
        state["io0"], state["meter"] = proc_io(pid), CpuMeter(pid)
        if profile is not None:
            state["profiler"] = Profiler(pid, duration - 0.5, profile)

    r, _ = await asyncio.to_thread(run_publishers, port, publishers, window, warmup,
                                   duration, procs, seed, started)
    io1, cpu = proc_io(pid), state["meter"].stop(r.pop("client_cpu_s"))
    io0, n = state["io0"], r["published"]
    if profile is not None:
        r["profile"] = {**await asyncio.to_thread(state["profiler"].finish),
                        "threads": thread_shares(profile)}
    return {"publishers": publishers, "window": window, "duration_s": duration, **r,
            "cpu": cpu,
            "write_bytes_per_event": round((io1["write_bytes"] - io0["write_bytes"]) / n)
            if n else None,
            "file_bytes_per_event": round(file_bytes(io0, io1, r.pop("rx_bytes")) / n)
            if n else None,
            "ok": not r["errors"] and n > 0}


def thread_shares(path: Path, top: int = 8) -> dict[str, Any]:
    """py-spy samples per router thread (event loop, the store's writer, others), and the
    writer's hottest frames: where a durable publish spends its time."""
    samples: Counter[str] = Counter()
    writer: Counter[str] = Counter()
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            kind = ("event loop" if "run_forever" in stack else
                    "store writer" if "_commit_batch" in stack or "futures/thread.py" in stack
                    else "other")
            samples[kind] += int(count)
            if kind == "store writer":
                writer[stack.rsplit(";", 1)[-1]] += int(count)
    total = sum(samples.values()) or 1
    return {"share_pct": {k: round(100 * v / total, 1) for k, v in samples.items()},
            "writer_self_top": [(f, round(100 * c / (sum(writer.values()) or 1), 1))
                                for f, c in writer.most_common(top)]}


async def generator_check(publishers: int, window: int, duration: float, procs: int,
                          seed: int) -> dict[str, Any]:
    """The same publisher processes against a trivial server that answers every PUBLISH
    with PUBLISHED at once (bench.wire.FakeBroker in its own process): the clients' ceiling."""
    fake = FakeBrokerProcess(batched=True)
    try:
        r, _ = await asyncio.to_thread(run_publishers, fake.rs_port, publishers, window,
                                       min(1.0, duration / 2), duration, procs, seed)
    finally:
        fake.stop()
    cpu_s = r.pop("client_cpu_s")
    return {"publishers": publishers, "window": window, **r,
            "client_cpu_pct": round(100 * cpu_s / duration)}
