"""The store's stand-in while it cannot be opened (:class:`UnavailableStore`): the router
routes without it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cairn.base.clock_readings import Anchor
from cairn.gateway.core.publication import HistoryRead, Restored, StorageError, StoredPublication
from cairn.gateway.store.port import StorePort
from cairn.gateway.store.pruning import Gap, PruneRule


class UnavailableStore(StorePort):
    """In the place of the store while it cannot be opened (disk full, read-only, damaged):
    the router routes without it. Nothing is stored (an acknowledged publication that would
    be gets StorageError), history cannot be read, what would be kept stays in memory."""

    congested = False
    queued_bytes = 0
    max_queue_bytes = 0  # nothing queues: never congested
    failed_writes = 0
    commit_latencies: tuple[float, ...] = ()
    on_drained: Callable[[], None] | None = None

    def __init__(self, reason: str) -> None:
        self._reason = reason

    @property
    def unavailable(self) -> str:
        return self._reason

    @property
    def damaged_rows(self) -> dict[str, int]:
        return {}  # nothing read

    @property
    def reader(self) -> UnavailableStore:
        return self  # its reads fail, or find nothing, as its writes do

    def _error(self) -> StorageError:
        return StorageError(f"the store is unavailable: {self.unavailable}")

    async def restored(self) -> Restored:
        return Restored()

    def append(self, pub: StoredPublication, within: float | None = None) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(self._error())
        future.exception()  # nobody may wait for it (no acknowledge): not worth a warning
        return future

    async def read_history(self, read: HistoryRead) -> list[tuple[Any, ...]]:
        raise self._error()

    def add_subscription(self, sub_id: int, realm: str, uri: str, match: str,
                         created: str) -> None:
        """Kept in memory: the router stores it when the store opens."""

    def remove_subscription(self, sub_id: int) -> None:
        pass

    def forget_retained(self, pub: StoredPublication) -> None:
        pass

    def add_anchor(self, anchor: Anchor, after_seq: int | None = None) -> None:
        pass  # no publication is stored that it would date

    async def prune(self, rules: list[PruneRule], max_bytes: int, now_ms: int,
                    clock_synced: bool) -> list[Gap]:
        return []

    async def summary(self, realm: str) -> dict[str, Any]:
        return {}

    async def health_figures(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        pass
