"""The card users flash, booted the way a Raspberry Pi 3 boots it (QEMU's raspi3b:
qemu_pi.py): the card's own u-boot-rpi runs the boot chooser, slot A's kernel and
initrd start with the card's Pi 3 device tree, the initramfs finds the root on the Pi's SD
host, the first boot makes the data partition, and the router becomes ready, which the
image says on the serial console. Then what the card holds after a power cut, and a slot B
whose kernel never reaches user space, which the Pi's U-Boot leaves for slot A by itself.
The boot partition is the same, byte for byte, after all of it: nothing writes the FAT on a
normal boot. One card for the module: a boot of it costs minutes under TCG."""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
import subprocess
import time

import pytest

from tests.appliance import boot_state, qemu_device, qemu_pi
from tests.appliance.qemu_device import partition_device, partitions

pytestmark = qemu_device.appliance_marks()
if qemu_pi.tools_missing():
    pytestmark = [pytest.mark.appliance, pytest.mark.skip(reason=qemu_pi.tools_missing())]

READY = r"cairn: ready: router ready, store open, no driver failed \(slot (\w), " \
        r"history to seq (\d+), (\d+) s since the kernel started\)"


@pytest.fixture(scope="module")
def pi(image, tmp_path_factory):
    card = qemu_pi.PiCard(image[0], tmp_path_factory.mktemp("pi3"))
    card.fat_before = fat_sha256(card)
    yield card
    card.close()


def fat_sha256(card: qemu_pi.PiCard) -> str:
    part = partitions(card.card)[0]
    with open(card.card, "rb") as f:
        f.seek(part["start"] * 512)
        return hashlib.sha256(f.read(part["size"] * 512)).hexdigest()


def test_the_card_carries_what_a_pi_3_and_a_pi_4_boot_from(pi):
    """The GPU firmware of a Pi 3 (bootcode.bin, start.elf) and of a Pi 4 (start4.elf),
    U-Boot, the boot script, the device trees of the Pi 3 B and B+ and of the Pi 4, and a
    config.txt that starts U-Boot in 64-bit mode with the mini UART fixed on both."""
    listing = subprocess.run(["mdir", "-b", "-i", pi._fat(), "::"], capture_output=True,
                             text=True, check=True).stdout
    names = {line.rsplit("/", 1)[-1] for line in listing.split()}
    for name in ("bootcode.bin", "start.elf", "fixup.dat", "start4.elf", "fixup4.dat",
                 "u-boot.bin", "boot.scr", "bcm2837-rpi-3-b.dtb", "bcm2837-rpi-3-b-plus.dtb",
                 "bcm2711-rpi-4-b.dtb", "config.txt"):
        assert name in names, (name, sorted(names))
    config = pi.read_boot_file("config.txt").decode()
    settings = {line.strip() for line in config.splitlines() if not line.startswith("#")}
    assert {"arm_64bit=1", "enable_uart=1", "kernel=u-boot.bin"} <= settings, config


def test_a_pi_3_boots_the_card_to_a_ready_router(pi):
    pi.start()
    console = pi.ready_console = pi.wait_for(READY).string
    took = time.monotonic() - pi.started
    # u-boot-rpi on the Pi's SD host ran the script: it read both copies of the state and
    # wrote the second (the first boot's try)
    assert "Booting bootflow 'mmc@7e202000.bootdev.part_1' with script" in console
    assert "MMC write: dev # 0, block # 32768, count 32 ... 32 blocks written: OK" in console
    assert "cairn: booting slot A (order A B, tries left A 2 B 0)" in console
    assert "Machine model: Raspberry Pi 3 Model B" in console
    assert "rauc.slot=A" in console               # slot A's kernel, from the chooser
    assert re.search(r"mmcblk0: p1 p2 p3\b", console), "the SD host's card, as flashed"
    assert re.search(r"EXT4-fs \(mmcblk0p2\): mounted filesystem .* ro", console)
    slot, _, uptime = re.search(READY, console).groups()
    assert slot == "A"
    print(f"\n[appliance] raspi3b: power-on to ready {took:.0f} s (kernel up {uptime} s)")
    print(f"[appliance] raspi3b first boot, from power-on: {pi.phases()}")


def test_after_a_power_cut_the_card_holds_the_routers_rows(pi):
    """The first boot made the data partition; what the router had stored when it said it
    was ready is on the card after the power goes, read from this host."""
    _, last_seq, _ = re.search(READY, pi.ready_console).groups()
    pi.kill()
    parts = partitions(pi.card)
    assert len(parts) == 4, parts
    store = pi.workdir / "store"
    store.mkdir(exist_ok=True)
    with partition_device(pi.card, 4, read_only=False) as dev:
        label = subprocess.run(["blkid", "-o", "value", "-s", "LABEL", dev],
                               capture_output=True, text=True).stdout.strip()
        assert label == "cairn-data"
        # its journal replayed, as the next boot's fsck does
        fsck = subprocess.run(["e2fsck", "-p", dev], capture_output=True, text=True)
        assert fsck.returncode in (0, 1), fsck.stdout + fsck.stderr
        for name in ("cairn.db", "cairn.db-wal"):
            done = subprocess.run(["debugfs", "-R", f"dump /cairn/{name} {store / name}", dev],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
    db = sqlite3.connect(store / "cairn.db")
    rows = db.execute("SELECT seq, topic, authid FROM publications ORDER BY seq").fetchall()
    assert rows and rows[-1][0] >= int(last_seq), (last_seq, rows[-5:])
    assert any(authid == "cairn.router" for _, _, authid in rows), rows


def test_a_slot_b_that_never_reaches_user_space_gives_way_to_slot_a_by_itself(pi):
    """Slot B written as an install writes it and made the next to boot (fw_setenv, as RAUC
    does), with a kernel that restarts the board (as one that panics does): three boots of B
    through the Pi's U-Boot, then A's kernel starts again."""
    root = pi.workdir / "slot-b"
    (root / "boot").mkdir(parents=True, exist_ok=True)
    (root / "boot" / "vmlinuz").write_bytes(qemu_pi.resetting_kernel())
    (root / "boot" / "initrd.img").write_bytes(b"initrd\n")
    part = pi.workdir / "slot-b.ext4"
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(root), str(part), "16M"], check=True)
    slot_b = partitions(pi.card)[2]
    with open(part, "rb") as src, open(pi.card, "r+b") as dst:
        dst.seek(slot_b["start"] * 512)
        shutil.copyfileobj(src, dst)
    boot_state.write(pi.card, BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3)
    pi.start()
    pi.wait_for(r"cairn: booting slot A .*\n(.|\n)*Starting kernel", timeout=900)
    pi.kill()
    chosen = re.findall(r"cairn: booting slot (\w) \(order B A, tries left A (\d) B (\d)\)",
                        pi.text())
    assert chosen == [("B", "3", "2"), ("B", "3", "1"), ("B", "3", "0"), ("A", "2", "0")]
    assert boot_state.read(pi.card) == {"BOOT_ORDER": "B A", "BOOT_A_LEFT": "2",
                                        "BOOT_B_LEFT": "0"}


def test_nothing_wrote_the_boot_partition(pi):
    """Boots, a power cut, resets: the FAT is what the card was flashed with (the state is in
    raw sectors of its own), and fsck finds it clean."""
    pi.kill()
    assert fat_sha256(pi) == pi.fat_before
    with partition_device(pi.card, 1) as dev:
        fsck = subprocess.run(["fsck.vfat", "-n", dev], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
