"""``[sync] daily_bytes``: what the uploader may send in a day, on a metered link.

A day is 24 hours of ``CLOCK_BOOTTIME``, which an unsynchronised or stepped wall clock does
not move: the window starts when the uploader first sends, and a new one starts 24 h later.
A reboot restarts that clock, so the window then restarts at the new boot's first check and
keeps what was used (a reboot never refills the budget). The state lives in the uploader's
status file (:class:`~cairn.base.data_dir.SyncStatus`), so runs of ``cairn sync --once``
from cron share one budget.
"""

from __future__ import annotations

import math

from cairn.base import clock
from cairn.base.clock_readings import rfc3339
from cairn.base.data_dir import SyncStatus

DAY_NS = 86_400 * 10**9
# Past the budget, health records still go, up to this much over it a window: twice what a
# gateway of 20 devices sends in a day at the default interval (~110 KB), 16 records of the
# largest size (formats.health.MAX_RECORD_BYTES). A gateway made to record more (a device
# flapping each minute, thousands of junk topics) sends the rest with the next window's data.
HEALTH_FLOOR_BYTES = 256 * 1024


def room(status: SyncStatus) -> float:
    """Bytes the day's budget has left (may be negative: health records go past it, up to
    :func:`health_room`); infinite without a budget. Starts a new window once a day is
    over."""
    if not status.budget_bytes:
        return math.inf
    boot, now = clock.boot_id(), clock.boottime_ns()
    window = status.budget_window
    if not window or window[0] != boot:
        _start(status, boot, now, keep_used=True)
    elif now - window[1] >= DAY_NS:
        _start(status, boot, now, keep_used=False)
    return status.budget_bytes - status.budget_used


def health_room(status: SyncStatus) -> float:
    """Bytes health records may still take: what the budget has left, and HEALTH_FLOOR_BYTES
    beyond it (infinite without a budget). Call after :func:`room`, which opens the window."""
    if not status.budget_bytes:
        return math.inf
    return status.budget_bytes + HEALTH_FLOOR_BYTES - status.budget_used


def ends_in_s(status: SyncStatus) -> float:
    """Seconds until the window ends (and the budget is whole again)."""
    window = status.budget_window
    return max(0.0, (window[1] + DAY_NS - clock.boottime_ns()) / 1e9) if window else 0.0


def _start(status: SyncStatus, boot: str, now: int, keep_used: bool) -> None:
    status.budget_window = [boot, now]
    status.budget_since = rfc3339(clock.wall_ns() // 1_000_000)
    if not keep_used:
        status.budget_used = 0
