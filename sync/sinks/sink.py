"""What a sink is: it either confirms a batch (both files are complete where they landed) or
raises :class:`SinkError`; the uploader advances its watermark only after a confirmation. The
manifest is written last, so a reader that sees a manifest can trust the data file.

``bandwidth`` (bytes/s, 0 = no cap) paces the bytes as they are written or sent
(:class:`Pacer`), in small chunks, so a large batch never bursts over a slow uplink at full
speed.

Two attributes a sink may have, which the uploader (sync.uploader) then uses: ``sent``, the
bytes it put on the wire so far (request heads, redirects and retries included, whether or
not the server took them), which the status and the data budget count instead of the bodies
(the HTTP and S3 sinks have it); and ``uplink_clock``, its view of the server's clock
(:class:`.s3.UplinkClock`), kept in the status and taken over by the next run of the same
boot (the S3 sink's).
"""

from __future__ import annotations

import time
from typing import Protocol


class Sink(Protocol):
    def describe(self) -> str:
        """Where it ships to, for logs (no secret)."""
        ...

    def put(self, name: str, data: bytes) -> None:
        """Land one file under ``name`` whole, or raise :class:`SinkError`."""
        ...


class SinkError(Exception):
    """The batch did not land; try again later."""


class Pacer:
    """A token bucket: :meth:`take` sleeps as needed to keep the average at ``rate`` bytes/s,
    with bursts of at most a quarter of a second's worth."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.chunk = max(1024, min(64 * 1024, rate // 8))
        self._allowance = 0.0
        self._last = time.monotonic()

    def take(self, n: int) -> None:
        now = time.monotonic()
        self._allowance = min(self.rate / 4, self._allowance + (now - self._last) * self.rate)
        self._last = now
        self._allowance -= n
        if self._allowance < 0:
            time.sleep(-self._allowance / self.rate)
