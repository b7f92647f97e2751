"""Deprecated path, kept for one release: the table lock is :mod:`cairn.central.table_lock`
now (the README documented ``sync.table_lock.locked``)."""

import warnings

from cairn.central.table_lock import *  # noqa: F403  (every public name of the old module)
from cairn.central.table_lock import locked  # noqa: F401  (the documented one, by name)

warnings.warn("cairn.sync.table_lock moved to cairn.central.table_lock", DeprecationWarning,
              stacklevel=2)
