"""The sections of ``cairn.toml`` and their checks, in one table: what a change of the file
must pass, whichever part of the command makes it (the router's ``cairn.admin.config.apply``,
``cairn config apply``, ``cairn provision``, ``cairn check-config``), so that no component is
left unable to start on it. A section the router does not read is checked here by its owner's
parser; a new one is a line in :data:`SECTIONS` (and its name in the router's list of the
file's sections, gateway.core.config.SECTIONS, which a test keeps equal to this table)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cairn.app.update_pull import parse_update
from cairn.gateway.core import config as router_config
from cairn.sync.cli import parse_sync

Check = Callable[[dict[str, Any], str], object]

SECTIONS: dict[str, Check | None] = {
    "router": None,    # the router's own (gateway.core.config.parse), always checked
    "realms": None,
    "driver": None,    # the drivers' sections, checked in their own files by cairn sensor,
    "sensors": None,   # cairn bridge mqtt and cairn provision
    "mqtt": None,
    "sync": parse_sync,         # cairn sync (sync.cli)
    "update": parse_update,     # cairn update pull (app.update_pull)
}


def check_whole(data: dict[str, Any], source: str) -> router_config.Config:
    """The router's parse, then the check of each other section ``data`` has."""
    config = router_config.parse(data, source)
    for section, check in SECTIONS.items():
        if check is not None and section in data:
            check(data, source)
    return config
