"""``kind = "w1"``: a 1-Wire thermometer (DS18B20, DS18S20, DS1822, DS1825) that the kernel's
w1_therm driver reads, ``/sys/bus/w1/devices/<id>/temperature``; see
:mod:`~cairn.drivers.kernel`."""

from __future__ import annotations

from cairn.drivers.kinds.kernel import kernel_kind
from cairn.drivers.sysfs import W1

KIND = kernel_kind(W1)
