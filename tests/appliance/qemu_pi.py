"""A Raspberry Pi 3 Model B booted from the card users flash, in QEMU's ``raspi3b`` machine
(QEMU 9 or newer; TCG): the card's own u-boot-rpi (``u-boot.bin`` from its FAT, where the Pi's
GPU firmware would start it: QEMU stands in for that firmware), the card's own Pi 3 device
tree, the Pi's SD host (``sdhost-bcm2835``) and its mini UART as the console (the second
serial port; ttyS1 in Linux). No network: the console and the card itself are the ways in
and out, as on a board in a field with only a serial cable.

QEMU's raspi machines have no watchdog timer: their power-management block resets the machine
the moment the full-reset configuration is written, which is what Linux's bcm2835_wdt does
when the watchdog is armed (QEMU's hw/misc/bcm2835_powermgt.c; a real Pi counts the ticks
down first). So systemd's runtime watchdog, armed as systemd starts, reset every boot about
a minute into user space, before the data partition was made. The card's kernel arguments
(cairn/bootargs.env, the board's own file) turn it off for QEMU: ``systemd.watchdog_sec=off``.
On a Pi the image keeps it (trixie's bcm2835_wdt has a 16 s hardware maximum and the kernel
pings it on PID 1's behalf, so systemd's 2 minutes hold; images/README.md)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.appliance.qemu_device import ANSI, partitions

CARD_BYTES = 8 << 30          # QEMU wants an SD card of a power-of-two size: an 8 GB card
PI3_TREE = "bcm2837-rpi-3-b.dtb"
PI_CONSOLE = "console=ttyS1,115200"      # the mini UART, as the image's own bootargs.env
QEMU_ONLY = "systemd.watchdog_sec=off"   # see above
PI_BOOT_TIMEOUT = 2400        # s: power-on to ready under TCG (the SD host reads ~0.7 MB/s)
# the console lines a boot's phases begin with, for where the minutes of a boot go
MILESTONES = {
    "U-Boot": r"^U-Boot 20",
    "boot script": r"cairn: booting slot",
    "kernel": r"Booting Linux on physical CPU",
    "initramfs": r"Run /init as init process|Loading, please wait",
    "root mounted": r"EXT4-fs \(mmcblk0p[23]\): mounted filesystem",
    "systemd": r"systemd\[1\]: systemd \d+|Welcome to ",
    "data partition": r"cairn-data-partition|Mounted .*/var/lib/cairn|cairn-data",
    "router ready": r"cairn: ready:",
}


def resetting_kernel() -> bytes:
    """An arm64 Image (Documentation/arch/arm64/booting.rst) that resets the board at once, the
    way a Pi's kernel that panics restarts it (the image's panic=10): it arms the SoC's
    watchdog with 10 ticks and the full-reset configuration, as Linux's restart does. A slot
    with it never reaches user space."""
    code = [0xD2A7E200,   # movz x0, #0x3f10, lsl #16   the PM block, 0x3f100000
            0x52AB4001,   # movz w1, #0x5a00, lsl #16   its password
            0x11002823,   # add  w3, w1, #10            10 ticks
            0x11008022,   # add  w2, w1, #0x20          full reset
            0xB9002403,   # str  w3, [x0, #0x24]        PM_WDOG
            0xB9001C02,   # str  w2, [x0, #0x1c]        PM_RSTC
            0xD5033F9F,   # dsb  sy
            0x14000000]   # b    .
    header = bytearray(64)
    header[0:4] = (0x14000010).to_bytes(4, "little")        # b +64: past the header
    header[8:16] = (0x80000).to_bytes(8, "little")          # text_offset, as Linux's
    header[16:24] = (0x10000).to_bytes(8, "little")         # image_size
    header[56:60] = b"ARM\x64"                               # magic
    body = b"".join(word.to_bytes(4, "little") for word in code)
    return bytes(header) + body + bytes(0x10000 - 64 - len(body))


class PiCard:
    """A copy of the image as a card in a Pi 3 (``card``), and the QEMU process that powers
    it. ``start`` again after ``kill`` is the next power-on of the same card."""

    def __init__(self, image: Path, workdir: Path, extra: list[str] | None = None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.card = workdir / "card.img"
        subprocess.run(["cp", "--sparse=always", str(image), str(self.card)], check=True)
        with open(self.card, "r+b") as f:
            f.truncate(CARD_BYTES)
        # what the Pi firmware would start, and the tree it would hand over: the card's own
        self.uboot = workdir / "u-boot.bin"
        self.tree = workdir / PI3_TREE
        self.uboot.write_bytes(self.read_boot_file("u-boot.bin"))
        self.tree.write_bytes(self.read_boot_file(PI3_TREE))
        self.write_boot_file("cairn/bootargs.env",
                             f"cairn_cmdline={PI_CONSOLE} {QEMU_ONLY}\n".encode())
        self.extra = extra or []
        # the HMP monitor (qom-set on a chip, stop/cont): a short path, as sockets need
        self.monitor_path = Path(tempfile.mkdtemp(prefix="cairn-pi-")) / "monitor"
        self.proc: subprocess.Popen | None = None
        self.boots = 0
        self.console = workdir / "console-0.log"

    def _fat(self) -> str:
        return f"{self.card}@@{partitions(self.card)[0]['start'] * 512}"

    def read_boot_file(self, path: str) -> bytes:
        return subprocess.run(["mcopy", "-n", "-i", self._fat(), f"::{path}", "-"],
                              capture_output=True, check=True).stdout

    def write_boot_file(self, path: str, data: bytes) -> None:
        local = self.workdir / "boot-file"
        local.write_bytes(data)
        folders = path.split("/")[:-1]
        for depth in range(1, len(folders) + 1):  # mmd: an error where one is there already
            subprocess.run(["mmd", "-i", self._fat(), "::" + "/".join(folders[:depth])],
                           capture_output=True)
        subprocess.run(["mcopy", "-o", "-i", self._fat(), str(local), f"::{path}"], check=True)

    def start(self) -> None:
        """Power on. Resets (a kernel that restarts the board, the boot chooser's own) reboot
        the board in the same run, as on a Pi."""
        assert not self.alive(), "already running"
        self.boots += 1
        self.console = self.workdir / f"console-{self.boots}.log"
        self.started = time.monotonic()
        cmd = ["qemu-system-aarch64", "-M", "raspi3b", "-kernel", str(self.uboot),
               "-dtb", str(self.tree), "-drive", f"if=sd,format=raw,file={self.card}",
               "-serial", "null", "-serial", f"file:{self.console}",
               "-display", "none", "-monitor", f"unix:{self.monitor_path},server=on,wait=off",
               *self.extra]
        self.qemu_log = self.workdir / f"qemu-{self.boots}.log"
        with open(self.qemu_log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        self.timeline: list[tuple[float, str]] = []
        self.pauses: list[tuple[float, float]] = []  # (s since power-on, s) of each pause
        threading.Thread(target=self._note_lines, args=(self.proc, self.console,
                                                        self.timeline), daemon=True).start()

    def _note_lines(self, proc: subprocess.Popen, console: Path,
                    timeline: list[tuple[float, str]]) -> None:
        """(s since power-on, line) of each console line as it appears, to 0.2 s; also in
        console-N.timed beside the console."""
        offset, partial = 0, b""
        while True:
            running = proc.poll() is None
            with contextlib.suppress(OSError), open(console, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset += len(chunk)
                *lines, partial = (partial + chunk).split(b"\n")
                now = time.monotonic() - self.started
                noted = [(now, ANSI.sub("", line.decode(errors="replace"))) for line in lines]
                timeline += noted
                with open(console.with_suffix(".timed"), "a") as timed:
                    timed.writelines(f"{t:7.1f} {line}\n" for t, line in noted)
            if not running:
                return
            time.sleep(0.2)

    def phases(self) -> str:
        """When this boot's console first showed each of MILESTONES, for the test's report."""
        seen = []
        for name, pattern in MILESTONES.items():
            at = next((t for t, line in self.timeline if re.search(pattern, line)), None)
            if at is not None:
                seen.append(f"{name} {at:.0f} s")
        return ", ".join(seen)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        try:
            return ANSI.sub("", self.console.read_text(errors="replace"))
        except OSError:
            return ""

    def wait_for(self, pattern: str, timeout: float = PI_BOOT_TIMEOUT, start: int = 0
                 ) -> re.Match:
        """Until ``pattern`` (a regex) is on this boot's console after offset ``start``."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.compile(pattern).search(self.text(), start)
            if found:
                return found
            if not self.alive():
                raise AssertionError(f"QEMU exited ({self.proc.returncode}) before "
                                     f"{pattern!r}:\n{self.text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n"
                                     f"{self.text()[-4000:]}")
            time.sleep(0.2)

    def monitor(self, command: str, timeout: float = 60) -> str:
        """Run an HMP command on the running machine; its answer."""
        deadline = time.monotonic() + timeout
        while not self.monitor_path.exists():  # QEMU makes the socket as it starts
            assert self.alive() and time.monotonic() < deadline, "no QEMU monitor"
            time.sleep(0.1)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.monitor_path))
            _read_to_prompt(sock)  # the banner
            sock.sendall(command.encode() + b"\n")
            answer = _read_to_prompt(sock)
        # the command echoed as typed (a line redrawn key by key), the answer, the next prompt
        _, _, rest = answer.partition("\n")
        rest = rest.removesuffix("(qemu) ").replace("\r", "").strip()
        assert not rest.startswith("Error"), f"{command}: {rest}"
        return rest

    def snapshot(self, number: int, dest: Path) -> Path:
        """Partition ``number`` as a power cut now would leave it: the machine paused (QEMU
        completes the writes in flight first), the partition's data copied (holes stay
        holes), the machine resumed."""
        part = partitions(self.card)[number - 1]
        paused = time.monotonic()
        self.monitor("stop")
        try:
            copy_range(self.card, part["start"] * 512, part["size"] * 512, dest)
        finally:
            self.monitor("cont")
            self.pauses.append((paused - self.started, time.monotonic() - paused))
        return dest

    def since_power_on(self, guest_seconds: float, offset: float) -> float:
        """A guest clock reading as seconds since this boot's power-on, given the ``offset``
        between the two before the first pause: the guest's clocks stand still while the
        machine is paused."""
        at = guest_seconds + offset
        for start, length in self.pauses:
            if start < at:
                at += length
        return at

    def kill(self) -> None:
        """Power cut."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def close(self) -> None:
        self.kill()


def _read_to_prompt(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"(qemu) "):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def copy_range(source: Path, offset: int, size: int, dest: Path) -> None:
    """Bytes offset..offset+size of ``source`` into ``dest``, reading only its data (SEEK_DATA),
    so a mostly empty 7 GB partition copies in a second."""
    with open(source, "rb") as src, open(dest, "wb") as out:
        out.truncate(size)
        at, end = offset, offset + size
        while at < end:
            try:
                at = os.lseek(src.fileno(), at, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past here
                break
            hole = min(os.lseek(src.fileno(), at, os.SEEK_HOLE), end)
            src.seek(at)
            out.seek(at - offset)
            while at < hole:
                chunk = src.read(min(hole - at, 8 << 20))
                out.write(chunk)
                at += len(chunk)


def tools_missing() -> str | None:
    for tool in ("qemu-system-aarch64", "mcopy", "sfdisk", "mkfs.ext4"):
        if not shutil.which(tool):
            return tool
    done = subprocess.run(["qemu-system-aarch64", "-machine", "help"], capture_output=True,
                          text=True)
    return None if "raspi3b" in done.stdout else "qemu-system-aarch64 with raspi3b (QEMU 9+)"
