"""The device as a user meets it: the Debian image of images/debian/build-image.sh, booted in
qemu-system-aarch64 (qemu_device.py), checked from this host over SSH and through the
router's port as an admin reaches it. Run with ``make appliance-test`` (``-m appliance``; as
root: the image build needs mmdebstrap and chroot, the fsck a loop device).

The same device then goes through system updates and power cuts (test_device_update.py).
What a QEMU guest cannot show (the Pi firmware's boot, real UART timing, the SD card's own
write cache) is listed in images/README.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import SubscribeOptions

from harness.wamp_client import connect
from tests.appliance import qemu_device

pytestmark = qemu_device.appliance_marks()


@pytest.fixture(scope="module")
def device(appliance_device):
    return appliance_device


http_get = qemu_device.http_get


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


def test_a_write_to_the_root_goes_to_ram_and_the_store_and_config_to_the_data_partition(device):
    """What a reboot keeps, read from the mounts instead of waiting for one (the pulled
    update in test_device_update.py reboots, and finds /etc/cairn and the store kept): a
    write to the root lands in the overlay's upper layer, a tmpfs, and not on the card's
    root below it; writes to /etc/cairn and /var/lib/cairn land on the data partition."""
    # each write must succeed: the overlay is writable (in RAM), the data partition too
    device.ssh("echo x | sudo tee /etc/written-on-overlay > /dev/null && "
               "echo x | sudo tee /etc/cairn/written-on-data-partition > /dev/null && "
               "sudo -u cairn touch /var/lib/cairn/written-on-data-partition")
    try:
        options = device.ssh("findmnt -no OPTIONS /").stdout.strip().split(",")
        layers = dict(o.split("=", 1) for o in options if "=" in o)
        upper, lower = layers["upperdir"], layers["lowerdir"]
        done = device.ssh(
            f"findmnt -no FSTYPE -T {upper}; findmnt -no SOURCE,OPTIONS -T {lower}; "
            f"for f in etc/written-on-overlay etc/cairn/written-on-data-partition; do "
            f"sudo test -e {upper}/$f && echo $f in RAM; "
            f"sudo test -e {lower}/$f && echo $f on the root; done; "
            # (as root: the store's directory is the cairn user's alone)
            "sudo findmnt -no SOURCE -T /etc/cairn/written-on-data-partition; "
            "sudo findmnt -no SOURCE -T /var/lib/cairn/written-on-data-partition")
        upper_fs, lower_mount, *where = done.stdout.strip().split("\n")
        assert upper_fs == "tmpfs", done.stdout
        lower_source, lower_options = lower_mount.split()
        assert lower_source.startswith("/dev/vda") and "ro" in lower_options.split(","), \
            done.stdout
        assert where == ["etc/written-on-overlay in RAM", "/dev/vda4[/etc/cairn]",
                         "/dev/vda4[/cairn]"], done.stdout
    finally:
        device.ssh("sudo rm -f /etc/written-on-overlay /etc/cairn/written-on-data-partition "
                   "/var/lib/cairn/written-on-data-partition", check=False)


# -- personalised from the boot partition (issue: provisioning without SSH) -------------------

PROVISIONED = qemu_device.PROVISIONED


def test_the_card_was_personalised_from_its_boot_partition_and_the_inputs_removed(device):
    """The image has no SSH key and ships the default config: what the device runs came from
    the cairn/ folder written to its FAT before the first boot. The folder keeps only U-Boot's
    files and the report; the report names what was applied and no secret."""
    listing = device.ssh("sudo ls -A /boot/firmware/cairn").stdout.split()
    assert set(listing) <= {"bootargs.env", "report.txt", "README.txt"}, listing
    # nothing writes the FAT on a normal boot
    assert _mount_options(device, "/boot/firmware")[0] == "ro"
    report = device.ssh("sudo cat /boot/firmware/cairn/report.txt").stdout
    for name in ("authorized_keys", *PROVISIONED):
        assert name in report, (name, report)
    assert qemu_device.ADMIN_SECRET not in report and "correct horse" not in report, report
    assert device.ssh("hostname").stdout.strip() == "pump-station-7"
    secret = device.ssh("sudo stat -c '%a %G' /etc/cairn/secrets/admin").stdout.split()
    assert secret == ["640", "cairn"], secret
    on_data = device.ssh("findmnt -no SOURCE -T /etc/cairn/cairn.toml").stdout.strip()
    assert on_data == "/dev/vda4[/etc/cairn]", on_data
    assert "cairn.admin" in device.ssh("cat /etc/cairn/cairn.toml").stdout


def test_ssh_takes_the_provisioned_key_and_no_other(device, tmp_path):
    other = tmp_path / "other-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    done = subprocess.run(
        ["ssh", "-p", str(device.ssh_port), "-i", str(other), "-o", "IdentitiesOnly=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "admin@127.0.0.1", "true"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 255 and "Permission denied (publickey)" in done.stderr, done


def test_network_profiles_from_the_card_are_loaded_by_networkmanager_and_wired_dhcp_is_up(
        device):
    """No radio here: NetworkManager has loaded the Wi-Fi and cellular profiles (the cellular
    one metered), and the wired link the tests reach the device by is its DHCP default."""
    profiles = device.ssh("nmcli -t -f NAME,TYPE,FILENAME connection show").stdout
    by_type = {line.split(":")[1]: line for line in profiles.splitlines()}
    assert "802-11-wireless" in by_type and "gsm" in by_type, profiles
    for line in (by_type["802-11-wireless"], by_type["gsm"]):
        assert "/etc/NetworkManager/system-connections/" in line, profiles
    gsm = by_type["gsm"].split(":")[0]
    settings = device.ssh(f"nmcli -g connection.metered,gsm.apn connection show '{gsm}'")
    assert settings.stdout.split() == ["yes", "iot.example"], settings.stdout
    wired = device.ssh("nmcli -t -f TYPE,STATE device").stdout
    assert "ethernet:connected" in wired, wired
    # the profiles are device settings, on the data partition
    assert device.ssh("sudo ls /data/etc/NetworkManager/system-connections").stdout.strip()


def _router_status(port: int) -> dict:
    async def call() -> dict:
        session = await connect(SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port))
        try:
            return await session.call("cairn.router.status")
        finally:
            session.leave()
    return asyncio.run(call())


def test_a_broken_config_on_the_boot_partition_is_refused_and_the_router_runs_on(device):
    """A card taken out, a cairn.toml that is not TOML put in its cairn/ folder: nothing of
    the folder is applied, the router keeps routing on the configuration it had, and the
    report (on the FAT) and the router's status (what the dashboard shows) say why."""
    pid = device.ssh("systemctl show -p MainPID --value cairn-router").stdout.strip()
    device.ssh("sudo mount -o remount,rw /boot/firmware "
               "&& printf 'listen = [oops\\n' "
               "| sudo tee /boot/firmware/cairn/cairn.toml >/dev/null "
               "&& echo other-name | sudo tee /boot/firmware/cairn/hostname >/dev/null "
               "&& sudo mount -o remount,ro /boot/firmware "
               "&& sudo systemctl restart cairn-provision")
    try:
        report = device.ssh("sudo cat /boot/firmware/cairn/report.txt").stdout
        assert "cairn.toml" in report and "nothing was applied" in report.lower(), report
        # provisioning made the FAT writable for its report, and read-only again
        assert _mount_options(device, "/boot/firmware")[0] == "ro"
        assert device.ssh("hostname").stdout.strip() == "pump-station-7"
        after = device.ssh("systemctl show -p MainPID --value cairn-router; "
                           "systemctl is-active cairn-router").stdout.split()
        assert after == [pid, "active"], after
        with device.tunnel() as port:
            status = _router_status(port)
        problem = json.dumps(status.get("provisioning"))
        assert "cairn.toml" in problem, status
    finally:
        device.ssh("sudo mount -o remount,rw /boot/firmware "
                   "&& sudo rm -f /boot/firmware/cairn/cairn.toml /boot/firmware/cairn/hostname "
                   "&& sudo mount -o remount,ro /boot/firmware "
                   "&& sudo systemctl restart cairn-provision")


def _mount_options(device, path: str) -> list[str]:
    return device.ssh(f"findmnt -no OPTIONS {path}").stdout.strip().split(",")


async def _call(port: int, procedure: str, *args, admin: bool = True):
    router = SimpleNamespace(ws_url=f"ws://127.0.0.1:{port}/ws", port=port)
    who = ({"authmethods": ["ticket"], "authid": "admin", "secret": qemu_device.ADMIN_SECRET}
           if admin else {})
    session = await connect(router, **who)
    try:
        return await session.call(procedure, *args)
    finally:
        session.leave()


def _change_settled(port: int, request: int) -> dict | None:
    """The history's record of the change a WAMP request asked for, once it has ended."""
    try:
        got = asyncio.run(_call(port, "cairn.admin.config.get"))
    except Exception:   # the router is restarting
        return None
    change = next((c for c in got["changes"] if c["request"] == request), None)
    return None if change is None or change["state"] == "pending" else {**change, "get": got}


def test_a_config_applied_over_wamp_that_cannot_start_is_rolled_back_by_itself(device):
    """The provisioned admin changes the config over WAMP to one the router cannot start on
    (a listener on port 81: the router's user may not bind below 1024). The device carries it
    out (cairn-config-apply.path), the router does not come back ready on it, and the last
    good configuration is back by itself, the change's history saying why. The anonymous
    local role, whose permission covers every URI, may not call it."""
    with device.tunnel() as port:
        with pytest.raises(ApplicationError) as refused:
            asyncio.run(_call(port, "cairn.admin.config.get", admin=False))
        assert refused.value.error == "wamp.error.not_authorized"
        text = asyncio.run(_call(port, "cairn.admin.config.get"))["text"]
        bad = text.replace('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:81"')
        assert bad != text
        answer = asyncio.run(_call(port, "cairn.admin.config.apply", bad))
        assert answer["state"] == "pending" and answer["action"] == "restart", answer
        started = time.monotonic()
        deadline = started + 600
        while (change := _change_settled(port, answer["request"])) is None:
            assert time.monotonic() < deadline, device.ssh(
                "sudo journalctl -b -o cat -u cairn-config-apply -u cairn-router | tail -40",
                check=False).stdout
            time.sleep(5)
    print(f"\n[appliance] a config the router cannot start on: rolled back "
          f"{time.monotonic() - started:.0f} s after the WAMP call")
    # the author is the request file's owner (the router's user), for the session it names
    assert change["state"] == "rolled_back", change
    assert change["by"] == "cairn for admin@realm1 over WAMP", change
    assert "81" in change["reason"], change
    got = change["get"]
    assert got["running"] == "file" and not got["problem"], got
    assert got["text"] == text
    # restarted on it: active once its ExecStartPost (the last good one marked) is done
    device.ssh("timeout 120 sh -c 'until systemctl is-active -q cairn-router; do sleep 1; done'")


def test_router_is_up_by_its_own_readiness_and_runs_under_the_watchdog(device):
    done = device.ssh("systemctl show cairn-router.service -p ActiveState -p SubState "
                      "-p Type -p WatchdogUSec -p NRestarts -p User")
    props = dict(line.split("=", 1) for line in done.stdout.split())
    assert props["ActiveState"] == "active" and props["SubState"] == "running", props
    assert props["Type"] == "notify" and props["WatchdogUSec"] == "30s", props
    assert props["NRestarts"] == "0" and props["User"] == "cairn", props


def test_systemd_feeds_the_hardware_watchdog(device):
    """PID 1 armed the board's watchdog (QEMU's i6300esb here; loaded in the initramfs) and
    feeds it: a system that hangs is reset by it."""
    done = device.ssh("systemctl show -p RuntimeWatchdogUSec -p WatchdogLastPingTimestampMonotonic;"
                      " ls /dev/watchdog0")
    props = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
    assert props["RuntimeWatchdogUSec"] == "2min", props
    assert int(props["WatchdogLastPingTimestampMonotonic"]) > 0, props


def test_the_boot_state_is_in_raw_sectors_of_the_card_and_rauc_reads_and_writes_it(device):
    """RAUC's fw_env.config, written at boot for this card, names the two raw copies (no file
    on the FAT); the health gate's mark-good gave slot A its tries back through it, and the
    console said the router was ready."""
    config = device.ssh("cat /etc/fw_env.config").stdout
    assert "/dev/vda 0x800000 0x4000" in config and "/dev/vda 0x1000000 0x4000" in config
    state = device.ssh("sudo fw_printenv BOOT_ORDER BOOT_A_LEFT").stdout.split("\n")
    assert state[:2] == ["BOOT_ORDER=A B", "BOOT_A_LEFT=3"], state
    assert "cairn: ready: router ready, store open" in device.console_tail(chars=10_000_000)


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
    """The sensor's config came with the card (PROVISIONED: sensors/uart.toml): its driver
    runs from boot."""
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
