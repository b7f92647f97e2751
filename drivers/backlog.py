"""What a driver keeps for the router: its publications in the order they were made, each
device's readings bounded on their own, so one device cannot take another's room.

Rules (no I/O here; :class:`drivers.runtime.RouterLink` sends what this keeps):

- A reading belongs to a device (a serial sensor's id, an MQTT source topic). A device keeps
  at most ``per_device`` readings waiting; past that its own oldest waiting reading goes.
- All devices together keep at most ``total`` readings waiting; past that the oldest reading
  of the device with the most waiting goes (longest queue drop, as a fair queue drops), so a
  flood, even one spread over many topics, costs the devices that flood and not a sensor
  that sends a reading a minute.
- A status (ok / stale / error) is not a reading: it is never dropped for room, only replaced
  by a newer status of the same topic that has not been sent yet. So the router always ends
  up with a device's latest status.
- What is taken to be sent is in flight: no bound drops it. If it is not acknowledged (the
  router went away) it is put back in front, in its order, and the bounds apply again.

Sending is in the order of :meth:`Backlog.add`, across devices. Dropping leaves a tombstone
in that order (so finding a device's oldest reading costs nothing); tombstones are swept
out once they are half of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Publication:
    topic: str
    kwargs: dict[str, Any]
    retain: bool = True
    args: list[Any] = field(default_factory=list)
    in_flight: asyncio.Future | None = None
    status: bool = False  # a device status: never dropped for room, only superseded
    device: str = ""      # whose bound a reading counts against (default: its topic)
    size: int = 0         # bytes it takes on the wire, about (the in-flight window's bound)
    gone: bool = False    # dropped or superseded while waiting: a tombstone in the order

    def __post_init__(self) -> None:
        self.device = self.device or self.topic


class _Lengths:
    """How many readings each device has waiting, grouped by that number, so the device
    with the most is found at once however many devices there are."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self._with: dict[int, dict[str, None]] = {}  # length -> devices (in arrival order)
        self.longest = 0

    def change(self, device: str, by: int) -> None:
        old = self.of.get(device, 0)
        new = old + by
        if old:
            devices = self._with[old]
            del devices[device]
            if not devices:
                del self._with[old]
        if new:
            self.of[device] = new
            self._with.setdefault(new, {})[device] = None
        else:
            del self.of[device]
        if new > self.longest:
            self.longest = new
        elif old == self.longest and old not in self._with:
            self.longest = new  # lengths move by one: the device just moved is the longest

    def most_waiting(self) -> str:
        return next(iter(self._with[self.longest]))


class Backlog:
    """See the module's docstring. ``len()`` counts what waits and what is in flight."""

    def __init__(self, per_device: int = 1000, total: int = 10_000) -> None:
        self.per_device = per_device
        self.total = total
        self.in_flight = 0
        self._order: deque[Publication] = deque()  # waiting, with tombstones
        self._tombstones = 0
        self._readings: dict[str, deque[Publication]] = {}  # waiting, per device, oldest first
        self._lengths = _Lengths()
        self._statuses: dict[str, Publication] = {}  # the waiting status of each topic

    def __len__(self) -> int:
        return self.waiting + self.in_flight

    def __iter__(self) -> Iterator[Publication]:
        """What waits to be sent, in order (not what is in flight)."""
        return (pub for pub in self._order if not pub.gone)

    @property
    def waiting(self) -> int:
        return len(self._order) - self._tombstones

    def waiting_of(self, device: str) -> int:
        """Readings of ``device`` waiting to be sent."""
        return self._lengths.of.get(device, 0)

    def add(self, pub: Publication) -> list[Publication]:
        """Keep ``pub``; returns the readings dropped to make room for it."""
        self._order.append(pub)
        if pub.status:
            self._supersede(pub)
            return []
        self._readings.setdefault(pub.device, deque()).append(pub)
        self._lengths.change(pub.device, +1)
        return self._keep_bounds([pub.device])

    def next(self) -> Publication | None:
        """The next publication to send (still waiting), or None."""
        while self._order and self._order[0].gone:
            self._order.popleft()
            self._tombstones -= 1
        return self._order[0] if self._order else None

    def take(self) -> Publication:
        """The next publication (:meth:`next`), now in flight."""
        pub = self.next()
        assert pub is not None, "take() with nothing waiting"
        self._order.popleft()
        if pub.status:
            if self._statuses.get(pub.topic) is pub:
                del self._statuses[pub.topic]
        else:  # the oldest in the order is its device's oldest
            self._readings[pub.device].popleft()
            self._forget_reading(pub.device)
        self.in_flight += 1
        return pub

    def done(self, pub: Publication) -> None:
        """``pub`` (in flight) is answered: acknowledged, or refused for good."""
        self.in_flight -= 1

    def put_back(self, pubs: Iterable[Publication]) -> list[Publication]:
        """In-flight publications not acknowledged, in the order they were taken: they wait
        again, before everything else. Returns the readings the bounds then drop."""
        devices = []
        for pub in reversed(list(pubs)):
            self.in_flight -= 1
            if pub.status:
                if pub.topic in self._statuses:  # a newer one waits: this one is superseded
                    continue
                self._statuses[pub.topic] = pub
            else:
                self._readings.setdefault(pub.device, deque()).appendleft(pub)
                self._lengths.change(pub.device, +1)
                devices.append(pub.device)
            self._order.appendleft(pub)
        return self._keep_bounds(dict.fromkeys(devices))

    def _supersede(self, status: Publication) -> None:
        older = self._statuses.get(status.topic)
        if older is not None:
            self._bury(older)
        self._statuses[status.topic] = status

    def _keep_bounds(self, devices: Iterable[str]) -> list[Publication]:
        dropped = []
        for device in devices:
            while self.waiting_of(device) > self.per_device:
                dropped.append(self._drop_oldest(device))
        while self.waiting_readings > self.total:
            dropped.append(self._drop_oldest(self._lengths.most_waiting()))
        return dropped

    @property
    def waiting_readings(self) -> int:
        return self.waiting - len(self._statuses)

    def _drop_oldest(self, device: str) -> Publication:
        pub = self._readings[device].popleft()
        self._forget_reading(device)
        self._bury(pub)
        return pub

    def _forget_reading(self, device: str) -> None:
        self._lengths.change(device, -1)
        if not self._readings[device]:
            del self._readings[device]

    def _bury(self, pub: Publication) -> None:
        pub.gone = True
        self._tombstones += 1
        if self._tombstones > len(self._order) // 2 + 64:
            self._order = deque(p for p in self._order if not p.gone)
            self._tombstones = 0
