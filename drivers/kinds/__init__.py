"""The sensor kinds ``[[sensors]] kind = ...`` names, one module each: its config keys and
checks, the task that reads a port of it, its statistics and its simulator. A new kind is a
module beside these (a :class:`~cairn.drivers.kinds.kind.SensorKind` named ``KIND``) and a
line in :data:`KINDS`."""

from __future__ import annotations

from cairn.drivers.kinds import line, modbus
from cairn.drivers.kinds.kind import SensorKind

KINDS: dict[str, SensorKind] = {
    "modbus": modbus.KIND,
    "line": line.KIND,
}
