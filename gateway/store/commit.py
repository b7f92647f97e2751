"""When the store commits: the batch being gathered (:class:`Pending`) and the loop that
commits it (:class:`CommitLoop`), at the earliest deadline any of its items asked for, or as
soon as the batch is full (:attr:`CommitLoop.full_rows`, :attr:`CommitLoop.full_bytes`), with
what arrives during a commit going into the next (group commit); backing off while writes
fail, unless someone waits. What a commit writes is the store's (gateway.store.writer); no
SQL here. With nothing queued, no timer runs: an idle router sleeps.

A deadline is a bound on delay, not a wait. Waiting saves the card a commit's fixed cost
(the file system's journal commit, ~12 KiB, the WAL's frame headers, the partly filled last
pages of the table and its index written again) shared by the rows that came in the
meantime; once a batch holds a few hundred rows that cost is small beside the rows' own
pages, and waiting longer would only hold the publishers back. So a full batch commits at
once, as a Kafka producer sends a batch when it reaches ``batch.size`` without waiting out
``linger.ms``. The thresholds sit well above what a window gathers on the reference
deployment (200 sensors, a reading each every 10 s: 100 rows in 5 s), whose commits stay one
per window."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from cairn.base.clock_readings import Anchor
from cairn.gateway.core.publication import StoredPublication
from cairn.gateway.store.pruning import Gap

log = logging.getLogger("cairn.store")


@dataclass
class Pending:
    """What the next commit writes, and who waits for it."""
    publications: list[StoredPublication] = field(default_factory=list)
    subscriptions: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    forgotten: list[tuple[Any, ...]] = field(default_factory=list)  # (sql, params)
    # retained slots forgotten: up to which seq (a newer publication of the slot stays)
    forgotten_slots: dict[tuple[str, str, str], int] = field(default_factory=dict)
    anchors: list[tuple[Anchor, int]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    waiters: list[asyncio.Future] = field(default_factory=list)
    size: int = 0  # payload bytes of the publications

    def __bool__(self) -> bool:
        return bool(self.publications or self.has_records())

    def has_records(self) -> bool:
        return bool(self.subscriptions or self.forgotten or self.anchors or self.gaps)


class CommitLoop:
    """Commits :attr:`pending` through ``commit`` when it is due; a batch that fails goes to
    ``failed(batch, error, retry_retained)``, which takes back what is to be retried.
    ``flush_interval()``: the deadline of what asked for none (the store's setting)."""

    full_rows = 256  # publications that make a batch worth committing before its deadline
    full_bytes = 64 * 2**10  # ... or their payload bytes

    def __init__(self, commit: Callable[[Pending], Awaitable[None]],
                 failed: Callable[[Pending, Exception, bool], None],
                 flush_interval: Callable[[], float]) -> None:
        self.commit = commit
        self.failed = failed
        self.flush_interval = flush_interval
        self.pending = Pending()
        self.latencies: list[float] = []  # seconds, recent commits (for metrics)
        self.closing = False
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()  # set: commit what is pending now
        self._deadline: asyncio.TimerHandle | None = None  # sets _wake for a pending batch
        self._due = float("inf")  # loop time by which the pending batch must be committed
        self._backoff = 0.0  # > 0 while writes fail: retry slower, unless someone is waiting
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self._loop.create_task(self._run())

    async def stop(self) -> None:
        """Commit everything pending (or give up on it while writes fail), then end."""
        self.closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def add(self, pub: StoredPublication, size: int, seconds: float) -> None:
        """Queue ``pub`` (``size`` payload bytes) to be committed within ``seconds``, or
        as soon as the batch is full."""
        pending = self.pending
        pending.publications.append(pub)
        pending.size += size
        full = len(pending.publications) >= self.full_rows or pending.size >= self.full_bytes
        if full and not self._backoff:  # (while writes fail, the backoff decides)
            self._wake.set()
        else:
            self.within(seconds)

    def within(self, seconds: float) -> None:
        """The pending batch is committed at the earliest deadline any of its items asked
        for. While writes fail, the backoff decides when to retry, unless someone waits
        (``seconds`` 0)."""
        if seconds <= 0:
            self._wake.set()
            return
        due = self._loop.time() + seconds
        if due >= self._due or self._backoff:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._due = due
        self._deadline = self._loop.call_at(due, self._wake.set)

    def waiter(self) -> asyncio.Future:
        # one future per caller, not one per batch: cancelling one awaiting task must not
        # cancel the others' acknowledgements
        future = self._loop.create_future()
        self.pending.waiters.append(future)
        return future

    async def flush(self) -> None:
        """Wait until everything queued so far is committed."""
        if self.pending:
            future = self.waiter()
            self._wake.set()
            await future

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._due = float("inf")

    async def _wait_for_work(self) -> None:
        if not self._wake.is_set():
            retry = self._loop.call_later(self._backoff, self._wake.set) if self._backoff else None
            try:
                await self._wake.wait()
            finally:
                if retry is not None:
                    retry.cancel()
        self._wake.clear()

    async def _run(self) -> None:
        while True:
            if not self.pending and self.closing:
                return
            await self._wait_for_work()
            if not self.pending:
                continue
            batch, self.pending = self.pending, Pending()
            self._disarm()  # what comes during the commit arms a deadline of its own
            started = time.perf_counter()
            try:
                await self.commit(batch)
            except sqlite3.Error as e:
                if not self._backoff:
                    log.error("the store cannot write (%s): acknowledged publishes get an "
                              "error, live routing goes on; retrying", e)
                self._backoff = min(max(self._backoff * 2, 0.1), 5.0)
                self._disarm()  # the backoff decides when to retry
                self.failed(batch, e, True)
                if self.closing:
                    log.error("closing with unwritten data: %d publications lost",
                              len(self.pending.publications))
                    return
                continue
            except Exception as e:  # a bug (say, a value msgpack cannot pack): lose this
                log.exception("the store could not write a batch")  # batch, not the store
                self.failed(batch, e, False)
                if self.pending:
                    self.within(self.flush_interval())
                continue
            if self._backoff:
                log.warning("the store writes again")
                self._backoff = 0.0
                if self.pending:  # queued during the backoff, when no deadline was armed
                    self.within(self.flush_interval())
            self.latencies.append(time.perf_counter() - started)
            del self.latencies[:-1000]
            for w in batch.waiters:
                if not w.done():
                    w.set_result(None)
