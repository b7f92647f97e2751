"""The A/B boot chooser, images/boot/boot.cmd, run by U-Boot itself: Debian's u-boot-qemu
(``qemu_arm64``) as the firmware of QEMU's virt machine, on a card laid out as the image's
(the boot state in raw sectors, a FAT boot partition, root slots A and B), its state written
the way RAUC's ``uboot`` backend writes it (libubootenv's fw_setenv: boot_state.py).
The same script runs on a Raspberry Pi under u-boot-rpi (test_device_pi.py); only the
board differs.

A slot's kernel here is the smallest arm64 Linux image U-Boot's booti accepts, whose first
instruction branches to itself: a kernel that never reaches user space, so nothing marks its
slot good. A boot is watched until that kernel is started (the chooser's state is written
by then) or the board resets."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.appliance import boot_state

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "boot" / "boot.cmd"
UBOOT = Path("/usr/lib/u-boot/qemu_arm64/u-boot.bin")
BOOT_START = boot_state.BOOT_START          # the image's layout: the FAT at 24 MiB
BOOT_SECTORS = 131072                       # a 64 MiB FAT32 boot partition (its least)
SLOT_SECTORS = 16384                        # two 8 MiB root slots

missing = next((tool for tool in ("qemu-system-aarch64", "mkimage", "mkenvimage", "mkfs.vfat",
                                  "mcopy", "sfdisk", *boot_state.TOOLS)
                if not shutil.which(tool)), None)
pytestmark = pytest.mark.skipif(
    missing is not None or not UBOOT.exists(),
    reason=f"{missing or UBOOT} is not installed (scripts/setup.sh test installs it)")


def hanging_kernel() -> bytes:
    """An arm64 Image header (Documentation/arch/arm64/booting.rst) whose code0 is `b .`."""
    header = bytearray(64)
    header[0:4] = (0x14000000).to_bytes(4, "little")        # b .  (branch to itself)
    header[8:16] = (0x80000).to_bytes(8, "little")          # text_offset
    header[16:24] = (0x10000).to_bytes(8, "little")         # image_size
    header[56:60] = b"ARM\x64"                               # magic
    return bytes(header) + bytes(0x10000 - 64)


NEW_CARD = {"BOOT_ORDER": "A B", "BOOT_A_LEFT": 3, "BOOT_B_LEFT": 3}


class Card:
    """A card image: boot.scr on its FAT partition, root slots A and B, each with a kernel and
    initrd in /boot unless it is left out of ``kernels``, and the boot state in both of its
    copies (``state``; None: a card whose state was never written)."""

    def __init__(self, workdir: Path, state: dict | None, kernels: str = "AB") -> None:
        self.workdir = workdir
        self.disk = workdir / "card.img"
        fat = workdir / "boot.part"
        script = workdir / "boot.scr"
        subprocess.run(["mkimage", "-A", "arm64", "-T", "script", "-C", "none",
                        "-d", str(SCRIPT), str(script)], capture_output=True, check=True)
        subprocess.run(["mkfs.vfat", "-C", "-F", "32", "-n", "CAIRN-BOOT", str(fat),
                        str(BOOT_SECTORS // 2)], capture_output=True, check=True)
        subprocess.run(["mmd", "-i", str(fat), "::cairn"], check=True)
        subprocess.run(["mcopy", "-i", str(fat), str(script), "::boot.scr"], check=True)
        slot_a = BOOT_START + BOOT_SECTORS
        total = slot_a + 2 * SLOT_SECTORS
        with open(self.disk, "wb") as f:
            f.truncate(total * 512)
        subprocess.run(["sfdisk", "--quiet", str(self.disk)], check=True, text=True, input=(
            "label: dos\n"
            f"start={BOOT_START}, size={BOOT_SECTORS}, type=c\n"
            f"start={slot_a}, size={SLOT_SECTORS}, type=83\n"
            f"start={slot_a + SLOT_SECTORS}, size={SLOT_SECTORS}, type=83\n"))
        self._write(fat, BOOT_START)
        for index, slot in enumerate("AB"):
            root = workdir / f"root-{slot}"
            (root / "boot").mkdir(parents=True)
            if slot in kernels:
                (root / "boot" / "vmlinuz").write_bytes(hanging_kernel())
                (root / "boot" / "initrd.img").write_bytes(b"initrd\n")
            part = workdir / f"root-{slot}.part"
            subprocess.run(["mkfs.ext4", "-q", "-d", str(root), str(part),
                            f"{SLOT_SECTORS // 2}k"], check=True)
            self._write(part, slot_a + index * SLOT_SECTORS)
        if state is not None:
            boot_state.initialise(self.disk, **state)
        self.fat_digest = self.fat_sha256()

    def _write(self, part: Path, start: int) -> None:
        with open(part, "rb") as src, open(self.disk, "r+b") as dst:
            dst.seek(start * 512)
            shutil.copyfileobj(src, dst)
        part.unlink()

    def state(self) -> dict[str, str]:
        return boot_state.read(self.disk)

    def console(self) -> str:
        return (self.workdir / "console.log").read_text(errors="replace")

    def fat_sha256(self) -> str:
        with open(self.disk, "rb") as f:
            f.seek(BOOT_START * 512)
            return hashlib.sha256(f.read(BOOT_SECTORS * 512)).hexdigest()

    def boot(self, timeout: float = 120) -> str:
        """Powers the board on and returns the slot whose kernel U-Boot started, or "reset"
        when the script reset the board instead (QEMU exits on a reset: -no-reboot). The
        firmware's two seconds of autoboot countdown (spent spinning, a core's worth under
        TCG) are cut short by a key, and ``boot`` runs what autoboot would have."""
        log = self.workdir / "console.log"
        with open(log, "wb") as out:
            qemu = subprocess.Popen(
                ["qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-m", "512",
                 "-nographic", "-no-reboot", "-net", "none", "-bios", str(UBOOT),
                 "-drive", f"if=none,id=card,file={self.disk},format=raw",
                 "-device", "virtio-blk-pci,drive=card"],
                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        typed = []
        try:
            while time.monotonic() < deadline:
                console = log.read_text(errors="replace")
                for waits_for, keys in (("Hit any key to stop autoboot", b"\r"),
                                        ("\n=> ", b"boot\r")):
                    if keys not in typed and waits_for in console and qemu.poll() is None:
                        qemu.stdin.write(keys)
                        qemu.stdin.flush()
                        typed.append(keys)
                chosen = re.search(r"cairn: booting slot (\w+)", console)
                if chosen and "Starting kernel" in console:
                    return chosen.group(1)
                if qemu.poll() is not None:
                    assert "every slot gets 3 again" in console or \
                        "has no kernel to boot" in console, console[-3000:]
                    return "reset"
                time.sleep(0.05)
            raise AssertionError("U-Boot chose no slot:\n" + log.read_text()[-3000:])
        finally:
            qemu.kill()
            qemu.wait()


@pytest.fixture
def card(tmp_path):
    made = []

    def make(state: dict | None = NEW_CARD, kernels: str = "AB") -> Card:
        made.append(Card(tmp_path, state, kernels))
        return made[-1]
    yield make
    # whatever a test booted, nothing wrote the FAT: a power cut cannot tear it
    for c in made:
        assert c.fat_sha256() == c.fat_digest, "the boot chooser wrote the FAT partition"


def test_a_new_card_boots_slot_a_and_takes_one_of_its_tries(card):
    c = card()
    assert c.boot() == "A"
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "3"}


def test_the_slot_rauc_installed_to_boots_next(card):
    c = card(dict(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3))
    assert c.boot() == "B"
    assert c.state()["BOOT_B_LEFT"] == "2"
    assert c.state()["BOOT_A_LEFT"] == "3"


def test_a_slot_that_never_reaches_user_space_gives_way_to_the_old_one_after_three_boots(card):
    """Nobody marks B good (its kernel never starts user space): three tries, then A."""
    c = card(dict(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3))
    assert [c.boot() for _ in range(4)] == ["B", "B", "B", "A"]
    assert c.state() == {"BOOT_ORDER": "B A", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "0"}


def test_when_every_slot_used_up_its_tries_they_get_them_again_and_the_board_resets(card):
    c = card(dict(BOOT_ORDER="A B", BOOT_A_LEFT=0, BOOT_B_LEFT=0))
    assert c.boot() == "reset"
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "3", "BOOT_B_LEFT": "3"}
    assert c.boot() == "A"


def test_a_slot_without_a_kernel_gives_up_its_tries_at_once_and_the_board_resets(card):
    """An install cut short leaves slot B empty or torn: one boot, not three, and back to A
    (falling through to U-Boot's network boot would end at a prompt nobody sees)."""
    c = card(dict(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3), kernels="A")
    assert c.boot() == "reset"
    assert c.state() == {"BOOT_ORDER": "B A", "BOOT_A_LEFT": "3", "BOOT_B_LEFT": "0"}
    assert c.boot() == "A"


def test_a_card_without_a_state_boots_slot_a_says_so_and_writes_the_state(card):
    c = card(state=None)
    assert c.boot() == "A"
    assert "cairn: no boot state on the card" in c.console()
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "3"}


def test_each_write_goes_to_the_other_copy_with_the_counter_one_higher(card):
    """So that a write torn by a power cut leaves the copy before it whole."""
    c = card()
    assert [copy.counter for copy in boot_state.copies(c.disk)] == [1, 1]
    c.boot()
    first, second = boot_state.copies(c.disk)
    assert (first.counter, second.counter) == (1, 2) and second.values["BOOT_A_LEFT"] == "2"
    assert first.values["BOOT_A_LEFT"] == "3"
    c.boot()
    first, second = boot_state.copies(c.disk)
    assert (first.counter, second.counter) == (3, 2) and first.values["BOOT_A_LEFT"] == "1"


def test_a_torn_copy_leaves_the_state_before_it(card):
    """The newer copy damaged (the power went while it was written): the older one is the
    state, as it was before that write."""
    c = card(dict(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3))
    boot_state.write(c.disk, BOOT_B_LEFT=1)           # the second copy, the newer
    boot_state.damage(c.disk, 1)
    assert c.boot() == "B"
    assert c.state() == {"BOOT_ORDER": "B A", "BOOT_A_LEFT": "3", "BOOT_B_LEFT": "2"}


def test_with_both_copies_damaged_slot_a_boots_with_a_console_line(card):
    c = card(dict(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=1))
    boot_state.damage(c.disk, 0)
    boot_state.damage(c.disk, 1)
    assert c.boot() == "A"
    assert "both copies damaged" in c.console()
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "3"}


@pytest.mark.parametrize(("counters", "newer"), [((0xFF, 0), 1), ((0, 0xFF), 0), ((7, 9), 1),
                                                 ((9, 7), 0)])
def test_the_newer_copy_is_the_state_and_255_is_followed_by_0(card, counters, newer):
    """libubootenv's rule (RAUC's fw_setenv writes it), the same in U-Boot."""
    c = card(dict(BOOT_ORDER="A B", BOOT_A_LEFT=3, BOOT_B_LEFT=3))
    boot_state.write(c.disk, BOOT_ORDER="B A")        # the second copy differs
    for index, counter in enumerate(counters):
        boot_state.set_counter(c.disk, index, counter)
    assert c.boot() == ("B" if newer == 1 else "A")
    written = boot_state.copies(c.disk)[1 - newer]
    assert written.valid and written.counter == (counters[newer] + 1) % 256


def test_what_u_boot_wrote_is_what_fw_printenv_reads_and_fw_setenv_is_what_it_reads(card):
    """RAUC's side of the state, the way the device's /etc/fw_env.config names it: after a
    boot the tool reads what U-Boot wrote, and what the tool writes (mark-good: 3 tries
    again) is what the next boot reads."""
    c = card()
    c.boot()
    assert boot_state.read(c.disk)["BOOT_A_LEFT"] == "2"
    boot_state.write(c.disk, BOOT_A_LEFT=3)
    c.boot()
    assert boot_state.read(c.disk)["BOOT_A_LEFT"] == "2"
