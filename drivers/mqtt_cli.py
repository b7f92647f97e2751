"""``cairn bridge mqtt --config FILE``: run the MQTT bridge (see :mod:`drivers.mqtt_bridge`).

``app.cli`` calls :func:`add_commands` on its subparsers; the parsed arguments carry
``handler=main``, which returns the exit code. Kept free of the MQTT imports, so ``cairn
router`` does not load them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from cairn.base.console import EXIT_OK, EXIT_USAGE, setup_logging


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    bridge = subparsers.add_parser("bridge", help="bridge other protocols into the router",
                                   description="Bridge other protocols into the router.")
    kinds = bridge.add_subparsers(dest="bridge", metavar="KIND", required=True)
    mqtt = kinds.add_parser(
        "mqtt", help="bridge an MQTT broker (Mosquitto, zigbee2mqtt, Tasmota) to WAMP",
        description="Map MQTT topics to WAMP topics ([[mqtt.map]]) and forward WAMP topics "
                    "to MQTT ([[mqtt.forward]]); reach the router as [driver] says.")
    mqtt.add_argument("--config", metavar="FILE", required=True,
                      help="TOML config file with [driver] and [mqtt]")
    mqtt.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                      default="info")
    mqtt.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from cairn.drivers import mqtt_bridge
    from cairn.drivers.config import read_toml
    from cairn.gateway.core.config import ConfigError

    try:
        driver, config = mqtt_bridge.load(*read_toml(args.config))
    except ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(args.log_level)
    logging.getLogger("mqtt").setLevel(logging.WARNING)  # aiomqtt, chatty at debug
    asyncio.run(_run(mqtt_bridge.MqttBridge, driver, config))
    return EXIT_OK


async def _run(bridge_class: Any, *config: Any) -> None:
    """Bridge until SIGTERM or SIGINT."""
    bridge = bridge_class(*config)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await bridge.run()


if __name__ == "__main__":  # python -m cairn.drivers.mqtt_cli bridge mqtt --config FILE
    parser = argparse.ArgumentParser(prog="cairn")
    add_commands(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args()
    sys.exit(parsed.handler(parsed))
