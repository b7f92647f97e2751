"""The counts and timings of an ingest, and their one-line summary (plain Python)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class IngestStats:
    """What an ingest did, summed over its chunks or micro-batches."""

    manifests: int = 0        # manifests looked at
    ingested: int = 0         # batches read into the table
    one_pass: int = 0         # of those, batches read, checked and written in one pass
    already: int = 0          # batches skipped: the same file was ingested before
    unread: int = 0           # of those, manifests not read: listed as when ingested
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (batch, reason)
    waiting: int = 0          # data files whose manifest has not landed (batch mode)
    rows_read: int = 0
    rows_added: int = 0
    rows_estimated: int = 0   # of the rows added, those with a re-based event_time
    rows_rebased: int = 0     # rows already in the table re-based with newly arrived anchors
    micro_batches: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step

    def timed(self, phase: str, started: float) -> float:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - started
        return now

    @property
    def duplicates(self) -> int:
        return self.rows_read - self.rows_added

    def count_added(self, totals: dict[str, Any]) -> None:
        self.rows_added += int(totals.get("rows") or 0)
        self.rows_estimated += int(totals.get("estimated") or 0)

    def add(self, other: IngestStats) -> None:
        for name in ("manifests", "ingested", "one_pass", "already", "unread", "waiting",
                     "rows_read", "rows_added", "rows_estimated", "rows_rebased"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.quarantined += other.quarantined
        for phase, seconds in other.phases.items():
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def summary(self) -> str:
        rate = self.rows_read / self.seconds if self.seconds else 0.0
        text = (f"{self.manifests} manifests: {self.ingested} batches ingested"
                + (f" ({self.one_pass} in one pass)" if self.one_pass else "")
                + f", {self.already} already in the table"
                + (f" ({self.unread} unchanged since, not read again)" if self.unread else "")
                + f", {len(self.quarantined)} quarantined"
                + (f", {self.waiting} data files waiting for their manifest"
                   if self.waiting else "")
                + f"; {self.rows_read} rows read, {self.rows_added} added "
                f"({self.duplicates} duplicates, {self.rows_estimated} with estimated time)")
        if self.rows_rebased:
            text += f"; {self.rows_rebased} earlier rows re-based on new clock anchors"
        if self.micro_batches:
            text += f"; {self.micro_batches} micro-batches"
        return text + f"; {self.seconds:.1f} s ({rate:,.0f} rows/s)"
