"""Modbus RTU benchmark: transactions/s on one simulated bus against the bus's theoretical
limit, and the CPU a driver uses polling 32 devices at 1 Hz.

Run from the repository root::

    .venv/bin/python -m bench.modbus [--duration 5] [--cpu-duration 20] [--devices 32]

1. Throughput. ``cairn sensor sim`` (its own process) simulates one device on a pty bus; it
   answers after the time the request and the response would take on a real line at the
   baud rate, plus the 3.5-character gap. The master in this process (``ModbusMaster``,
   8E1 = 11 bits per character, as the Modbus spec counts) reads 2 input registers back to
   back for ``--duration`` seconds. The theoretical limit of a line is one transaction per
   (8 request + 9 response bytes) x 11 bits / baud + two inter-frame gaps: with 3.5-character
   gaps, and with the spec's fixed 1.75 ms gap above 19200 baud, which the master uses. An
   ``instant`` row (the simulator answers at once) shows the ceiling of master + pty +
   simulator without any wire time, and the master's CPU per transaction.
2. CPU. A router (``cairn router``, history on ``sensor``), a simulated bus of
   ``--devices`` devices at ``--cpu-baudrate`` and ``cairn sensor run`` polling each of them
   every second, every reading published (deadband 0, heartbeat 0.5 s: the worst case),
   retained and acknowledged. After a warm-up the driver's process time (utime + stime
   from /proc) is measured over ``--cpu-duration`` seconds, along with the readings that
   reached a subscriber.

The table goes to stdout, the details to ``bench/results/modbus.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pubsub import results_end, results_start
from cairn.drivers.modbus import ModbusError, ModbusMaster, frame_gap
from cairn.drivers.serial_port import SerialPort
from harness.config import history_rule, open_realm
from harness.process import RouterProcess, process_cpu_seconds

REPO = Path(__file__).resolve().parent.parent
BITS = 11
REQUEST, RESPONSE = 8, 9  # bytes, reading 2 registers


def bus_limit(baudrate: int, spec_gap: bool) -> float:
    """Transactions/s a line can carry at best: request + response + two gaps."""
    char = BITS / baudrate
    gap = frame_gap(baudrate, char) if spec_gap else 3.5 * char
    return 1 / ((REQUEST + RESPONSE) * char + 2 * gap)


class Proc:
    """A child process with its stderr in a log file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([sys.executable, *args], cwd=REPO,
                                     env={**os.environ, "PYTHONPATH": str(REPO)},
                                     stdout=subprocess.DEVNULL, stderr=log.open("wb"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_sim(workdir: Path, devices: int, baudrate: int, instant: bool = False) -> tuple[Proc,
                                                                                          Path]:
    sim_dir = workdir / f"sim-{baudrate}-{devices}{'-instant' if instant else ''}"
    args = ["-m", "cairn.drivers.cli", "sensor", "sim", "--modbus", str(devices), "--line", "0",
            "--baudrate", str(baudrate), "--dir", str(sim_dir)]
    proc = Proc(args + (["--instant"] if instant else []), workdir / f"{sim_dir.name}.log")
    link = sim_dir / "modbus0"
    deadline = time.monotonic() + 15
    while not link.exists():
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"simulator did not start:\n{proc.log.read_text()}")
        time.sleep(0.05)
    return proc, link


async def measure_throughput(link: Path, baudrate: int, duration: float) -> dict[str, Any]:
    port = SerialPort(str(link), baudrate, parity="E")
    await port.open()
    master = ModbusMaster(port, timeout=0.5, retries=0)
    for _ in range(5):  # warm up
        await master.read_registers(1, 4, 1, 2)
    ok = failed = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    latencies = []
    while time.monotonic() - t0 < duration:
        started = time.monotonic()
        try:
            await master.read_registers(1, 4, 1, 2)
            ok += 1
            latencies.append(time.monotonic() - started)
        except ModbusError:
            failed += 1
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    port.close()
    latencies.sort()
    return {"transactions": ok, "failed": failed, "duration_s": round(elapsed, 3),
            "tx_per_s": round(ok / elapsed, 1),
            "median_ms": round(latencies[len(latencies) // 2] * 1000, 2),
            "master_cpu_us_per_tx": round(cpu / max(ok, 1) * 1e6, 1)}


async def count_readings(url: str, seconds: float) -> int:
    from autobahn.wamp.types import SubscribeOptions

    from cairn.drivers.runtime import open_session

    session = await open_session(url, "realm1")
    seen = 0

    def on_event(*args: Any, **kwargs: Any) -> None:
        nonlocal seen
        seen += 1

    await session.subscribe(on_event, "sensor", options=SubscribeOptions(match="prefix"))
    await asyncio.sleep(seconds)
    await session.leave()
    return seen


def measure_cpu(workdir: Path, devices: int, baudrate: int, duration: float,
                warmup: float = 4.0) -> dict[str, Any]:
    router = RouterProcess(workdir, open_realm(history=[history_rule("sensor")]),
                           log_level="warning").start()
    rawsocket = router.rawsocket_port
    sim = driver = None
    try:
        sim, link = start_sim(workdir, devices, baudrate)
        sensors = [f'[driver]\nrouter = "rawsocket+tcp://127.0.0.1:{rawsocket}"\n']
        for address in range(1, devices + 1):
            sensors.append(f'[[sensors]]\nid = "bench-{address}"\nkind = "modbus"\n'
                           f'port = "{link}"\nbaudrate = {baudrate}\nparity = "E"\n'
                           f'address = {address}\ninterval = 1\ndeadband = 0\n'
                           f'heartbeat = 0.5\n')
        config = workdir / "sensors.toml"
        config.write_text("\n".join(sensors))
        driver = Proc(["-m", "cairn.drivers.cli", "sensor", "run", "--config", str(config),
                       "--log-level", "warning"], workdir / "driver.log")
        time.sleep(warmup)
        if not driver.alive():
            raise RuntimeError(f"driver exited:\n{driver.log.read_text()}")
        cpu = {name: process_cpu_seconds(p.pid) for name, p in
               (("driver", driver), ("simulator", sim), ("router", router))}
        t0 = time.monotonic()
        readings = asyncio.run(count_readings(f"rawsocket+tcp://127.0.0.1:{rawsocket}",
                                              duration))
        elapsed = time.monotonic() - t0
        used = {name: process_cpu_seconds(p.pid) - cpu[name] for name, p in
                (("driver", driver), ("simulator", sim), ("router", router))}
        with open(f"/proc/{driver.pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        return {
            "devices": devices, "baudrate": baudrate, "interval_s": 1.0,
            "duration_s": round(elapsed, 2),
            "readings_per_s": round(readings / elapsed, 1),
            "expected_per_s": devices,
            "bus_busy_pct": round(100 * devices / bus_limit(baudrate, spec_gap=True), 1),
            "driver_cpu_pct": round(100 * used["driver"] / elapsed, 2),
            "driver_cpu_ms_per_reading": round(1000 * used["driver"] / max(readings, 1), 3),
            "driver_rss_mib": round(rss / 1024, 1),
            "simulator_cpu_pct": round(100 * used["simulator"] / elapsed, 2),
            "router_cpu_pct": round(100 * used["router"] / elapsed, 2),
        }
    finally:
        for proc in (driver, sim, router):
            if proc is not None:
                proc.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.modbus", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0,
                        help="seconds per throughput case (default 5)")
    parser.add_argument("--cpu-duration", type=float, default=20.0,
                        help="seconds of the CPU measurement (default 20)")
    parser.add_argument("--devices", type=int, default=32,
                        help="devices polled at 1 Hz in the CPU case (default 32)")
    parser.add_argument("--cpu-baudrate", type=int, default=9600,
                        help="baud rate of the CPU case (default 9600)")
    parser.add_argument("--bauds", default="9600,115200",
                        help="baud rates of the throughput cases (default 9600,115200)")
    parser.add_argument("--output", type=Path, default=REPO / "bench/results/modbus.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    results = {**results_start("modbus", opts), "throughput": []}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-modbus-") as tmp:
        workdir = Path(tmp)
        cases = [(int(b), False) for b in opts.bauds.split(",")] + [(115200, True)]
        for baudrate, instant in cases:
            sim, link = start_sim(workdir, 1, baudrate, instant)
            try:
                row = asyncio.run(measure_throughput(link, baudrate, opts.duration))
            finally:
                sim.stop()
            row.update(baudrate=baudrate, wire="instant" if instant else "timed")
            if not instant:
                row["limit_3_5_char"] = round(bus_limit(baudrate, spec_gap=False), 1)
                row["limit_spec_gap"] = round(bus_limit(baudrate, spec_gap=True), 1)
                row["of_spec_limit_pct"] = round(100 * row["tx_per_s"] /
                                                 row["limit_spec_gap"], 1)
            results["throughput"].append(row)
        results["cpu"] = measure_cpu(workdir, opts.devices, opts.cpu_baudrate,
                                     opts.cpu_duration)
    results_end(results, table(results), opts.output)
    return 0


def table(results: dict[str, Any]) -> str:
    out = ["Modbus RTU on one simulated bus (2 input registers per transaction, 8E1 = 11 "
           "bits/char)", "",
           f"{'baud':>7} {'wire':>7} {'tx/s':>7} {'limit 3.5ch':>11} {'limit spec':>10} "
           f"{'of spec':>7} {'median ms':>9} {'failed':>6} {'master CPU/tx':>13}"]
    for r in results["throughput"]:
        of_spec = f"{r['of_spec_limit_pct']}%" if "of_spec_limit_pct" in r else "-"
        out.append(f"{r['baudrate']:>7} {r['wire']:>7} {r['tx_per_s']:>7.1f} "
                   f"{r.get('limit_3_5_char', '-'):>11} {r.get('limit_spec_gap', '-'):>10} "
                   f"{of_spec:>7} {r['median_ms']:>9} "
                   f"{r['failed']:>6} {r['master_cpu_us_per_tx']:>10} us")
    c = results["cpu"]
    out += ["", f"Driver polling {c['devices']} devices at 1 Hz on one {c['baudrate']}-baud bus "
                f"({c['bus_busy_pct']}% of its capacity), every reading published, "
                f"{c['duration_s']} s:",
            f"  readings/s at the router {c['readings_per_s']} (expected {c['expected_per_s']})",
            f"  driver CPU {c['driver_cpu_pct']}% of one core "
            f"({c['driver_cpu_ms_per_reading']} ms per reading), RSS {c['driver_rss_mib']} MiB",
            f"  (simulator {c['simulator_cpu_pct']}%, router {c['router_cpu_pct']}%)"]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
