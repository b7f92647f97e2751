"""Waiting for a condition instead of sleeping for a guess. The deadlines are generous: a wait
ends as soon as its condition holds, and a loaded machine (CI with an image build beside the
tests) is slower than an idle one by more than a short deadline allows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def until(condition: Callable[[], Any], timeout: float = 30.0,
                what: str = "condition") -> None:
    """Return as soon as ``condition()`` is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(0.01)


def blocking_until(condition: Callable[[], Any], timeout: float = 30.0,
                   what: str = "condition") -> None:
    """:func:`until` for code without an event loop (another process's or thread's
    progress, polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)
