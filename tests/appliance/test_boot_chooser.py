"""The A/B boot chooser, images/boot/boot.cmd, run by U-Boot itself: Debian's u-boot-qemu
(``qemu_arm64``) as the firmware of QEMU's virt machine, on a card laid out as the image's
(FAT boot partition, root slots A and B), its state file written the way RAUC's ``uboot``
backend writes it (an environment image with a CRC, as ``mkenvimage`` and ``fw_setenv`` make
it). The same script runs on a Raspberry Pi 4 under u-boot-rpi; only the board differs.

A slot's kernel here is the smallest arm64 Linux image U-Boot's booti accepts, whose first
instruction branches to itself: a kernel that never reaches user space, so nothing marks its
slot good. A boot is watched until that kernel is started (the chooser's state is written
by then) or the board resets."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "images" / "boot" / "boot.cmd"
UBOOT = Path("/usr/lib/u-boot/qemu_arm64/u-boot.bin")
ENV_SIZE = 0x4000
BOOT_START, BOOT_SECTORS = 8192, 131072     # a 64 MiB FAT32 boot partition (its least)
SLOT_SECTORS = 16384                        # two 8 MiB root slots

missing = next((tool for tool in ("qemu-system-aarch64", "mkimage", "mkenvimage", "mkfs.vfat",
                                  "mcopy", "sfdisk") if not shutil.which(tool)), None)
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


def env_image(**values: str | int) -> bytes:
    """A state file as RAUC's fw_setenv writes it (mkenvimage's format)."""
    text = "".join(f"{name}={value}\n" for name, value in values.items())
    done = subprocess.run(["mkenvimage", "-s", str(ENV_SIZE), "-o", "-", "-"],
                          input=text.encode(), capture_output=True, check=True)
    return done.stdout


def parse_env(image: bytes) -> dict[str, str]:
    crc, data = int.from_bytes(image[:4], "little"), image[4:]
    assert zlib.crc32(data) == crc, "the state file's CRC does not match"
    pairs = data.split(b"\0\0", 1)[0].split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if p)


class Card:
    """A card image: boot.scr and cairn/boot.env on its FAT partition, and root slots A and B,
    each with a kernel and initrd in /boot unless it is left out of ``kernels``."""

    def __init__(self, workdir: Path, state: bytes | None, kernels: str = "AB") -> None:
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
        if state is not None:
            (workdir / "boot.env").write_bytes(state)
            subprocess.run(["mcopy", "-i", str(fat), str(workdir / "boot.env"),
                            "::cairn/boot.env"], check=True)
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

    def _write(self, part: Path, start: int) -> None:
        with open(part, "rb") as src, open(self.disk, "r+b") as dst:
            dst.seek(start * 512)
            shutil.copyfileobj(src, dst)
        part.unlink()

    def state(self) -> dict[str, str]:
        done = subprocess.run(["mcopy", "-n", "-i", f"{self.disk}@@{BOOT_START * 512}",
                               "::cairn/boot.env", "-"], capture_output=True, check=True)
        return parse_env(done.stdout)

    def damage_state(self) -> None:
        """One flipped byte in the state file's variables (a torn write, a bad sector)."""
        image = bytearray(self.state_bytes())
        image[8] ^= 0x20
        path = self.workdir / "damaged.env"
        path.write_bytes(bytes(image))
        subprocess.run(["mcopy", "-o", "-i", f"{self.disk}@@{BOOT_START * 512}", str(path),
                        "::cairn/boot.env"], check=True)

    def state_bytes(self) -> bytes:
        return subprocess.run(["mcopy", "-n", "-i", f"{self.disk}@@{BOOT_START * 512}",
                               "::cairn/boot.env", "-"], capture_output=True,
                              check=True).stdout

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
    def make(state: bytes | None = env_image(BOOT_ORDER="A B", BOOT_A_LEFT=3,
                                             BOOT_B_LEFT=3), kernels: str = "AB") -> Card:
        return Card(tmp_path, state, kernels)
    return make


def test_a_new_card_boots_slot_a_and_takes_one_of_its_tries(card):
    c = card()
    assert c.boot() == "A"
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "3"}


def test_the_slot_rauc_installed_to_boots_next(card):
    c = card(env_image(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3))
    assert c.boot() == "B"
    assert c.state()["BOOT_B_LEFT"] == "2"
    assert c.state()["BOOT_A_LEFT"] == "3"


def test_a_slot_that_never_reaches_user_space_gives_way_to_the_old_one_after_three_boots(card):
    """Nobody marks B good (its kernel never starts user space): three tries, then A."""
    c = card(env_image(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3))
    assert [c.boot() for _ in range(4)] == ["B", "B", "B", "A"]
    assert c.state() == {"BOOT_ORDER": "B A", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "0"}


def test_when_every_slot_used_up_its_tries_they_get_them_again_and_the_board_resets(card):
    c = card(env_image(BOOT_ORDER="A B", BOOT_A_LEFT=0, BOOT_B_LEFT=0))
    assert c.boot() == "reset"
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "3", "BOOT_B_LEFT": "3"}
    assert c.boot() == "A"


def test_a_slot_without_a_kernel_gives_up_its_tries_at_once_and_the_board_resets(card):
    """An install cut short leaves slot B empty or torn: one boot, not three, and back to A
    (falling through to U-Boot's network boot would end at a prompt nobody sees)."""
    c = card(env_image(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=3), kernels="A")
    assert c.boot() == "reset"
    assert c.state() == {"BOOT_ORDER": "B A", "BOOT_A_LEFT": "3", "BOOT_B_LEFT": "0"}
    assert c.boot() == "A"


def test_without_a_state_file_slot_a_boots_and_the_state_is_written(card):
    c = card(state=None)
    assert c.boot() == "A"
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "3"}


def test_a_damaged_state_file_is_read_as_the_defaults(card):
    c = card(env_image(BOOT_ORDER="B A", BOOT_A_LEFT=3, BOOT_B_LEFT=1))
    c.damage_state()
    assert c.boot() == "A"
    assert c.state() == {"BOOT_ORDER": "A B", "BOOT_A_LEFT": "2", "BOOT_B_LEFT": "3"}


def test_the_state_file_is_what_fw_setenv_reads(card, tmp_path):
    """RAUC's uboot backend reads and writes the file through fw_printenv/fw_setenv (the
    device's /etc/fw_env.config names it): after a boot, the tool reads what U-Boot wrote."""
    tool = shutil.which("fw_printenv")
    if tool is None:
        pytest.skip("fw_printenv (u-boot-tools) is not installed")
    c = card()
    c.boot()
    (tmp_path / "boot.env.copy").write_bytes(c.state_bytes())
    config = tmp_path / "fw_env.config"
    config.write_text(f"{tmp_path / 'boot.env.copy'} 0x0000 {ENV_SIZE:#x}\n")
    done = subprocess.run([tool, "-c", str(config), "BOOT_ORDER", "BOOT_A_LEFT"],
                          capture_output=True, text=True, env={**os.environ, "LANG": "C"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["BOOT_ORDER=A B", "BOOT_A_LEFT=2"]
