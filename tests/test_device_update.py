"""A/B system updates on the device as a user meets them: the Debian image booted in QEMU
under U-Boot (tests/qemu_device.py), RAUC bundles built here from the image's own root file
system (signed by the test CA the image trusts, or changed to fail in a chosen way), copied
in over SSH and installed with ``cairn update install``. Run with ``make appliance-test``.

The boot chooser itself is tested in U-Boot alone (tests/test_boot_chooser.py), the health
gate's and the pull's logic on this host (tests/test_update.py, tests/test_update_pull.py)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from autobahn.wamp.types import PublishOptions

from harness.wamp_client import connect, retained_values
from tests import qemu_device

pytestmark = qemu_device.appliance_marks()


@pytest.fixture(scope="module")
def device(image, tmp_path_factory):
    yield from qemu_device.booted(image, tmp_path_factory.mktemp("device"))


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
    device.ssh("echo kept | sudo tee /etc/cairn/site-note > /dev/null && "
               f"printf '%s' '{qemu_device.SERIAL_SENSOR_CONFIG}' | "
               "sudo tee /etc/cairn/sensors/uart.toml > /dev/null")
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
    # the sensor configured before the update runs in the new slot: its config is kept
    assert device.ssh("systemctl is-active cairn-sensor@uart").stdout.strip() == "active"
    with device.tunnel() as port:
        assert asyncio.run(_publish_and_read_retained(port, None)) == 1   # the data came along
        assert asyncio.run(_publish_and_read_retained(port, 2)) == 2
        metrics = qemu_device.http_get(port, "/metrics")[1]
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
                    f"--keyring={bundles.ca['keyring']}",   # the bundle as it was signed
                    f"--signing-keyring={other['keyring']}",   # and as it is now
                    str(bundles.built), str(foreign)],
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
        assert after["last"]["version"] == "incoming.raucb", after   # the file it was given
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
