"""Mosquitto's 1->N fan-out with the workload of :mod:`bench.pubsub`, for issue 46's ratio.

Run from the repository root::

    .venv/bin/python -m bench.mosquitto_pubsub [--duration 5] [--subscribers 1,8]

It starts ``/usr/sbin/mosquitto`` on a free 127.0.0.1 port and drives it as bench.pubsub
drives Cairn: one publisher in this process writes pre-built MQTT 3.1.1 QoS 0 PUBLISH
packets (a 16-byte payload: sequence number and send time) in batches of ``--batch``, never
more than ``--window`` ahead of the slowest subscriber; each subscriber is its own process on
a raw socket and checks that the sequence numbers arrive in order. Delivered events/s =
events received by all subscribers / (last delivery - first send); broker µs/ev = the
broker's CPU time in that phase per event delivered. The table goes to stdout, the details
to ``bench/results/mosquitto_pubsub.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.pubsub import RESULTS_DIR, fmt, results_end, results_start
from harness.process import free_port, process_cpu_seconds, wait_for_ports

CTX = mp.get_context("fork")
TOPIC = b"bench/topic"
_CONNACK = b"\x20\x02\x00\x00"


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _remaining_length(len(body)) + body


def _string(text: bytes) -> bytes:
    return len(text).to_bytes(2, "big") + text


def connect(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # MQTT 3.1.1 CONNECT: protocol name and level 4, clean session, 60 s keep-alive
    sock.sendall(_packet(0x10, _string(b"MQTT") + b"\x04\x02\x00\x3c"
                         + _string(client_id.encode())))
    if _read_exactly(sock, 4) != _CONNACK:
        raise ConnectionError("Mosquitto refused the connection")
    return sock


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def publish_packet(seq: int, ts: int) -> bytes:
    return _packet(0x30, _string(TOPIC) + seq.to_bytes(8, "big") + ts.to_bytes(8, "big"))


def _subscriber(port: int, index: int, counts, lasts, problems, ready) -> None:
    sock = connect(port, f"sub{index}")
    sock.sendall(_packet(0x82, b"\x00\x01" + _string(TOPIC) + b"\x00"))
    _read_exactly(sock, 5)  # SUBACK
    sock.settimeout(None)
    ready.release()
    buf, expected, received = b"", 0, 0
    while True:
        chunk = sock.recv(1 << 18)
        if not chunk:
            return
        buf += chunk
        pos, end = 0, len(buf)
        while end - pos >= 2:
            length, shift, head = 0, 0, pos + 1
            while head < end:  # the remaining length, 1-4 bytes of 7 bits
                byte = buf[head]
                length |= (byte & 0x7F) << shift
                head, shift = head + 1, shift + 7
                if byte < 0x80:
                    break
            else:
                break
            if head + length > end:
                break
            if buf[pos] >> 4 == 3:  # PUBLISH, QoS 0: topic, then the payload
                topic_end = head + 2 + int.from_bytes(buf[head:head + 2], "big")
                seq = int.from_bytes(buf[topic_end:topic_end + 8], "big")
                if seq != expected:
                    problems.value += 1
                expected, received = seq + 1, received + 1
            pos = head + length
        buf = buf[pos:]
        counts[index] = received
        lasts[index] = time.perf_counter_ns()


def run_case(port: int, pid: int, subscribers: int, duration: float, window: int,
             batch: int) -> dict:
    counts = CTX.Array("q", subscribers, lock=False)
    lasts = CTX.Array("q", subscribers, lock=False)
    problems = CTX.Value("i", 0, lock=False)
    ready = CTX.Semaphore(0)
    procs = [CTX.Process(target=_subscriber, args=(port, i, counts, lasts, problems, ready),
                         daemon=True) for i in range(subscribers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        if not ready.acquire(timeout=30):
            raise RuntimeError("a subscriber did not subscribe within 30 s")
    pub = connect(port, "publisher")
    seq = 0
    cpu0 = process_cpu_seconds(pid)
    t0 = time.perf_counter_ns()
    deadline = t0 + int(duration * 1e9)
    while (now := time.perf_counter_ns()) < deadline:
        if seq + batch - min(counts) > window:
            time.sleep(0.0002)
            continue
        pub.sendall(b"".join(publish_packet(s, now) for s in range(seq, seq + batch)))
        seq += batch
    drain = time.monotonic() + max(10.0, 2 * duration)
    while min(counts) < seq and time.monotonic() < drain:
        time.sleep(0.001)
    cpu = process_cpu_seconds(pid) - cpu0
    delivered = sum(counts)
    elapsed = (max(lasts) - t0) / 1e9
    pub.close()
    for proc in procs:
        proc.terminate()
        proc.join(5)
    return {"subscribers": subscribers, "published": seq, "delivered": delivered,
            "expected": seq * subscribers, "duration_s": round(elapsed, 3),
            "events_per_s": round(delivered / elapsed),
            "broker_cpu_us_per_event": round(1e6 * cpu / delivered, 2) if delivered else None,
            "out_of_order": problems.value, "ok": delivered == seq * subscribers
            and not problems.value}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.mosquitto_pubsub",
                                description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--subscribers", default="1,8", help="comma-separated (default 1,8)")
    p.add_argument("--window", type=int, default=1000,
                   help="max publications ahead of the slowest subscriber (as bench.pubsub)")
    p.add_argument("--batch", type=int, default=50, help="PUBLISH packets per write")
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "mosquitto_pubsub.json")
    return p.parse_args(argv)


def run(subscribers: list[int], duration: float = 5.0, window: int = 1000,
        batch: int = 50) -> tuple[int, list[dict]]:
    """A Mosquitto on a free port, each case run against it in turn; (port, results)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                        "persistence false\nlog_type error\n")
        broker = subprocess.Popen(["/usr/sbin/mosquitto", "-c", str(conf)])
        try:
            wait_for_ports([port], lambda: broker.poll() is None)
            return port, [run_case(port, broker.pid, n, duration, window, batch)
                          for n in subscribers]
        finally:
            broker.terminate()
            broker.wait(10)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    results = results_start("mosquitto_pubsub", opts)
    port, results["cases"] = run([int(n) for n in opts.subscribers.split(",")],
                                 opts.duration, opts.window, opts.batch)
    rows = [("case", "events/s", "broker µs/ev", "ok")] + [
        (f"1->{c['subscribers']}", fmt(c["events_per_s"], ","),
         fmt(c["broker_cpu_us_per_event"], ".2f"), "yes" if c["ok"] else "NO")
        for c in results["cases"]]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    table = "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True))
                      for r in rows)
    results_end(results, f"Mosquitto on 127.0.0.1:{port}\n{table}", opts.output)
    return 0 if all(c["ok"] for c in results["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
