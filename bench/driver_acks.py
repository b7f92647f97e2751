"""Acknowledged readings a second per driver: the serial driver and the MQTT bridge, each
into a router whose ``sensor`` history rule has the image's ``commit_window`` of 5 s.

Run from the repository root::

    .venv/bin/python -m bench.driver_acks [--paths serial,mqtt] [--budgets image,lifted]
        [--rate 2000] [--sensors 10] [--warm-up 10] [--duration 20]

Per case, on fresh processes:

1. ``cairn router`` (its own process) with the image's history rules (``sensor`` prefix,
   ``commit_window = "5s"``; ``gateway.device``) and a Unix socket the driver joins over, as on
   the device; budget ``image`` keeps the default config (fair shares, no per-connection cap
   on reads; the cap was 1,000 messages a second by default before), ``lifted`` sets the cap
   far above anything, to show what the driver itself carries.
2. The driver in this process, so its own counters are read: ``serial`` is ``SerialDriver``
   with ``--sensors`` line sensors (``$THS`` sentences, deadband 0: every sentence is a
   reading) on one pty, which a feeder process writes at ``--rate`` sentences a second;
   ``mqtt`` is ``MqttBridge`` on a real Mosquitto, mapping ``bench/+`` to
   ``sensor.bench.{1}``, with a publisher process sending ``--rate`` JSON messages a second
   (QoS 0) spread over ``--sensors`` topics.
3. After ``--warm-up`` s, the publications the driver's link saw acknowledged (PUBLISHED:
   committed with fsync) are counted for ``--duration`` s: acknowledged readings/s. Also: what
   was offered (sentences or MQTT messages received), readings dropped for a full backlog,
   CPU % of this process (the driver) and of the router, and the load average.
4. The feed stops; once the backlog is empty (at most 20 s) and nothing is pending, one lone
   reading is published and the time to its PUBLISHED measured: with a 5 s window it must
   not be longer than the window.
5. The router stops and the rows in its history are counted from the SQLite file: at least
   every acknowledged publication must be there.

The machine's load matters (2 cores here, shared): the load average is printed with every
row. Output: a table on stdout, everything in ``bench/results/driver_acks.json``; with ``--docs``
the table goes into docs/benchmarks.md (its own section, which ``python -m bench`` keeps),
beside ``--before``, an earlier run's JSON (another build's: run this file with that build's
venv).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import sqlite3
import sys
import time
import tomllib
import tty
from pathlib import Path
from typing import Any

from bench.mqtt import start_mosquitto
from bench.pubsub import RESULTS_DIR, machine, source_version
from bench.wear import write_docs_section
from harness.config import NO_READ_BUDGET, history_rule, open_realm
from harness.process import RouterProcess, process_cpu_seconds, wait_for_ports

OUTPUT = RESULTS_DIR / "driver_acks.json"
WINDOW = 5.0  # the image's commit_window on sensor (images/config/cairn.toml)
IMAGE_HISTORY = [
    history_rule("sensor", max_events=1_000_000, max_age="90d", commit_window="5s"),
    history_rule("gateway.device", max_events=100_000, max_age="30d"),
]
CTX = mp.get_context("fork")


# -- what feeds the drivers: child processes ---------------------------------------------------


def _paced(rate: float, send: Any, stop: Any) -> None:
    """Call ``send(i)`` ``rate`` times a second, in slices of 10 ms, until ``stop``."""
    started, i = time.monotonic(), 0
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while i < due:
            send(i)
            i += 1
        time.sleep(0.01)


def _feed_pty(master: int, sensors: int, rate: float, stop: Any) -> None:
    """Child process: $THS sentences round robin over ``sensors`` ids, each one's temperature
    a step from its last (deadband 0 publishes every one)."""
    from cairn.drivers.line import ths_sentence

    def send(i: int) -> None:
        seq = i // sensors
        line = ths_sentence(f"s{i % sensors}", seq, (seq % 1000) / 10, 50.0)
        os.write(master, line.encode("ascii") + b"\r\n")

    _paced(rate, send, stop)


def _feed_mqtt(port: int, sensors: int, rate: float, stop: Any) -> None:
    """Child process: JSON readings at QoS 0 round robin over ``sensors`` MQTT topics."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-feeder")
    client.connect("127.0.0.1", port)
    client.loop_start()

    def send(i: int) -> None:
        client.publish(f"bench/s{i % sensors}", b'{"seq":%d,"t":21.5,"rh":48.0}' % i)

    _paced(rate, send, stop)
    client.loop_stop()
    client.disconnect()


# -- the drivers, in this process --------------------------------------------------------------


def serial_driver(url: str, device: str, sensors: int) -> Any:
    from cairn.drivers import serial_config
    from cairn.drivers.serial_driver import SerialDriver

    text = f'[driver]\nrouter = "{url}"\n\n' + "".join(
        f'[[sensors]]\nid = "s{n}"\nkind = "line"\nport = "{device}"\nmatch_id = "s{n}"\n'
        f'interval = 1\ndeadband = 0\nstale_after = 600\n\n' for n in range(sensors))
    return SerialDriver(serial_config.parse(tomllib.loads(text), "bench.toml"))


def mqtt_bridge(url: str, mqtt_port: int) -> Any:
    from cairn.drivers.mqtt_bridge import MqttBridge, load

    text = (f'[driver]\nrouter = "{url}"\n[mqtt]\nbroker = "127.0.0.1:{mqtt_port}"\n'
            f'client_id = "bench-bridge"\n[[mqtt.map]]\nfilter = "bench/+"\n'
            f'topic = "sensor.bench.{{1}}"\nqos = 0\n')
    return MqttBridge(*load(tomllib.loads(text), "bench.toml"))


class Feed:
    """A feeder child process for one path; ``offered()``: what reached the driver."""

    def __init__(self, path: str, workdir: Path, sensors: int, rate: float) -> None:
        self.path, self.sensors, self.rate = path, sensors, rate
        self.stop = CTX.Event()
        self.mosquitto = None
        self.master = self.slave = None
        if path == "serial":
            self.master, self.slave = os.openpty()
            tty.setraw(self.slave)
            self.device = os.ttyname(self.slave)
        else:
            self.mosquitto, self.mqtt_port = start_mosquitto(workdir)
            wait_for_ports([self.mqtt_port], lambda: self.mosquitto.proc.poll() is None)
        self.child: Any = None

    def start(self) -> None:
        target, first = ((_feed_pty, self.master) if self.path == "serial"
                         else (_feed_mqtt, self.mqtt_port))
        self.child = CTX.Process(target=target, args=(first, self.sensors, self.rate,
                                                      self.stop), daemon=True)
        self.child.start()

    def end(self) -> None:
        self.stop.set()
        if self.child is not None:
            self.child.join(10)
            if self.child.is_alive():
                self.child.kill()

    def close(self) -> None:
        self.end()
        if self.mosquitto is not None:
            self.mosquitto.stop()
        for fd in (self.master, self.slave):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def offered(driver: Any) -> int:
    """Sentences read (serial) or MQTT messages received (bridge)."""
    if hasattr(driver, "ports"):
        return sum(port.parser.stats.sentences for port in driver.ports.values())
    return driver.stats.received


# -- one case ----------------------------------------------------------------------------------


async def run_case(path: str, budget: str, opts: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(opts.workdir) / f"{path}-{budget}"
    workdir.mkdir(parents=True)
    limits = f"\n[router.limits]\n{NO_READ_BUDGET}" if budget == "lifted" else ""
    router = RouterProcess(workdir, open_realm(history=IMAGE_HISTORY), router_toml=limits,
                           unix=True, log_level="warning").start()
    feed = Feed(path, workdir, opts.sensors, opts.rate)
    url = f"rawsocket+unix:{router.unix_path}"
    driver = serial_driver(url, feed.device, opts.sensors) if path == "serial" else \
        mqtt_bridge(url, feed.mqtt_port)
    task = asyncio.create_task(driver.run())
    try:
        await _until(lambda: driver.link.stats.connected, 30, "the driver to connect")
        feed.start()
        result = await measure(driver, router, opts)
        feed.end()
        result["lone_ack_s"] = await lone_ack(driver)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        feed.close()
        router.stop()
    stored = stored_rows(router.db_path)
    link = driver.link.stats
    return {"path": path, "budget": budget, **result, "published_total": link.published,
            "stored_rows": stored, "acknowledged_all_stored": stored >= link.published,
            "dropped_full": link.dropped_full, "dropped_refused": link.dropped_refused}


async def measure(driver: Any, router: RouterProcess, opts: argparse.Namespace
                  ) -> dict[str, Any]:
    await asyncio.sleep(opts.warm_up)
    link = driver.link.stats
    load_before = os.getloadavg()
    acked, fed, drops = link.published, offered(driver), link.dropped_full
    cpu, router_cpu, started = time.process_time(), process_cpu_seconds(router.pid), \
        time.monotonic()
    await asyncio.sleep(opts.duration)
    elapsed = time.monotonic() - started
    return {
        "acked_per_s": round((link.published - acked) / elapsed, 1),
        "offered_per_s": round((offered(driver) - fed) / elapsed, 1),
        "dropped_per_s": round((link.dropped_full - drops) / elapsed, 1),
        "driver_cpu_pct": round(100 * (time.process_time() - cpu) / elapsed, 1),
        "router_cpu_pct": round(100 * (process_cpu_seconds(router.pid) - router_cpu) / elapsed,
                                1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


async def lone_ack(driver: Any) -> float | None:
    """Seconds from queueing one reading, alone, to its PUBLISHED (None: the backlog did not
    drain within 20 s, so it would not have been alone)."""
    link = driver.link
    with contextlib.suppress(TimeoutError):
        await _until(lambda: not link.backlog, 20, "")
    if link.backlog:
        return None
    await asyncio.sleep(WINDOW + 1)  # whatever was pending is committed
    before = link.stats.published
    started = time.monotonic()
    link.publish("sensor.bench.lone", {"temperature": 21.5})
    await _until(lambda: link.stats.published > before, 3 * WINDOW, "the lone reading")
    return round(time.monotonic() - started, 3)


def stored_rows(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT count(*) FROM publications WHERE topic LIKE 'sensor.%'"
                            " OR topic LIKE 'gateway.device.%'").fetchone()[0]


async def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        await asyncio.sleep(0.005)


# -- output ------------------------------------------------------------------------------------

HEAD = ("path", "budget", "acked/s", "offered/s", "dropped/s", "lone ack s", "driver CPU %",
        "router CPU %", "all acked stored", "load 1m before/after")


def cells(r: dict[str, Any]) -> tuple[str, ...]:
    lone = "-" if r["lone_ack_s"] is None else f"{r['lone_ack_s']:.2f}"
    return (r["path"], r["budget"], f"{r['acked_per_s']:,.1f}", f"{r['offered_per_s']:,.1f}",
            f"{r['dropped_per_s']:,.1f}", lone, f"{r['driver_cpu_pct']}",
            f"{r['router_cpu_pct']}", "yes" if r["acknowledged_all_stored"] else "NO",
            f"{r['load_before'][0]:.2f}/{r['load_after'][0]:.2f}")


def table(results: list[dict[str, Any]]) -> str:
    rows = [HEAD, *(cells(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)


SECTION = "bench.driver_acks"


def markdown(run: dict[str, Any], before: dict[str, Any] | None) -> str:
    o, m = run["options"], run["machine"]
    lines = [
        "## Acknowledged readings per driver (`bench.driver_acks`)",
        "",
        f"Run with `.venv/bin/python -m bench.driver_acks --docs` (see its docstring; "
        f"{m['cpu_model']}, {m['nproc']} cores, load average shown per row). "
        f"Readings offered (`--rate`, {o['rate']} by default) over {o['sensors']} devices to one "
        f"driver, "
        f"counted for {o['duration']} s after {o['warm_up']} s: `serial` line sensors on a "
        f"pty, `mqtt` the bridge on Mosquitto; the router on the image's history rules "
        f"(`commit_window = \"5s\"` on `sensor`); budget `image` is the default config (no "
        f"cap on a connection's reads since fair shares; before, 1,000 messages a second), "
        f"`lifted` a cap far above anything. Lone ack: one reading "
        f"alone, queued to PUBLISHED (the window plus the commit).",
        "",
    ]
    for title, r in (("Before", before), ("After", run)):
        if r is None:
            continue
        if before is not None:
            source = r["source"]
            changed = ", with local changes" if source.get("gateway_dirty") else ""
            lines += [f"{title} (commit {str(source.get('commit'))[:10]}{changed}):", ""]
        lines += ["| " + " | ".join(HEAD) + " |", "|---|---|" + "---:|" * (len(HEAD) - 2),
                  *("| " + " | ".join(cells(x)) + " |" for x in r["results"]), ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.driver_acks",
                                description=__doc__.split("\n")[0])
    p.add_argument("--paths", default="serial,mqtt", help="serial, mqtt or both")
    p.add_argument("--budgets", default="image,lifted",
                   help="image (the default config: fair shares, no read cap), lifted (a "
                        "cap far above anything), or both")
    p.add_argument("--rate", type=float, default=2000, help="readings offered a second")
    p.add_argument("--sensors", type=int, default=10, help="devices the readings spread over")
    p.add_argument("--warm-up", type=float, default=10.0, help="s before counting")
    p.add_argument("--duration", type=float, default=20.0, help="s counted")
    p.add_argument("--output", type=Path, default=OUTPUT)
    p.add_argument("--before", type=Path, metavar="JSON",
                   help="an earlier run's output, shown before this one in the docs section")
    p.add_argument("--docs", action="store_true",
                   help="write the results into docs/benchmarks.md (its driver_acks section)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    opts = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="cairn-bench-acks-") as workdir:
        opts.workdir = workdir
        for path in opts.paths.split(","):
            for budget in opts.budgets.split(","):
                print(f"  {path}, budget {budget}: {opts.warm_up:g} + {opts.duration:g} s ...",
                      end=" ", flush=True, file=sys.stderr)
                results.append(asyncio.run(run_case(path, budget, opts)))
                print(f"{results[-1]['acked_per_s']:,} acknowledged/s", file=sys.stderr)
    print(table(results))
    run = {"benchmark": "driver_acks", "machine": machine(), "source": source_version(),
           "options": {k: str(v) for k, v in vars(opts).items() if k != "workdir"},
           "results": results}
    opts.output.parent.mkdir(parents=True, exist_ok=True)
    opts.output.write_text(json.dumps(run, indent=2) + "\n")
    print(f"\n{opts.output}")
    if opts.docs:
        before = json.loads(opts.before.read_text()) if opts.before else None
        write_docs_section(markdown(run, before), SECTION)
        print("wrote the driver_acks section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
