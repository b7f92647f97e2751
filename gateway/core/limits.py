"""Bounds on what a client can make the router hold, and how hitting one is reported.

An unattended device on a LAN meets buggy and hostile clients. Every bound is a setting of
``[router.limits]`` (:class:`gateway.core.config.Limits`); hitting one is counted for
``/metrics`` (``cairn_limit_hits_total{limit}``) and logged at most once per
:attr:`LimitHits.interval`, with how often it was hit since the last line, never once per
event: a flood must not become a flood of log lines on the card. (The bounds on connections
are the shell's: :mod:`gateway.shell.admission`.)
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("cairn.limits")


class LimitHits:
    """``clock``: seconds, for the spacing of log lines (the shell's ``time.monotonic``)."""

    interval = 60.0  # seconds between log lines about one limit

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.counts: Counter[str] = Counter()  # since start, for /metrics
        self._unreported: Counter[str] = Counter()
        self._logged: dict[str, float] = {}

    def hit(self, limit: str, detail: str) -> None:
        self.counts[limit] += 1
        self._unreported[limit] += 1
        now = self.clock()
        if now - self._logged.get(limit, -self.interval) >= self.interval:
            n = self._unreported.pop(limit)
            log.warning("limit %s: %s%s", limit, detail,
                        f" ({n} times in the last {self.interval:g} s)" if n > 1 else "")
            self._logged[limit] = now
