"""What a dashboard sees of the drivers: every event on ``sensor.*`` and ``gateway.device.*``
(the retained ones first), and the retained values a dashboard that connects now gets at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from autobahn.wamp.types import SubscribeOptions

from harness.wamp_client import connect

TOPICS = ("sensor", "gateway.device")  # prefixes: readings, device statuses


class Seen:
    """Everything a subscriber to ``sensor`` and ``gateway.device`` receives, retained
    events first."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict, bool]] = []

    def __call__(self, *args, details=None, **kwargs) -> None:
        self.events.append((details.topic, kwargs, bool(details.retained)))

    def readings(self, device: str) -> list[dict]:
        return [kw for topic, kw, _ in self.events if topic == f"sensor.{device}"]

    def statuses(self, device: str) -> list[tuple[str, str | None]]:
        return [(kw["status"], kw["reason"]) for topic, kw, _ in self.events
                if topic == f"gateway.device.{device}.status"]


async def subscribed(session: Any) -> Seen:
    seen = Seen()
    for topic in TOPICS:
        await session.subscribe(seen, topic, options=SubscribeOptions(
            match="prefix", get_retained=True, details_arg="details"))
    return seen


@contextlib.asynccontextmanager
async def watching(router: Any) -> AsyncIterator[Seen]:
    """A session of its own seeing the devices while the block runs."""
    session = await connect(router)
    try:
        yield await subscribed(session)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.leave(), 2)


async def retained_now(router: Any) -> dict[str, dict]:
    """Topic -> kwargs of the retained event a dashboard connecting now gets for it."""
    session = await connect(router)
    seen = await subscribed(session)
    await session.call("wamp.session.count")  # retained events arrive before this returns
    await session.leave()
    return {topic: kw for topic, kw, was_retained in seen.events if was_retained}
