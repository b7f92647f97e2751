"""Power cuts while U-Boot runs the boot chooser, on the card ``make image`` produces: on
QEMU's virt machine (the image's u-boot-qemu) and on raspi3b (the card's own u-boot-rpi and
Pi 3 tree). Each cut comes at a random instant between the script's start and the kernel's
start, most of them in the state's read and write (they are a few milliseconds long under
TCG; a cut is aimed by the time that part took in the previous boot). After each cut:
``fsck.vfat -n`` finds the FAT clean and it is byte for byte as flashed, one copy of the
state at least is whole and is the state before or after that boot's write, and the next
power-on runs the script again (the card boots). The last boot is let through to the kernel.

QEMU writes whole sectors: what a real card's controller does to the rest of an erase block
when the power fails mid-write is not shown here (images/README.md says what the design
leaves the card to tear). Cuts during RAUC's own writes in Linux are
soak/test_boot_state_writes.py.

    CAIRN_POWER_CUTS=50 pytest soak/test_boot_power_cuts.py -v -s      # as root"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.appliance import boot_state, qemu_device, qemu_pi
from tests.appliance.qemu_device import partition_device, partitions

CUTS = int(os.environ.get("CAIRN_POWER_CUTS", "50"))
SCRIPT_STARTS = "with script"   # U-Boot's boot flow: "** Booting bootflow '...' with script"
STATE_WRITTEN = "cairn: booting slot"

pytestmark = qemu_device.appliance_marks()


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return qemu_device.build_test_image(tmp_path_factory.mktemp("build") / "build.log")


class Board:
    """A card and how to power it on: ``machine`` virt or raspi3b."""

    def __init__(self, machine: str, image: tuple[Path, Path], workdir: Path) -> None:
        self.machine, self.workdir = machine, workdir
        if machine == "raspi3b":
            self.pi = qemu_pi.PiCard(image[0], workdir)
            self.card = self.pi.card
        else:
            self.card = workdir / "card.img"
            subprocess.run(["cp", "--sparse=always", str(image[0]), str(self.card)],
                           check=True)
            os.truncate(self.card, 5 << 30)
            self.uboot = image[1] / "u-boot-qemu.bin"
        self.console = workdir / "console.log"

    def power_on(self) -> subprocess.Popen:
        if self.machine == "raspi3b":
            cmd = ["qemu-system-aarch64", "-M", "raspi3b", "-kernel", str(self.pi.uboot),
                   "-dtb", str(self.pi.tree), "-drive", f"if=sd,format=raw,file={self.card}",
                   "-serial", "null", "-serial", f"file:{self.console}"]
        else:
            cmd = ["qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-m", "1024",
                   "-bios", str(self.uboot), "-serial", f"file:{self.console}",
                   "-drive", f"if=none,id=card,file={self.card},format=raw",
                   "-device", "virtio-blk-pci,drive=card"]
        return subprocess.Popen(cmd + ["-display", "none", "-monitor", "none", "-no-reboot"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def text(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    def wait_for(self, qemu: subprocess.Popen, needle: str, timeout: float = 600) -> float:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert qemu.poll() is None, f"QEMU exited before {needle!r}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {needle!r}:\n{self.text()[-3000:]}"
            time.sleep(0.002)
        return time.monotonic()

    def fat(self) -> tuple[str, str]:
        part = partitions(self.card)[0]
        with open(self.card, "rb") as f:
            f.seek(part["start"] * 512)
            digest = hashlib.sha256(f.read(part["size"] * 512)).hexdigest()
        with partition_device(self.card, 1) as dev:
            fsck = subprocess.run(["fsck.vfat", "-n", dev], capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
        return digest, fsck.stdout


@pytest.mark.parametrize("machine", ["virt", "raspi3b"])
def test_power_cuts_while_u_boot_chooses_a_slot_leave_the_card_bootable(machine, image,
                                                                        tmp_path):
    board = Board(machine, image, tmp_path)
    flashed, _ = board.fat()
    rng = random.Random(int(os.environ.get("CAIRN_POWER_CUT_SEED", "2026")))
    state_phase = None          # s: from the script's start to the state written
    in_state_phase = 0
    states: set[tuple[str, str, str]] = set()
    for cut in range(CUTS + 1):
        before = boot_state.read(board.card)
        board.console.unlink(missing_ok=True)
        qemu = board.power_on()
        started = board.wait_for(qemu, SCRIPT_STARTS)
        if cut == CUTS:        # the last boot: through to the kernel
            board.wait_for(qemu, "Starting kernel")
            qemu.kill()
            break
        if state_phase is None:    # the first boot measures the part the cuts aim at
            state_phase = board.wait_for(qemu, STATE_WRITTEN) - started
            aim = state_phase + rng.uniform(0, 2)
        elif cut % 2:              # inside the state's read and write
            aim = rng.uniform(0, state_phase * 1.2)
        else:                      # anywhere up to the kernel's load
            aim = rng.uniform(0, state_phase + 5)
        while time.monotonic() < started + aim and qemu.poll() is None:
            time.sleep(0.001)
        qemu.send_signal(signal.SIGKILL)
        qemu.wait()
        if STATE_WRITTEN not in board.text():
            in_state_phase += 1
        digest, _ = board.fat()
        assert digest == flashed, f"cut {cut}: the FAT changed"
        assert any(copy.valid for copy in boot_state.copies(board.card)), f"cut {cut}"
        after = boot_state.read(board.card)
        states.add(tuple(after[k] for k in ("BOOT_ORDER", "BOOT_A_LEFT", "BOOT_B_LEFT")))
        assert after == before or _one_try_taken(before, after), (cut, before, after)
        if after["BOOT_A_LEFT"] == "0":   # as the health gate does in Linux: A is good
            boot_state.write(board.card, BOOT_A_LEFT=3)
    print(f"\n[power cuts] {machine}: {CUTS} cuts ({in_state_phase} before the state was "
          f"written; that part took {state_phase:.3f} s), the FAT unchanged and clean after "
          f"each, states seen {sorted(states)}")


def _one_try_taken(before: dict[str, str], after: dict[str, str]) -> bool:
    return after == {**before, "BOOT_A_LEFT": str(int(before["BOOT_A_LEFT"]) - 1)}
