"""``kind = "iio"``: a chip of the kernel's Industrial I/O subsystem (BME280, DPS310, DHT11
on a GPIO, HDC100x...), its ``in_temp``, ``in_humidityrelative`` and ``in_pressure`` channels
in its ``iio:deviceN`` directory; see :mod:`~cairn.drivers.kernel`."""

from __future__ import annotations

from cairn.drivers.kinds.kernel import kernel_kind
from cairn.drivers.sysfs import IIO

KIND = kernel_kind(IIO)
