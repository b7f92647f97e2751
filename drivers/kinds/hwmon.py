"""``kind = "hwmon"``: a chip the kernel's hwmon drivers read (SHT3x, SHT4x, SHT21/HTU21,
LM75/TMP102...), its ``temp<n>_input`` and ``humidity<n>_input`` in its ``hwmon/hwmonN``
directory; see :mod:`~cairn.drivers.kernel`."""

from __future__ import annotations

from cairn.drivers.kinds.kernel import kernel_kind
from cairn.drivers.sysfs import HWMON

KIND = kernel_kind(HWMON)
