"""The data directory: the names of what lives in it, and the one file two programs share.

The router (status, /metrics, the seq floor of a lost store), ``cairn sync`` and the ops
commands (backup, restore, doctor) name these files only through here:

- ``cairn.db`` (and its ``-wal``/``-shm``): the store, written by the router alone;
- ``cairn.lock``: held by the running router, so a second one (or a restore) is refused;
- ``sync-status.json``: written by ``cairn sync`` (:class:`SyncStatus`), read by the router;
- ``cra-decoy.key``: the key of the made-up WAMP-CRA salts of unknown authids
  (:func:`cra_decoy_key`), created once by the router.
- ``signing.key``: the gateway's Ed25519 key that ``cairn sync`` signs each batch's manifest
  with (formats.batch_signature), created once by it.
- ``config-state.json`` and ``config-requests/`` (``queue/``, ``refused/``): what
  configuration the router runs, and the changes asked for over WAMP; their format is
  gateway.ops.config_history's, and root reads them by base.files.read_untrusted.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cairn.base.files import write_atomically

DB_NAME = "cairn.db"
LOCK_NAME = "cairn.lock"
SYNC_STATUS_NAME = "sync-status.json"
CRA_DECOY_KEY_NAME = "cra-decoy.key"
CRA_DECOY_KEY_BYTES = 32
SIGNING_KEY_NAME = "signing.key"

log = logging.getLogger("cairn.data_dir")


def db_path(data_dir: Path) -> Path:
    return data_dir / DB_NAME


def lock_path(data_dir: Path) -> Path:
    return data_dir / LOCK_NAME


def sync_status_path(data_dir: Path) -> Path:
    return data_dir / SYNC_STATUS_NAME


def signing_key_path(data_dir: Path) -> Path:
    return data_dir / SIGNING_KEY_NAME


@dataclass
class SyncStatus:
    gateway_id: str
    sink: str
    state: str = "starting"  # ok | retrying | idle | waiting (for an unmetered link)
    synced_seq: int = 0
    backlog: int = 0
    last_success: str | None = None
    last_attempt: str | None = None
    last_error: str | None = None
    rate_events_per_s: float | None = None
    batches: int = 0
    events: int = 0
    damaged_rows: int = 0  # history rows that could not be read, shipped as gaps
    last_damaged: dict[str, Any] | None = None
    # history rows larger than a whole day's budget, shipped as gaps ("over budget: ...")
    over_budget_rows: int = 0
    last_over_budget: dict[str, Any] | None = None  # first_seq, last_seq, reason
    bytes_sent: int = 0  # every try's bytes, taken or not (sync.uploader), since the first run
    budget_bytes: int = 0  # [sync] daily_bytes; 0: no limit
    budget_used: int = 0  # sent in the budget's current window (a day of CLOCK_BOOTTIME)
    budget_since: str | None = None  # when that window began (wall clock, to read)
    budget_window: list[Any] | None = None  # [boot_id, CLOCK_BOOTTIME ns] of its start
    health_only: bool = False  # the budget is spent: only health records go until it ends
    health_seq: int = 0  # the last health record shipped ahead of the watermark
    waiting_for: str | None = None  # why nothing goes now ([sync] on_metered = "wait")
    waiting_since: str | None = None  # when this wait began (wall clock, to read)
    # the uplink's view of the clock: an S3 sink's offset of the server's time from this
    # wall clock, carried forward on CLOCK_BOOTTIME (sync.sinks.s3.UplinkClock.view); None: unknown
    uplink_clock: dict[str, Any] | None = None


AGING = ("last_success", "last_attempt", "rate_events_per_s")  # what changes when idle
# what a run of the uploader takes over from the last one (``cairn sync --once`` from cron)
CARRIED = {"bytes_sent": int, "budget_used": int, "budget_since": str, "budget_window": list,
           "health_seq": int, "uplink_clock": dict}


def write_sync_status(path: Path, status: SyncStatus) -> None:
    """Replace the file whole (a reader never sees half of it); OSError if it cannot. Not
    synced: it is rewritten at every sync run, and the next run rewrites one a power cut lost."""
    write_atomically(path, json.dumps(asdict(status), indent=1), mode=None, durable=False)


def read_sync_status(data_dir: Path) -> dict[str, Any] | None:
    """What ``cairn sync`` last wrote, or None (not there, unreadable, not an object). A
    mapping rather than a SyncStatus: an older or newer uploader may write other fields."""
    return read_sync_status_file(sync_status_path(data_dir))


def read_sync_status_file(path: Path) -> dict[str, Any] | None:
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def cra_decoy_key(data_dir: Path) -> bytes:
    """The key of the salts unknown authids are challenged with. Kept in the data directory
    (0600), so an unknown authid's salt is the same after a SIGHUP or a reboot, as a real
    user's is: were it drawn per process, the salts that change would tell who is not a
    user. A missing or damaged file is replaced; one that cannot be written costs the
    stability, not the start (a key for this process only, and a warning)."""
    path = data_dir / CRA_DECOY_KEY_NAME
    try:
        key = path.read_bytes()
        if len(key) == CRA_DECOY_KEY_BYTES:
            return key
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot read %s: %s: making a new one", path, e.strerror or e)
    key = secrets.token_bytes(CRA_DECOY_KEY_BYTES)
    try:
        _write_private(path, key)
    except OSError as e:
        log.warning("cannot write %s: %s: unknown authids' WAMP-CRA salts will change at the "
                    "next start", path, e.strerror or e)
    return key


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path`` whole and durably, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data, mode=0o600)
