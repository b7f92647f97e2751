"""The asyncio shell around the protocol core: listeners, the outbox pump, signals.

``Node`` owns the :class:`~gateway.core.router.Router` and carries out what the core writes into
an :class:`~gateway.core.session.Outbox`: send messages, close transports, start timers, run tasks;
the effects on the store go to :class:`~gateway.shell.store_service.StoreService`, which owns the
store's lifecycle. What a message queues for the store is charged here to its connection
(gateway.shell.flow_control.StoreBackpressure), so the transports never see the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import resource
import signal
import ssl
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from autobahn.wamp import message as m

from cairn.base.clock_readings import Reading
from cairn.base.data_dir import cra_decoy_key
from cairn.gateway.core.config import (
    EMBEDDED,
    RELOADABLE,
    Check,
    Config,
    ConfigError,
    Endpoint,
    load,
    parse,
    restart_needed,
)
from cairn.gateway.core.limits import LimitHits
from cairn.gateway.core.router import Realm, Router
from cairn.gateway.core.session import (
    Outbox,
    Session,
    Task,
    Timer,
)
from cairn.gateway.ops.config_history import History, RunningConfig, digest, file_digest
from cairn.gateway.shell.admission import Admission
from cairn.gateway.shell.config_admin import admin_procedures
from cairn.gateway.shell.flow_control import StoreBackpressure
from cairn.gateway.shell.health import HealthReporter
from cairn.gateway.shell.http_front import HttpFront
from cairn.gateway.shell.notify import keep_watchdog_fed, notify
from cairn.gateway.shell.origins import BrowserGuard
from cairn.gateway.shell.shell_state import Callbacks, ShellState
from cairn.gateway.shell.store_service import StoreService
from cairn.gateway.shell.transport import rawsocket_factory, websocket_factory
from cairn.gateway.shell.web import Web
from cairn.gateway.store import UnavailableStore

log = logging.getLogger("cairn.server")

GOODBYE_WAIT = 0.2  # s stop() gives the peers told GOODBYE to answer and close, at the most


class Node:
    def __init__(self, config: Config, running: RunningConfig | None = None,
                 check: Check = parse) -> None:
        """``running``: which file it was told to run and whether ``config`` is that file
        or the last good one (by default: the file ``config`` came from). ``check``: what a
        new text of the file must pass (``cairn.admin.config.apply``): the router's own
        sections by default, the whole file's check when the ``cairn`` command runs it
        (app.sections.check_whole)."""
        self.config = config
        self.limit_hits = LimitHits(time.monotonic)
        if running is None:
            file = None if config.source == EMBEDDED else config.source
            running = RunningConfig(file, sha256=file_digest(file) if file else None)
        self.running = running
        self.state = ShellState(config, self.limit_hits,
                                Admission(config.router.limits, self.limit_hits), running,
                                check=check)
        self.callbacks = Callbacks(self.receive, self.violation, self.lost)
        self.router: Router  # built in start(), once the store is open
        self.web: Web  # built in start(), with the router
        self.guard: BrowserGuard  # built in start(), renewed on SIGHUP
        self.health: HealthReporter  # started once listening
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task] = set()
        self._health: asyncio.Task | None = None
        self.rawsocket_ports: list[int] = []
        self.backpressure = StoreBackpressure(self.limit_hits, UnavailableStore("not open yet"))
        self.stores = StoreService(config, self.backpressure, self.flush, self.state.clock)
        # while stop() waits for the peers told GOODBYE to close: those still open, and then
        self._closing: tuple[set[Any], asyncio.Future[None]] | None = None

    # -- the outbox pump -----------------------------------------------------------------

    def receive(self, session: Session, msg: m.Message, extra: dict | None = None) -> None:
        self.state.counters.received[type(msg)] += 1
        out = Outbox(self.state.clock.now)
        try:
            self.router.receive(session, msg, out, extra)
        except Exception:
            # A bug must cost one session, never the router.
            log.exception("internal error handling %s from session %s", type(msg).__name__,
                          session.id)
            self.router.abort(session, "wamp.error.internal_error",
                              "internal error in the router (see its log)", out)
        # only effects add to the store's queue, and most messages have none
        queued = self.stores.queued_bytes if out.effects else None
        self.flush(out)
        if queued is None:
            return
        grown = self.stores.queued_bytes - queued  # (commits end in callbacks, not here)
        if grown > 0:  # charged to the connection: it may be paused while the store catches up
            self.backpressure.added(session.link, grown)

    def violation(self, session: Session, reason: str) -> None:
        if session.closed:
            return
        self.state.protocol_violations += 1
        out = Outbox(self.state.clock.now)
        self.router.abort(session, "wamp.error.protocol_violation", reason, out)
        self.flush(out)

    def lost(self, session: Session) -> None:
        out = Outbox(self.state.clock.now)
        self.router.lost(session, out)
        self.flush(out)
        if self._closing is not None:
            waiting, closed = self._closing
            waiting.discard(session.link)
            if not waiting and not closed.done():
                closed.set_result(None)

    def flush(self, out: Outbox) -> None:
        for effect in out.effects:  # first, as when the core wrote to the store itself
            self.stores.carry_out(effect, out)
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

    def _fire(self, timer: Timer) -> None:
        out = Outbox(self.state.clock.now)
        timer(out)
        self.flush(out)

    async def _run(self, task: Task) -> None:
        out = Outbox(self.state.clock.now)
        try:
            await task(out)
        except Exception:
            log.exception("internal error in a background task")
        self.flush(out)

    def _status_procedure(self, realm: Realm):
        async def status(caller: Session, args: list, kwargs: dict, now: Reading) -> dict:
            return await self.web.status(realm)
        return status

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        # a store that could not be opened and opens later is handed to the router then
        restored = await self.stores.open(lambda restored, out: self.router.resume(restored, out))
        out = Outbox(self.state.clock.now)
        self.router = Router(self.config, restored, out, self.limit_hits,
                             {"cairn.router.status": self._status_procedure,
                              **admin_procedures(self.state)},
                             cra_decoy_key(self.config.router.data_dir))
        self.flush(out)
        self.web = Web(self.state, self.router, self.stores)
        self.stores.start()
        try:
            await self._listen()
        except BaseException:
            await self.stop()
            raise
        self._save_running()
        self.health = HealthReporter(self.web, self.publish_health,
                                     self.config.router.health_interval)
        self._health = asyncio.get_running_loop().create_task(self.health.run())

    def publish_health(self, record: dict[str, Any]) -> None:
        out = Outbox(self.state.clock.now)
        self.router.publish_health(record, out)
        self.flush(out)

    async def _listen(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config.router
        listen = cfg.listen
        self.guard = BrowserGuard(cfg.allowed_hosts, cfg.allowed_origins)
        # Every listener is bound before any accepts: a file the router cannot start on (the
        # last one fails) is given up without having taken, and then reset, a connection.
        server = await loop.create_server(  # (self.guard: the one of the latest SIGHUP)
            lambda: HttpFront(self._ws, self.web.route, self.state.admission, self.guard),
            listen.host, listen.port, ssl=self._tls(listen), start_serving=False)
        self.port = server.sockets[0].getsockname()[1]  # the real one when port 0 was asked
        ws_url = f"{'wss' if listen.tls else 'ws'}://{_host_port(listen.host, self.port)}/ws"
        self._ws = websocket_factory(self.state, self.callbacks, ws_url)
        self._servers.append(server)
        self.state.urls.append(ws_url)
        for endpoint in cfg.rawsocket:
            rs = await self._listen_rawsocket(loop, endpoint)
            self._servers.append(rs)
            if endpoint.path:
                self.state.urls.append(f"rawsocket+unix:{endpoint.path}")
            else:
                port = rs.sockets[0].getsockname()[1]
                self.rawsocket_ports.append(port)
                scheme = "rawsocket+tls" if endpoint.tls else "rawsocket+tcp"
                self.state.urls.append(f"{scheme}://{_host_port(endpoint.host, port)}")
        for bound in self._servers:
            await bound.start_serving()
        log.info("listening: %s", "  ".join(self.state.urls))

    async def _listen_rawsocket(self, loop: asyncio.AbstractEventLoop,
                                endpoint: Endpoint) -> asyncio.AbstractServer:
        factory = rawsocket_factory(self.state, self.callbacks)
        if endpoint.path:
            path = Path(endpoint.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket from an unclean stop
            server = await loop.create_unix_server(factory, str(path), start_serving=False)
            os.chmod(path, 0o660)  # before it accepts anyone
            return server
        return await loop.create_server(factory, endpoint.host, endpoint.port,
                                        ssl=self._tls(endpoint), start_serving=False)

    def _tls(self, endpoint: Endpoint) -> ssl.SSLContext | None:
        tls = self.config.router.tls
        if not endpoint.tls or tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls.cert, tls.key)
        return context

    def _save_running(self) -> None:
        """What it runs, for ``cairn config`` (config-state.json in the data directory)."""
        try:
            self.running.save(self.config.router.data_dir)
        except OSError as e:
            log.warning("cannot write the config state into %s: %s",
                        self.config.router.data_dir, e)

    def reload(self) -> None:
        """SIGHUP: re-read users and roles, and the [router] keys of RELOADABLE, from the
        config file; the other keys that changed are logged as waiting for a restart.
        Sessions stay; those whose role is gone are closed. A config with an error is logged,
        ignored and shown in the status. Running on the last good configuration, a fixed file
        is taken when a reload can apply all of it."""
        file = self.running.file
        if file is None:
            log.info("SIGHUP: running on the embedded default, nothing to reload")
            return
        try:
            text = Path(file).read_text(encoding="utf-8")
            config = load(file)
        except (ConfigError, OSError, UnicodeDecodeError) as e:
            log.error("SIGHUP: keeping the running config: %s", e)
            self._set_running(self.running.running, str(e), self.running.sha256)
            return
        later = restart_needed(self.config, config)
        if self.running.running == "last-good" and later:
            problem = (f"{file} is valid now but changes {', '.join(later)}: it takes effect "
                       f"at the next restart")
            log.warning("SIGHUP: staying on the last good configuration: %s", problem)
            self._set_running("last-good", problem, self.running.sha256)
            return
        out = Outbox(self.state.clock.now)
        self.router.reload(config, out)
        self.flush(out)
        self._reload_router_keys(config, later)
        self._set_running("file", None, digest(text))
        log.info("SIGHUP: reloaded users and roles, %s from %s",
                 ", ".join(f"router.{key}" for key in RELOADABLE.values()), config.source)

    def _set_running(self, running: str, problem: str | None, sha256: str | None) -> None:
        self.running.running, self.running.problem = running, problem
        self.running.sha256 = sha256
        self._save_running()

    def _reload_router_keys(self, config: Config, later: list[str]) -> None:
        for key in later:
            log.warning("SIGHUP: %s changed: it takes effect at the next restart", key)
        running = self.config.router
        router = replace(running, **{name: getattr(config.router, name) for name in RELOADABLE})
        self.config = self.state.config = replace(config, router=router)
        self.guard = BrowserGuard(router.allowed_hosts, router.allowed_origins)

    async def stop(self) -> None:
        if self._health is not None:
            self._health.cancel()
        out = Outbox(self.state.clock.now)
        self.router.shutdown(out)
        for connection in list(self.state.connections):
            if not connection.session.established:  # connected, but no session yet
                self.router.abort(connection.session, "wamp.close.system_shutdown",
                                  "the router is stopping", out)
        self.flush(out)
        for server in self._servers:
            server.close()
        if out.messages:  # let GOODBYEs reach the wire, and the replies come back
            await self._until_closed({session.link for session, _ in out.messages},
                                     GOODBYE_WAIT)
        for connection in list(self.state.connections):
            connection.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)
        for endpoint in self.config.router.rawsocket:
            if endpoint.path:
                with contextlib.suppress(OSError):
                    Path(endpoint.path).unlink()
        await self.stores.close()

    async def _until_closed(self, links: set[Any], timeout: float) -> None:
        """Until the peers of ``links`` have closed them (a client closes its transport once
        it answered GOODBYE or got ABORT), or ``timeout`` s for those that do not."""
        waiting = links & self.state.connections
        if not waiting:
            return
        closed = asyncio.get_running_loop().create_future()
        self._closing = waiting, closed
        try:
            await asyncio.wait([closed], timeout=timeout)
        finally:
            self._closing = None


async def serve(config: Config, ready: asyncio.Event | None = None,
                running: RunningConfig | None = None, check: Check = parse) -> None:
    """Run the router until SIGTERM or SIGINT. When it cannot start on its file (a listener
    on an address the host does not have...) and a last good configuration differs, it runs
    on that one."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # before start(): a signal that comes once the ports are open must stop us cleanly, or
    # reload once started (SIGHUP's default action would end the process)
    hangup = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    node = await _start(config, running, check)
    reloads = loop.create_task(_reload_on_hangup(node, hangup))
    # What exists now (modules, config, retained events) lives as long as the process: keep
    # it out of the collector's full passes, which otherwise stall the loop for 10-30 ms.
    gc.collect()
    gc.freeze()
    if ready is not None:
        ready.set()
    notify(f"READY=1\nSTATUS=listening: {' '.join(node.state.urls)}")
    watchdog = loop.create_task(keep_watchdog_fed(stop))
    await stop.wait()
    notify("STOPPING=1")
    watchdog.cancel()
    reloads.cancel()
    log.info("stopping: saying GOODBYE to %d sessions", len(node.router.sessions))
    await node.stop()
    log.info("stopped")


async def _reload_on_hangup(node: Node, hangup: asyncio.Event) -> None:
    while True:
        await hangup.wait()
        hangup.clear()
        node.reload()


async def _start(config: Config, running: RunningConfig | None, check: Check) -> Node:
    node = Node(config, running, check)
    _raise_file_limit(config)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(functools.partial(_loop_exception, node.limit_hits))
    try:
        await node.start()  # (it stops itself cleanly when a listener fails)
        return node
    except OSError as e:
        fallback = _fallback(node.running)
        if fallback is None:
            raise
        last_good, sha = fallback
        problem = f"{node.running.file}: cannot start on it: {e}"
        log.error("%s; running on the last good configuration %s", problem, last_good.source)
        return await _start(last_good, RunningConfig(node.running.file, "last-good", problem,
                                                     sha), check)


def _fallback(running: RunningConfig) -> tuple[Config, str] | None:
    """The last good configuration beside the file, when the file was running and differs
    from it (not again on the one that just failed)."""
    if running.file is None or running.running != "file":
        return None
    history = History(running.file)
    text = history.last_good_text()
    if text is None or digest(text) == running.sha256:
        return None
    config = history.last_good()
    return (config, digest(text)) if config is not None else None


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 in brackets


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
