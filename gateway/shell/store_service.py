"""The store as the shell runs it: its lifecycle and the core's effects on it.

:class:`StoreService` locks the data directory, opens the store (or routes without it and
tries again, when the medium is full, read-only or damaged), keeps history within its bounds,
samples the card's wear, and carries out what the core writes to an Outbox for the store
(``Persist``, ``Read``, ``KeepSubscription``...), one handler per effect type.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from cairn.base.clock import SystemClock
from cairn.base.data_dir import db_path, read_sync_status
from cairn.gateway.core.config import Config
from cairn.gateway.core.publication import Restored
from cairn.gateway.core.session import (
    ClockStep,
    Effect,
    ForgetRetained,
    ForgetSubscription,
    KeepSubscription,
    Outbox,
    Persist,
    Read,
    Stored,
)
from cairn.gateway.ops.maintenance import DataDirBusy, data_dir_lock
from cairn.gateway.ops.wear import WearMeter, disk_of
from cairn.gateway.shell.flow_control import StoreBackpressure
from cairn.gateway.store import PruneRule, SchemaTooNew, Store, StorePort, UnavailableStore

log = logging.getLogger("cairn.server")  # the logger these lines had in gateway.shell.server

# what the router does once a store that could not be opened is open again
Resumed = Callable[[Restored, Outbox], None]


class StoreService:
    """Owns the open store (``store``: a :class:`Store`, or an :class:`UnavailableStore`
    saying why not) for the shell; ``flush`` carries out an Outbox (gateway.shell.server.Node);
    ``clock`` is read for the calls into the core it makes and for pruning by age."""

    retry_interval = 30.0  # s between attempts to open a store that failed to open
    maintenance_interval = 60.0  # s between prunes (and wear samples)

    def __init__(self, config: Config, backpressure: StoreBackpressure,
                 flush: Callable[[Outbox], None], clock: SystemClock) -> None:
        self.config = config
        self.store: StorePort = UnavailableStore("not open yet")
        self.wear: WearMeter | None = None
        self._backpressure = backpressure
        self._flush = flush
        self._clock = clock
        self._lock: contextlib.AbstractContextManager | None = None
        self._maintenance: asyncio.Task | None = None
        self._reopening: asyncio.Task | None = None
        self._effects: dict[type, Callable[[Any, Outbox], None]] = {
            Persist: self._persist,
            Read: self._spawn_read,
            KeepSubscription: self._keep_subscription,
            ForgetSubscription: self._forget_subscription,
            ForgetRetained: self._forget_retained,
            ClockStep: self._add_anchor,
        }

    @property
    def error(self) -> str | None:
        """Why the store could not be opened (None while it is open)."""
        return self.store.unavailable

    @property
    def queued_bytes(self) -> int:
        """What waits for a commit: the shell charges it to the connection that queued it."""
        return self.store.queued_bytes

    # -- the core's effects on the store -------------------------------------------------

    def carry_out(self, effect: Effect, out: Outbox) -> None:
        handler = self._effects.get(type(effect))
        if handler is not None:  # (as the isinstance ladder did: nothing for anything else)
            handler(effect, out)

    def _persist(self, effect: Persist, out: Outbox) -> None:
        durable = self.store.append(effect.pub, effect.within)
        if effect.then is not None:
            durable.add_done_callback(functools.partial(self._stored, effect.then))

    def _spawn_read(self, effect: Read, out: Outbox) -> None:
        # appended to the outbox being flushed: it works because effects run before tasks
        out.spawn(functools.partial(self._read, effect))

    def _keep_subscription(self, effect: KeepSubscription, out: Outbox) -> None:
        self.store.add_subscription(effect.id, effect.realm, effect.uri, effect.match,
                                    effect.created)

    def _forget_subscription(self, effect: ForgetSubscription, out: Outbox) -> None:
        self.store.remove_subscription(effect.id)

    def _forget_retained(self, effect: ForgetRetained, out: Outbox) -> None:
        self.store.forget_retained(effect.pub)

    def _add_anchor(self, effect: ClockStep, out: Outbox) -> None:
        self.store.add_anchor(effect.anchor, effect.after_seq)

    def _stored(self, then: Stored, durable: asyncio.Future) -> None:
        if durable.cancelled():  # the router is stopping
            return
        out = Outbox(self._clock.now)
        try:
            then(durable.exception(), out)
        except Exception:
            log.exception("internal error after a store write")
        self._flush(out)

    async def _read(self, effect: Read, out: Outbox) -> None:
        try:
            outcome: Any = await self.store.reader.read_history(effect.request)
        except Exception as e:  # the core turns it into the caller's error
            outcome = e
        effect.answer(outcome, out)

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self, resumed: Resumed) -> Restored:
        """The store, and what it kept; if it cannot be opened for want of storage, the
        router starts without it (and tries again, then ``resumed(restored, out)``)."""
        try:
            return await self._attach()
        except Exception as e:
            if not _storage_trouble(e):
                raise  # a data_dir that cannot be: a configuration mistake, said at once
            self._unavailable(e)  # full, read-only, damaged: route without it
            self._reopening = asyncio.get_running_loop().create_task(self._reopen(resumed))
            return Restored()

    def start(self) -> None:
        """Once the router runs: prune and sample the card's wear, from now on."""
        self.wear = WearMeter(disk_of(self.config.router.data_dir),
                              self.config.router.card_endurance_tb)
        self._maintenance = asyncio.get_running_loop().create_task(self._maintain())

    async def _attach(self) -> Restored:
        """Lock the data directory, open the store and read back what it kept."""
        if self._lock is None:
            lock = data_dir_lock(self.config.router.data_dir)
            lock.__enter__()  # released in close(); refuses a second router on this dir
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
        self._backpressure.attach(store)
        log.info("store %s: %d retained events, %d subscriptions with history, next seq %d",
                 path, len(restored.retained), len(restored.subscriptions), store.next_seq)
        return restored

    def _shipped_seq(self) -> int:
        seq = (read_sync_status(self.config.router.data_dir) or {}).get("synced_seq")
        return seq if type(seq) is int and seq > 0 else 0

    def _unavailable(self, error: Exception) -> None:
        reason = f"{error}" or type(error).__name__
        if reason != self.error:
            log.error("cannot open the store in %s (%s): routing without storing it (no "
                      "history; retained values in memory only; acknowledged publishes that "
                      "would be stored get cairn.error.storage_failed); trying again every %g s",
                      self.config.router.data_dir, reason, self.retry_interval,
                      exc_info=None if isinstance(error, OSError | sqlite3.Error) else error)
        self.store = UnavailableStore(reason)

    async def _reopen(self, resumed: Resumed) -> None:
        while self.error:
            await asyncio.sleep(self.retry_interval)
            try:
                restored = await self._attach()
            except Exception as e:  # whatever it is, the router routes on and tries again
                self._unavailable(e)
            else:
                out = Outbox(self._clock.now)
                resumed(restored, out)
                self._flush(out)
                log.warning("the store in %s is open again: storing resumes",
                            self.config.router.data_dir)

    def prune_rules(self) -> list[PruneRule]:
        return [PruneRule(realm.name, i, rule.max_events,
                          int(rule.max_age * 1000) if rule.max_age else None)
                for realm in self.config.realms
                for i, rule in enumerate(self.config.history_rules(realm))]

    async def prune(self) -> None:
        """Keep history within its bounds (per rule and overall); drops become gap records."""
        reading = self._clock.now()
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

    async def close(self) -> None:
        """Stop the loops, close the store and unlock the data directory."""
        for task in (self._maintenance, self._reopening):
            if task is not None:
                task.cancel()
        await self.store.close()
        self.store = UnavailableStore("closed")
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None


# what the medium does to a data directory that is right: routing goes on without the store
_MEDIUM_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO}


def _storage_trouble(error: Exception) -> bool:
    """Trouble with the medium or the file, not the configuration: the router routes on.
    Besides SQLite's errors, whatever reading the file raised that no read left out as a
    damaged row (gateway.store.damage): a bug, logged with its traceback, must not keep
    the router from routing. A newer schema and a second router are said at once."""
    if isinstance(error, SchemaTooNew | DataDirBusy):
        return False
    return not isinstance(error, OSError) or error.errno in _MEDIUM_ERRNOS
