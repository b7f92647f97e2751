"""What every ``cairn`` command shares: its exit codes, the shape of its log lines and the
version it reports (``cairn --version``, the router's health records)."""

from __future__ import annotations

import logging
import sys
from importlib import metadata

import txaio

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2  # 2: bad usage or bad config


def setup_logging(level: str) -> None:
    """One line per event, no timestamps (journald adds them), level and component first."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    txaio.use_asyncio()
    txaio.set_global_log_level("warn")
    for noisy in ("autobahn", "txaio", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def installed_version() -> str:
    """The version of the installed distribution (the wheel's), which an upgrade changes."""
    try:
        return metadata.version("cairn")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"
