"""The sensor driver (named for its first kinds, the serial ones): ``[[sensors]]`` in,
readings and device status out to the router.

Every ``[[sensors]]`` entry becomes a :class:`drivers.runtime.Device` (change filter,
status) fed by the task of its port, which its kind makes (drivers.kinds: one
:class:`~drivers.modbus.ModbusBus` per Modbus port, all devices on it polled in turn, since an
RS-485 line carries one exchange at a time; one :class:`~drivers.line.LinePort` per text
port; one :class:`~drivers.kernel.KernelSensor` per kernel device, read in sysfs). All devices
publish through one :class:`~drivers.runtime.RouterLink`.

Status, retained on ``gateway.device.<id>.status``:

- ``ok`` from the first reading on;
- ``error`` with a reason when the port cannot be opened or went away, or the device did not
  answer (after retries), answered garbage, or answered with a Modbus exception; a kernel
  device when its files are not there or a read gave an errno or garbage (after retries);
- ``stale`` when no reading came for ``stale_after`` seconds (a line sensor that went
  quiet), and when the driver stops.

A device in error comes back to ``ok`` with its next good reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from cairn.drivers.kinds import KINDS
from cairn.drivers.kinds.kind import PortTask
from cairn.drivers.runtime import ChangeFilter, Device, RouterLink
from cairn.drivers.serial_config import SensorConfig, SerialConfig

log = logging.getLogger("cairn.sensor")

# ChangeFilter publishes when |change| > deadband. Readings are multiples of the sensor's
# resolution, so a change of exactly the deadband (21.6 - 21.5 = 0.10000000000000142) must
# not count as more than it: the band is widened by far less than any resolution.
_EPSILON = 1e-9


class SerialDriver:
    """Runs until cancelled; then marks its devices stale ("driver stopped") and gives the
    link a moment to deliver that."""

    def __init__(self, config: SerialConfig, link: RouterLink | None = None,
                 *, stale_check: float = 0.5, drain_timeout: float = 3.0) -> None:
        self.config = config
        d = config.driver
        self.link = link or RouterLink(d.router, d.realm, authid=d.authid, secret=d.secret,
                                       backlog=d.backlog, backlog_total=d.backlog_total)
        self.stale_check = stale_check
        self.drain_timeout = drain_timeout
        self.devices: dict[str, Device] = {}
        self.ports: dict[str, PortTask] = {}  # by port path, each made by its sensors' kind
        self.kinds: dict[str, str] = {}  # each port's kind
        self._started = time.monotonic()
        by_port: dict[str, list[SensorConfig]] = {}
        for sensor in config.sensors:
            change = ChangeFilter(
                deadband={k: b + _EPSILON for k, b in sensor.deadband.items()},
                default_deadband=sensor.default_deadband + _EPSILON,
                heartbeat=sensor.heartbeat)
            self.devices[sensor.id] = Device(sensor.id, self.link, change, sensor.stale_after)
            by_port.setdefault(sensor.port, []).append(sensor)
        for path, sensors in by_port.items():
            self.ports[path] = KINDS[sensors[0].kind].task(sensors, self._reading, self._error)
            self.kinds[path] = sensors[0].kind

    def _reading(self, device_id: str, values: dict[str, float]) -> None:
        self.devices[device_id].reading(values)

    def _error(self, device_id: str, reason: str) -> None:
        self.devices[device_id].error(reason)

    def check_stale(self) -> None:
        """ok -> stale when readings stop; also a device that never gave one."""
        now = time.monotonic()
        for device in self.devices.values():
            if device.status.state == "ok":
                device.check_stale()
            elif device.status.state is None and now - self._started > device.stale_after:
                device.status.set("stale", "no reading since the driver started")

    async def _watch_stale(self) -> None:
        while True:
            await asyncio.sleep(self.stale_check)
            self.check_stale()

    async def run(self) -> None:
        self._started = time.monotonic()
        for device in self.devices.values():
            device.last_reading = self._started
        log.info("%d sensor(s) on %d port(s), publishing to %s realm %s", len(self.devices),
                 len(self.ports), self.link.url, self.link.realm)
        link_task = asyncio.create_task(self.link.run(), name="router-link")
        tasks = [asyncio.create_task(port.run(), name=f"{self.kinds[path]} {path}")
                 for path, port in self.ports.items()]
        tasks.append(asyncio.create_task(self._watch_stale(), name="stale"))
        try:
            # these run forever: returning means one of them failed
            done, _ = await asyncio.wait([link_task, *tasks],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for device in self.devices.values():
                device.status.set("stale", "driver stopped")
            await self._drain(link_task)
            link_task.cancel()
            await asyncio.gather(link_task, return_exceptions=True)
            await self.link.close()
            log.info("stopped: %s", self.stats())

    async def _drain(self, link_task: asyncio.Task) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.link.backlog and not link_task.done() and time.monotonic() < deadline:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)
        if self.link.backlog:
            log.warning("%d publications not delivered at exit", len(self.link.backlog))

    def stats(self) -> dict[str, Any]:
        """Counters: per kind, per port (a Modbus bus by address, a line port), and the
        router link."""
        found: dict[str, Any] = {name: {} for name in KINDS}
        for path, port in self.ports.items():
            found[self.kinds[path]][path] = KINDS[self.kinds[path]].stats(port)
        return {**found, "link": dataclasses.asdict(self.link.stats)}
