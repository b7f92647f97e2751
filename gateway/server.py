"""Deprecated path, kept for one release: the router's asyncio shell is
:mod:`cairn.gateway.shell.server` now (``scripts/setup.sh`` still imports this name to check
an install)."""

import warnings

from cairn.gateway.shell.server import Node, serve  # noqa: F401  (the old names)

warnings.warn("cairn.gateway.server moved to cairn.gateway.shell.server", DeprecationWarning,
              stacklevel=2)
