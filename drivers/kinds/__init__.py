"""The sensor kinds ``[[sensors]] kind = ...`` names, one module each: its config keys and
checks, the task that reads a port (or a kernel device) of it, its statistics and its
simulator. A new kind is a module beside these (a :class:`~cairn.drivers.kinds.kind.SensorKind`
named ``KIND``) and a line in :data:`KINDS`; the kernel kinds share
:mod:`~cairn.drivers.kinds.kernel`."""

from __future__ import annotations

from cairn.drivers.kinds import hwmon, iio, line, modbus, w1
from cairn.drivers.kinds.kind import SensorKind

KINDS: dict[str, SensorKind] = {
    "modbus": modbus.KIND,
    "line": line.KIND,
    "hwmon": hwmon.KIND,
    "iio": iio.KIND,
    "w1": w1.KIND,
}
