"""The card users flash, booted the way a Raspberry Pi 3 boots it (QEMU's raspi3b:
qemu_pi.py): the card's own u-boot-rpi runs the boot chooser, slot A's kernel and
initrd start with the card's Pi 3 device tree, the initramfs finds the root on the Pi's SD
host, the first boot makes the data partition, and the router becomes ready, which the
image says on the serial console.

The card is provisioned as a user would: a sensors file in the FAT's cairn/ folder naming
two I2C chips that sit on the Pi's bus 1 (QEMU's tmp105, which Linux's lm75 hwmon driver
reads, and its dps310, an IIO driver) and one address where nothing answers. Their readings
reach the store through the kernel's own drivers, a temperature the host sets shows up there,
and the missing chip is the device's status. The store is read from the card while the
board runs (paused for the copy, as a power cut at that instant would leave it).

Then what the card holds after a power cut, and a slot B whose kernel never reaches user
space, which the Pi's U-Boot leaves for slot A by itself. The boot partition is what it was
flashed with, but for the provisioning boot's report: nothing writes the FAT on a normal
boot. One card for the module: a boot of it costs minutes under TCG."""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

from tests.appliance import boot_state, qemu_device, qemu_pi
from tests.appliance.qemu_device import partition_device, partitions

pytestmark = qemu_device.appliance_marks()
if qemu_pi.tools_missing():
    pytestmark = [pytest.mark.appliance, pytest.mark.skip(reason=qemu_pi.tools_missing())]

READY = r"cairn: ready: router ready, store open, no driver failed \(slot (\w), " \
        r"history to seq (\d+), (\d+) s since the kernel started\)"


# On bus 1 (GPIO 2/3, Linux's i2c-1): a TMP105 at 0x48 and a DPS310 at 0x77; nothing at 0x49
I2C_CHIPS = ["-device", "tmp105,bus=i2c-bus.1,address=0x48,id=air",
             "-device", "dps310,bus=i2c-bus.1,address=0x77"]
SENSORS = """\
[driver]
router = "rawsocket+unix:/run/cairn/wamp.sock"
realm = "realm1"

[[sensors]]
id = "air"
kind = "hwmon"
device = "1-0048"
chip = "tmp105"
interval = 2

[[sensors]]
id = "baro"
kind = "iio"
device = "1-0077"
chip = "dps310"
interval = 2

[[sensors]]
id = "absent"
kind = "hwmon"
device = "1-0049"
chip = "tmp105"
interval = 2
"""
START_CELSIUS, SET_CELSIUS = 21.5, 30.5  # the TMP105 resolves 0.5 °C at least
STORE_WAIT = 900  # s: from ready, for readings in a copy of the card (TCG; copies ~15 s apart)


@pytest.fixture(scope="module")
def pi(image, tmp_path_factory):
    card = qemu_pi.PiCard(image[0], tmp_path_factory.mktemp("pi3"), extra=I2C_CHIPS)
    card.flashed = fat_files(card)
    card.write_boot_file("cairn/sensors/i2c.toml", SENSORS.encode())
    yield card
    card.close()


def fat_sha256(card: qemu_pi.PiCard) -> str:
    part = partitions(card.card)[0]
    with open(card.card, "rb") as f:
        f.seek(part["start"] * 512)
        return hashlib.sha256(f.read(part["size"] * 512)).hexdigest()


def fat_files(card: qemu_pi.PiCard) -> dict[str, str]:
    """Each file of the card's FAT (its path there) and the SHA-256 of its content."""
    into = card.workdir / f"fat-{time.monotonic_ns()}"
    into.mkdir()
    subprocess.run(["mcopy", "-s", "-n", "-i", card._fat(), "::*", str(into)], check=True,
                   capture_output=True)
    return {str(path.relative_to(into)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(into.rglob("*")) if path.is_file()}


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
    # what the TMP105 measures, set by the host (QEMU's property is in m°C)
    pi.monitor(f"qom-set /machine/peripheral/air temperature {START_CELSIUS * 1000:.0f}")
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


# -- the Pi's I2C sensors, read by the kernel's drivers -----------------------------------------

class StoreCopy:
    """The router's store as a copy of the running card's data partition holds it."""

    def __init__(self, pi: qemu_pi.PiCard) -> None:
        self.pi, self.copies = pi, 0

    def rows(self) -> list[tuple[int, str, float, dict]]:
        """(seq, topic, CLOCK_BOOTTIME s at receipt, fields) of every stored publication."""
        self.copies += 1
        part = self.pi.snapshot(4, self.pi.workdir / "data-copy.ext4")
        store = self.pi.workdir / "store-copy"
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir()
        read_store(part, store)
        db = sqlite3.connect(store / "cairn.db")
        try:
            return [(seq, topic, ns / 1e9, fields(payload)) for seq, topic, ns, payload in
                    db.execute("SELECT seq, topic, boottime_ns, payload FROM publications "
                               "ORDER BY seq")]
        finally:
            db.close()

    def until(self, found, what: str, timeout: float = STORE_WAIT):
        """Copies, ~15 s apart, until ``found(rows)`` gives something; that."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.rows()
            result = found(rows)
            if result:
                return result
            if time.monotonic() > deadline:
                journal = [(topic, f) for _, topic, _, f in rows if "status" in topic]
                raise AssertionError(f"no {what} in the store after {timeout:.0f} s "
                                     f"({self.copies} copies); statuses: {journal[-10:]}\n"
                                     f"{self.pi.text()[-3000:]}")
            time.sleep(15)


def read_store(part: Path, store: Path) -> None:
    """cairn.db and its WAL out of a data partition (a device or a file), its journal
    replayed first, as the next boot's fsck does."""
    fsck = subprocess.run(["e2fsck", "-p", str(part)], capture_output=True, text=True)
    assert fsck.returncode in (0, 1), fsck.stdout + fsck.stderr
    for name in ("cairn.db", "cairn.db-wal"):
        done = subprocess.run(["debugfs", "-R", f"dump /cairn/{name} {store / name}",
                               str(part)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def fields(payload: bytes) -> dict:
    args, kwargs = (msgpack.unpackb(payload) + [[], {}])[:2]
    first = args[0] if args and isinstance(args[0], dict) else {}
    return {**first, **(kwargs or {})}


def readings(rows, topic: str) -> list[tuple[float, dict]]:
    return [(at, f) for _, t, at, f in rows if t == topic]


@pytest.fixture(scope="module")
def store(pi) -> StoreCopy:
    return StoreCopy(pi)


def test_the_pi_s_i2c_chips_are_made_at_boot_and_read_into_the_store(pi, store):
    """sensors/i2c.toml from the card's FAT: the TMP105 (lm75, hwmon) and the DPS310 (IIO)
    are made on bus 1 as root before the driver starts, and their readings are stored, in
    °C and hPa, retained."""
    rows = store.until(lambda rows: readings(rows, "sensor.air") and
                       readings(rows, "sensor.baro") and rows, "readings of both chips")
    (_, air), *_ = readings(rows, "sensor.air")
    (_, baro), *_ = readings(rows, "sensor.baro")
    assert air == {"temperature": START_CELSIUS}, air
    # QEMU's DPS310 measures what its registers hold: about 24.7 °C and 929 hPa
    assert set(baro) == {"temperature", "pressure"}, baro
    assert 20 < baro["temperature"] < 30 and 900 < baro["pressure"] < 960, baro
    print(f"\n[appliance] raspi3b I2C: air {air}, baro {baro}")


def test_a_temperature_the_host_sets_on_the_chip_reaches_the_store(pi, store):
    pi.monitor(f"qom-set /machine/peripheral/air temperature {SET_CELSIUS * 1000:.0f}")
    changed = time.monotonic() - pi.started
    rows = store.until(lambda rows: [r for r in readings(rows, "sensor.air")
                                     if r[1] == {"temperature": SET_CELSIUS}],
                       f"sensor.air reading of {SET_CELSIUS} °C")
    found = time.monotonic() - pi.started
    received = pi.since_power_on(rows[0][0], guest_clock_offset(pi))
    print(f"\n[appliance] raspi3b I2C: host set the TMP105 to {SET_CELSIUS} °C; the router "
          f"received the reading {received - changed:.1f} s later (guest clock mapped through "
          f"the kernel's console timestamps), found stored in a copy {found - changed:.0f} s "
          f"later")
    assert received - changed < 30, (received, changed)


def guest_clock_offset(pi: qemu_pi.PiCard) -> float:
    """Seconds from the guest's CLOCK_BOOTTIME to this boot's seconds since power-on before
    the first pause: the kernel's console lines carry the first, the console's timeline the
    second (each line noted a little after it was written, so the least difference is the
    closest)."""
    first_pause = pi.pauses[0][0] if pi.pauses else float("inf")
    stamped = [(at, float(m.group(1))) for at, line in pi.timeline
               if at < first_pause and (m := re.match(r"\[\s*(\d+\.\d+)\]", line))]
    assert stamped, "no kernel timestamps on the console"
    return min(at - kernel for at, kernel in stamped)


def test_a_chip_that_does_not_answer_is_the_device_s_status_with_the_reason(pi, store):
    def status(rows):
        found = readings(rows, "gateway.device.absent.status")
        return found and found[-1][1]
    last = store.until(status, "status of the absent chip")
    assert last["status"] == "error", last
    assert "1-0049 has no driver bound: its probe failed" in last["reason"], last


def test_after_a_power_cut_the_card_holds_the_routers_rows(pi):
    """The first boot made the data partition; what the router had stored when it said it
    was ready is on the card after the power goes, read from this host."""
    _, last_seq, _ = re.search(READY, pi.ready_console).groups()
    pi.kill()
    parts = partitions(pi.card)
    assert len(parts) == 4, parts
    store = pi.workdir / "store"
    store.mkdir(exist_ok=True)
    pi.fat_after_first_boot = fat_sha256(pi)
    with partition_device(pi.card, 4, read_only=False) as dev:
        label = subprocess.run(["blkid", "-o", "value", "-s", "LABEL", dev],
                               capture_output=True, text=True).stdout.strip()
        assert label == "cairn-data"
        read_store(Path(dev), store)
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


def test_the_provisioning_boot_took_its_file_and_wrote_only_its_report(pi):
    """The first boot moved sensors/i2c.toml off the FAT and wrote cairn/report.txt; every
    other file is the one flashed."""
    pi.kill()
    now = fat_files(pi)
    assert {k: v for k, v in now.items() if k != "cairn/report.txt"} == pi.flashed
    report = pi.read_boot_file("cairn/report.txt").decode()
    assert "sensors/i2c.toml -> /etc/cairn/sensors/i2c.toml" in report, report


def test_nothing_wrote_the_boot_partition(pi):
    """After the provisioning boot: boots, a power cut, resets leave the FAT byte for byte as
    it was (the boot chooser's state is in raw sectors of its own), and fsck finds it
    clean."""
    pi.kill()
    assert fat_sha256(pi) == pi.fat_after_first_boot
    with partition_device(pi.card, 1) as dev:
        fsck = subprocess.run(["fsck.vfat", "-n", dev], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
