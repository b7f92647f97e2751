"""The asyncio shell around the protocol core: listeners, the outbox pump, signals.

``Node`` owns the :class:`~gateway.router.Router` and carries out what the core writes into
an :class:`~gateway.core.Outbox`: send messages, close transports, start timers, run tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import logging
import os
import resource
import signal
import sqlite3
import ssl
import time
from pathlib import Path
from typing import Any

from autobahn.wamp import message as m

from cairn.gateway.admission import Admission
from cairn.gateway.config import EMBEDDED, Config, ConfigError, Endpoint, load
from cairn.gateway.core import (
    ClockStep,
    Effect,
    ForgetRetained,
    ForgetSubscription,
    KeepSubscription,
    Outbox,
    Persist,
    Read,
    Session,
    Stored,
    Task,
    Timer,
)
from cairn.gateway.data_dir import db_path, read_sync_status
from cairn.gateway.flow_control import StoreBackpressure, WriteBatcher
from cairn.gateway.http_front import HttpFront
from cairn.gateway.limits import LimitHits
from cairn.gateway.metrics import MessageCounters
from cairn.gateway.notify import keep_watchdog_fed, notify
from cairn.gateway.ops import data_dir_lock
from cairn.gateway.origins import BrowserGuard
from cairn.gateway.publication import Restored
from cairn.gateway.router import Realm, Router
from cairn.gateway.store import PruneRule, Store, UnavailableStore
from cairn.gateway.transport import rawsocket_factory, websocket_factory
from cairn.gateway.wear import WearMeter, disk_of
from cairn.gateway.web import Web

log = logging.getLogger("cairn.server")

class Node:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.limit_hits = LimitHits()
        self.router: Router  # built in start(), once the store is open
        self.started = time.monotonic()
        self.slow_consumers = 0
        self.protocol_violations = 0
        self.counters = MessageCounters()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task] = set()
        self.urls: list[str] = []
        self.store: Store | UnavailableStore = UnavailableStore("not open yet")
        self.wear: WearMeter | None = None
        self.connections: set = set()  # open transports (gateway.transport.Connection)
        self.writes = WriteBatcher()
        self._maintenance: asyncio.Task | None = None
        self._reopening: asyncio.Task | None = None
        self._lock: contextlib.AbstractContextManager | None = None
        self.maintenance_interval = 60.0
        self.rawsocket_ports: list[int] = []
        self.web = Web(self)
        self.admission = Admission(config.router.limits, self.limit_hits)
        self.backpressure = StoreBackpressure(self.limit_hits, self.store)

    # -- the outbox pump -----------------------------------------------------------------

    def receive(self, session: Session, msg: m.Message, extra: dict | None = None) -> None:
        self.counters.received[type(msg)] += 1
        out = Outbox()
        try:
            self.router.receive(session, msg, out, extra)
        except Exception:
            # A bug must cost one session, never the router.
            log.exception("internal error handling %s from session %s", type(msg).__name__,
                          session.id)
            self.router.abort(session, "wamp.error.internal_error",
                              "internal error in the router (see its log)", out)
        self.flush(out)

    def violation(self, session: Session, reason: str) -> None:
        if session.closed:
            return
        self.protocol_violations += 1
        out = Outbox()
        self.router.abort(session, "wamp.error.protocol_violation", reason, out)
        self.flush(out)

    def lost(self, session: Session) -> None:
        out = Outbox()
        self.router.lost(session, out)
        self.flush(out)

    def flush(self, out: Outbox) -> None:
        for effect in out.effects:  # first, as when the core wrote to the store itself
            self._carry_out(effect, out)
        for session, msg in out.messages:
            session.link.send(msg)
        for session in out.closes:
            session.link.close()
        if not (out.timers or out.tasks):
            return
        loop = asyncio.get_running_loop()
        for delay, timer in out.timers:
            loop.call_later(delay, self._fire, timer)
        for task in out.tasks:
            t = loop.create_task(self._run(task))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    # -- the core's effects on the store -------------------------------------------------

    def _carry_out(self, effect: Effect, out: Outbox) -> None:
        store = self.store
        if isinstance(effect, Persist):
            durable = store.append(effect.pub, effect.within)
            if effect.then is not None:
                durable.add_done_callback(functools.partial(self._stored, effect.then))
        elif isinstance(effect, Read):
            out.spawn(functools.partial(self._read, effect))
        elif isinstance(effect, KeepSubscription):
            store.add_subscription(effect.id, effect.realm, effect.uri, effect.match,
                                   effect.created)
        elif isinstance(effect, ForgetSubscription):
            store.remove_subscription(effect.id)
        elif isinstance(effect, ForgetRetained):
            store.forget_retained(effect.pub)
        elif isinstance(effect, ClockStep):
            store.add_anchor(effect.anchor, effect.after_seq)

    def _stored(self, then: Stored, durable: asyncio.Future) -> None:
        if durable.cancelled():  # the router is stopping
            return
        out = Outbox()
        try:
            then(durable.exception(), out)
        except Exception:
            log.exception("internal error after a store write")
        self.flush(out)

    async def _read(self, effect: Read, out: Outbox) -> None:
        try:
            outcome: Any = await self.store.reader.read_history(effect.request)
        except Exception as e:  # the core turns it into the caller's error
            outcome = e
        effect.answer(outcome, out)

    def _fire(self, timer: Timer) -> None:
        out = Outbox()
        timer(out)
        self.flush(out)

    async def _run(self, task: Task) -> None:
        out = Outbox()
        try:
            await task(out)
        except Exception:
            log.exception("internal error in a background task")
        self.flush(out)

    def _sync_status(self) -> dict[str, Any] | None:
        return read_sync_status(self.config.router.data_dir)

    def _shipped_seq(self) -> int:
        seq = (self._sync_status() or {}).get("synced_seq")
        return seq if type(seq) is int and seq > 0 else 0

    def _status_procedure(self, realm: Realm):
        async def status(caller: Session, args: list, kwargs: dict) -> dict:
            return await self.web.status(realm)
        return status

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def store_error(self) -> str | None:
        """Why the store could not be opened (None while it is open)."""
        return self.store.unavailable

    async def start(self) -> None:
        restored = await self._open_store()
        out = Outbox()
        self.router = Router(self.config, restored, out, self.limit_hits,
                             {"cairn.router.status": self._status_procedure})
        self.flush(out)
        self.wear = WearMeter(disk_of(self.config.router.data_dir),
                              self.config.router.card_endurance_tb)
        self._maintenance = asyncio.get_running_loop().create_task(self._maintain())
        try:
            await self._listen()
        except BaseException:
            await self.stop()
            raise

    store_retry_interval = 30.0  # s between attempts to open a store that failed to open

    async def _open_store(self) -> Restored:
        """The store, and what it kept; if it cannot be opened for want of storage, the
        router starts without it (and tries again)."""
        try:
            return await self._attach_store()
        except (OSError, sqlite3.Error) as e:
            if not _storage_trouble(e):
                raise  # a data_dir that cannot be: a configuration mistake, said at once
            self._store_unavailable(e)  # full, read-only, damaged: route without it
            self._reopening = asyncio.get_running_loop().create_task(self._reopen_store())
            return Restored()

    async def _attach_store(self) -> Restored:
        """Lock the data directory, open the store and read back what it kept."""
        if self._lock is None:
            lock = data_dir_lock(self.config.router.data_dir)
            lock.__enter__()  # released in stop(); refuses a second router on this dir
            self._lock = lock
        path = db_path(self.config.router.data_dir)
        # a store lost or emptied (a 0-byte file) must not hand out seqs shipped already:
        # the central dedupe would drop the new readings as duplicates
        store = await Store.open(path, seq_floor=self._shipped_seq())
        store.max_queue_bytes = self.config.router.limits.max_store_queue_bytes
        store.bounds = self.prune_rules(), self.config.router.max_store_bytes
        try:
            restored = await store.restored()
        except BaseException:
            await store.close()  # the next attempt opens it again
            raise
        self.store = store
        self.backpressure.attach(store)
        log.info("store %s: %d retained events, %d subscriptions with history, next seq %d",
                 path, len(restored.retained), len(restored.subscriptions), store.next_seq)
        return restored

    def _store_unavailable(self, error: Exception) -> None:
        reason = f"{error}" or type(error).__name__
        if reason != self.store_error:
            log.error("cannot open the store in %s (%s): routing without storing it (no "
                      "history; retained values in memory only; acknowledged publishes that "
                      "would be stored get cairn.error.storage_failed); trying again every %g s",
                      self.config.router.data_dir, reason, self.store_retry_interval)
        self.store = UnavailableStore(reason)

    async def _reopen_store(self) -> None:
        while self.store_error:
            await asyncio.sleep(self.store_retry_interval)
            try:
                restored = await self._attach_store()
            except (OSError, sqlite3.Error) as e:
                self._store_unavailable(e)
            else:
                out = Outbox()
                self.router.resume(restored, out)
                self.flush(out)
                log.warning("the store in %s is open again: storing resumes",
                            self.config.router.data_dir)

    def prune_rules(self) -> list[PruneRule]:
        return [PruneRule(realm.name, i, rule.max_events,
                          int(rule.max_age * 1000) if rule.max_age else None)
                for realm in self.config.realms for i, rule in enumerate(realm.history)]

    async def prune(self) -> None:
        """Keep history within its bounds (per rule and overall); drops become gap records."""
        reading, _ = self.router.clock.read()
        await self.store.prune(self.prune_rules(), self.config.router.max_store_bytes,
                               reading.wall_ms, reading.synced)

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.maintenance_interval)
            try:
                await self.prune()
            except Exception:
                log.exception("pruning the store failed; will try again")
            if self.wear is not None:
                self.wear.sample()

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config.router
        listen = cfg.listen
        guard = BrowserGuard(cfg.allowed_hosts, cfg.allowed_origins)
        server = await loop.create_server(
            lambda: HttpFront(self._ws, self.web.route, self.admission, guard),
            listen.host, listen.port, ssl=self._tls(listen))
        self.port = server.sockets[0].getsockname()[1]  # the real one when port 0 was asked
        ws_url = f"{'wss' if listen.tls else 'ws'}://{listen.host}:{self.port}/ws"
        self._ws = websocket_factory(self, ws_url)
        self._servers.append(server)
        self.urls.append(ws_url)
        for endpoint in cfg.rawsocket:
            rs = await self._listen_rawsocket(loop, endpoint)
            self._servers.append(rs)
            if endpoint.path:
                self.urls.append(f"rawsocket+unix:{endpoint.path}")
            else:
                port = rs.sockets[0].getsockname()[1]
                self.rawsocket_ports.append(port)
                scheme = "rawsocket+tls" if endpoint.tls else "rawsocket+tcp"
                self.urls.append(f"{scheme}://{endpoint.host}:{port}")
        log.info("listening: %s", "  ".join(self.urls))

    async def _listen_rawsocket(self, loop: asyncio.AbstractEventLoop,
                                endpoint: Endpoint) -> asyncio.AbstractServer:
        factory = rawsocket_factory(self)
        if endpoint.path:
            path = Path(endpoint.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket from an unclean stop
            server = await loop.create_unix_server(factory, str(path))
            os.chmod(path, 0o660)
            return server
        return await loop.create_server(factory, endpoint.host, endpoint.port,
                                        ssl=self._tls(endpoint))

    def _tls(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        tls = self.config.router.tls
        if not endpoint.tls or tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls.cert, tls.key)
        return context

    def reload(self) -> None:
        """SIGHUP: re-read users and roles from the config file. Sessions stay; those whose
        role is gone are closed. A config with an error is logged and ignored."""
        if self.config.source == EMBEDDED:
            log.info("SIGHUP: running on the embedded default, nothing to reload")
            return
        try:
            config = load(self.config.source)
        except ConfigError as e:
            log.error("SIGHUP: keeping the running config: %s", e)
            return
        out = Outbox()
        self.router.reload(config, out)
        self.flush(out)
        log.info("SIGHUP: reloaded users and roles from %s", config.source)

    async def stop(self) -> None:
        out = Outbox()
        self.router.shutdown(out)
        for connection in list(self.connections):
            if not connection.session.established:  # connected, but no session yet
                self.router.abort(connection.session, "wamp.close.system_shutdown",
                                  "the router is stopping", out)
        self.flush(out)
        for server in self._servers:
            server.close()
        if out.messages:
            await asyncio.sleep(0.2)  # let GOODBYEs reach the wire, and the replies come back
        for connection in list(self.connections):
            connection.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        for endpoint in self.config.router.rawsocket:
            if endpoint.path:
                with contextlib.suppress(OSError):
                    Path(endpoint.path).unlink()
        for task in (self._maintenance, self._reopening):
            if task is not None:
                task.cancel()
        await self.store.close()
        self.store = UnavailableStore("closed")
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None


async def serve(config: Config, ready: asyncio.Event | None = None) -> None:
    """Run the router until SIGTERM or SIGINT."""
    node = Node(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    _raise_file_limit(config)
    loop.set_exception_handler(functools.partial(_loop_exception, node.limit_hits))
    # before start(): a signal that comes once "listening" is logged must stop us cleanly
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, node.reload)
    await node.start()
    # What exists now (modules, config, retained events) lives as long as the process: keep
    # it out of the collector's full passes, which otherwise stall the loop for 10-30 ms.
    gc.collect()
    gc.freeze()
    if ready is not None:
        ready.set()
    notify(f"READY=1\nSTATUS=listening: {' '.join(node.urls)}")
    watchdog = loop.create_task(keep_watchdog_fed(stop))
    await stop.wait()
    notify("STOPPING=1")
    watchdog.cancel()
    log.info("stopping: saying GOODBYE to %d sessions", len(node.router.sessions))
    await node.stop()
    log.info("stopped")


def _raise_file_limit(config: Config) -> None:
    """As many file descriptors as the system lets us have: the connection limits, not
    EMFILE, must be what refuses a flood."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    limits = config.router.limits
    needed = limits.max_connections + limits.max_local_connections + 64
    if soft < needed:
        log.warning("only %d file descriptors for up to %d connections: EMFILE may refuse "
                    "connections before the limits do (raise LimitNOFILE, or lower "
                    "router.limits)", soft, needed)


def _loop_exception(hits: LimitHits, loop: asyncio.AbstractEventLoop,
                    context: dict[str, Any]) -> None:
    """asyncio reports each failed accept() (out of file descriptors) separately: one log
    line a minute is enough, and the rest is counted."""
    exception = context.get("exception")
    if isinstance(exception, OSError) and "accept" in context.get("message", ""):
        hits.hit("accept_failed", f"{context['message']}: {exception}")
        return
    loop.default_exception_handler(context)


# what the medium does to a data directory that is right: routing goes on without the store
_MEDIUM_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO}


def _storage_trouble(error: Exception) -> bool:
    return isinstance(error, sqlite3.Error) or error.errno in _MEDIUM_ERRNOS
