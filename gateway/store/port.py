"""What the asyncio shell uses of a store (``gateway.shell.server``, ``gateway.shell.flow_control``,
``gateway.shell.web``): :class:`StorePort`, which the store (:class:`~.writer.StoreWriter`) and its
stand-in while it cannot be opened (:class:`~.unavailable.UnavailableStore`) both implement."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from cairn.base.clock_readings import Anchor
from cairn.gateway.core.publication import HistoryRead, StoredPublication
from cairn.gateway.store.pruning import Gap, PruneRule


@runtime_checkable
class StoreReads(Protocol):
    """The reads the shell makes: history pages (the core's requests), the status summary
    and what the health records add to it."""

    async def read_history(self, read: HistoryRead) -> list[tuple[Any, ...]]: ...

    async def summary(self, realm: str) -> dict[str, Any]: ...

    async def health_figures(self) -> dict[str, Any]: ...


@runtime_checkable
class StorePort(Protocol):
    """A store as the shell uses it: the core's effects (append, subscriptions, retained
    slots, anchors), reads through :attr:`reader`, pruning, the queue's bound for
    backpressure, and the figures status and metrics show."""

    on_drained: Callable[[], None] | None  # set by the shell: called once no more congested

    @property
    def unavailable(self) -> str | None:
        """Why the store could not be opened; None while it is open."""

    @property
    def reader(self) -> StoreReads: ...

    @property
    def congested(self) -> bool: ...

    @property
    def queued_bytes(self) -> int: ...

    @property
    def max_queue_bytes(self) -> int: ...

    @property
    def failed_writes(self) -> int: ...

    @property
    def damaged_rows(self) -> dict[str, int]:
        """Rows its reads left out as damaged, by table (gateway.store.damage)."""

    @property
    def commit_latencies(self) -> Sequence[float]: ...

    def append(self, pub: StoredPublication, within: float | None = None) -> asyncio.Future: ...

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None: ...

    def remove_subscription(self, sub_id: int) -> None: ...

    def forget_retained(self, pub: StoredPublication) -> None: ...

    def add_anchor(self, anchor: Anchor, after_seq: int | None = None) -> None: ...

    async def prune(self, rules: list[PruneRule], max_bytes: int, now_ms: int,
                    clock_synced: bool) -> list[Gap]: ...

    async def close(self) -> None: ...
