"""The gateway's own health, recorded in its history (``cairn.gateway.health``).

Every ``router.health_interval`` (15 min), and within :attr:`HealthReporter.check_interval`
of a change of what matters (a device's status, the clock's state or a step, the store
opening or failing, an update's result, the uplink failing or its budget spent, the card's
life under :data:`~gateway.ops.wear.WARN_YEARS`), the router assembles a record of its health
here, in the shell, and publishes it through the core (``Router.publish_health``) like its
own meta events. The first realm keeps it in history, so ``cairn sync`` ships it in the same
batches as the readings: a gateway that was offline for a week reports the week. Clients
may subscribe to it; only the router publishes there. The fields are formats.health.FIELDS
(the README's table is made of them): the record is built through it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn.base import clock
from cairn.base.clock_readings import age_s
from cairn.base.console import installed_version
from cairn.base.data_dir import read_sync_status
from cairn.formats import health as record_format
from cairn.gateway.ops import update_state
from cairn.gateway.ops.wear import WARN_YEARS

if TYPE_CHECKING:
    from cairn.gateway.core.publication import StoredPublication
    from cairn.gateway.shell.web import Web

log = logging.getLogger("cairn.health")

STATUS_TOPICS = ("gateway.device..status", "wildcard")  # the drivers' (drivers.runtime)
READING_TOPICS = ("sensor.", "prefix")


class HealthReporter:
    check_interval = 60.0  # s between looks for a change: at most one record a minute

    def __init__(self, web: Web, publish: Callable[[dict[str, Any]], None],
                 interval: float) -> None:
        self.web = web
        self.publish = publish  # hands the record to the core (Node.publish_health)
        self.interval = interval

    async def run(self) -> None:
        """A record at start, then on a change or when the interval is up."""
        last_key, last_at = None, -math.inf
        while True:
            key = self.key()
            if key != last_key or time.monotonic() - last_at >= self.interval:
                try:
                    self.publish(await self.record())
                    last_key, last_at = key, time.monotonic()
                except Exception:  # a bug here must not stop the records for good
                    log.exception("assembling a health record failed; trying again")
            await asyncio.sleep(min(self.check_interval, self.interval))

    # -- what changes publish a record at once -------------------------------------------

    def key(self) -> tuple[Any, ...]:
        """The important parts, read from memory and small files (no store query)."""
        web = self.web
        update = update_state.summary()
        sync = read_sync_status(web.state.config.router.data_dir) or {}
        wear = web.stores.wear.report() if web.stores.wear is not None else {}
        named = record_format.listed(self.devices())[0]
        devices = {name: device.get("status") for name, device in named.items()}
        return (clock.clock_synchronized(), web.router.clock.steps, web.stores.error,
                update["slot"], update["trial"], (update["last"] or {}).get("at"),
                sorted(devices.items()), sync.get("state") == "retrying",
                bool(sync.get("health_only")),
                (wear.get("life_years") or math.inf) < WARN_YEARS, self._config())

    def _config(self) -> dict[str, Any] | None:
        """Which configuration runs and why (config_history.RunningConfig)."""
        running = self.web.state.running
        return None if running is None else {"running": running.running,
                                             "problem": running.problem}

    # -- the record ----------------------------------------------------------------------

    async def record(self) -> dict[str, Any]:
        web = self.web
        realm = next(iter(web.router.realms.values()))
        status = await web.status(realm)
        store, wear = status["store"] or {}, status["wear"] or {}
        figures = await web.stores.store.reader.health_figures()
        oldest = figures.get("oldest_unsynced_ms")
        now_ms = clock.wall_ns() // 1_000_000
        update = status["update"]
        devices, unlisted = record_format.listed(self.devices())
        return record_format.build({
            "interval_s": self.interval,  # the central report expects one this often
            "version": installed_version(),
            "boot_id": web.state.clock.boot_id,
            "uptime_s": status["uptime_s"],
            "system_uptime_s": round(clock.boottime_ns() / 1e9),
            "slot": update["slot"],
            "update_on_trial": update["trial"],
            "last_update": update["last"],
            "clock": {"synchronized": status["clock"]["synchronized"],
                      "steps": store.get("clock_steps"),
                      "last_step": figures.get("last_clock_step")},
            "store": {"available": status["store_error"] is None,
                      "error": status["store_error"], "bytes": store.get("bytes"),
                      "events": store.get("events"),
                      "dropped_events": store.get("dropped_events"),
                      "damaged_rows_skipped": store.get("damaged_rows", 0)},
            "backlog": {"events": figures.get("unsynced_events"),
                        "oldest_age_s": round((now_ms - oldest) / 1000)
                        if oldest is not None else None},
            "sync": sync_section(status["sync"]),
            "card": {"bytes_per_day": wear.get("bytes_per_day"),
                     "life_years": wear.get("life_years"),
                     "measuring": wear.get("measuring"), "window_s": wear.get("measured_s"),
                     "endurance_tb": wear.get("endurance_tb")},
            "devices": devices,
            "devices_unlisted": unlisted,
            "limit_hits": status["limit_hits"],
            "config": self._config(),
        })

    def devices(self) -> dict[str, dict[str, Any]]:
        """Per device (its status topic or its readings), what its driver said last and
        how long ago its last reading came; devices of realms after the first are named
        ``realm/device``. All of them: the record names some (formats.health.listed)."""
        found: dict[str, dict[str, Any]] = {}
        for i, realm in enumerate(self.web.router.realms.values()):
            prefix = "" if i == 0 else f"{realm.name}/"
            for pub in realm.retention.newest(*STATUS_TOPICS):
                said = pub.kwargs or {}
                found.setdefault(prefix + pub.topic.split(".")[2], {}).update(
                    status=said.get("status"), reason=said.get("reason"),
                    errors=said.get("errors"))
            for pub in realm.retention.newest(*READING_TOPICS):
                name = prefix + pub.topic.removeprefix(READING_TOPICS[0])
                found.setdefault(name, {})["last_reading_age_s"] = self._age_s(pub)
        return dict(sorted(found.items()))

    def _age_s(self, pub: StoredPublication) -> float:
        """By CLOCK_BOOTTIME within this boot (a clock step does not make it lie), else by
        the wall clock."""
        age = age_s(pub.boot_id, pub.boottime_ns, self.web.state.clock.now())
        if age is not None:
            return age
        return round((clock.wall_ns() // 1_000_000 - pub.wall_ms) / 1000, 1)


def sync_section(status: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record's ``sync``: the uploader's state as its status file says (None: sync is not
    running here)."""
    if status is None:
        return None
    picked = {key: status.get(key) for key in record_format.SYNC_STATUS_FIELDS}
    picked["damaged_rows_shipped"] = status.get("damaged_rows", 0)
    return picked
