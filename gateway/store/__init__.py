"""The store: publications (history), retained events, stable subscription ids, clock
anchors and gap records, in one SQLite file in WAL mode. Every SQL statement of Cairn's
router and uploader lives in this package.

- :mod:`.port`: :class:`StorePort`, what the asyncio shell uses of a store
- :mod:`.schema`: the schema, its migrations, connection settings, shared SQL helpers
- :mod:`.state`: what the store keeps of its history in memory (topics, counts, slots)
- :mod:`.rows`: the rows a commit inserts (the ``publication_batch`` view)
- :mod:`.writer`: :class:`StoreWriter` (also ``Store``), the group-commit writer
- :mod:`.pruning`: keeping history within its bounds
- :mod:`.reader`: :class:`StoreReader`, history pages and the status summary
- :mod:`.unavailable`: :class:`UnavailableStore`, the stand-in while it cannot be opened
- :mod:`.export`: :class:`HistoryReader`, what ``cairn sync`` reads
- :mod:`.damage`: reading rows a damaged card changed: left out and counted, never fatal
- :mod:`.check`: every row read as the router reads it, for ``cairn doctor``, ``backup``,
  ``restore`` and ``repair`` (:func:`inspect`, :func:`repair`)

The names below are the package's interface; import them from here.
"""

from __future__ import annotations

from cairn.gateway.core.publication import StorageError, StoredPublication
from cairn.gateway.store.check import Findings, inspect, repair
from cairn.gateway.store.export import Damaged, HistoryReader
from cairn.gateway.store.port import StorePort, StoreReads
from cairn.gateway.store.pruning import VACUUM_STEP_SECONDS, Gap, PruneRule
from cairn.gateway.store.reader import StoreReader, eligible
from cairn.gateway.store.schema import (
    LEGACY_SEQ_OF_PUBLICATION,
    MIGRATIONS,
    PAGE_SIZE,
    SCHEMA_VERSION,
    SchemaTooNew,
    discard_pre_migration_copies,
    pre_migration_copy,
)
from cairn.gateway.store.state import Topics
from cairn.gateway.store.unavailable import UnavailableStore
from cairn.gateway.store.writer import Store, StoreWriter

__all__ = [
    "MIGRATIONS", "PAGE_SIZE", "SCHEMA_VERSION", "VACUUM_STEP_SECONDS",
    "LEGACY_SEQ_OF_PUBLICATION", "Damaged", "Findings", "Gap", "HistoryReader", "PruneRule",
    "SchemaTooNew", "StorageError", "Store", "StorePort", "StoreReader", "StoreReads",
    "StoreWriter", "StoredPublication", "Topics", "UnavailableStore",
    "discard_pre_migration_copies", "eligible", "inspect", "pre_migration_copy", "repair",
]
