"""How many publications a driver keeps waiting for their PUBLISHED: a window that follows
the router's pace, bounded by count and by bytes. No I/O here; :class:`drivers.runtime.
RouterLink` asks it before each send.

Why a window that grows. A publication on a history rule with a ``commit_window`` is
acknowledged when its group commit is on the card (fsync), and the router commits a group
when its window ends or as soon as it is full (``gateway.store.commit``: a few hundred
rows). A fixed window of 32 therefore carried 32 readings per commit window, 6.4 a second
with the image's 5 s, whatever the link could do. How others size what is in flight:

- Kafka's producer gathers records into batches (``batch.size``, ``linger.ms``) and keeps up
  to ``max.in.flight.requests.per.connection`` (5) batches unacknowledged, bounded overall
  by ``buffer.memory``: a fixed count of batches, each as large as the bytes allow.
- SQLite's WAL has no group commit of its own: the application groups transactions. And
  PostgreSQL's ``commit_delay`` waits before flushing WAL only when ``commit_siblings``
  other transactions are active, i.e. when someone is likely to share the flush.
- TCP grows its congestion window by one segment per acknowledgement while the window is
  what holds the sender back (slow start: it doubles every round trip) and halves it on a
  congestion signal.

Cairn's router does the batching (its group commit); the driver only has to offer enough at
once for a group to fill, without flooding a router that is slow. So the window starts at
:attr:`InFlightWindow.initial` (a full group: the first round trip already commits at once
instead of waiting out the commit window), grows by one per acknowledgement while it, not
the backlog, is what holds publications back (doubling per round trip, as TCP's slow start),
up to :attr:`~InFlightWindow.most` publications and :attr:`~InFlightWindow.most_bytes`, and
halves when the router refuses a publication because its store cannot keep up. Acknowledgements
come back as fast as the router commits, so the window follows its pace: a card that
commits slowly gets fewer rounds a second, not more data queued than the bounds allow.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class InFlightWindow:
    initial: int = 256           # publications: a full group commit (gateway.store.commit)
    most: int = 4096             # publications in flight at most
    most_bytes: int = 2**20      # ... and their bytes (a quarter of the router's store queue)
    fewest: int = 16             # what halving leaves at least
    limit: int = field(init=False)  # publications in flight allowed now
    count: int = 0               # publications in flight
    bytes: int = 0               # ... their bytes
    held_back: bool = False      # the window, not the backlog, stopped the last send

    def __post_init__(self) -> None:
        self.limit = self.initial

    def has_room(self, size: int) -> bool:
        """Whether a publication of ``size`` bytes may be sent now (one always may, when
        none is in flight)."""
        room = self.count < self.limit and (not self.count or self.bytes + size <= self.most_bytes)
        self.held_back = not room
        return room

    def caught_up(self) -> None:
        """Everything waiting was sent: the backlog, not the window, holds the sender back."""
        self.held_back = False

    def sent(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def acknowledged(self, size: int) -> None:
        self.answered(size)
        if self.held_back and self.limit < self.most:
            self.limit += 1

    def answered(self, size: int) -> None:
        """One in flight is answered without growing the window (refused, or lost)."""
        self.count -= 1
        self.bytes -= size

    def congested(self) -> None:
        self.limit = max(self.fewest, self.limit // 2)
