"""A/B system updates on the device as a user meets them: the Debian image booted in QEMU
under U-Boot (qemu_device.py), RAUC bundles built here from the image's own root file
system (signed by the test CA the image trusts, or changed to fail in a chosen way), copied
in over SSH and installed with ``cairn update install``, or pulled from a central side on
this host. The device is the one test_device.py checked (one first boot for both); in
order: power cuts at three points of an install, a good update A→B pulled over a link that
drops, a bad one and one that never boots (each back on B by itself), refused bundles, and a
clean shutdown at the end. Run with ``make appliance-test``.

The boot chooser itself is tested in U-Boot alone (test_boot_chooser.py), the health
gate's and the pull's logic on this host (tests/system/test_update.py, test_update_pull.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from harness.central import Central
from harness.wamp_client import connect, retained_values
from tests.appliance import qemu_device

pytestmark = qemu_device.appliance_marks()


@pytest.fixture(scope="module")
def device(appliance_device):
    return appliance_device


# -- system updates: RAUC bundles into the other slot, kept only when healthy ----------------


def _reboot(device: qemu_device.Guest) -> float:
    """Reboots and waits until the router is ready again; returns the seconds it took."""
    boot_id = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    device.ssh("sudo systemctl --no-block reboot")
    return device.wait_ready(after_boot=boot_id)


def _wait_for_reboot(device: qemu_device.Guest, boot_id: str, timeout: float = 900) -> float:
    """Until the device has rebooted by itself and its router is ready again."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            now = device.ssh("cat /proc/sys/kernel/random/boot_id", check=False, timeout=30)
        except subprocess.TimeoutExpired:
            break
        if now.returncode != 0 or now.stdout.strip() != boot_id:
            break
        time.sleep(5)
    return device.wait_ready(after_boot=boot_id) + (time.monotonic() - started)


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
    the image trusts); ``make(version, edits, files, hook)``: a bundle of a copy of its root
    file system changed by debugfs commands (``{files}`` in them is where ``files`` are
    written), with ``hook`` as its slot-post-install hook, signed by the same CA. Made with
    zstd at level 1 (4 s instead of 35 s for the gzip of the image's own bundle)."""
    img, _ = image
    rootfs = img.with_name(img.name.removesuffix(".img") + ".rootfs.ext4")
    work = tmp_path_factory.mktemp("bundles")

    ca = qemu_device.make_ca(qemu_device.WORK / "ca", "Cairn test updates")

    def make(version: str, edits: list[str] = (), files: dict[str, str] | None = None,
             hook: str | None = None) -> Path:
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
        hooks = ""
        if hook:
            (content / "hook.sh").write_text(hook)
            (content / "hook.sh").chmod(0o755)
            hooks = "[hooks]\nfilename=hook.sh\n\n"
        (content / "manifest.raucm").write_text(
            f"[update]\ncompatible=cairn-debian-arm64\nversion={version}\n\n"
            f"[bundle]\nformat=verity\n\n{hooks}[image.rootfs]\nfilename=rootfs.ext4\n"
            + ("hooks=post-install\n" if hook else ""))
        out = work / f"cairn-{version}.raucb"
        subprocess.run(["rauc", "bundle", f"--cert={ca['cert']}", f"--key={ca['key']}",
                        "--mksquashfs-args=-comp zstd -Xcompression-level 1",
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


def test_the_image_carries_debians_updates_published_after_its_cached_base(image):
    """The base root file system is cached by its package list; each build upgrades it from
    trixie, -updates and -security, and its manifest lists what that changed, each at the
    version the image holds (an empty list when the base is as new as the archive)."""
    img, _ = image
    prefix = img.with_name(img.name.removesuffix(".img"))
    manifest = json.loads(prefix.with_name(prefix.name + ".manifest.json").read_text())
    installed = {p["name"]: p["version"] for p in manifest["packages"]}
    assert isinstance(manifest["debian_updates"], list)
    for update in manifest["debian_updates"]:
        assert installed.get(update["name"]) == update["to"], update
    log = (qemu_device.WORK.parent / "debian-test-build.log").read_text()
    assert "Debian's updates since the base was built" in log


def _usb_stick(bundle: Path, name: str) -> Path:
    """A FAT-formatted stick image holding ``bundle`` as ``name`` at its top."""
    stick = bundle.with_name(f"{name}.stick")
    size_kib = bundle.stat().st_size // 1024 + 64 * 1024
    subprocess.run(["mkfs.vfat", "-C", "-n", "STICK", str(stick), str(size_kib)],
                   capture_output=True, check=True)
    subprocess.run(["mcopy", "-i", str(stick), str(bundle), f"::{name}"], check=True)
    return stick


def _usb_log(device: qemu_device.Guest) -> str:
    """What cairn update usb said in this boot."""
    return device.ssh("journalctl -b -o cat -u 'cairn-update-usb@*'", check=False).stdout


def _install(device: qemu_device.Guest, bundle: Path) -> subprocess.CompletedProcess:
    with open(bundle, "rb") as f:
        device.ssh_stdin("sudo sh -c 'cat > /data/incoming.raucb'", f)
    try:
        return device.ssh("sudo cairn update install /data/incoming.raucb", check=False,
                          timeout=1800)
    finally:
        device.ssh("sudo rm -f /data/incoming.raucb", check=False)


# -- power cuts during an install: the running slot and every reading stay ----------------

# A test bundle's slot hook: RAUC runs it once the slot is written and switches slots only
# after it returns, so the power cut "just before the switch" comes while it waits here.
HOLD_BEFORE_SWITCH = """#!/bin/sh
[ "$1" = slot-post-install ] || exit 0
echo "cairn-test: slot $RAUC_SLOT_BOOTNAME written, switch pending" > /dev/console
exec sleep 900
"""
CUT_POINTS = ("early", "mid-write", "before the switch")
MID_WRITE_S = 8   # into the copy of the 667 MiB root file system (about 30 s in the guest)


class InstallUntil:
    """``rauc install`` in the guest, its progress read as it comes (``lines``);
    ``reached`` is set at ``point`` of the install: early (RAUC checks the bundle),
    mid-write (some seconds into the copy), before the switch (the slot hook says the
    slot is written)."""

    def __init__(self, device: qemu_device.Guest, bundle: str, point: str) -> None:
        self.device, self.point = device, point
        self.reached = threading.Event()
        self.lines: list[str] = []
        console = device.console.read_text(errors="replace")
        self.console_seen = len(console)
        self.proc = subprocess.Popen(
            device.ssh_command() + [f"sudo stdbuf -oL rauc install {bundle}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if self.point == "early" and "Checking bundle" in line:
                break
            if "Copying image to" in line and "done" not in line:
                if self.point == "mid-write":
                    time.sleep(MID_WRITE_S)
                    break
                if self.point == "before the switch" and self._console_says("switch pending"):
                    break
        else:
            return   # the install ended (or failed) before the point: reached stays unset
        self.reached.set()

    def _console_says(self, what: str, timeout: float = 300) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what in self.device.console.read_text(errors="replace")[self.console_seen:]:
                return True
            time.sleep(0.2)
        return False


async def _publish_until_cut(port: int, guest: qemu_device.Guest, cycle: int,
                             start_install: Callable[[], InstallUntil], pace: float = 0.5,
                             in_flight: int = 8) -> tuple[InstallUntil, set[int]]:
    """Acknowledged, retained publishes from a host autobahn client, one every ``pace``
    seconds (at most ``in_flight`` unanswered), from the join on; the install is started
    once the client has joined (a join through the tunnel into a busy guest can take long)
    and, once it reached its point, a batch of ``in_flight`` goes at once and the power is
    cut (QEMU SIGKILLed) while it waits for its commit. Returns the install and what was
    acknowledged."""
    session = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
    install = start_install()
    cut_when = install.reached
    acked: set[int] = set()
    cut = asyncio.Event()

    async def one(n: int) -> None:
        await session.publish("sensor.powercut", temperature=20 + n / 100, cycle=cycle, n=n,
                              options=PublishOptions(acknowledge=True, retain=True))
        if not cut.is_set():
            acked.add(n)

    tasks: set[asyncio.Task] = set()
    n, last_ack = 0, time.monotonic()
    while not (acked and cut_when.is_set()):
        if len(tasks) < in_flight:
            tasks.add(asyncio.ensure_future(one(n)))
            n += 1
        done, tasks = await asyncio.wait(tasks, timeout=pace)
        for t in done:
            t.result()
            last_ack = time.monotonic()
        assert time.monotonic() - last_ack < 120, "no acknowledgement in 120 s"
    # A commit window acknowledges a whole batch at once: send a fresh batch, let the event
    # loop write it out, and cut the power while it waits for its commit.
    for _ in range(in_flight):
        tasks.add(asyncio.ensure_future(one(n)))
        n += 1
    await asyncio.sleep(0)
    cut.set()
    guest.kill()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return install, acked


async def _stored(port: int) -> tuple[list[tuple[int, int]], dict]:
    """Every sensor.powercut reading in the store's history, and the retained one."""
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


def _store_and_card_are_clean(device: qemu_device.Guest) -> None:
    check = device.ssh(
        "sudo -u cairn python3 -c 'import sqlite3; print(\"integrity\", sqlite3.connect("
        "\"file:/var/lib/cairn/cairn.db?mode=ro\", uri=True)"
        ".execute(\"PRAGMA integrity_check\").fetchone()[0])'; "
        "journalctl -b 0 -q -o cat -u 'systemd-fsck@*' | grep cairn-data")
    assert "integrity ok" in check.stdout, check.stdout
    # the boot's own fsck (fstab pass 2) replayed the journal and found it clean
    assert re.search(r"cairn-data: clean", check.stdout), check.stdout
    assert "UNEXPECTED INCONSISTENCY" not in check.stdout


def test_power_cuts_during_an_install_keep_the_running_slot_and_every_reading(device,
                                                                            bundles):
    """The power is cut three times while a bundle is installed and readings are published:
    early (RAUC checking the bundle), mid-write, and just before the slot switch (the slot
    written, held there by the bundle's own slot hook). Each time the old slot boots with
    every acknowledged reading, nothing on trial, the store and the data partition clean;
    the cut-off install is recorded as such (not as the version's failure). The next install
    succeeds (the test after this one)."""
    cut = bundles.make("8.9.0+cut", hook=HOLD_BEFORE_SWITCH)
    with open(cut, "rb") as f:
        device.ssh_stdin("sudo sh -c 'cat > /data/cut.raucb && sync'", f)
    slot = _booted_slot(device)
    all_acked: set[tuple[int, int]] = set()
    boots = []
    for cycle, point in enumerate(CUT_POINTS):
        with device.tunnel() as port:
            start = functools.partial(InstallUntil, device, "/data/cut.raucb", point)
            install, acked = asyncio.run(_publish_until_cut(port, device, cycle, start))
        assert install.reached.is_set(), (point, install.lines)
        all_acked |= {(cycle, n) for n in acked}
        device.start()
        boots.append(round(device.wait_ready()))
        assert _booted_slot(device) == slot, point
        status = _settled(device)
        assert status["booted"] == slot and status["trial"] is None, status
        assert status["installing"] is None, status
        if point != "early":   # the install had begun (RAUC's pre-install handler ran)
            assert status["last"]["result"] == "interrupted", status
            assert status["last"]["version"] == "8.9.0+cut", status
            other = "B" if slot == "A" else "A"
            assert status["slots"][other]["boot_status"] == "bad", status
        with device.tunnel() as port:
            stored, retained = asyncio.run(_stored(port))
        missing = all_acked - set(stored)
        assert not missing, f"cut {point}: acknowledged but lost: {sorted(missing)}"
        # the retained reading is the newest stored one, never older than an acknowledged one
        assert (retained["cycle"], retained["n"]) == max(stored), (retained, max(stored))
        _store_and_card_are_clean(device)
    device.ssh("sudo rm -f /data/cut.raucb")
    print(f"\n[appliance] power cuts during an install ({', '.join(CUT_POINTS)}): boot to "
          f"ready after each {boots} s; {len(all_acked)} acknowledged readings, all kept")


class SensorOnTheLine:
    """A THS sensor on the host end of the guest's second UART, a sentence every 0.5 s until
    ``stop``, whatever the guest does meanwhile (a reboot: what QEMU cannot pass on waits in
    the pty, or is dropped when that is full)."""

    def __init__(self, pty: str) -> None:
        import tty

        self.fd = os.open(pty, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        tty.setraw(self.fd)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from cairn.drivers.line import ths_sentence

        seq = 0
        while not self.stopped.wait(0.5):
            seq += 1
            with contextlib.suppress(BlockingIOError):
                os.write(self.fd, f"{ths_sentence('uart-1', seq, 21.5, 40.0)}\r\n".encode())

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        os.close(self.fd)


def _readings_by_boot(device: qemu_device.Guest, topic: str) -> list[tuple[str, float, float]]:
    """(boot id, first, last receipt by the wall clock, s) of the stored history of
    ``topic``, one per boot in seq order, read from the device's store."""
    query = ("SELECT boot_id, min(wall_ms), max(wall_ms) FROM publications WHERE topic = ? "
             "GROUP BY boot_id ORDER BY min(seq)")
    script = ("import json, sqlite3, sys; db = sqlite3.connect('file:/var/lib/cairn/cairn.db"
              f"?mode=ro', uri=True); print(json.dumps(db.execute({query!r}, "
              "(sys.argv[1],)).fetchall()))")
    rows = json.loads(device.ssh(f'sudo python3 -c "{script}" {topic}').stdout)
    return [(boot, first / 1000, last / 1000) for boot, first, last in rows]


def test_a_good_update_pulled_from_the_central_side_resumes_after_the_link_drops(device,
                                                                                 bundles):
    """A→B the way an online device updates: [update] source names the central side (a
    server on this host, reached through QEMU's guestfwd). Halfway through the bundle the
    network cable is pulled (QEMU's set_link) for longer than [update] timeout, then put
    back: the next check resumes the download where it stopped; the bundle is checked and
    written into the slot that is not running, the device reboots into it on trial, the
    health gate marks it good; the store, /etc/cairn and the configured sensor come along,
    and the device finds itself up to date. (The tests below install into A from B.)"""
    assert _booted_slot(device) == "A"
    with device.tunnel() as port:
        assert asyncio.run(_publish_and_read_retained(port, 1)) == 1
    device.ssh("echo kept | sudo tee /etc/cairn/site-note > /dev/null && "
               f"printf '%s' '{qemu_device.SERIAL_SENSOR_CONFIG}' | "
               "sudo tee /etc/cairn/sensors/uart.toml > /dev/null && "
               "sudo systemctl start cairn-sensor@uart")
    sensor = SensorOnTheLine(device.serial_pty)   # reads all through the update
    pulled = bundles.make("9.3.0+pulled", files={"marker": "the newer build\n"},
                          edits=["write {files}/marker /etc/cairn-build-marker"])
    central = Central(port=device.host_services[qemu_device.CENTRAL])
    try:
        name = central.offer("9.3.0+pulled", pulled.read_bytes())
        size = pulled.stat().st_size
        print(f"\n[appliance] bundle: {size / 2**20:.0f} MiB")
        boot_id = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        config = (f'\n[update]\nsource = "http://{qemu_device.CENTRAL}/{{gateway_id}}/"\n'
                  "timeout = 10\ninterval = 20\n")
        device.ssh(f"printf '%s' '{config}' | sudo tee -a /etc/cairn/cairn.toml > /dev/null "
                   "&& sudo systemctl restart cairn-update-pull")
        deadline = time.monotonic() + 600
        while central.sent < size // 2:
            assert time.monotonic() < deadline, f"{central.sent} of {size} bytes in 600 s"
            time.sleep(0.2)
        device.monitor("set_link nic off")
        time.sleep(25)   # [update] timeout is 10 s: the download gives up
        device.monitor("set_link nic on")
        took = _wait_for_reboot(device, boot_id)
        print(f"[appliance] pulled update: from the cable back to the new slot ready: "
              f"{took:.0f} s")
        assert _booted_slot(device) == "B"
        status = _settled(device)
        assert status["last"]["result"] == "ok", status
        assert status["last"]["version"] == "9.3.0+pulled", status
        assert status["slots"]["B"]["boot_status"] == "good", status
        downloads = [wanted for file, wanted, _ in central.requests if file == name]
        # the first GET from the start, a later one from where the first stopped
        assert downloads[0] is None and len(downloads) >= 2, central.requests
        resumed_at = int(downloads[-1].removeprefix("bytes=").split("-")[0])
        assert 0 < resumed_at < size, downloads
        print(f"[appliance] the download resumed at {resumed_at / 2**20:.0f} of "
              f"{size / 2**20:.0f} MiB")
        assert device.ssh("cat /etc/cairn-build-marker").stdout == "the newer build\n"
        assert device.ssh("cat /etc/cairn/site-note").stdout == "kept\n"
        # the sensor configured before the update runs in the new slot: its config is kept
        # (it may still be starting: the health gate waits for the router, not for it)
        started = device.ssh("timeout 120 sh -c 'until systemctl is-active -q "
                             "cairn-sensor@uart; do sleep 1; done'", check=False)
        assert started.returncode == 0, device.ssh(
            "systemctl status --no-pager cairn-sensor@uart; journalctl --no-pager -b "
            "-u cairn-sensor@uart | tail -n 30", check=False).stdout
        with device.tunnel() as port:
            assert asyncio.run(_publish_and_read_retained(port, None)) == 1  # the data came
            assert asyncio.run(_publish_and_read_retained(port, 2)) == 2
            metrics = qemu_device.http_get(port, "/metrics")[1]
        assert 'cairn_system_slot_info{slot="B"} 1' in metrics, metrics[-800:]
        assert 'cairn_update_last_failed{version="9.3.0+pulled"} 0' in metrics, metrics[-800:]
        device.ssh("timeout 180 sh -c 'until journalctl -b 0 -u cairn-update-pull -o cat "
                   "| grep -q \"up to date (9.3.0+pulled)\"; do sleep 2; done'", timeout=240)
        new_boot = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        deadline = time.monotonic() + 300
        while (readings := _readings_by_boot(device, "sensor.uart-1") or [("", 0, 0)]
               )[-1][0] != new_boot:
            assert time.monotonic() < deadline, (readings, device.ssh(
                "journalctl -b 0 -u cairn-sensor@uart -o cat | tail -20", check=False).stdout)
            time.sleep(5)
        assert len(readings) >= 2 and readings[-2][0] == boot_id, (boot_id, readings)
        (_, _, old_last), (_, new_first, _) = readings[-2:]
        print(f"[appliance] the router's downtime in the update: {new_first - old_last:.1f} s "
              "from the sensor's last reading stored before it to the first after")
        assert new_first > old_last
    finally:
        sensor.stop()
        central.close()
        device.ssh("sudo sed -i '/^\\[update\\]$/,$d' /etc/cairn/cairn.toml", check=False)


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
    # it comes on a USB stick: installed and rebooted into by the device itself
    stick = _usb_stick(bad, "CAIRN-9.1.0.RAUCB")
    boot_id = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    started = time.monotonic()
    device.plug_usb_stick(stick)
    try:
        # ready again only on the old slot: the new one's router never is
        _wait_for_reboot(device, boot_id, timeout=1800)
        print(f"\n[appliance] bad update from a USB stick: old slot serving again "
              f"{time.monotonic() - started:.0f} s after the stick went in")
        _check_bad_update_undone(device, before)
        # the stick is still in: this boot saw it and left the failed version alone
        deadline = time.monotonic() + 300
        while "was tried and not kept" not in (log := _usb_log(device)):
            assert time.monotonic() < deadline, log
            time.sleep(5)
        assert _booted_slot(device) == before
    finally:
        device.unplug_usb_stick()


def _check_bad_update_undone(device: qemu_device.Guest, before: str) -> None:
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
    the initramfs), gives up after rootwait (10 s here), panics and restarts the board
    (panic=1 here) at every try; after its three tries U-Boot boots the old slot, where the
    health gate records the failure. Nothing on the device ran the new slot's user space."""
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
    """Nothing changes: the same slot stays primary, no trial is started; whether the bundle
    was copied to the device or came on a USB stick."""
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
    # and on a USB stick: the same refusal, recorded, and no reboot. Of a version that is
    # neither running nor failed before (a stick of the running one is left alone): its
    # signed manifest reads well, its root file system does not
    on_stick = bundles.make("9.4.0+tampered")
    data = bytearray(on_stick.read_bytes())
    data[len(data) // 2] ^= 0xFF
    on_stick.write_bytes(bytes(data))
    boot_id = device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    device.plug_usb_stick(_usb_stick(on_stick, "cairn-tampered.raucb"), "tampered")
    try:
        deadline = time.monotonic() + 300
        # the status answers while RAUC is busy with the stick's install too, from Cairn's
        # records ("rauc": "busy: installing"); RAUC's own slot details come after it
        while ((after := _update_status(device))["rauc"] != "ok"
               or (after["last"] or {}).get("version") != "9.4.0+tampered"):
            assert time.monotonic() < deadline, (after, _usb_log(device))
            time.sleep(5)
    finally:
        device.unplug_usb_stick("tampered")
    assert "not installed" in after["last"]["reason"], after
    assert after["primary"] == before["primary"] and after["trial"] is None, after
    assert device.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip() == boot_id


def test_after_all_this_a_clean_shutdown_leaves_the_data_partition_clean(device):
    """Power cuts, updates and rollbacks later: a clean shutdown, then the data partition
    checked from this host (e2fsck -f) finds nothing to fix."""
    device.poweroff()
    with qemu_device.partition_device(device.disk, 4) as dev:
        fsck = subprocess.run(["e2fsck", "-fn", dev], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


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
