"""``cairn demo``: the whole gateway in one process, for a first look.

The router on its embedded default (or ``--config``), simulated sensors on pseudo-terminals
(Modbus RTU devices on one bus and ``$THS`` line sensors, drifting slowly, with an optional
fault rate), and the real serial driver polling them over those ports, publishing retained
readings the dashboard shows at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import tempfile
import tomllib
from typing import Any

from cairn.drivers.serial_config import parse as parse_sensors
from cairn.drivers.serial_driver import SerialDriver
from cairn.drivers.simulator import Simulator
from cairn.gateway.core import config as gateway_config
from cairn.gateway.shell.server import Node

log = logging.getLogger("cairn.demo")


def add_commands(commands: Any) -> None:
    demo = commands.add_parser(
        "demo", help="router + simulated sensors + dashboard, for a first look",
        description="Run the router (embedded default unless --config), simulated serial "
                    "sensors and the serial driver in one process, and print the dashboard "
                    "URL. Stop with Ctrl-C.")
    demo.add_argument("--config", metavar="FILE", help="router config (default: embedded)")
    demo.add_argument("--modbus", type=int, default=4, metavar="N",
                      help="simulated Modbus devices on one bus (default 4)")
    demo.add_argument("--line", type=int, default=2, metavar="N",
                      help="simulated $THS line sensors (default 2)")
    demo.add_argument("--fault-rate", type=float, default=0.02, metavar="R",
                      help="fraction of exchanges that go wrong, to show error handling "
                           "(default 0.02)")
    demo.add_argument("--interval", type=float, default=2.0, metavar="S",
                      help="seconds between polls of each simulated device (default 2)")


def main(args: argparse.Namespace) -> int:
    try:
        config = gateway_config.load(args.config)
    except gateway_config.ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_demo(config, args))
    except OSError as e:
        log.error("cannot start: %s", e)
        return 1
    return 0


async def _demo(config: gateway_config.Config, args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node = Node(config)
    await node.start()
    realm = config.realms[0].name
    with tempfile.TemporaryDirectory(prefix="cairn-demo-") as ports:
        simulator = Simulator(ports, modbus=args.modbus, line=args.line,
                              fault_rate=args.fault_rate, line_interval=args.interval)
        await simulator.start()
        sensors_toml = simulator.sample_config(router=f"ws://127.0.0.1:{node.port}/ws",
                                               realm=realm)
        sensors_toml = sensors_toml.replace("interval = 5\n", f"interval = {args.interval:g}\n")
        driver = SerialDriver(parse_sensors(tomllib.loads(sensors_toml), "<demo sensors>"))
        tasks = [loop.create_task(driver.run())]
        host = config.router.listen.host
        print(f"\n  Cairn demo: {len(driver.devices)} simulated sensors -> router -> "
              f"dashboard\n  Dashboard:  http://{host}:{node.port}/\n"
              f"  WAMP:       ws://{host}:{node.port}/ws  (realm {realm})\n"
              f"  Stop with Ctrl-C.\n", flush=True)
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await simulator.stop()
            await node.stop()
