"""MQTT bridge benchmark: messages/s from Mosquitto through ``cairn bridge mqtt`` into a WAMP
subscriber.

Run from the repository root::

    .venv/bin/python -m bench.mqtt [--messages 20000] [--qos 0 1] [--backlog 1000]

Each case starts its own Mosquitto (no persistence), router (``cairn router``, history on
``sensor.`` as in the embedded default) and bridge
(``python -m cairn.drivers.mqtt_cli bridge mqtt``,
over the router's Unix socket as on the device), each a process on free loopback ports. A
publisher process sends N small JSON objects ``{"seq": i, "t": 21.5, "rh": 48.0}`` to
``bench/data`` as fast as it can at the case's QoS (QoS 1 with up to 256 in flight); the map
entry ``bench/+ -> sensor.bench.{1}`` turns them into retained, acknowledged WAMP
publications, and a subscriber in this process counts what arrives on ``sensor.bench.data``
until all N are there or nothing arrived for ``--idle`` seconds.

Reported: the publisher's rate, the delivered rate (delivered / (last arrival - first
send)), loss (N - distinct seqs delivered) and where it happened (the bridge's own counts,
logged when it stops: MQTT messages received, readings dropped from the full backlog), and
the CPU seconds of each process. The table goes to stdout, the details to
``bench/results/mqtt.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pubsub import machine, source_version
from harness.config import history_rule, open_realm, router_table
from harness.process import free_port, process_cpu_seconds, wait_for_ports

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "mqtt.json"

BRIDGE_TOML = """\
[driver]
router = "rawsocket+unix:{dir}/wamp.sock"
backlog = {backlog}

[mqtt]
broker = "127.0.0.1:{mqtt_port}"
client_id = "bench-bridge"

[[mqtt.map]]
filter = "bench/+"
topic = "sensor.bench.{{1}}"
qos = 1
"""

MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence false
log_dest stderr
"""


class Process:
    def __init__(self, name: str, cmd: list[str], log: Path, cwd: Path | None = None) -> None:
        self.name, self.log = name, log
        self._out = open(log, "wb")  # noqa: SIM115 (closed in stop())
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=cwd, env=env)

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()
        return self.log.read_text(errors="replace")


def start_mosquitto(workdir: Path, nodelay: bool = False) -> tuple[Process, int]:
    """Mosquitto (no persistence) on a free loopback port, config and log in ``workdir``;
    returns the process and the port (not yet waited for). ``nodelay``: set_tcp_nodelay
    (off by default: Nagle holds back writes that follow an unacknowledged small one)."""
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port)
                    + ("user root\n" if os.geteuid() == 0 else "")
                    + ("set_tcp_nodelay true\n" if nodelay else ""))
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    return Process("mosquitto", [exe, "-c", str(conf)], workdir / "mosquitto.log"), port


def _publisher(port: int, n: int, qos: int, start: Any, result: Any) -> None:
    """Child process: wait for ``start``, publish N messages, report (first, last) send."""
    import aiomqtt

    async def publish() -> tuple[float, float]:
        async with aiomqtt.Client("127.0.0.1", port, identifier="bench-publisher",
                                  max_inflight_messages=256) as client:
            client.pending_calls_threshold = n + 1  # 256 in flight is the point, not a leak
            window = asyncio.Semaphore(256)

            async def one(i: int) -> None:
                async with window:
                    await client.publish("bench/data", b'{"seq":%d,"t":21.5,"rh":48.0}' % i,
                                         qos=qos)

            start.wait()
            first = time.monotonic()
            if qos == 0:
                for i in range(n):
                    await client.publish("bench/data", b'{"seq":%d,"t":21.5,"rh":48.0}' % i)
                    if i % 256 == 0:
                        await asyncio.sleep(0)  # let paho's writer run
            else:
                async with asyncio.TaskGroup() as tasks:
                    for i in range(n):
                        tasks.create_task(one(i))
            last = time.monotonic()
            await asyncio.sleep(0.5)  # let the last QoS 0 messages leave before disconnecting
            return first, last

    result.put(asyncio.run(publish()))


def start_servers(workdir: Path) -> tuple[Process, int, Process, int, int]:
    """Mosquitto and ``cairn router`` (history on ``sensor``, a Unix socket in ``workdir``),
    started, not yet waited for: (mosquitto, its port, router, WebSocket port, RawSocket
    port)."""
    ws_port, rs_port = free_port(), free_port()
    mosquitto, mqtt_port = start_mosquitto(workdir)
    (workdir / "router.toml").write_text(
        router_table(workdir / "data", f"127.0.0.1:{ws_port}",
                     [f"unix:{workdir}/wamp.sock", f"127.0.0.1:{rs_port}"], "warning")
        + open_realm(history=[history_rule("sensor")]))
    router = Process("router", [sys.executable, "-m", "cairn.app.cli", "router", "--config",
                                str(workdir / "router.toml")], workdir / "router.log", workdir)
    return mosquitto, mqtt_port, router, ws_port, rs_port


async def run_case(qos: int, n: int, backlog: int, idle: float) -> dict[str, Any]:
    from autobahn.wamp.types import SubscribeOptions

    from cairn.drivers.runtime import open_session

    workdir = Path(tempfile.mkdtemp(prefix="cairn-bench-mqtt-"))
    mosquitto, mqtt_port, router, ws_port, rs_port = start_servers(workdir)
    (workdir / "bridge.toml").write_text(BRIDGE_TOML.format(dir=workdir, backlog=backlog,
                                                            mqtt_port=mqtt_port))
    processes = [mosquitto, router]
    try:
        wait_for_ports([mqtt_port, ws_port, rs_port], lambda: all(
            p.proc.poll() is None for p in processes))
        bridge = Process("bridge", [sys.executable, "-m", "cairn.drivers.mqtt_cli", "bridge",
                                    "mqtt", "--config", str(workdir / "bridge.toml")],
                         workdir / "bridge.log", workdir)
        processes.append(bridge)
        session = await open_session(f"rawsocket+tcp://127.0.0.1:{rs_port}", "realm1")
        seqs: list[int] = []
        arrivals: list[float] = []

        def on_event(*args: Any, details: Any, **kwargs: Any) -> None:
            arrivals.append(time.monotonic())
            seqs.append(kwargs.get("seq", -1))

        await session.subscribe(on_event, "sensor.bench.", options=SubscribeOptions(
            match="prefix", details_arg="details"))
        await warm_up(mqtt_port, seqs, processes)
        seqs.clear()
        arrivals.clear()

        ctx = mp.get_context("fork")
        start, result = ctx.Event(), ctx.Queue()
        publisher = ctx.Process(target=_publisher, args=(mqtt_port, n, qos, start, result))
        publisher.start()
        await asyncio.sleep(1.0)  # connected and idle
        cpu_before = {p.name: p.cpu_seconds() for p in processes}
        start.set()
        first, last_send = await asyncio.get_running_loop().run_in_executor(None, result.get)
        while len(seqs) < n:
            seen = len(seqs)
            await asyncio.sleep(idle)
            if len(seqs) == seen:
                break
        cpu = {p.name: round(p.cpu_seconds() - cpu_before[p.name], 2) for p in processes}
        publisher.join(5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.leave(), 2)
    finally:
        logs = {p.name: p.stop() for p in reversed(processes)}
    shutil.rmtree(workdir, ignore_errors=True)  # kept, with the logs, when the case failed
    delivered = len(set(seqs) - {-1})
    counts = stopped_counts(logs.get("bridge", ""))
    span = (arrivals[-1] - first) if arrivals else None
    return {
        "qos": qos, "messages": n, "backlog": backlog,
        "publish_per_s": round(n / (last_send - first)),
        "delivered": delivered, "duplicates": len(seqs) - delivered,
        "delivered_per_s": round(delivered / span) if span else 0,
        "loss": n - delivered, "loss_pct": round(100 * (n - delivered) / n, 2),
        "bridge_received": counts.get("received"),
        "backlog_dropped": counts.get("dropped_full"),
        "in_order": seqs == sorted(seqs),
        "cpu_s": cpu,
    }


async def warm_up(port: int, seqs: list[Any], processes: list[Process],
                  topic: str = "bench/warmup", payload: bytes = b'{"seq": -1}') -> None:
    """Publish until the bridge is connected both ways and an event comes through."""
    import aiomqtt

    deadline = time.monotonic() + 20
    while not seqs:
        exited = [p.name for p in processes if p.proc.poll() is not None]
        if exited or time.monotonic() > deadline:
            raise RuntimeError(f"the bridge did not come up (exited: {exited or 'none'}); "
                               f"logs in {processes[0].log.parent}")
        with contextlib.suppress(aiomqtt.MqttError):
            async with aiomqtt.Client("127.0.0.1", port) as client:
                await client.publish(topic, payload, qos=1)
        await asyncio.sleep(0.3)


def stopped_counts(log: str) -> dict[str, int]:
    """The counters of the bridge's last "stopped: ..." line."""
    lines = [line for line in log.splitlines() if "stopped:" in line]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])} if lines else {}


def table(results: list[dict[str, Any]]) -> str:
    head = ("QoS", "messages", "backlog", "publish/s", "delivered", "delivered/s", "loss",
            "bridge rx", "backlog drops", "cpu bridge/router/mosq s")
    rows = [head] + [(
        str(r["qos"]), f"{r['messages']:,}", f"{r['backlog']:,}", f"{r['publish_per_s']:,}",
        f"{r['delivered']:,}", f"{r['delivered_per_s']:,}",
        f"{r['loss']:,} ({r['loss_pct']}%)", f"{r['bridge_received'] or 0:,}",
        f"{r['backlog_dropped'] or 0:,}",
        "{bridge}/{router}/{mosquitto}".format(**r["cpu_s"])) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--qos", type=int, nargs="+", choices=[0, 1], default=[0, 1])
    parser.add_argument("--backlog", type=int, nargs="+", default=[1000, 20_000],
                        help="the bridge's [driver] backlog: the default, and one that holds all")
    parser.add_argument("--idle", type=float, default=3.0,
                        help="stop counting after this many seconds without an event")
    args = parser.parse_args()
    results = []
    for backlog in args.backlog:
        for qos in args.qos:
            results.append(asyncio.run(run_case(qos, args.messages, backlog, args.idle)))
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr)
    print(table(results))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "mqtt", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(), "source": source_version(), "settings": vars(args),
        "results": results}, indent=2) + "\n")
    print(f"details: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
