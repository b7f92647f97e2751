"""Fixtures of the appliance tests: the test image, built once per run, and one booted device
for the modules that share it."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def image():
    """The Debian test image and its boot files (qemu_device.py), built once per run
    for every appliance test module, rebuilt only when its sources changed."""
    import time

    from tests.appliance import qemu_device

    log = qemu_device.WORK.parent / "debian-test-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    built = qemu_device.build_test_image(log)
    print(f"\n[appliance] image ready in {time.monotonic() - started:.0f} s: {built[0]} "
          f"({built[0].stat().st_size / 2**20:.0f} MiB)")
    return built


@pytest.fixture(scope="session")
def appliance_device(image, tmp_path_factory):
    """One booted device for the appliance and system update modules (a first boot costs
    two minutes of emulated CPU), personalised from its boot partition
    (``qemu_device.PROVISIONED``): it can reach a service on this host's loopback port
    ``appliance_device.host_services[qemu_device.CENTRAL]`` as the central side."""
    from tests.appliance import qemu_device

    yield from qemu_device.booted(image, tmp_path_factory.mktemp("device"),
                                  {qemu_device.CENTRAL: qemu_device.free_port()},
                                  provision=qemu_device.PROVISIONED)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The appliance boots' systemd generator times and any boot that froze (issue: the boot
    that freezes in systemd), counted on the boots the tests make anyway."""
    from tests.appliance import qemu_device

    took = sorted(qemu_device.GENERATOR_SECONDS)
    if took or qemu_device.FROZEN_BOOTS:
        terminalreporter.write_line(
            f"[appliance] {len(took)} boots ready, {len(qemu_device.FROZEN_BOOTS)} froze in "
            f"systemd; generators took {took[0]:.1f} to {took[-1]:.1f} s (median "
            f"{took[len(took) // 2]:.1f} s)" if took else
            f"[appliance] {len(qemu_device.FROZEN_BOOTS)} boots froze in systemd")
