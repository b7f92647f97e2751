"""What the device's A/B system updates left behind, for whoever reports on the device (the
router's status and /metrics, ``cairn doctor``, ``cairn update status``): the slot this boot
runs, the install under way, the update on trial, the last update's result and the last
check of ``cairn update pull``. Written by RAUC's pre- and post-install handlers
(images/update/cairn-update-installing, -installed), by the health gate (cairn.app.update)
and by the puller (cairn.app.update_pull), in UPDATE_DIR on the data partition, outside
either root slot."""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cairn.base.files import write_atomically

UPDATE_DIR = Path(os.environ.get("CAIRN_UPDATE_DIR", "/data/update"))
CMDLINE = Path("/proc/cmdline")
INSTALLING, TRIAL = "installing", "trial"   # an install begun; its slot written and switched to
PULL = "pull.json"   # the last check of ``cairn update pull``


def booted_slot(cmdline: str) -> str | None:
    """The slot this boot runs (``rauc.slot=`` from boot.cmd), None off an A/B image."""
    m = re.search(r"(?:^|\s)rauc\.slot=(\S+)", cmdline)
    return m.group(1) if m else None


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the records on the data partition -------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    slot: str
    version: str
    from_slot: str

    @classmethod
    def read(cls, directory: Path, name: str = TRIAL) -> Trial | None:
        """The trial (or, with ``name=INSTALLING``, the install under way)."""
        try:
            text = (directory / name).read_text()
        except (OSError, UnicodeDecodeError):  # no trial, or a record damaged past reading
            return None
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        if "slot" not in fields:
            return None
        return cls(fields["slot"], fields.get("version", "?"), fields.get("from_slot", "?"))


def record(directory: Path, result: str, reason: str, trial: Trial | None,
           ends: tuple[str, ...] = (TRIAL, INSTALLING)) -> dict[str, Any]:
    """Writes last.json (atomically) and ends the trial and the install it came from (or
    what ``ends`` names)."""
    last = {"result": result, "reason": reason, "at": now_utc(),
            "version": trial.version if trial else None,
            "slot": trial.slot if trial else None,
            "from_slot": trial.from_slot if trial else None}
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / "last.json", json.dumps(last, indent=1) + "\n", mode=None,
                     durable=False)
    for name in ends:
        (directory / name).unlink(missing_ok=True)
    return last


def last_result(directory: Path) -> dict[str, Any] | None:
    return _read(directory / "last.json")


def record_pull(directory: Path, result: str, reason: str) -> None:
    """The outcome of ``cairn update pull``'s last check (``ok`` or ``failed``, and what it
    did or why not) in pull.json, with ``since``: when checks began to end so. Rewritten
    only when the outcome changes (an hourly check that finds nothing new writes nothing)."""
    path = directory / PULL
    last = _read(path)
    if last and (last.get("result"), last.get("reason")) == (result, reason):
        return
    directory.mkdir(parents=True, exist_ok=True)
    pull = {"result": result, "reason": reason, "since": now_utc()}
    write_atomically(path, json.dumps(pull, indent=1) + "\n", mode=None, durable=False)


def last_pull(directory: Path) -> dict[str, Any] | None:
    return _read(directory / PULL)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@functools.cache
def _booted_slot_of(cmdline: Path) -> str | None:
    """The kernel command line does not change during a boot: read once (status and /metrics
    ask on every call)."""
    try:
        return booted_slot(cmdline.read_text())
    except OSError:
        return None


def running_slot() -> str | None:
    """The slot this boot runs, None off an A/B image."""
    return _booted_slot_of(CMDLINE)


def summary(directory: Path | None = None) -> dict[str, Any]:
    """The slot running now, the update on trial, the last update's result and the last
    pull's."""
    directory = directory or UPDATE_DIR
    trial = Trial.read(directory)
    return {"slot": running_slot(), "trial": vars(trial) if trial else None,
            "last": last_result(directory), "pull": last_pull(directory)}
