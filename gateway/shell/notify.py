"""systemd readiness and watchdog notifications (``Type=notify``, ``WatchdogSec=``), spoken
directly on ``$NOTIFY_SOCKET``; a no-op when not run by systemd."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket


def notify(message: str) -> bool:
    """Send one sd_notify message (e.g. ``READY=1``); False when there is no systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(address)
        s.sendall(message.encode())
        return True
    return False


def watchdog_interval() -> float | None:
    """Half of WatchdogSec, as systemd recommends, or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000


async def keep_watchdog_fed(alive: asyncio.Event | None = None) -> None:
    """Ping the watchdog for as long as the event loop turns: a hung loop stops the pings
    and systemd restarts the router."""
    interval = watchdog_interval()
    if interval is None:
        return
    while alive is None or not alive.is_set():
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
