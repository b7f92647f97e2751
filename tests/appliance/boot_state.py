"""The boot chooser's state on a card image, as the tests read and write it: a redundant U-Boot
environment in raw sectors outside every partition (two copies of ENV_SIZE bytes at
COPY_OFFSETS; images/boot/boot.cmd). Written with libubootenv's fw_setenv and read with its
fw_printenv, the tools RAUC itself runs on the device, through a config naming the card file
(the device's /etc/fw_env.config names its card the same way: cairn-boot-state); ``copies``
parses both copies here, to see which one a write went to."""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

ENV_SIZE = 0x4000
COPY_OFFSETS = (8 << 20, 16 << 20)     # bytes into the card
BOOT_START = 24 << 11                  # the FAT's first sector (512 B): 24 MiB
TOOLS = ("fw_printenv", "fw_setenv")


def tools_missing() -> str | None:
    return next((tool for tool in TOOLS if not shutil.which(tool)), None)


def fw_config(card: Path) -> Path:
    """An fw_env.config for ``card``, beside it."""
    config = card.with_name(card.name + ".fw_env.config")
    config.write_text("".join(f"{card} {offset:#x} {ENV_SIZE:#x}\n" for offset in COPY_OFFSETS))
    return config


def _tool(card: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    # fw_printenv and fw_setenv are one program: what it does is its name (argv[0])
    return subprocess.run([args[0], "-c", str(fw_config(card)), *args[1:]], input=stdin,
                          capture_output=True, text=True, env={**os.environ, "LANG": "C"})


def read(card: Path) -> dict[str, str]:
    """The state as RAUC reads it (fw_printenv): the variables of the current copy."""
    done = _tool(card, "fw_printenv")
    assert done.returncode == 0, f"fw_printenv: {done.stderr}"
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def write(card: Path, **values: str | int) -> None:
    """What RAUC's uboot backend does (fw_setenv): the variables set in the other copy."""
    script = "".join(f"{name}={value}\n" for name, value in values.items())
    done = _tool(card, "fw_setenv", "-s", "-", stdin=script)
    assert done.returncode == 0, f"fw_setenv: {done.stderr}"


@dataclass(frozen=True)
class Copy:
    valid: bool            # its CRC holds
    counter: int           # the byte that says which copy is newer
    values: dict[str, str]


def copies(card: Path) -> list[Copy]:
    found = []
    with open(card, "rb") as f:
        for offset in COPY_OFFSETS:
            f.seek(offset)
            raw = f.read(ENV_SIZE)
            crc, counter, data = int.from_bytes(raw[:4], "little"), raw[4], raw[5:]
            pairs = data.split(b"\0\0", 1)[0].split(b"\0")
            values = dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
            found.append(Copy(zlib.crc32(data) == crc, counter, values))
    return found


def initialise(card: Path, **values: str | int) -> None:
    """Both copies as a new card's image build writes them (mkenvimage -r, counter 1)."""
    text = "".join(f"{name}={value}\n" for name, value in values.items())
    image = subprocess.run(["mkenvimage", "-r", "-s", str(ENV_SIZE), "-o", "-", "-"],
                           input=text.encode(), capture_output=True, check=True).stdout
    with open(card, "r+b") as f:
        for offset in COPY_OFFSETS:
            f.seek(offset)
            f.write(image)


def damage(card: Path, index: int) -> None:
    """One flipped byte among a copy's variables (a torn write, a bad sector)."""
    with open(card, "r+b") as f:
        f.seek(COPY_OFFSETS[index] + 8)
        byte = f.read(1)[0]
        f.seek(COPY_OFFSETS[index] + 8)
        f.write(bytes([byte ^ 0x20]))


def set_counter(card: Path, index: int, counter: int) -> None:
    """A copy's counter byte (which the CRC does not cover), e.g. to show its wrap."""
    with open(card, "r+b") as f:
        f.seek(COPY_OFFSETS[index] + 4)
        f.write(bytes([counter]))
