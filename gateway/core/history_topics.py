"""The topics a realm keeps history for, within bounds (``[router.limits]``).

Each topic stored in history is a row of the store's ``topics`` table and an entry of its
memory for as long as the store keeps it: one event published to each of 40,000 ever-new
topics under a history rule once grew the router by 9.4 MiB, for good. So:

- a realm keeps history for at most ``max_history_topics`` topics;
- of the topics new since the start, one anonymous client makes at most
  ``max_history_topics_per_client`` (by address, :func:`~gateway.core.broker.maker_of`, so
  reconnecting gives no new share);
- a driver's topics (a user who logged in, or a session over the Unix socket: see
  :mod:`gateway.core.retention`) are never refused, past both bounds, so junk cannot take a
  sensor's history. The router's own (its health records) are outside the bounds and their
  counts.

A publication refused a new history topic is still delivered (and retained); an
acknowledged one gets ``cairn.error.limit_reached``. Topics the store kept count in the
realm's bound, in no client's share; one whose events are all pruned stays until ``cairn
repair`` builds the topics again from the history rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from cairn.gateway.core.config import HEALTH_TOPIC, Limits


class HistoryTopics:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._topics: set[str] = set()
        self._made: Counter[Hashable] = Counter()  # new topics per client since the start

    def __len__(self) -> int:
        return len(self._topics)

    def __contains__(self, topic: str) -> bool:
        return topic in self._topics

    def restore(self, topics: Iterable[str]) -> None:
        """Topics the store keeps history for (in no client's share)."""
        self._topics.update(topics)
        self._topics.discard(HEALTH_TOPIC)

    def admit(self, topic: str, maker: Hashable, driver: bool) -> str | None:
        """Keep history for ``topic``, published by ``maker`` (``driver``: never refused)?
        None when it may (a new topic is counted now), else the bound that refuses it (the
        limit's name, ": ", why)."""
        if topic in self._topics:
            return None
        limits = self.limits
        if not driver:
            if self._made[maker] >= limits.max_history_topics_per_client:
                return (f"max_history_topics_per_client: {self._made[maker]} topics with "
                        f"history were made by {maker}")
            if len(self._topics) >= limits.max_history_topics:
                return f"max_history_topics: the realm keeps history for {len(self._topics)} topics"
        self._topics.add(topic)
        self._made[maker] += 1
        return None
