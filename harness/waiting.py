"""Waiting for a condition instead of sleeping for a guess."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def until(condition: Callable[[], Any], timeout: float = 10.0,
                what: str = "condition") -> None:
    """Return as soon as ``condition()`` is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(0.01)
