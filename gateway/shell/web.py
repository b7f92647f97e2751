"""HTTP on the router's main port, beside the WebSocket upgrade: the dashboard's files, a
plain-text ``/status``, Prometheus ``/metrics``, and the status the dashboard and
``cairn.router.status`` show. Reads the running gateway; changes nothing."""

from __future__ import annotations

import hmac
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairn.base.clock_readings import rfc3339
from cairn.base.data_dir import read_sync_status
from cairn.gateway.ops import update_state
from cairn.gateway.ops.config_history import provisioning_outcome
from cairn.gateway.shell.metrics import render as render_metrics

if TYPE_CHECKING:
    from cairn.gateway.core.router import Realm, Router
    from cairn.gateway.shell.shell_state import ShellState
    from cairn.gateway.shell.store_service import StoreService

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"  # gateway/dashboard
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
                  ".png": "image/png", ".txt": "text/plain; charset=utf-8"}
_ASSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9]+)+")  # no "/", no ".."


class StaticFiles:
    """The dashboard's files (package data of ``gateway``), read once and served from memory.

    Only plain file names directly in the directory, with a known extension, are served: no
    sub-directories (so not ``node_modules``), no dot files, nothing outside it. A file that is
    missing is looked for again on the next request (the build may add it later)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, tuple[str, bytes]] = {}

    def get(self, name: str) -> tuple[str, bytes] | None:
        if name in self._cache:
            return self._cache[name]
        content_type = _CONTENT_TYPES.get(os.path.splitext(name)[1])
        if content_type is None or not _ASSET_NAME.fullmatch(name):
            return None
        try:
            body = (self.directory / name).read_bytes()
        except OSError:  # missing, a directory, unreadable
            return None
        self._cache[name] = content_type, body
        return content_type, body


class Web:
    def __init__(self, state: ShellState, router: Router, stores: StoreService) -> None:
        self.state = state
        self.router = router
        self.stores = stores
        self.dashboard = StaticFiles(DASHBOARD_DIR)

    async def route(self, method: str, path: str, headers: dict[str, str],
                   local: bool = True) -> tuple[int, str, bytes]:
        """The dashboard at ``/`` (its files under ``/dashboard/``), a plain-text status at
        ``/status``; WAMP itself is the WebSocket upgrade on ``/ws``. GET and HEAD only."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        route = path.split("?")[0]
        if route == "/ws":
            return 426, "text/plain", b"this endpoint speaks WAMP over WebSocket\n"
        if route in ("/status", "/metrics") and not local:
            refused = self._status_refused(headers.get("authorization", ""))
            if refused is not None:
                return refused
        if route == "/status":
            return 200, "text/plain; charset=utf-8", self._status_text().encode()
        if route == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", \
                (await self.metrics()).encode()
        if route in ("/", "/index.html"):
            name = "index.html"
        elif route.startswith("/dashboard/"):
            name = route.removeprefix("/dashboard/")
        else:
            return 404, "text/plain", b"not found\n"
        found = self.dashboard.get(name)
        if found is None:
            if name == "autobahn.min.js":
                return 404, "text/plain", (b"the dashboard's WAMP client is not built: "
                                           b"reinstall cairn with npm at hand (pip install "
                                           b". or scripts/setup.sh)\n")
            return 404, "text/plain", b"not found\n"
        return 200, *found

    def _status_refused(self, authorization: str) -> tuple[int, str, bytes] | None:
        """/status and /metrics from another host: only with the bearer token of
        ``router.status_token_file`` (what they tell helps an attacker on the LAN)."""
        token = self.state.config.router.status_token
        if token is None:
            return 403, "text/plain", (b"/status and /metrics answer the device itself; for "
                                       b"other hosts set router.status_token_file and send "
                                       b"Authorization: Bearer <token>\n")
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                               token.encode()):
            return None
        self.state.limit_hits.hit("status_token", "a request for /status or /metrics from "
                                                 "another host without the right token")
        return 401, "text/plain", b"a bearer token is needed (router.status_token_file)\n"

    async def status(self, realm: Realm) -> dict[str, Any]:
        """What the dashboard's status strip and ``cairn doctor`` show."""
        state, stores = self.state, self.stores
        reading = self.state.clock.now()
        store = await stores.store.reader.summary(realm.name)
        return {
            "uptime_s": round(time.monotonic() - state.started, 1),
            "sessions": len(realm.sessions),
            "realm": realm.name,
            "store": store,
            "store_error": stores.error,
            "store_damaged_rows": stores.store.damaged_rows,
            "retained_topics": len(realm.retention),
            "retained_slots": realm.retention.count,
            "retained_bytes": realm.retention.bytes,
            "retained_cache_bytes": realm.retention.cache.bytes,
            "clock": {"synchronized": reading.synced, "boot_id": reading.boot_id,
                      "now": rfc3339(reading.wall_ms)},
            "sync": read_sync_status(state.config.router.data_dir),
            "update": update_state.summary(),
            "slow_consumers": state.slow_consumers,
            "wear": stores.wear.report() if stores.wear is not None else None,
            "connections": {"network": state.admission.network,
                            "local": state.admission.local, "pending": state.admission.pending},
            "limit_hits": dict(state.limit_hits.counts),
            "config": state.running.status() if state.running is not None else None,
            "provisioning": (provisioning_outcome(state.running.file)
                             if state.running is not None and state.running.file else None),
        }

    async def metrics(self) -> str:
        realms = list(self.router.realms.values())
        status = await self.status(realms[0])
        status["sessions_by_realm"] = {r.name: len(r.sessions) for r in realms}
        status["protocol_violations"] = self.state.protocol_violations
        store = self.stores.store
        status["failed_writes"] = store.failed_writes
        status["store_queued_bytes"] = store.queued_bytes
        return render_metrics(status, self.state.counters, store.commit_latencies)

    def _status_text(self) -> str:
        return (f"Cairn router\nrealms: {', '.join(self.router.realms)}\n"
                f"sessions: {len(self.router.sessions)}\n"
                f"uptime: {time.monotonic() - self.state.started:.0f} s\n"
                f"WAMP endpoints: {' '.join(self.state.urls)}\n")
