"""Power cuts during RAUC's own writes of the boot chooser's state, in Linux on the device
(QEMU's virt machine, the image as built): RAUC marks the running slot good (what the health
gate does at every boot) and the other slot active (what an install's switch does), over and
over, through its uboot backend (libubootenv's fw_setenv into the card's raw copies), and the
power goes at a random instant. After each cut: one copy of the state at least is whole, the
state is one RAUC wrote (or the boot's own), the FAT is byte for byte as the first boot left
it (that boot took the card's provisioning folder, the test's SSH key, and wrote its report),
and the card boots to a ready router again.

    CAIRN_STATE_WRITE_CUTS=10 pytest soak/test_boot_state_writes.py -v -s     # as root"""

from __future__ import annotations

import hashlib
import os
import random
import time

from tests.appliance import boot_state, qemu_device
from tests.appliance.qemu_device import partitions

CUTS = int(os.environ.get("CAIRN_STATE_WRITE_CUTS", "10"))
# good: the running slot A gets its tries back; active: slot B becomes the next to boot
FLIP = ("while true; do rauc status mark-good booted >/dev/null; "
        "rauc status mark-active other >/dev/null; done")

pytestmark = qemu_device.appliance_marks()


def fat_sha256(disk) -> str:
    part = partitions(disk)[0]
    with open(disk, "rb") as f:
        f.seek(part["start"] * 512)
        return hashlib.sha256(f.read(part["size"] * 512)).hexdigest()


def test_power_cuts_during_raucs_state_writes_leave_a_whole_state_and_a_bootable_card(
        tmp_path):
    image = qemu_device.build_test_image(tmp_path / "build.log")
    guest = qemu_device.Guest(*image, tmp_path / "device", sensor_uart=False)
    rng = random.Random(int(os.environ.get("CAIRN_POWER_CUT_SEED", "2026")))
    seen = []
    try:
        for cut in range(CUTS):
            guest.start()
            guest.wait_ready()
            if cut == 0:  # provisioned: the FAT is read-only from here on
                provisioned = fat_sha256(guest.disk)
            guest.ssh("sudo rauc status mark-good booted")
            guest.ssh(f"sudo nohup sh -c '{FLIP}' >/dev/null 2>&1 &")
            time.sleep(rng.uniform(0.5, 5))
            guest.kill()
            copies = boot_state.copies(guest.disk)
            assert any(copy.valid for copy in copies), f"cut {cut}: {copies}"
            state = boot_state.read(guest.disk)
            seen.append(state["BOOT_ORDER"])
            assert state["BOOT_ORDER"] in ("A B", "B A"), state
            assert fat_sha256(guest.disk) == provisioned, f"cut {cut}: the FAT changed"
            # slot B is empty on this card: give A back its place, as a person would not
            # need to (boot counting would after B's tries), to keep each round one boot
            boot_state.write(guest.disk, BOOT_ORDER="A B", BOOT_A_LEFT=3)
        guest.start()
        guest.wait_ready()
    finally:
        guest.close()
    print(f"\n[state writes] {CUTS} cuts during RAUC's writes: a whole state after each "
          f"(orders {seen}), the FAT unchanged, the card booting every time")
