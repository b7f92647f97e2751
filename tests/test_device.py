"""The device as a user meets it: the Debian image of images/debian/build-image.sh, booted in
qemu-system-aarch64 (tests/qemu_device.py), checked from this host over SSH and through the
router's port as an admin reaches it. Run with ``make appliance-test`` (``-m appliance``; as
root: the image build needs mmdebstrap and chroot, the fsck a loop device).

What a QEMU guest cannot show (the Pi firmware's boot, real UART timing, the SD card's own
write cache) is listed in images/README.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from harness.wamp_client import connect, retained_values
from tests import qemu_device

pytestmark = [pytest.mark.appliance]

missing = qemu_device.tools_missing()
if missing or os.geteuid() != 0:
    pytestmark.append(pytest.mark.skip(
        reason=f"{missing} is not installed" if missing else "needs root"))


@pytest.fixture(scope="module")
def device(image, tmp_path_factory):
    """One device for the module: first boot (data partition, host keys, the switch to the
    read-only root and its reboot), then ready."""
    img, boot = image
    guest = qemu_device.Guest(img, boot, tmp_path_factory.mktemp("device"))
    guest.start()
    took = guest.wait_ready()
    print(f"\n[appliance] first boot to cairn-router ready (incl. its reboot): {took:.0f} s")
    yield guest
    guest.close()


def http_get(port: int, path: str, timeout: float = 30) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


# -- first boot and the appliance ---------------------------------------------------------------


def test_first_boot_puts_the_store_on_its_own_noatime_partition(device):
    """Partition 4, after the boot partition and root slots A and B: /data, with the store
    bound on /var/lib/cairn and the device's config on /etc/cairn."""
    done = device.ssh("lsblk -no LABEL /dev/vda4; for m in /data /var/lib/cairn /etc/cairn; "
                      "do findmnt -no SOURCE,FSTYPE,OPTIONS $m; done")
    label, data, store, etc = done.stdout.strip().split("\n")
    assert label.strip() == "cairn-data"
    for mount, source in ((data, "/dev/vda4"), (store, "/dev/vda4[/cairn]"),
                          (etc, "/dev/vda4[/etc/cairn]")):
        found, fstype, options = mount.split()
        assert found == source and fstype == "ext4", done.stdout
        assert {"noatime", "commit=60"} <= set(options.split(",")), options


def test_root_is_read_only_and_the_journal_lives_in_ram(device):
    done = device.ssh("findmnt -no FSTYPE /; findmnt -no OPTIONS /media/root-ro; "
                      "journalctl --header -q | grep 'File path'")
    lines = done.stdout.split("\n")
    assert lines[0] == "overlay"
    assert "ro" in lines[1].split(","), lines[1]   # the card's root, underneath
    # and no unit failed on the way (systemd-remount-fs cannot remount an overlay on trixie)
    failed = device.ssh("systemctl --failed --no-legend --plain").stdout
    assert failed.strip() == "", failed
    # Debian ships /var/log/journal, but with Storage=volatile every journal file is in RAM
    paths = re.findall(r"File path: (\S+)", done.stdout)
    assert paths and all(p.startswith("/run/log/journal/") for p in paths), paths


def test_a_write_to_the_root_is_gone_after_a_reboot_but_the_store_and_config_are_not(device):
    # each write must succeed: the overlay is writable (in RAM), the data partition too
    device.ssh("echo x | sudo tee /etc/written-on-overlay && "
               "echo x | sudo tee /etc/cairn/written-on-data-partition && "
               "sudo -u cairn touch /var/lib/cairn/written-on-data-partition && sync")
    boot_id = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    device.ssh("sudo systemctl --no-block reboot")
    device.wait_ready(after_boot=boot_id)   # QEMU restarts the guest itself
    done = device.ssh("sudo ls /etc/written-on-overlay /etc/cairn/written-on-data-partition "
                      "/var/lib/cairn/written-on-data-partition 2>&1 || true")
    lines = done.stdout.strip().split("\n")
    assert re.search(r"written-on-overlay'?: No such file", lines[0]), done.stdout
    assert lines[1:] == ["/etc/cairn/written-on-data-partition",
                         "/var/lib/cairn/written-on-data-partition"], done.stdout
    device.ssh("sudo rm /etc/cairn/written-on-data-partition")


def test_router_is_up_by_its_own_readiness_and_runs_under_the_watchdog(device):
    done = device.ssh("systemctl show cairn-router.service -p ActiveState -p SubState "
                      "-p Type -p WatchdogUSec -p NRestarts -p User")
    props = dict(line.split("=", 1) for line in done.stdout.split())
    assert props["ActiveState"] == "active" and props["SubState"] == "running", props
    assert props["Type"] == "notify" and props["WatchdogUSec"] == "30s", props
    assert props["NRestarts"] == "0" and props["User"] == "cairn", props


def test_dashboard_and_metrics_answer_through_an_ssh_tunnel(device):
    with device.tunnel() as port:
        status, page = http_get(port, "/")
        assert status == 200 and "<html" in page.lower()
        status, metrics = http_get(port, "/metrics")
        assert status == 200
        assert re.search(r"^cairn_sessions(\{[^}]*\})? \d+", metrics, re.M), metrics[:500]


def test_the_shipped_config_keeps_the_router_off_the_lan(device):
    """QEMU forwards a host port to the guest's 8080 on its LAN address: with the shipped
    /etc/cairn/cairn.toml (loopback only) nothing answers there."""
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        http_get(device.http_port, "/", timeout=15)


def test_cairn_doctor_passes_on_the_device(device):
    done = device.ssh("sudo -u cairn cairn doctor --config /etc/cairn/cairn.toml", check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ssh_accepts_keys_only(device):
    done = subprocess.run(
        ["ssh", "-p", str(device.ssh_port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
         "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,"
         "keyboard-interactive", "-o", "ConnectTimeout=10", "admin@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 255
    assert "Permission denied (publickey)" in done.stderr, done.stderr


def test_each_device_makes_its_own_ssh_host_keys(device, image):
    """The image carries no SSH host keys (every card flashed from it would share them);
    the device made its own on first boot, on its data partition (not in a slot, which an
    update replaces), and sshd presents them."""
    with qemu_device.partition_device(image[0], 2) as root:
        listing = subprocess.run(["debugfs", "-R", "ls /etc/ssh", root], capture_output=True,
                                 text=True, check=True).stdout
    assert "sshd_config" in listing and "ssh_host_" not in listing, listing
    done = device.ssh("sudo cat /data/etc/ssh/ssh_host_ed25519_key.pub; "
                      "ssh-keyscan -t ed25519 127.0.0.1 2>/dev/null")
    kept, presented = [line for line in done.stdout.strip().split("\n")
                       if not line.startswith("#")]
    assert kept.split()[1] == presented.split()[2], done.stdout


# -- a sensor on a serial line ---------------------------------------------------------------

SENSOR_CONFIG = """[driver]
router = "rawsocket+unix:/run/cairn/wamp.sock"
realm = "realm1"

[[sensors]]
id = "uart-1"
kind = "line"
port = "/dev/ttyS0"
baudrate = 9600
"""


async def _sensor_readings(port: int, pty: str, count: int) -> tuple[list[dict], dict]:
    """Play a $THS sensor on the host end of the guest's second UART, one sentence every
    0.5 s (the sensor's own pace), until ``count`` readings reached a WAMP session on the
    host; then what a new session gets retained."""
    import tty

    from cairn.drivers.line import ths_sentence
    session = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
    got: list[dict] = []
    enough = asyncio.Event()

    def on_reading(*args, **kwargs):
        got.append(kwargs)
        if len(got) >= count:
            enough.set()

    await session.subscribe(on_reading, "sensor.uart-1")
    fd = os.open(pty, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    try:
        seq = 0
        deadline = time.monotonic() + 180
        while not enough.is_set():
            assert time.monotonic() < deadline, f"only {len(got)} readings arrived"
            seq += 1
            sentence = ths_sentence("uart-1", seq, 20 + seq / 10, 40 + seq / 10)
            os.write(fd, f"{sentence}\r\n".encode())  # the sensor ends each line with CR LF
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(enough.wait(), 0.5)
    finally:
        os.close(fd)
    session.leave()
    late = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
    retained: asyncio.Future = asyncio.get_running_loop().create_future()
    await late.subscribe(lambda *a, **kw: retained.done() or retained.set_result(kw),
                         "sensor.uart-1", options=SubscribeOptions(get_retained=True))
    last = await asyncio.wait_for(retained, 30)
    late.leave()
    return got, last


def test_a_serial_sensor_on_the_second_uart_reaches_a_host_client_retained(device):
    device.ssh(f"printf '%s' '{SENSOR_CONFIG}' | sudo tee /etc/cairn/sensors/uart.toml "
               "> /dev/null && sudo systemctl start cairn-sensor@uart.service")
    try:
        with device.tunnel() as port:
            got, last = asyncio.run(_sensor_readings(port, device.serial_pty, count=5))
        temps = [r["temperature"] for r in got]
        assert len(temps) >= 5
        # each reading is the sentence the host wrote (t = 20 + seq/10), in order
        assert temps == sorted(temps) and all(20 < t < 40 for t in temps), temps
        assert last["temperature"] >= temps[-1], (last, temps)
        state = device.ssh("systemctl is-active cairn-sensor@uart.service").stdout.strip()
        assert state == "active"
    finally:
        device.ssh("sudo systemctl stop cairn-sensor@uart.service", check=False)


# -- a bad payload --------------------------------------------------------------------------


def test_a_damaged_payload_is_refused_and_the_running_version_left_alone(device):
    (tarball,) = (qemu_device.WORK / "payload").glob("cairn-payload-*.tar.gz")
    before = device.ssh("readlink /opt/cairn; systemctl show -p MainPID --value cairn-router"
                        ).stdout.split()
    with open(tarball, "rb") as f:
        device.ssh_stdin("rm -rf /tmp/p && mkdir /tmp/p && tar -xzf - -C /tmp/p "
                         "--strip-components=1", f)
    # one byte of the wheel changed, as a bad download or a bad card would
    device.ssh("w=$(ls /tmp/p/wheels/cairn-*.whl) && printf X | "
               "dd of=\"$w\" bs=1 seek=100 conv=notrunc status=none")
    done = device.ssh("sudo /tmp/p/install.sh", check=False)
    assert done.returncode == 1
    assert "payload damaged (SHA256SUMS)" in done.stdout + done.stderr, done
    after = device.ssh("readlink /opt/cairn; systemctl show -p MainPID --value cairn-router; "
                       "systemctl is-active cairn-router").stdout.split()
    assert after[:2] == before and after[2] == "active", (before, after)



# -- system updates: RAUC bundles into the other slot, kept only when healthy ----------------


def _reboot(device: qemu_device.Guest) -> float:
    """Reboots and waits until the router is ready again; returns the seconds it took."""
    boot_id = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    device.ssh("sudo systemctl --no-block reboot")
    return device.wait_ready(after_boot=boot_id)


def _booted_slot(device: qemu_device.Guest) -> str:
    return re.search(r"rauc\.slot=(\w+)", device.ssh("cat /proc/cmdline").stdout).group(1)


def _update_status(device: qemu_device.Guest) -> dict:
    return json.loads(device.ssh("sudo cairn update status --json").stdout)


def _settled(device: qemu_device.Guest, timeout: float = 300) -> dict:
    """The update status once the health gate has settled this boot (cairn-health done)."""
    device.ssh(f"timeout {timeout:.0f} sh -c 'until systemctl show -p ActiveState --value "
               "cairn-health | grep -qx active; do sleep 2; done'", timeout=timeout + 60)
    return _update_status(device)


@pytest.fixture(scope="module")
def bundles(image, tmp_path_factory) -> SimpleNamespace:
    """``built``: the test image's own bundle (build-image.sh signs it with the test CA, which
    the image trusts); ``make(version, edits, files)``: a bundle of a copy of its root file
    system changed by debugfs commands (``{files}`` in them is where ``files`` are
    written), signed by the same CA."""
    img, _ = image
    rootfs = img.with_name(img.name.removesuffix(".img") + ".rootfs.ext4")
    work = tmp_path_factory.mktemp("bundles")

    ca = qemu_device.make_ca(qemu_device.WORK / "ca", "Cairn test updates")

    def make(version: str, edits: list[str] = (), files: dict[str, str] | None = None) -> Path:
        content = work / version
        content.mkdir()
        shutil.copy(rootfs, content / "rootfs.ext4")
        for name, text in (files or {}).items():
            (work / name).write_text(text)
        if edits:
            script = work / f"{version}.debugfs"
            script.write_text("\n".join(e.format(files=work) for e in edits) + "\n")
            subprocess.run(["debugfs", "-w", "-f", str(script), str(content / "rootfs.ext4")],
                           capture_output=True, check=True)
        (content / "manifest.raucm").write_text(
            f"[update]\ncompatible=cairn-debian-arm64\nversion={version}\n\n"
            "[bundle]\nformat=verity\n\n[image.rootfs]\nfilename=rootfs.ext4\n")
        out = work / f"cairn-{version}.raucb"
        subprocess.run(["rauc", "bundle", f"--cert={ca['cert']}", f"--key={ca['key']}",
                        str(content), str(out)], capture_output=True, check=True)
        shutil.rmtree(content)
        return out

    built = img.with_name(img.name.removesuffix(".img") + ".raucb")
    return SimpleNamespace(make=make, work=work, ca=ca, built=built, rootfs=rootfs)


def test_the_image_and_the_bundle_of_one_build_name_the_same_versions(image):
    """The .img's manifest and the .raucb's (as RAUC reads it, signature checked) name the
    same Cairn version and build, and the bundle carries the very root file system of the
    image's slot A."""
    img, _ = image
    prefix = img.with_name(img.name.removesuffix(".img"))
    manifest = json.loads(prefix.with_name(prefix.name + ".manifest.json").read_text())
    keyring = qemu_device.WORK / "ca" / "ca.cert.pem"
    done = subprocess.run(["rauc", "info", f"--keyring={keyring}", "--output-format=json",
                           str(prefix.with_name(prefix.name + ".raucb"))],
                          capture_output=True, text=True, check=True)
    bundle = json.loads(done.stdout)
    assert bundle["version"] == manifest["cairn"]["version"]
    assert bundle["build"] == manifest["build"] and bundle["compatible"] == manifest["compatible"]
    (rootfs,) = [entry["rootfs"] for entry in bundle["images"]]
    assert rootfs["checksum"] == manifest["rootfs"]["sha256"]


def _install(device: qemu_device.Guest, bundle: Path) -> subprocess.CompletedProcess:
    with open(bundle, "rb") as f:
        device.ssh_stdin("sudo sh -c 'cat > /data/incoming.raucb'", f)
    try:
        return device.ssh("sudo cairn update install /data/incoming.raucb", check=False,
                          timeout=1800)
    finally:
        device.ssh("sudo rm -f /data/incoming.raucb", check=False)


def test_a_good_update_boots_the_other_slot_on_trial_and_keeps_data_and_config(device,
                                                                                 bundles):
    """A→B: the bundle is written into the slot that is not running, boots on trial, is
    marked good by the health gate; the store, /etc/cairn and the configured sensor come
    along. (The tests below install into A from B.)"""
    assert _booted_slot(device) == "A"
    with device.tunnel() as port:
        assert asyncio.run(_publish_and_read_retained(port, 1)) == 1
    device.ssh("echo kept | sudo tee /etc/cairn/site-note > /dev/null")
    newer = bundles.make("9.0.0+newer", files={"marker": "the newer build\n"},
                         edits=["write {files}/marker /etc/cairn-build-marker"])
    print(f"\n[appliance] bundle: {newer.stat().st_size / 2**20:.0f} MiB")
    started = time.monotonic()
    done = _install(device, newer)
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"[appliance] install (copy and rauc install): {time.monotonic() - started:.0f} s")
    status = _update_status(device)
    assert status["primary"] == "rootfs.1" and status["trial"]["slot"] == "B", status

    took = _reboot(device)
    print(f"[appliance] reboot into the new slot, router ready: {took:.0f} s")
    assert _booted_slot(device) == "B"
    status = _settled(device)
    assert status["last"]["result"] == "ok" and status["last"]["version"] == "9.0.0+newer", status
    assert status["slots"]["B"]["boot_status"] == "good", status
    assert device.ssh("cat /etc/cairn-build-marker").stdout == "the newer build\n"
    assert device.ssh("cat /etc/cairn/site-note").stdout == "kept\n"
    # the sensor configured earlier (tests above) runs in the new slot too: its config is kept
    assert device.ssh("systemctl is-active cairn-sensor@uart").stdout.strip() == "active"
    with device.tunnel() as port:
        assert asyncio.run(_publish_and_read_retained(port, None)) == 1   # the data came along
        assert asyncio.run(_publish_and_read_retained(port, 2)) == 2
        metrics = http_get(port, "/metrics")[1]
    assert 'cairn_system_slot_info{slot="B"} 1' in metrics, metrics[-800:]
    assert 'cairn_update_last_failed{version="9.0.0+newer"} 0' in metrics, metrics[-800:]



def _newer_schema_module(rootfs: Path, out: Path) -> str:
    """The store's schema.py of the image's Cairn, one schema version newer (one more
    migration); returns its path in the slot."""
    listing = subprocess.run(["debugfs", "-R", "ls -p /opt", str(rootfs)], capture_output=True,
                             text=True, check=True).stdout
    (venv,) = re.findall(r"/(cairn-[^/]+-[0-9a-f]+)/", listing)
    path = f"/opt/{venv}/lib/python3.13/site-packages/cairn/gateway/store/schema.py"
    source = subprocess.run(["debugfs", "-R", f"cat {path}", str(rootfs)], capture_output=True,
                            text=True, check=True).stdout
    version = int(re.search(r"^SCHEMA_VERSION = (\d+)$", source, re.M).group(1))
    out.write_text(source.replace(f"SCHEMA_VERSION = {version}\n",
                                  f"SCHEMA_VERSION = {version + 1}\n")
                   + "\nMIGRATIONS.append('CREATE TABLE a_newer_feature (x)')\n")
    return path


def test_a_bad_update_that_migrated_the_store_goes_back_with_every_reading(device, bundles):
    """The new slot's router migrates the store, then never becomes ready (a step after its
    start fails): the health gate marks the slot bad and reboots; the old slot serves again,
    no command typed, on the copy of the store the migration kept, with every reading
    acknowledged before the update; status and doctor say what happened."""
    before = _booted_slot(device)
    with device.tunnel() as port:
        assert asyncio.run(_publish_and_read_retained(port, 3)) == 3
    schema_path = _newer_schema_module(bundles.rootfs, bundles.work / "schema.py")
    bad = bundles.make(
        "9.1.0+broken",
        files={"broken.conf": "[Service]\nExecStartPost=/bin/false\n",
               "fast.conf": "[Service]\nEnvironment=CAIRN_HEALTH_TIMEOUT=60\n"},
        edits=[f"rm {schema_path}", f"write {{files}}/schema.py {schema_path}",
               "mkdir /usr/lib/systemd/system/cairn-router.service.d",
               "write {files}/broken.conf /usr/lib/systemd/system/cairn-router.service.d/"
               "broken.conf",
               "mkdir /usr/lib/systemd/system/cairn-health.service.d",
               "write {files}/fast.conf /usr/lib/systemd/system/cairn-health.service.d/fast.conf"])
    done = _install(device, bad)
    assert done.returncode == 0, done.stdout + done.stderr
    started = time.monotonic()
    _reboot(device)     # ready again only on the old slot: the new one's router never is
    print(f"\n[appliance] bad update: old slot serving again {time.monotonic() - started:.0f} s "
          f"after the reboot into the new one")
    assert _booted_slot(device) == before
    status = _settled(device)
    last = status["last"]
    assert last["result"] == "failed" and last["version"] == "9.1.0+broken", status
    assert "cairn-router" in last["reason"], last
    other = "B" if before == "A" else "A"
    assert status["slots"][other]["boot_status"] == "bad", status
    doctor = device.ssh("sudo -u cairn cairn doctor --config /etc/cairn/cairn.toml").stdout
    assert re.search(r"warn\s+system update\s+running slot \w; last update 9.1.0\+broken was "
                     r"not kept .*cairn-router", doctor), doctor
    # the newer release did migrate the store: its file is set aside, the old one back
    files = device.ssh("sudo ls /var/lib/cairn").stdout.split()
    assert any(f.endswith(".rolled-back") for f in files), files
    with device.tunnel() as port:
        assert asyncio.run(_publish_and_read_retained(port, None)) == 3


def test_a_slot_whose_kernel_never_reaches_user_space_is_given_up_by_boot_counting(device,
                                                                                    bundles):
    """The new slot's initramfs is garbage: its kernel finds no root (its disk driver is in
    the initramfs), gives up after rootwait=30, panics and restarts the board (panic=10) at
    every try; after its three tries U-Boot boots the old slot, where the health gate
    records the failure. Nothing on the device ran the new slot's user space."""
    before = _booted_slot(device)
    bad = bundles.make("9.2.0+no-boot", files={"garbage": "not an initramfs\n" * 1000},
                       edits=["rm /boot/initrd.img", "write {files}/garbage /boot/initrd.img"])
    done = _install(device, bad)
    assert done.returncode == 0, done.stdout + done.stderr
    boots = device.console.read_text(errors="replace").count("cairn: booting slot")
    started = time.monotonic()
    _reboot(device)
    print(f"\n[appliance] kernel that never boots: old slot serving again "
          f"{time.monotonic() - started:.0f} s after the reboot")
    assert _booted_slot(device) == before
    chosen = re.findall(r"cairn: booting slot (\w)", device.console.read_text(errors="replace"))
    other = "B" if before == "A" else "A"
    assert chosen[boots:] == [other, other, other, before], chosen[boots:]
    last = _settled(device)["last"]
    assert last["result"] == "failed" and last["version"] == "9.2.0+no-boot", last
    assert "never reached user space" in last["reason"], last


def test_a_tampered_bundle_and_one_signed_by_another_key_are_refused(device, bundles):
    """Nothing changes: the same slot stays primary, no trial is started."""
    tampered = bundles.work / "tampered.raucb"
    data = bytearray(bundles.built.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    other = qemu_device.make_ca(bundles.work / "other-ca", "Someone else")
    foreign = bundles.work / "foreign.raucb"    # the same bundle, signed by someone else
    subprocess.run(["rauc", "resign", f"--cert={other['cert']}", f"--key={other['key']}",
                    f"--keyring={bundles.ca['keyring']}", str(bundles.built), str(foreign)],
                   capture_output=True, check=True)
    before = _update_status(device)
    for bundle in (tampered, foreign):
        done = _install(device, bundle)
        assert done.returncode != 0, done.stdout
        assert "cairn update:" in done.stderr, done.stderr
        after = _update_status(device)
        assert after["primary"] == before["primary"] and after["trial"] is None, after
        assert after["booted"] == before["booted"]
        # and the refusal is the last update's result, with RAUC's reason
        assert after["last"]["result"] == "failed", after
        assert after["last"]["version"] == bundle.name, after
        assert "not installed" in after["last"]["reason"], after


async def _publish_and_read_retained(port: int, value: int | None) -> int:
    """Publish ``value`` retained to sensor.upgrade (unless None); then the retained value a
    new session gets."""
    router = SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port)
    if value is not None:
        session = await connect(router)
        await session.publish("sensor.upgrade", value,
                              options=PublishOptions(acknowledge=True, retain=True))
        session.leave()
    session = await connect(router)
    retained = await retained_values(session, "sensor.upgrade")
    session.leave()
    return retained["sensor.upgrade"]

# -- power cuts ----------------------------------------------------------------------------

CYCLES = int(os.environ.get("CAIRN_POWER_CUTS", "3"))


async def _publish_until_cut(port: int, guest: qemu_device.Guest, cycle: int,
                             acked_before_cut: int = 12, in_flight: int = 8) -> set[int]:
    """Acknowledged, retained publishes from a host autobahn client, ``in_flight`` at a
    time; the power is cut (QEMU SIGKILLed) once ``acked_before_cut`` have been
    acknowledged, with the rest still in flight. Returns what was acknowledged."""
    session = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
    acked: set[int] = set()
    cut = asyncio.Event()

    async def one(n: int) -> None:
        await session.publish("sensor.powercut", temperature=20 + n / 100, cycle=cycle, n=n,
                              options=PublishOptions(acknowledge=True, retain=True))
        if not cut.is_set():
            acked.add(n)

    tasks: set[asyncio.Task] = set()
    n = 0
    while len(acked) < acked_before_cut:
        while len(tasks) < in_flight:
            tasks.add(asyncio.ensure_future(one(n)))
            n += 1
        done, tasks = await asyncio.wait(tasks, timeout=120,
                                         return_when=asyncio.FIRST_COMPLETED)
        assert done, "no acknowledgement in 120 s"
        for t in done:
            t.result()
    # A commit window acknowledges a whole batch at once: send a fresh batch, let the event
    # loop write it out, and cut the power while it waits for its commit.
    while len(tasks) < in_flight:
        tasks.add(asyncio.ensure_future(one(n)))
        n += 1
    await asyncio.sleep(0)
    cut.set()
    guest.kill()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return acked


async def _stored(port: int) -> tuple[list[tuple[int, int]], dict]:
    session = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
    sub = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
    result = await session.call("wamp.subscription.get_events", sub, topic="sensor.powercut",
                                limit=1000)
    events = result.results[0]   # (the result carries is_limit_reached in its kwargs)
    assert not result.kwresults["is_limit_reached"]
    retained: asyncio.Future = asyncio.get_running_loop().create_future()

    def on_event(*args, **kwargs):
        if not retained.done():
            retained.set_result(kwargs)

    await session.subscribe(on_event, "sensor.powercut",
                            options=SubscribeOptions(get_retained=True))
    last = await asyncio.wait_for(retained, 30)
    session.leave()
    return [(e["kwargs"]["cycle"], e["kwargs"]["n"]) for e in events], last


def test_acknowledged_readings_survive_power_cuts(device):
    device_log = []
    all_acked: set[tuple[int, int]] = set()
    for cycle in range(CYCLES):
        with device.tunnel() as port:
            acked = asyncio.run(_publish_until_cut(port, device, cycle))
        all_acked |= {(cycle, n) for n in acked}
        device.start()
        took = device.wait_ready()
        device_log.append(round(took))
        with device.tunnel() as port:
            stored, retained = asyncio.run(_stored(port))
        missing = all_acked - set(stored)
        assert not missing, f"cycle {cycle}: acknowledged but lost: {sorted(missing)}"
        # the retained reading is the newest stored one, never older than an acknowledged one
        assert (retained["cycle"], retained["n"]) == max(stored), (retained, max(stored))
        check = device.ssh(
            "sudo -u cairn python3 -c 'import sqlite3; print(\"integrity\", sqlite3.connect("
            "\"file:/var/lib/cairn/cairn.db?mode=ro\", uri=True)"
            ".execute(\"PRAGMA integrity_check\").fetchone()[0])'; "
            "journalctl -b 0 -q -o cat -u 'systemd-fsck@*' | grep cairn-data")
        assert "integrity ok" in check.stdout, check.stdout
        # the boot's own fsck (fstab pass 2) replayed the journal and found it clean
        assert re.search(r"cairn-data: clean", check.stdout), check.stdout
        assert "UNEXPECTED INCONSISTENCY" not in check.stdout
    print(f"\n[appliance] {CYCLES} power cuts; boot to ready after each: {device_log} s; "
          f"{len(all_acked)} acknowledged readings, all kept")
    # A clean shutdown, then the data partition checked from the host: clean.
    device.poweroff()
    with qemu_device.partition_device(device.disk, 4) as dev:
        fsck = subprocess.run(["e2fsck", "-fn", dev], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    device.start()
    device.wait_ready()
