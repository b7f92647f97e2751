"""``cairn sensor``: run the sensor driver, list the kernel's sensors, or simulate serial
sensors.

``app.cli`` hooks this in with ``add_commands(subparsers)`` and hands the parsed
arguments of ``cairn sensor ...`` to ``main(args)``. Standalone, for tests and benchmarks:
``python -m cairn.drivers.cli sensor run --config FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from cairn.base.console import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, setup_logging
from cairn.gateway.core.config import ConfigError


def add_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    sensor = subparsers.add_parser(
        "sensor", help="sensors: run the driver, find kernel sensors, or simulate sensors",
        description="Sensors publishing to the router: serial (Modbus RTU, line-oriented "
                    "text) and the kernel's own drivers (hwmon, IIO, 1-Wire) through sysfs.")
    commands = sensor.add_subparsers(dest="sensor_command", metavar="SUBCOMMAND")
    run = commands.add_parser(
        "run", help="run the sensor driver for the [[sensors]] of a config file",
        description="Poll the [[sensors]] of FILE and publish their readings to the router "
                    "named in [driver], retained, on sensor.<id>; device status on "
                    "gateway.device.<id>.status. Runs until SIGTERM or SIGINT.")
    run.add_argument("--config", metavar="FILE", required=True, help="TOML config file")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                     default="info")
    scan = commands.add_parser(
        "scan", help="list the kernel's hwmon, IIO and 1-Wire sensors as [[sensors]] entries",
        description="List the hwmon, IIO and 1-Wire thermometer devices the kernel offers, "
                    "with their names, channels and current values, each with a [[sensors]] "
                    "entry that reads it (TOML to paste into a config).")
    scan.add_argument("--sysfs", default=None, metavar="DIR",
                      help="where sysfs is (default /sys; a copy or a test tree)")
    chips = commands.add_parser(
        "chips", help="create the I2C chips that the [[sensors]] of a config name (as root)",
        description="For each [[sensors]] entry of FILE with chip = ..., write the chip's name "
                    "and address to its bus's new_device unless the device is there already, "
                    "and say what happened, one line each. Creating a chip needs root: the "
                    "image runs this before each sensor driver, which may not write sysfs. A "
                    "chip that cannot be made is not an error here: its driver reports why "
                    "as the device's status.")
    chips.add_argument("--config", metavar="FILE", required=True, help="TOML config file")
    sim = commands.add_parser(
        "sim", help="simulate serial sensors on pseudo-terminals",
        description="Create pseudo-terminals that behave like Modbus RTU temperature/humidity "
                    "sensors on one bus and $THS line sensors, with stable names in DIR, print "
                    "them and a matching [[sensors]] config, and run until SIGTERM or SIGINT.")
    sim.add_argument("--modbus", type=_count, default=2, metavar="N",
                     help="Modbus devices on the bus DIR/modbus0, addresses 1..N (default 2)")
    sim.add_argument("--line", type=_count, default=1, metavar="N",
                     help="line sensors DIR/line0.. (default 1)")
    sim.add_argument("--dir", default="cairn-sim", metavar="DIR",
                     help="where the port names go (default ./cairn-sim)")
    sim.add_argument("--baudrate", type=int, default=9600, metavar="B",
                     help="the bus's baud rate; answers take as long as on a real line "
                          "(default 9600)")
    sim.add_argument("--fault-rate", type=_rate, default=0.0, metavar="R",
                     help="fraction of exchanges/sentences that go wrong: bad CRC, no answer, "
                          "garbage, noise; bad checksum, partial line (default 0)")
    sim.add_argument("--unplug-every", type=float, default=0.0, metavar="S",
                     help="every S seconds unplug a random port for 3 s (default never)")
    sim.add_argument("--line-interval", type=float, default=1.0, metavar="S",
                     help="seconds between sentences of a line sensor (default 1)")
    sim.add_argument("--router", default="ws://127.0.0.1:8080/ws", metavar="URL",
                     help="router URL for the printed sample config")
    sim.add_argument("--seed", type=int, default=None, help="random seed")
    sim.add_argument("--instant", action="store_true",
                     help="answer at once instead of at the line's speed (benchmarks)")
    sensor.set_defaults(handler=main)
    return sensor


def _count(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 247:
        raise argparse.ArgumentTypeError("must be 0..247")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def main(args: argparse.Namespace) -> int:
    """Run ``cairn sensor <subcommand>``; returns the exit code."""
    command = getattr(args, "sensor_command", None)
    if command == "run":
        return run_driver(args.config, args.log_level)
    if command == "sim":
        return run_simulator(args)
    if command == "scan":
        return run_scan(args.sysfs)
    if command == "chips":
        return run_chips(args.config)
    print("usage: cairn sensor {run,scan,chips,sim} ... (see cairn sensor --help)", file=sys.stderr)
    return EXIT_USAGE


async def _until_signal(work: Callable[[], Awaitable[object]]) -> None:
    """Run ``work()`` until it ends or SIGTERM/SIGINT arrives, then cancel it and let it
    clean up."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.ensure_future(work())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def run_driver(config_path: str, log_level: str = "info") -> int:
    from cairn.drivers import serial_config
    from cairn.drivers.serial_driver import SerialDriver

    try:
        config = serial_config.load(config_path)
    except ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(log_level)
    try:
        asyncio.run(_until_signal(SerialDriver(config).run))
    except Exception as e:  # a bug: say so, exit 1
        import logging

        logging.getLogger("cairn.sensor").exception("driver failed: %s", e)
        return EXIT_FAILURE
    return EXIT_OK


def run_scan(root: str | None) -> int:
    from cairn.drivers import kernel, sysfs

    where = kernel.Sysfs(root or kernel.DEFAULT_SYSFS)
    if not where.root.is_dir():
        print(f"cairn: no sysfs at {where.root}", file=sys.stderr)
        return EXIT_FAILURE
    found = kernel.scan(where)
    print(f"# {len(found)} kernel sensor device(s) in {where.root}: hwmon (class/hwmon), IIO "
          f"(bus/iio/devices), 1-Wire thermometers (bus/w1/devices)")
    for device in found:
        print(f"\n{sysfs.scan_entry(device, root)}")
    if not found:
        print("# none: load the chip's driver (an overlay in config.txt, such as "
              "dtoverlay=i2c-sensor,bme280 or dtoverlay=w1-gpio), or create it with "
              "chip = ... in its [[sensors]] entry")
    return EXIT_OK


def run_chips(config_path: str) -> int:
    from cairn.drivers import serial_config
    from cairn.drivers.kinds.kernel import chips

    try:
        config = serial_config.load(config_path)
    except ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return EXIT_USAGE
    for sensor_id, device in chips(config.sensors):
        made = device.stats.created
        fault = device.create_chip()
        what = f"cannot create {device.chip}: {fault.reason}" if fault else \
            f"created {device.chip}" if device.stats.created > made else "already there"
        print(f"cairn: sensor {sensor_id}: {device.device}: {what}")
    return EXIT_OK


def run_simulator(args: argparse.Namespace) -> int:
    from cairn.drivers.simulator import Simulator

    if args.modbus == 0 and args.line == 0:
        print("cairn: nothing to simulate (--modbus 0 --line 0)", file=sys.stderr)
        return EXIT_USAGE
    sim = Simulator(Path(args.dir), modbus=args.modbus, line=args.line, baudrate=args.baudrate,
                    fault_rate=args.fault_rate, line_interval=args.line_interval,
                    seed=args.seed, wire_timing=not args.instant)

    failed: list[str] = []

    async def simulate() -> None:
        try:
            await sim.start()
        except OSError as e:
            failed.append(f"cairn: cannot create the simulated ports in {args.dir}: {e}")
            await sim.stop()
            return
        try:
            # all of it TOML: `cairn sensor sim > sensors.toml` makes a config to run
            print("\n".join(f"# {line}" for line in sim.describe()))
            print(f"# fault rate {args.fault_rate:g}; stop with Ctrl-C or SIGTERM\n")
            print(sim.sample_config(args.router), flush=True)
            while True:
                if args.unplug_every > 0:
                    await asyncio.sleep(args.unplug_every)
                    port = sim.rng.choice(sim.ports)
                    print(f"unplugging {port.link} for 3 s", file=sys.stderr, flush=True)
                    port.unplug(for_seconds=3.0)
                else:
                    await asyncio.sleep(3600)
        finally:
            await sim.stop()
            print(f"stopped: {json.dumps(sim.stats())}", file=sys.stderr, flush=True)

    asyncio.run(_until_signal(simulate))
    if failed:
        print(failed[0], file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def standalone(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cairn")
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(standalone())
