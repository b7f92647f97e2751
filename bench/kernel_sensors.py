"""Kernel sensors benchmark: the driver's CPU per reading, and how often it wakes at idle.

Run from the repository root::

    .venv/bin/python -m bench.kernel_sensors [--devices 20] [--cpu-duration 20] [--idle-duration 60]

The sensors are a simulated sysfs tree (drivers.kernel_sim) of ``--devices`` devices, the
three kinds in turn: an SHT3x (hwmon), a BME280 (IIO: three channels) and a DS18B20 (w1), each
on its own I2C bus or 1-Wire id. Reading the tree costs what reading sysfs costs Cairn (open,
read, close per file, in the device's worker thread); what it does not have is the kernel
driver's own time on the bus (an SHT3x ~15 ms, a DS18B20 750 ms), which the driver spends
waiting in that thread, not on the CPU.

1. ``read``: in this process, :meth:`KernelDevice.read` of each kind back to back, the best
   of ``--repeat`` runs: microseconds of CPU per reading, the files it reads.
2. ``cpu``: a router (``cairn router``, history on ``sensor``) and ``cairn sensor run``
   polling every device each ``--interval`` s, every reading published (deadband 0,
   heartbeat 0.5 s: the worst case), retained and acknowledged. After a warm-up, the driver's
   process time (utime + stime from /proc, all threads) over ``--cpu-duration`` seconds,
   divided by the readings that reached a subscriber.
3. ``idle``: the same tree and driver, one device and then all of them, polled at the default
   interval (10 s), values unchanged and the heartbeat beyond the measurement (so nothing is
   published after the first readings: idle, not the heartbeat's once a minute). Over
   ``--idle-duration`` seconds, the context switches of the driver's threads
   (``voluntary_ctxt_switches`` and ``nonvoluntary_ctxt_switches`` in
   /proc/PID/task/TID/status), as wakeups a second, the event loop's and the other threads'
   (the devices' readers), and the router's beside it.

The table goes to stdout, the details to ``bench/results/kernel_sensors.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.modbus import Proc, count_readings
from bench.pubsub import results_end, results_start
from cairn.drivers.kernel import KernelDevice, Sysfs
from cairn.drivers.kernel_sim import SimSysfs
from cairn.drivers.sysfs import HWMON, IIO, W1
from harness.config import history_rule, open_realm
from harness.process import RouterProcess, process_cpu_seconds

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "kernel_sensors.json"
KINDS = ("hwmon", "iio", "w1")


def build_tree(root: Path, devices: int) -> list[tuple[str, str]]:
    """``devices`` simulated devices, the kinds in turn: [(kind, device name)]."""
    sim = SimSysfs(root)
    made = []
    for i in range(devices):
        kind = KINDS[i % 3]
        if kind == "hwmon":
            chip = sim.sht3x(bus=i + 1, temperature=20 + i / 10, humidity=40 + i / 10)
        elif kind == "iio":
            chip = sim.bme280(bus=i + 1, temperature=20 + i / 10)
        else:
            chip = sim.ds18b20(f"{i:012x}", temperature=20 + i / 10)
        made.append((kind, chip.device))
    return made


def measure_reads(root: Path, repeat: int, reads: int) -> list[dict[str, Any]]:
    families = {"hwmon": HWMON, "iio": IIO, "w1": W1}
    names = {"hwmon": "1-0044", "iio": "2-0076", "w1": f"28-{2:012x}"}
    rows = []
    for kind, family in families.items():
        device = KernelDevice(Sysfs(root), family, names[kind])
        values = device.read()
        best = float("inf")
        for _ in range(repeat):
            cpu0 = time.process_time()
            for _ in range(reads):
                device.read()
            best = min(best, (time.process_time() - cpu0) / reads)
        rows.append({"kind": kind, "device": names[kind], "fields": len(values),
                     "files": len(device.files),
                     "cpu_us_per_reading": round(best * 1e6, 1)})
    return rows


def sensors_toml(rawsocket: int, root: Path, devices: list[tuple[str, str]],
                 busy: dict[str, Any] | None) -> str:
    lines = [f'[driver]\nrouter = "rawsocket+tcp://127.0.0.1:{rawsocket}"\n']
    extra = "".join(f"{k} = {v}\n" for k, v in (busy or {}).items())
    for n, (kind, name) in enumerate(devices):
        lines.append(f'[[sensors]]\nid = "bench-{n}"\nkind = "{kind}"\ndevice = "{name}"\n'
                     f'sysfs = "{root}"\n{extra}')
    return "\n".join(lines)


@contextlib.contextmanager
def running(workdir: Path, root: Path, devices: list[tuple[str, str]],
            busy: dict[str, Any] | None, name: str):
    """A router and ``cairn sensor run`` for the tree; yields (router, driver, rawsocket)."""
    (workdir / name).mkdir()
    router = RouterProcess(workdir / name, open_realm(history=[history_rule("sensor")]),
                           log_level="warning").start()
    driver = None
    try:
        config = workdir / f"{name}.toml"
        config.write_text(sensors_toml(router.rawsocket_port, root, devices, busy))
        driver = Proc(["-m", "cairn.drivers.cli", "sensor", "run", "--config", str(config),
                       "--log-level", "warning"], workdir / f"{name}-driver.log")
        yield router, driver, router.rawsocket_port
    finally:
        if driver is not None:
            driver.stop()
        router.stop()


def measure_cpu(workdir: Path, root: Path, devices: list[tuple[str, str]], interval: float,
                duration: float, warmup: float = 4.0) -> dict[str, Any]:
    busy = {"interval": interval, "deadband": 0, "heartbeat": 0.5}
    with running(workdir, root, devices, busy, "cpu") as (router, driver, rawsocket):
        time.sleep(warmup)
        if not driver.alive():
            raise RuntimeError(f"driver exited:\n{driver.log.read_text()}")
        cpu0 = {p: process_cpu_seconds(p.pid) for p in (driver, router)}
        t0 = time.monotonic()
        readings = asyncio.run(count_readings(f"rawsocket+tcp://127.0.0.1:{rawsocket}",
                                              duration))
        elapsed = time.monotonic() - t0
        used = {p: process_cpu_seconds(p.pid) - cpu0[p] for p in (driver, router)}
        return {"devices": len(devices), "interval_s": interval,
                "duration_s": round(elapsed, 2),
                "readings_per_s": round(readings / elapsed, 1),
                "expected_per_s": round(len(devices) / interval, 1),
                "driver_cpu_pct": round(100 * used[driver] / elapsed, 2),
                "driver_cpu_ms_per_reading": round(1000 * used[driver] / max(readings, 1), 3),
                "driver_rss_mib": round(rss_kib(driver.pid) / 1024, 1),
                "driver_threads": len(threads(driver.pid)),
                "router_cpu_pct": round(100 * used[router] / elapsed, 2)}


def threads(pid: int) -> dict[str, tuple[str, int]]:
    """Thread id -> (its name, context switches so far: voluntary + involuntary). Python does
    not name its threads for the kernel: each is the process's name."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in
                          (task / "status").read_text().splitlines() if ":" in line)
            switches = int(fields["voluntary_ctxt_switches"]) + \
                int(fields["nonvoluntary_ctxt_switches"])
            found[task.name] = (fields["Name"].strip(), switches)
    return found


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def measure_idle(workdir: Path, root: Path, devices: list[tuple[str, str]], duration: float,
                 warmup: float = 12.0) -> dict[str, Any]:
    quiet = {"heartbeat": 10 * (warmup + duration)}
    with running(workdir, root, devices, quiet, f"idle-{len(devices)}") as (router, driver, _):
        time.sleep(warmup)  # connected, first readings published, each device polled once
        if not driver.alive():
            raise RuntimeError(f"driver exited:\n{driver.log.read_text()}")
        before = {p: threads(p.pid) for p in (driver, router)}
        cpu0 = process_cpu_seconds(driver.pid)
        time.sleep(duration)
        after = {p: threads(p.pid) for p in (driver, router)}
        cpu = process_cpu_seconds(driver.pid) - cpu0

    def per_second(proc) -> dict[str, float]:
        rates: dict[str, float] = {}
        for tid, (name, switches) in after[proc].items():
            start = before[proc].get(tid, (name, 0))[1]
            label = "event loop" if tid == str(proc.pid) else "other threads"
            rates[label] = round(rates.get(label, 0) + (switches - start) / duration, 2)
        return rates

    driver_rates, router_rates = per_second(driver), per_second(router)
    return {"devices": len(devices), "interval_s": 10.0, "duration_s": duration,
            "driver_wakeups_per_s": round(sum(driver_rates.values()), 2),
            "driver_by_thread": driver_rates,
            "driver_cpu_pct": round(100 * cpu / duration, 3),
            "router_wakeups_per_s": round(sum(router_rates.values()), 2)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_sensors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=20,
                        help="simulated devices, the three kinds in turn (default 20)")
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between polls in the CPU case (default 1)")
    parser.add_argument("--cpu-duration", type=float, default=20.0,
                        help="seconds of the CPU measurement (default 20)")
    parser.add_argument("--idle-duration", type=float, default=60.0,
                        help="seconds of the idle measurement (default 60)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of the read case (default 5)")
    parser.add_argument("--reads", type=int, default=2000,
                        help="reads of each kind per run of the read case (default 2000)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    results = results_start("kernel_sensors", opts)
    with tempfile.TemporaryDirectory(prefix="cairn-bench-kernel-") as tmp:
        workdir = Path(tmp)
        root = workdir / "sys"
        devices = build_tree(root, max(opts.devices, 3))
        results["read"] = measure_reads(root, opts.repeat, opts.reads)
        results["cpu"] = measure_cpu(workdir, root, devices, opts.interval, opts.cpu_duration)
        results["idle"] = [measure_idle(workdir, root, some, opts.idle_duration)
                           for some in (devices[:1], devices)]
    results_end(results, table(results), opts.output)
    return 0


def table(results: dict[str, Any]) -> str:
    out = ["Kernel sensors on a simulated sysfs tree", "",
           "One reading (KernelDevice.read, in this process, best run):",
           f"  {'kind':<6} {'fields':>6} {'files':>5} {'CPU/reading':>12}"]
    for r in results["read"]:
        out.append(f"  {r['kind']:<6} {r['fields']:>6} {r['files']:>5} "
                   f"{r['cpu_us_per_reading']:>9} us")
    c = results["cpu"]
    out += ["", f"Driver polling {c['devices']} devices every {c['interval_s']:g} s, every "
                f"reading published, {c['duration_s']} s:",
            f"  readings/s at the router {c['readings_per_s']} (expected {c['expected_per_s']})",
            f"  driver CPU {c['driver_cpu_pct']}% of one core "
            f"({c['driver_cpu_ms_per_reading']} ms per reading), RSS {c['driver_rss_mib']} MiB, "
            f"{c['driver_threads']} threads (router {c['router_cpu_pct']}%)",
            "", "Idle: polled every 10 s, values unchanged, nothing published "
                f"({results['idle'][0]['duration_s']:g} s):",
            f"  {'devices':>7} {'driver wakeups/s':>16} {'event loop':>10} {'readers':>7} "
            f"{'driver CPU':>10} {'router wakeups/s':>16}"]
    for i in results["idle"]:
        by = i["driver_by_thread"]
        out.append(f"  {i['devices']:>7} {i['driver_wakeups_per_s']:>16} "
                   f"{by.get('event loop', 0):>10} {by.get('other threads', 0):>7} "
                   f"{i['driver_cpu_pct']:>9}% {i['router_wakeups_per_s']:>16}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
