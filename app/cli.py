"""The ``cairn`` command. Exit codes: 0 ok, 2 bad usage or bad config, 1 other failure."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from cairn.app import config_cli, provision, update
from cairn.app.sections import check_whole
from cairn.base.console import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    installed_version,
    setup_logging,
)
from cairn.central import cli as central_cli
from cairn.drivers import cli as sensor_cli
from cairn.drivers import demo, mqtt_cli
from cairn.gateway.core import config as cfg
from cairn.gateway.ops import maintenance as ops
from cairn.gateway.ops.config_history import RunningConfig, startup_config
from cairn.sync import cli as sync_cli

# the other components' commands, each adding its subcommands to ``cairn``
COMPONENTS = (ops, config_cli, demo, sensor_cli, mqtt_cli, sync_cli, central_cli, update,
              provision)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cairn",
        description="Cairn: an off-grid IoT edge gateway built around a WAMP router.",
    )
    parser.add_argument("--version", action="version", version=f"cairn {installed_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    router = commands.add_parser(
        "router", help="run the WAMP router",
        description="Run the WAMP router. Without --config it runs the embedded default: "
                    "ws://127.0.0.1:8080/ws, realm 'realm1', anonymous on loopback.")
    router.add_argument("--config", metavar="FILE", help="TOML config file")
    router.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        help="override router.log_level")
    check = commands.add_parser("check-config", help="validate a config file and exit",
                                description="Validate a config file: exit 0 if it is good, "
                                            "2 with a message naming the key if not.")
    check.add_argument("config", metavar="FILE", nargs="?")
    for module in COMPONENTS:
        before = set(commands.choices)
        module.add_commands(commands)
        for name in set(commands.choices) - before:
            commands.choices[name].set_defaults(handler=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command not in ("router", "check-config"):
        setup_logging(getattr(args, "log_level", None) or "info")
        return args.handler(args)
    try:
        if args.command == "router":  # a bad file with a last good one beside it runs that
            config, running = startup_config(args.config)
        else:
            config, running = check_whole(*cfg.read_document(args.config)), None
    except cfg.ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "check-config":
        print(f"{config.source}: ok ({len(config.realms)} realm(s))")
        return EXIT_OK
    return run_router(config, running, args.log_level)


def run_router(config: cfg.Config, running: RunningConfig, log_level: str | None) -> int:
    import sqlite3

    from cairn.gateway.shell.server import serve
    from cairn.gateway.store import SchemaTooNew

    setup_logging(log_level or config.router.log_level)
    if running.problem is not None:
        logging.getLogger("cairn").error("bad config: %s; running on the last good "
                                         "configuration %s", running.problem, config.source)
    try:
        asyncio.run(serve(config, running=running, check=check_whole))
    except (OSError, SchemaTooNew, sqlite3.DatabaseError, ops.DataDirBusy) as e:
        logging.getLogger("cairn").error("cannot start: %s", e)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
