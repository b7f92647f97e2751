"""The A/B boot chooser, images/boot/boot.cmd, run by U-Boot itself: Debian's u-boot-qemu
(``qemu_arm64``) as the firmware of QEMU's virt machine, on a card laid out as the image's
(FAT boot partition, root slots A and B), its state file written the way RAUC's ``uboot``
backend writes it (an environment image with a CRC, as ``mkenvimage`` and ``fw_setenv`` make
it). The same script runs on a Raspberry Pi 4 under u-boot-rpi; only the board differs.

The slots here hold no kernel: a boot is watched until the script names the slot it chose and
has written its state back, which it does before it loads anything."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    """A card image: boot.scr and cairn/boot.env on its FAT partition, two empty slots."""

    def __init__(self, workdir: Path, state: bytes | None) -> None:
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
        with open(fat, "rb") as src, open(self.disk, "r+b") as dst:
            dst.seek(BOOT_START * 512)
            shutil.copyfileobj(src, dst)
        fat.unlink()

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
        """Powers the board on and returns the slot the script chose, or "reset" when it
        reset the board instead (QEMU exits on a reset: -no-reboot)."""
        log = self.workdir / "console.log"
        with open(log, "wb") as out:
            qemu = subprocess.Popen(
                ["qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-m", "512",
                 "-nographic", "-no-reboot", "-net", "none", "-bios", str(UBOOT),
                 "-drive", f"if=none,id=card,file={self.disk},format=raw",
                 "-device", "virtio-blk-pci,drive=card"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                console = log.read_text(errors="replace")
                chosen = re.search(r"cairn: booting slot (\w+)", console)
                if chosen:
                    return chosen.group(1)
                if qemu.poll() is not None:
                    assert "every slot gets 3 again" in console, console[-3000:]
                    return "reset"
                time.sleep(0.1)
            raise AssertionError("U-Boot chose no slot:\n" + log.read_text()[-3000:])
        finally:
            qemu.kill()
            qemu.wait()


@pytest.fixture
def card(tmp_path):
    def make(state: bytes | None = env_image(BOOT_ORDER="A B", BOOT_A_LEFT=3,
                                             BOOT_B_LEFT=3)) -> Card:
        return Card(tmp_path, state)
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
