"""The appliance: systemd units, udev rules, sysusers/tmpfiles, the image payload and the
pi-gen stage, checked with the real tools (systemd-analyze, systemd-sysusers,
systemd-tmpfiles, udevadm, sfdisk) against throwaway roots, never against this machine's
own /etc.

The units are verified against a temporary root laid out like the device: this machine's
systemd units (Debian 12 ships the same systemd 252 as Raspberry Pi OS bookworm), our units
under /usr/lib/systemd/system, and /opt/cairn/bin/cairn. In the default suite that is this
checkout's console script; the slow test installs the real payload into an overlay of this
machine's root with the stage's own scripts, as pi-gen would, and verifies against that.
"""

from __future__ import annotations

import configparser
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from bench.wear import MOUNT_OPTIONS as WEAR_MOUNT_OPTIONS
from harness.process import free_port

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
IMAGES = ROOT / "images"
STAGE = IMAGES / "pi-gen" / "stage-cairn"
FIRSTBOOT = STAGE / "01-appliance" / "files"
UPDATE = IMAGES / "update"     # the A/B system of the Debian image
CAIRN = Path(sys.executable).with_name("cairn")

UNITS = ["cairn-router.service", "cairn-sensor@.service", "cairn-bridge-mqtt@.service",
         "cairn-sync.service", "cairn-config-apply.path", "cairn-config-apply.service"]
IMAGE_UNITS = ["cairn-data-partition.service", "cairn-readonly-root.service",
               "cairn-overlay-rw.service", "cairn-drivers.service",
               "cairn-device-settings.service", "cairn-health.service",
               "cairn-update-pull.service", "cairn-update-usb@.service",
               "cairn-provision.service", "cairn-device-identity.service",
               "cairn-boot-state.service", "cairn-ready.service"]
# what `systemd-analyze verify` is asked about: templates through an instance, so that
# their specifiers (%i) are expanded as on the device
INSTANCES = {"cairn-sensor@.service": "cairn-sensor@greenhouse.service",
             "cairn-bridge-mqtt@.service": "cairn-bridge-mqtt@local.service",
             "cairn-update-usb@.service": "cairn-update-usb@sda1.service"}
# Exposure ("systemd-analyze security", 0 = locked down .. 10 = unprotected). The router
# must stay well inside "OK" (below 2.0): what it keeps is what it needs (its own network,
# /proc/sys for the boot id, a group-readable data directory for `cairn backup`).
# The sensor driver needs the serial devices and the dialout group on top.
EXPOSURE_LIMITS = {"cairn-router.service": 1.5, "cairn-sensor@.service": 2.0,
                   "cairn-bridge-mqtt@.service": 1.5, "cairn-sync.service": 1.5}

needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed")


def run(*cmd: str | Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=kwargs.pop("timeout", 120), **kwargs)


def unit_file(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values, ...]}} (keys may repeat)."""
    parser = configparser.RawConfigParser(strict=False, delimiters=("=",),
                                          comment_prefixes=("#", ";"), interpolation=None,
                                          dict_type=_MultiDict)
    parser.optionxform = str
    parser.read(SYSTEMD / name if (SYSTEMD / name).exists() else FIRSTBOOT / name)
    return {s: {k: v.split("\n") for k, v in parser[s].items()} for s in parser.sections()}


class _MultiDict(dict):
    def __setitem__(self, key, value):
        if key in self and isinstance(value, list) and isinstance(self[key], list):
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def words(unit: dict, section: str, key: str) -> list[str]:
    return " ".join(unit.get(section, {}).get(key, [])).split()


def fake_device_root(root: Path, cairn: Path | None = None) -> Path:
    """A root for systemd-analyze --root: this machine's units, kill(1) and mount(8), ours
    installed where the payload puts them, and /opt/cairn/bin/cairn."""
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/cairn").mkdir(parents=True)
    shutil.copy2(shutil.which("kill"), root / "usr/bin/kill")
    shutil.copy2(shutil.which("mount"), root / "usr/bin/mount")
    (root / "bin").symlink_to("usr/bin")
    for name in UNITS:
        shutil.copy2(SYSTEMD / name, root / "usr/lib/systemd/system" / name)
    for name in IMAGE_UNITS:
        source = FIRSTBOOT / name if (FIRSTBOOT / name).exists() else UPDATE / name
        shutil.copy2(source, root / "usr/lib/systemd/system" / name)
    for tool in ("cairn-data-partition", "cairn-readonly-root", "cairn-drivers"):
        shutil.copy2(FIRSTBOOT / tool, root / "usr/lib/cairn" / tool)
    for tool in ("cairn-device-settings", "cairn-update-installing", "cairn-update-installed",
                 "cairn-device-identity", "cairn-boot-state"):
        shutil.copy2(UPDATE / tool, root / "usr/lib/cairn" / tool)
    (root / "opt/cairn/bin").mkdir(parents=True)
    shutil.copy2(cairn or (CAIRN if CAIRN.exists() else shutil.which("true")),
                 root / "opt/cairn/bin/cairn")
    return root


def verify(root: Path, unit: str) -> subprocess.CompletedProcess:
    return run("systemd-analyze", "verify", "--man=no", f"--root={root}",
               INSTANCES.get(unit, unit))


def exposure(root: Path, unit: str) -> tuple[float, str]:
    done = run("systemd-analyze", "security", "--offline=yes", "--no-pager", f"--root={root}",
               INSTANCES.get(unit, unit))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert m, done.stdout + done.stderr
    return float(m.group(1)), m.group(2)


# -- units ---------------------------------------------------------------------------------


@needs_systemd_analyze
@pytest.mark.parametrize("unit", UNITS + IMAGE_UNITS)
def test_unit_verifies_without_any_warning(tmp_path, unit):
    root = fake_device_root(tmp_path / "root")
    done = verify(root, unit)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", \
        f"systemd-analyze verify {unit}:\n{done.stdout}{done.stderr}"


@needs_systemd_analyze
def test_verify_is_not_vacuous(tmp_path):
    """The same check on a broken copy of the router's unit does complain."""
    root = fake_device_root(tmp_path / "root")
    path = root / "usr/lib/systemd/system/cairn-router.service"
    path.write_text(path.read_text().replace("ProtectSystem=strict", "ProtectSystem=strickt")
                    .replace("/opt/cairn/bin/cairn router", "/opt/cairn/bin/nothing router"))
    done = verify(root, "cairn-router.service")
    assert "strickt" in done.stderr and "/opt/cairn/bin/nothing" in done.stderr


@needs_systemd_analyze
def test_security_exposure_scores(tmp_path):
    root = fake_device_root(tmp_path / "root")
    scores = {unit: exposure(root, unit) for unit in UNITS + IMAGE_UNITS}
    print("\nsystemd-analyze security --offline=yes (exposure, 0 best .. 10 worst):")
    for unit, (score, verdict) in scores.items():
        print(f"  {unit:<32} {score:>4.1f} {verdict}")
    for unit, limit in EXPOSURE_LIMITS.items():
        assert scores[unit][0] <= limit, f"{unit}: exposure {scores[unit]} above {limit}"


def test_router_unit_is_a_notify_service_that_needs_nothing_but_local_things():
    unit = unit_file("cairn-router.service")
    service = unit["Service"]
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert service["WatchdogSec"] == ["30"] and service["Restart"] == ["on-failure"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["RestartPreventExitStatus"] == ["2"]  # bad config: do not loop
    assert service["User"] == ["cairn"] and service["DynamicUser"] == ["no"]
    assert service["StateDirectory"] == ["cairn"] and service["RuntimeDirectory"] == ["cairn"]
    assert service["RuntimeDirectoryPreserve"] == ["yes"]
    assert service["CapabilityBoundingSet"] == [""]
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "PrivateDevices": "yes", "NoNewPrivileges": "yes",
                       "MemoryDenyWriteExecute": "yes", "LockPersonality": "yes",
                       "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
                       "ProtectKernelLogs": "yes"}.items():
        assert service[key] == [value], key
    assert words(unit, "Service", "RestrictAddressFamilies") == ["AF_UNIX", "AF_INET",
                                                                 "AF_INET6"]
    assert "@system-service" in words(unit, "Service", "SystemCallFilter")
    ordering = {u for key in ("After", "Wants", "Requires", "BindsTo", "Requisite")
                for u in words(unit, "Unit", key)}
    assert not ordering & {"network-online.target", "network.target", "time-sync.target",
                           "time-set.target", "systemd-time-wait-sync.service"}, ordering
    assert words(unit, "Unit", "RequiresMountsFor") == ["/var/lib/cairn"]


def test_drivers_start_after_the_router_but_survive_its_restarts():
    for name in ("cairn-sensor@.service", "cairn-bridge-mqtt@.service"):
        unit = unit_file(name)
        assert "cairn-router.service" in words(unit, "Unit", "After")
        assert "cairn-router.service" in words(unit, "Unit", "Wants")
        for strong in ("Requires", "BindsTo", "PartOf"):  # would stop them with the router
            assert "cairn-router.service" not in words(unit, "Unit", strong), (name, strong)
        assert "network-online.target" not in words(unit, "Unit", "After")
        assert unit["Service"]["User"] == ["cairn"]


def test_sensor_driver_reaches_serial_ports_and_nothing_else():
    unit = unit_file("cairn-sensor@.service")
    service = unit["Service"]
    assert service["SupplementaryGroups"] == ["dialout"]
    assert service["DevicePolicy"] == ["closed"]
    allowed = {value.split()[0]: value.split()[1] for value in service["DeviceAllow"]}
    assert allowed == {"char-ttyUSB": "rw", "char-ttyACM": "rw", "char-ttyAMA": "rw",
                       "char-ttyS": "rw"}
    assert "PrivateDevices" not in service  # it would hide the ports
    assert service["ExecStart"] == [
        "/opt/cairn/bin/cairn sensor run --config /etc/cairn/sensors/%i.toml"]


def test_sensor_driver_s_i2c_chips_are_made_as_root_before_it_and_may_fail():
    service = unit_file("cairn-sensor@.service")["Service"]
    assert service["ProtectKernelTunables"] == ["yes"]  # the driver itself cannot write /sys
    (pre,) = service["ExecStartPre"]
    assert pre.startswith("-+/bin/sh -c "), pre
    assert "exec /opt/cairn/bin/cairn sensor chips --config /etc/cairn/sensors/%i.toml" in pre


def test_sensor_driver_s_chip_step_runs_cairn_only_for_a_file_that_names_a_chip(tmp_path):
    """The unit's own shell line, run here with its paths pointed at a temporary tree."""
    (pre,) = unit_file("cairn-sensor@.service")["Service"]["ExecStartPre"]
    script = pre.removeprefix("-+/bin/sh -c ").strip("'")
    script = script.replace("/etc/cairn/sensors/%i.toml", str(tmp_path / "x.toml"))
    script = script.replace("exec /opt/cairn/bin/cairn", "echo cairn")
    for text, ran in (('[[sensors]]\nid = "a"\nkind = "modbus"\n', ""),
                      ('# chip = "bme280" (a comment)\n', ""),
                      ('[[sensors]]\nid = "b"\nkind = "iio"\n  chip = "bme280"\n',
                       f"cairn sensor chips --config {tmp_path / 'x.toml'}\n")):
        (tmp_path / "x.toml").write_text(text)
        done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)
        assert (done.returncode, done.stdout) == (0, ran), (text, done)


def test_sync_waits_for_the_network():
    unit = unit_file("cairn-sync.service")
    assert "network-online.target" in words(unit, "Unit", "After")
    assert "network-online.target" in words(unit, "Unit", "Wants")
    assert unit["Service"]["StateDirectory"] == ["cairn"]  # sync-status.json, the -shm file


def test_units_and_the_shipped_config_agree():
    """The paths the units create and the ones the device config uses are the same."""
    config = tomllib.loads((IMAGES / "config/cairn.toml").read_text())
    router = unit_file("cairn-router.service")
    assert router["Service"]["ExecStart"] == [
        "/opt/cairn/bin/cairn router --config /etc/cairn/cairn.toml"]
    assert config["router"]["data_dir"] == "/var/lib/" + router["Service"]["StateDirectory"][0]
    sockets = [e for e in config["router"]["rawsocket"] if e.startswith("unix:")]
    assert sockets == ["unix:/run/cairn/wamp.sock"]
    assert Path(sockets[0][5:]).parent == Path("/run") / router["Service"]["RuntimeDirectory"][0]
    host = config["router"]["listen"].rpartition(":")[0]
    assert host.startswith("127."), "the shipped config must not open the router to the LAN"
    for sample in ("sensors/example.toml.sample", "mqtt/example.toml.sample"):
        driver = tomllib.loads((IMAGES / "config" / sample).read_text())["driver"]
        assert driver["router"] == f"rawsocket+{sockets[0]}"
    for name in UNITS:
        if name.endswith(".service"):
            for line in unit_file(name)["Service"]["ExecStart"]:
                assert line.lstrip("-+@:!").startswith("/opt/cairn/bin/cairn "), line


def test_sysusers_and_tmpfiles_apply_to_an_empty_root(tmp_path):
    if not shutil.which("systemd-sysusers") or not shutil.which("systemd-tmpfiles"):
        pytest.skip("systemd-sysusers/systemd-tmpfiles are not installed")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/group").write_text("root:x:0:\ndialout:x:20:\n")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    done = run("systemd-sysusers", f"--root={root}", SYSTEMD / "cairn.sysusers.conf")
    assert done.returncode == 0, done.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in
              (root / "etc/passwd").read_text().splitlines()}
    assert passwd["cairn"][6] == "/usr/sbin/nologin"
    assert int(passwd["cairn"][2]) < 1000, "a system user"
    groups = {line.split(":")[0]: line.split(":") for line in
              (root / "etc/group").read_text().splitlines()}
    assert groups["dialout"][3] == "cairn" and groups["dialout"][2] == "20"
    done = run("systemd-tmpfiles", f"--root={root}", "--create",
               SYSTEMD / "cairn.tmpfiles.conf")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    secrets = root / "etc/cairn/secrets"
    assert secrets.stat().st_mode & 0o777 == 0o750
    assert secrets.stat().st_gid == int(groups["cairn"][2])
    for sub in ("sensors", "mqtt"):
        assert (root / "etc/cairn" / sub).is_dir()


# -- udev ----------------------------------------------------------------------------------


def test_udev_rules_parse_without_complaint(tmp_path):
    """udevadm test, run in a private mount namespace over tmpfs copies of /etc/udev/rules.d,
    /run and /dev, so that nothing of this machine is touched; any line of its output about
    our file (other than reading it) is a parse problem."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("udevadm") \
            or not Path("/sys/class/tty/tty1").exists():
        pytest.skip("needs root, unshare, udevadm and /sys/class/tty/tty1")
    script = tmp_path / "check.sh"
    script.write_text("set -e\nfor d in /etc/udev/rules.d /run /dev; do mount -t tmpfs none "
                      "$d; done\nmkdir -p /run/udev\ncp \"$1\" /etc/udev/rules.d/\n"
                      "udevadm test --action=add /sys/class/tty/tty1 2>&1\n")
    done = run("unshare", "-m", "sh", script, SYSTEMD / "99-cairn-serial.rules")
    if done.returncode != 0 and "Operation not permitted" in done.stdout + done.stderr:
        pytest.skip("cannot mount in a new namespace here")
    assert "99-cairn-serial.rules" in done.stdout, done.stdout + done.stderr
    complaints = [line for line in done.stdout.splitlines()
                  if "99-cairn-serial.rules" in line and not line.startswith("Reading rules")]
    assert not complaints, complaints


def test_udev_rules_name_every_adapter_kind_and_set_the_serial_group():
    rules = (SYSTEMD / "99-cairn-serial.rules").read_text()
    active = [line for line in rules.splitlines() if line.strip() and not line.startswith("#")]
    text = "\n".join(active)
    assert 'GROUP="dialout", MODE="0660"' in text
    assert 'KERNEL!="ttyUSB[0-9]*|ttyACM[0-9]*"' in text
    for link in ("cairn/usb-$env{ID_SERIAL_SHORT}", "cairn/rs485-$env{ID_SERIAL_SHORT}",
                 "cairn/cp210x-$env{ID_SERIAL_SHORT}", "cairn/port-$env{ID_PATH_TAG}"):
        assert f'SYMLINK+="{link}' in text, link
    for vendor in ('ENV{ID_VENDOR_ID}=="0403"', 'ENV{ID_VENDOR_ID}=="10c4"',
                   'ENV{ID_VENDOR_ID}=="1a86"'):  # FTDI, CP210x, CH340
        assert vendor in text, vendor
    labels = re.findall(r'GOTO="(\w+)"', text)
    assert set(labels) == set(re.findall(r'LABEL="(\w+)"', text))


# -- the router under the unit's memory protection -------------------------------------------


def _mdwe_supported() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(66, 0, 0, 0, 0) >= 0  # PR_GET_MDWE (Linux 6.3+)


MDWE_EXEC = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN
    sys.exit("PR_SET_MDWE failed: errno %d" % ctypes.get_errno())
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.skipif(not _mdwe_supported(), reason="the kernel has no PR_SET_MDWE (Linux 6.3)")
async def test_router_serves_under_memory_deny_write_execute(tmp_path):
    """MemoryDenyWriteExecute=yes is what most often breaks Python services (libffi
    trampolines, JITs). The kernel's MDWE gives the process the same refusal; the router must
    start, route an acknowledged retained publication over the Unix socket, serve /metrics
    and stop cleanly under it."""
    from autobahn.asyncio.rawsocket import WampRawSocketClientFactory
    from autobahn.wamp import types
    from autobahn.wamp.serializer import MsgPackSerializer

    from harness.wamp_client import JOIN_TIMEOUT, Client

    port = free_port()
    sock = tmp_path / "run" / "wamp.sock"
    config = tmp_path / "cairn.toml"
    config.write_text(
        (IMAGES / "config/cairn.toml").read_text()
        .replace('listen = "127.0.0.1:8080"', f'listen = "127.0.0.1:{port}"')
        .replace("unix:/run/cairn/wamp.sock", f"unix:{sock}")
        .replace('data_dir = "/var/lib/cairn"', f'data_dir = "{tmp_path / "data"}"'))
    log = (tmp_path / "router.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", MDWE_EXEC, sys.executable, "-m", "cairn.app.cli", "router",
         "--config", str(config)], stdout=log, stderr=log, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 20
        while not sock.exists():
            assert proc.poll() is None, (tmp_path / "router.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "router.log").read_text()
            time.sleep(0.05)
        import asyncio

        loop = asyncio.get_running_loop()
        session = Client(types.ComponentConfig(realm="realm1"))
        factory = WampRawSocketClientFactory(lambda: session, serializer=MsgPackSerializer())
        await loop.create_unix_connection(factory, str(sock))
        await asyncio.wait_for(session.joined, JOIN_TIMEOUT)
        pub = await session.publish("sensor.mdwe", temperature=21.5, options=types.
                                    PublishOptions(acknowledge=True, retain=True))
        assert pub.id
        await session.leave()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            stored = re.search(rb"^cairn_history_events (\d+)", r.read(), re.MULTILINE)
        # the reading, and the router's health record once it rode along with its commit
        assert stored and int(stored[1]) in (1, 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        log.close()
    assert code == 0, (tmp_path / "router.log").read_text()


# -- the payload -----------------------------------------------------------------------------


def build_payload(out: Path) -> Path:
    done = run(sys.executable, IMAGES / "build_payload.py", "--out", out, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> Path:
    return build_payload(tmp_path_factory.mktemp("payload"))


def test_payload_has_every_file_with_its_hash(payload):
    manifest = json.loads((payload / "manifest.json").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert manifest["version"] == version
    assert payload.name == f"cairn-payload-{version}"
    expected = {f"rootfs/usr/lib/systemd/system/{u}" for u in UNITS} | {
        "rootfs/usr/lib/sysusers.d/cairn.conf", "rootfs/usr/lib/tmpfiles.d/cairn.conf",
        "rootfs/etc/udev/rules.d/99-cairn-serial.rules", "rootfs/etc/cairn/cairn.toml",
        "rootfs/etc/cairn/sensors/example.toml.sample",
        "rootfs/etc/cairn/mqtt/example.toml.sample", "rootfs/usr/share/doc/cairn/README.md",
        "install.sh", "constraints.txt", f"wheels/cairn-{version}-py3-none-any.whl"}
    listed = {entry["path"] for entry in manifest["files"]}
    assert expected <= listed, expected - listed
    on_disk = {p.relative_to(payload).as_posix() for p in payload.rglob("*") if p.is_file()}
    assert on_disk == listed | {"manifest.json", "SHA256SUMS"}
    done = run("sha256sum", "--strict", "-c", "SHA256SUMS", cwd=payload)
    assert done.returncode == 0, done.stdout + done.stderr
    for source, target in [(SYSTEMD / "cairn-router.service",
                            "rootfs/usr/lib/systemd/system/cairn-router.service"),
                           (IMAGES / "config/cairn.toml", "rootfs/etc/cairn/cairn.toml")]:
        assert (payload / target).read_bytes() == source.read_bytes()
    assert os.access(payload / "install.sh", os.X_OK)
    assert manifest["enable"] == ["cairn-router.service"]


def test_payload_tarball_holds_the_same_files(payload):
    with tarfile.open(payload.with_name(payload.name + ".tar.gz")) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert all(m.uid == 0 and m.gid == 0 for m in members.values())
        for path in payload.rglob("*"):
            name = f"{payload.name}/{path.relative_to(payload).as_posix()}"
            assert name in members, name
            if path.is_file():
                assert tar.extractfile(members[name]).read() == path.read_bytes()


def test_payload_wheel_and_pins(payload):
    import zipfile

    manifest = json.loads((payload / "manifest.json").read_text())
    with zipfile.ZipFile(payload / manifest["wheel"]) as wheel:
        names = set(wheel.namelist())
    for module in ("app/cli.py", "gateway/ops/maintenance.py", "gateway/shell/metrics.py",
                   "sync/cli.py", "central/plan.py", "base/clock.py", "formats/batch.py",
                   "drivers/__init__.py", "gateway/dashboard/index.html",
                   "gateway/dashboard/autobahn.min.js"):
        assert f"cairn/{module}" in names, module
    assert not [n for n in names if "__pycache__" in n or "node_modules" in n]
    pins = [line for line in (payload / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    pinned = {line.split("==")[0] for line in pins}
    assert all(re.fullmatch(r"[a-z0-9-]+==[\w.+!-]+", line) for line in pins), pins
    assert {"autobahn", "txaio", "msgpack", "cbor2", "aiosqlite", "cryptography"} <= pinned
    assert "pytest" not in pinned and "pyspark" not in pinned  # extras stay out


def test_payload_carries_every_pinned_dependency_as_a_wheel_the_device_runs(payload):
    """A device off the grid installs from the payload alone: one wheel per pin, at the
    pinned version, pure Python or built for linux aarch64 with the image's CPython (3.13)."""
    from packaging.tags import Tag
    from packaging.utils import canonicalize_name, parse_wheel_filename

    manifest = json.loads((payload / "manifest.json").read_text())
    pins = dict(line.split("==") for line in manifest["dependencies"])
    wheels = sorted((payload / "wheels" / "deps").glob("*.whl"))
    assert [f"wheels/deps/{w.name}" for w in wheels] == manifest["dependency_wheels"]["files"]
    found = {}
    for wheel in wheels:
        name, version, _, tags = parse_wheel_filename(wheel.name)
        found[canonicalize_name(name)] = str(version)
        assert any(t.platform == "any" or t.platform.endswith("_aarch64") for t in tags), wheel
        assert any(t.interpreter in ("py3", "cp313") or t.abi == "abi3" for t in tags), wheel
        assert Tag("cp313", "cp313", "linux_x86_64") not in tags, wheel
    assert found == pins


@needs_systemd_analyze
def test_payload_units_verify(payload, tmp_path):
    root = fake_device_root(tmp_path / "root")
    shutil.copytree(payload / "rootfs", root, dirs_exist_ok=True, symlinks=True)
    for unit in UNITS:
        done = verify(root, unit)
        assert done.returncode == 0 and not done.stderr, f"{unit}:\n{done.stderr}"


def test_payload_configs_validate(payload, tmp_path):
    config = payload / "rootfs/etc/cairn/cairn.toml"
    done = run(CAIRN if CAIRN.exists() else sys.executable, *(
        [] if CAIRN.exists() else ["-m", "cairn.app.cli"]), "check-config", config,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout
    # the driver samples, through the drivers' own parsers
    serial_config = pytest.importorskip("cairn.drivers.serial_config")
    mqtt_bridge = pytest.importorskip("cairn.drivers.mqtt_bridge")
    from cairn.drivers.config import read_toml

    sensors = serial_config.load(payload / "rootfs/etc/cairn/sensors/example.toml.sample")
    assert sensors.driver.router == "rawsocket+unix:/run/cairn/wamp.sock"
    driver, _ = mqtt_bridge.load(*read_toml(
        payload / "rootfs/etc/cairn/mqtt/example.toml.sample"))
    assert driver.router == "rawsocket+unix:/run/cairn/wamp.sock"


def test_the_documented_way_to_open_the_router_validates(tmp_path):
    """The comments of the shipped config: listen on the LAN, drop anonymous, add users
    with secret files. `cairn check-config` must accept the result."""
    from cairn.gateway.core import config as cfg

    for name in ("dashboard", "drivers"):
        (tmp_path / name).write_text("s3cret-" + name)
    text = (IMAGES / "config/cairn.toml").read_text()
    block = re.search(r"# \[router\].*?\n#\n(.*?)\n#\n# TLS", text, re.S).group(1)
    uncommented = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                            for line in block.splitlines())
    opened = (text.replace('listen = "127.0.0.1:8080"', 'listen = "0.0.0.0:8080"')
              .replace('anonymous_role = "local"\n', "")
              .replace("/etc/cairn/secrets/", f"{tmp_path}/")) + "\n" + \
        uncommented.replace("/etc/cairn/secrets/", f"{tmp_path}/")
    loaded = cfg.parse(tomllib.loads(opened), "opened.toml")
    realm = loaded.realm("realm1")
    assert realm.anonymous_role is None
    assert {u.authid: u.secret for u in realm.users} == {"dashboard": "s3cret-dashboard",
                                                         "drivers": "s3cret-drivers"}
    assert not loaded.router.listen.is_loopback
    with pytest.raises(cfg.ConfigError, match="reachable from the network"):
        cfg.parse(tomllib.loads(text.replace('listen = "127.0.0.1:8080"',
                                             'listen = "0.0.0.0:8080"')), "open-no-users")


def test_payload_is_reproducible(payload, tmp_path):
    again = build_payload(tmp_path)
    first = payload.with_name(payload.name + ".tar.gz").read_bytes()
    second = again.with_name(again.name + ".tar.gz").read_bytes()
    assert first == second, "two builds of the same sources differ"


def test_payload_refuses_a_wheel_without_the_dashboard(tmp_path, payload):
    import zipfile

    manifest = json.loads((payload / "manifest.json").read_text())
    broken = tmp_path / Path(manifest["wheel"]).name
    with zipfile.ZipFile(payload / manifest["wheel"]) as src, \
            zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("autobahn.min.js"):
                dst.writestr(item, src.read(item))
    done = run(sys.executable, IMAGES / "build_payload.py", "--out", tmp_path / "out",
               "--wheel", broken)
    assert done.returncode == 1
    assert "autobahn.min.js" in done.stderr and "scripts/setup.sh" in done.stderr


# -- the pi-gen stage ------------------------------------------------------------------------


def test_pi_gen_stage_follows_pi_gen_conventions():
    prerun = STAGE / "prerun.sh"
    assert os.access(prerun, os.X_OK) and "copy_previous" in prerun.read_text()
    assert re.search(r'^IMG_SUFFIX="-cairn"$', (STAGE / "EXPORT_IMAGE").read_text(), re.M)
    substages = sorted(p for p in STAGE.iterdir() if p.is_dir())
    assert [p.name for p in substages] == ["00-cairn", "01-appliance"]
    for sub in substages:
        for script in sub.iterdir():
            if not re.fullmatch(r"\d\d-(run\.sh|run-chroot\.sh|packages|packages-nr|debconf)",
                                script.name) and script.name != "files":
                pytest.fail(f"{script} is not a pi-gen sub-stage file")
            if script.name.endswith("run.sh"):
                assert os.access(script, os.X_OK), f"{script} must be executable"
            if script.name.endswith(".sh"):
                assert script.read_text().startswith("#!/bin/bash -e\n"), script
                done = run("bash", "-n", script)
                assert done.returncode == 0, done.stderr
            for ref in re.findall(r"files/([\w@-]+(?:\.[\w@-]+)*)", script.read_text()) \
                    if script.is_file() else []:
                assert ref == "cairn-payload.tar.gz" or (sub / "files" / ref).exists(), ref
    packages = (STAGE / "00-cairn/00-packages-nr").read_text().split()
    assert {"python3-venv", "fdisk"} <= set(packages)
    for script in (IMAGES / "build-image.sh", FIRSTBOOT / "cairn-readonly-root",
                   IMAGES / "install.sh"):
        shell = "bash" if script.read_text().startswith("#!/bin/bash") else "sh"
        done = run(shell, "-n", script)
        assert done.returncode == 0, (script, done.stderr)


def test_pi_gen_config_resolves_everything_on_the_host():
    done = run("bash", IMAGES / "build-image.sh", "--print-config",
               env={**os.environ, "CAIRN_SSH_PUBKEY": "ssh-ed25519 AAAAC3Nza test@host",
                    "CAIRN_HOSTNAME": "greenhouse-7"})
    assert done.returncode == 0, done.stderr
    values = {}
    rendered = done.stdout
    for line in rendered.splitlines():
        if "=" in line and not line.startswith("#"):
            name = line.split("=")[0]
            values[name] = run("bash", "-c", f"{line}; printf %s \"${name}\"").stdout
    assert values["STAGE_LIST"] == "stage0 stage1 stage2 stage-cairn"
    assert values["RELEASE"] == "trixie"
    assert values["TARGET_HOSTNAME"] == "greenhouse-7"
    assert values["PUBKEY_SSH_FIRST_USER"] == "ssh-ed25519 AAAAC3Nza test@host"
    assert values["PUBKEY_ONLY_SSH"] == "1" and values["ENABLE_SSH"] == "1"
    assert values["CAIRN_READONLY_ROOT"] == "1"
    assert "export CAIRN_READONLY_ROOT" in rendered


# -- first boot: the data partition and the read-only root -------------------------------------

needs_sfdisk = pytest.mark.skipif(not shutil.which("sfdisk") or not shutil.which("mkfs.ext4"),
                                  reason="sfdisk (package fdisk) and mkfs.ext4 are needed")


def pi_gen_card(path: Path, size_mib: int, root_sectors: int | None = 81920) -> Path:
    """A sparse disk image laid out as pi-gen exports it: FAT boot at 4 MiB, then root."""
    with path.open("wb") as f:
        f.truncate(size_mib * 2**20)
    root = f"size={root_sectors}, " if root_sectors else ""
    done = run("sfdisk", "-q", path, input=f"label: dos\nstart=8192, size=65536, type=c\n"
                                           f"start=73728, {root}type=83\n")
    assert done.returncode == 0, done.stderr
    return path


def table(path: Path) -> dict:
    return json.loads(run("sfdisk", "--json", path).stdout)["partitiontable"]


@needs_sfdisk
def test_first_boot_makes_the_data_partition_in_the_free_space_once(tmp_path):
    card = pi_gen_card(tmp_path / "card.img", 400)
    tool = FIRSTBOOT / "cairn-data-partition"
    first = run(sys.executable, tool, "--disk", card)
    assert first.returncode == 0, first.stderr
    parts = table(card)["partitions"]
    assert len(parts) == 3
    data = parts[2]
    assert data["start"] == 155648 and data["start"] % 8192 == 0  # right after root, aligned
    assert data["start"] + data["size"] == 400 * 2048  # to the end of the card
    assert data["type"] == "83"
    probe = run("blkid", "-p", "-O", str(data["start"] * 512), "-o", "export", card).stdout
    assert "LABEL=cairn-data" in probe and "TYPE=ext4" in probe
    again = run(sys.executable, tool, "--disk", card)
    assert again.returncode == 0 and "there already" in again.stdout
    assert table(card)["partitions"] == parts


@needs_sfdisk
def test_first_boot_refuses_when_the_root_has_taken_the_card(tmp_path):
    card = pi_gen_card(tmp_path / "card.img", 300, root_sectors=None)
    done = run(sys.executable, FIRSTBOOT / "cairn-data-partition", "--disk", card)
    assert done.returncode == 1
    assert "no room for the data partition" in done.stderr
    assert len(table(card)["partitions"]) == 2


def _readonly_root(tmp_path: Path, proc_cmdline: str, data_is_mount: bool,
                   raspi_adds: str | None, root_type: str = "ext4",
                   overlayroot_script: Path | None = None,
                   ) -> tuple[subprocess.CompletedProcess, str, str]:
    """Run cairn-readonly-root with stand-ins for raspi-config (none when ``raspi_adds`` is
    None: Debian), systemctl and mountpoint."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    boot = tmp_path / "cmdline.txt"
    boot.write_text("console=serial0,115200 console=tty1 root=PARTUUID=1234-02 rootfstype=ext4"
                    " fsck.repair=yes rootwait\n")
    stand_ins = {
        "raspi-config": f'echo "raspi-config $*" >> {calls}\n'
                        f'sed -i "s/^/{raspi_adds} /" {boot}',
        "systemctl": f'echo "systemctl $*" >> {calls}',
        "mountpoint": "exit 0" if data_is_mount else "exit 1",
        "sync": "exit 0",
    }
    if raspi_adds is None:
        del stand_ins["raspi-config"]
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    proc = tmp_path / "proc-cmdline"
    proc.write_text(proc_cmdline + "\n")
    mounts = tmp_path / "proc-mounts"
    mounts.write_text(f"/dev/mmcblk0p2 / {root_type} rw,noatime 0 0\n")
    flag = tmp_path / "readonly-root"
    flag.touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "CAIRN_READONLY_FLAG": str(flag), "CAIRN_PROC_CMDLINE": str(proc),
           "CAIRN_PROC_MOUNTS": str(mounts), "CAIRN_BOOT_CMDLINE": str(boot),
           "CAIRN_DATA_DIR": str(tmp_path),
           "CAIRN_OVERLAYROOT_CONF": str(tmp_path / "overlayroot.local.conf"),
           "CAIRN_OVERLAYROOT_SCRIPT": str(overlayroot_script or tmp_path / "absent")}
    done = run("sh", FIRSTBOOT / "cairn-readonly-root", env=env)
    return done, calls.read_text() if calls.exists() else "", boot.read_text()


@pytest.mark.parametrize("raspi_adds, expected", [
    ("boot=overlay", "boot=overlay console="),                   # bookworm's raspi-config
    ("overlayroot=tmpfs", "overlayroot=tmpfs:recurse=0 console="),  # trixie: overlayroot
])
def test_read_only_root_is_turned_on_once_and_keeps_the_data_partition_writable(
        tmp_path, raspi_adds, expected):
    done, calls, boot = _readonly_root(tmp_path, "root=PARTUUID=1234-02 rootwait", True,
                                       raspi_adds)
    assert done.returncode == 0, done.stderr
    assert "raspi-config nonint do_overlayfs 0" in calls
    assert "systemctl --no-block reboot" in calls
    assert boot.startswith(expected), boot


def test_read_only_root_does_nothing_when_already_read_only(tmp_path):
    done, calls, _ = _readonly_root(tmp_path, "overlayroot=tmpfs:recurse=0 root=/dev/x", True,
                                    "boot=overlay")
    assert done.returncode == 0 and calls == ""


def test_read_only_root_on_debian_writes_overlayroot_config_and_reboots(tmp_path):
    script = tmp_path / "overlayroot-initramfs-script"
    script.touch()
    done, calls, boot = _readonly_root(tmp_path, "root=PARTUUID=1234-02 rootwait", True, None,
                                       overlayroot_script=script)
    assert done.returncode == 0, done.stderr
    conf = (tmp_path / "overlayroot.local.conf").read_text()
    # recurse=0: the overlay stays off /var/lib/cairn, the store stays on its partition
    assert re.search(r'^overlayroot="tmpfs:recurse=0"$', conf, re.M), conf
    assert calls.strip() == "systemctl --no-block reboot"
    assert "overlay" not in boot  # the kernel command line is left as it is


def test_read_only_root_on_debian_is_left_alone_once_the_root_is_an_overlay(tmp_path):
    script = tmp_path / "overlayroot-initramfs-script"
    script.touch()
    done, calls, _ = _readonly_root(tmp_path, "root=PARTUUID=1234-02 rootwait", True, None,
                                    root_type="overlay", overlayroot_script=script)
    assert done.returncode == 0 and "read-only already" in done.stdout
    assert calls == "" and not (tmp_path / "overlayroot.local.conf").exists()


def test_read_only_root_on_debian_does_not_reboot_again_when_the_overlay_failed(tmp_path):
    """Asked for at the last boot, but the root is still no overlay (the initramfs could
    not make it): a second reboot would only loop."""
    script = tmp_path / "overlayroot-initramfs-script"
    script.touch()
    (tmp_path / "overlayroot.local.conf").write_text('overlayroot="tmpfs:recurse=0"\n')
    done, calls, _ = _readonly_root(tmp_path, "root=PARTUUID=1234-02 rootwait", True, None,
                                    overlayroot_script=script)
    assert done.returncode == 1 and "did not come up" in done.stderr
    assert calls == ""


def test_read_only_root_refuses_without_raspi_config_or_overlayroot(tmp_path):
    done, calls, _ = _readonly_root(tmp_path, "root=PARTUUID=1234-02 rootwait", True, None)
    assert done.returncode == 1 and "neither raspi-config nor overlayroot" in done.stderr
    assert calls == ""


def test_read_only_root_refuses_while_the_store_is_on_the_root(tmp_path):
    done, calls, _ = _readonly_root(tmp_path, "root=PARTUUID=1234-02", False, "boot=overlay")
    assert done.returncode == 1 and "not a mounted partition" in done.stdout + done.stderr
    assert calls == ""


# -- the stage, run as pi-gen runs it, on a throwaway Debian root ------------------------------

# modules that may only import with an optional extra installed (pyproject's extras)
OPTIONAL_EXTRAS = ("pyspark",)

MINI_PI_GEN = r"""
set -euo pipefail
R=$1; UPPER=$2; WORKDIR=$3; STAGE=$4; OUT=$5
mount -t overlay overlay -o "lowerdir=/,upperdir=$UPPER,workdir=$WORKDIR" "$R"
mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"; mount --rbind /sys "$R/sys"
mount -t tmpfs tmpfs "$R/run"; mount -t tmpfs tmpfs "$R/tmp"
# what stage1 of pi-gen leaves behind, which the stage edits
mkdir -p "$R/boot/firmware"
echo "console=serial0,115200 console=tty1 root=ROOTDEV rootfstype=ext4 fsck.repair=yes" \
    "rootwait resize" > "$R/boot/firmware/cmdline.txt"
printf '%s\n' "proc /proc proc defaults 0 0" "BOOTDEV /boot/firmware vfat defaults 0 2" \
    "ROOTDEV / ext4 defaults,noatime 0 1" > "$R/etc/fstab"
rm -rf "$R/opt/cairn" "$R"/opt/cairn-* "$R/etc/cairn"

# pi-gen's helpers (scripts/common), as its build.sh exports them to the stage scripts
export ROOTFS_DIR="$R" CAIRN_READONLY_ROOT=1
copy_previous() { :; }
on_chroot() { capsh --drop=cap_setfcap "--chroot=${ROOTFS_DIR}/" -- -e "$@"; }
export -f copy_previous on_chroot
cd "$STAGE"
./prerun.sh
for sub in [0-9][0-9]-*/; do
    pushd "$sub" > /dev/null
    for i in 00 01 02 03; do
        if [ -f "${i}-packages-nr" ]; then
            for pkg in $(cat "${i}-packages-nr"); do
                chroot "$R" dpkg-query -W -f='${Status}\n' "$pkg" | grep -q "ok installed" ||
                    { echo "MISSING-PACKAGE $pkg"; exit 3; }
            done
        fi
        if [ -x "${i}-run.sh" ]; then "./${i}-run.sh"; fi
        if [ -f "${i}-run-chroot.sh" ]; then on_chroot < "${i}-run-chroot.sh"; fi
    done
    popd > /dev/null
done

# the result, looked at from inside
{
    echo "== help"; chroot "$R" /opt/cairn/bin/cairn --help | head -n 1
    echo "== check-config"; chroot "$R" /opt/cairn/bin/cairn check-config /etc/cairn/cairn.toml
    echo "== imports"
    chroot "$R" /opt/cairn/bin/python -c 'import pkgutil, importlib, cairn
for pkg in (importlib.import_module(f"cairn.{n}") for n in ("app", "base", "formats", "gateway",
                                                             "drivers", "sync", "central")):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        try:
            importlib.import_module(m.name)
        except ImportError as e:
            print("cannot import", m.name, "-", type(e).__name__, getattr(e, "name", e))
print("imports checked")' 2>&1 || true
    echo "== enabled"
    for u in cairn-router.service cairn-readonly-root.service; do
        echo "$u $(systemctl --root="$R" is-enabled "$u" 2>&1)"
    done
    echo "== verify"
    for u in cairn-router.service cairn-sensor@greenhouse.service cairn-bridge-mqtt@local.service \
             cairn-sync.service cairn-data-partition.service cairn-readonly-root.service; do
        systemd-analyze verify --man=no --root="$R" "$u" 2>&1 | sed "s|^|$u: |"
    done
    echo "== security"
    systemd-analyze security --offline=yes --no-pager --root="$R" cairn-router.service 2>&1 |
        tail -n 1
    echo "== router"
    # as systemd would start it: RuntimeDirectory, StateDirectory, the cairn user; in a
    # network namespace of its own, so that its port 8080 meets nothing of this machine's
    chroot "$R" install -d -o cairn -g cairn -m 750 /run/cairn /var/lib/cairn
    unshare --net bash -c '
        R=$1; OUT=$2
        ip link set lo up
        chroot "$R" setpriv --reuid=cairn --regid=cairn --init-groups \
            /opt/cairn/bin/cairn router --config /etc/cairn/cairn.toml > "$OUT/router.log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do [ -S "$R/run/cairn/wamp.sock" ] && break; sleep 0.1; done
        chroot "$R" /opt/cairn/bin/python -c "import urllib.request
print(urllib.request.urlopen(\"http://127.0.0.1:8080/metrics\", timeout=5).read().decode())" \
            | grep -E "^cairn_(sessions|store_bytes)" || echo "no metrics"
        chroot "$R" ls -l /run/cairn/wamp.sock | cut -d" " -f1,3,4
        kill -TERM $pid; wait $pid; echo "router exit $?"' sh "$R" "$OUT"
    echo "== doctor"
    chroot "$R" setpriv --reuid=cairn --regid=cairn --init-groups \
        /opt/cairn/bin/cairn doctor --config /etc/cairn/cairn.toml; echo "doctor exit $?"
    echo "== install again"
    mkdir -p "$R/tmp/p" && tar -xzf "$STAGE/00-cairn/files/cairn-payload.tar.gz" -C "$R/tmp/p" \
        --strip-components=1
    sed -i 's/^max_store_bytes = .*/max_store_bytes = 1073741824/' "$R/etc/cairn/cairn.toml"
    chroot "$R" env CAIRN_ENABLE= /tmp/p/install.sh 2>&1
} > "$OUT/report.txt" 2>&1
"""


@pytest.mark.slow
def test_the_pi_gen_stage_installs_a_working_cairn_into_a_debian_root(payload, tmp_path):
    """The stage's scripts, run the way pi-gen's build.sh runs them, against an overlay of
    this Debian 12 machine's root (Raspberry Pi OS Lite is Debian 12 plus Raspberry Pi
    packages): the payload's install.sh in the chroot, the venv, the user, the units
    enabled, fstab and cmdline edited. Then the installed router is started as systemd
    would (user cairn, its directories) and checked, and every unit verified against that
    root with the real /opt/cairn/bin/cairn."""
    for tool in ("unshare", "capsh", "setpriv", "ip", "systemd-analyze"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces, overlayfs, chroot)")
    stage = tmp_path / "stage-cairn"
    shutil.copytree(STAGE, stage)
    shutil.copy2(payload.with_name(payload.name + ".tar.gz"),
                 stage / "00-cairn/files/cairn-payload.tar.gz")
    dirs = {name: tmp_path / name for name in ("root", "upper", "work", "out")}
    for path in dirs.values():
        path.mkdir()
    script = tmp_path / "mini-pi-gen.sh"
    script.write_text(MINI_PI_GEN)
    done = run("unshare", "--mount", "bash", script, dirs["root"], dirs["upper"],
               dirs["work"], stage, dirs["out"], timeout=900)
    if "Failed to establish a new connection" in done.stderr:
        pytest.skip("pip cannot reach the package index from here")
    if "MISSING-PACKAGE" in done.stdout:
        pytest.skip(f"this machine lacks a package the stage installs: {done.stdout}")
    if done.returncode != 0 and "permission denied" in (done.stdout + done.stderr).lower():
        pytest.skip(f"cannot set up an overlay root here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (dirs["out"] / "report.txt").read_text()
    print(report)
    sections: dict[str, str] = {}
    name = ""
    for line in report.splitlines():
        if line.startswith("== "):
            name = line[3:]
            sections[name] = ""
        else:
            sections[name] = sections.get(name, "") + line + "\n"

    upper = dirs["upper"]
    assert sections["help"].startswith("usage: cairn")
    assert "ok" in sections["check-config"]
    failed = [line for line in sections["imports"].splitlines()
              if line.startswith("cannot import") and not line.endswith(OPTIONAL_EXTRAS)]
    assert not failed, "the wheel's dependencies miss what its modules import:\n" + \
        "\n".join(failed)
    assert "imports checked" in sections["imports"], sections["imports"]  # it ran to the end
    assert "cairn-router.service enabled" in sections["enabled"]
    assert "cairn-readonly-root.service enabled" in sections["enabled"]
    assert sections["verify"].strip() == "", sections["verify"]
    assert re.search(r"cairn-router.service: (\d\.\d)", sections["security"])
    assert "cairn_sessions" in sections["router"] and "router exit 0" in sections["router"]
    assert "srw-rw---- cairn cairn" in sections["router"]
    assert "doctor exit 0" in sections["doctor"]
    again = sections["install again"]
    assert "done" in again and "kept your /etc/cairn/cairn.toml" in again, again
    assert "max_store_bytes = 1073741824" in (upper / "etc/cairn/cairn.toml").read_text()
    assert (upper / "etc/cairn/cairn.toml.dist").exists()
    assert not (upper / "etc/udev/rules.d/99-cairn-serial.rules.dist").exists()
    assert (upper / "usr/lib/cairn/payload-manifest.json").exists()
    (venv,) = [p for p in (upper / "opt").iterdir() if p.name.startswith("cairn-")]
    assert os.readlink(upper / "opt/cairn") == venv.name
    fstab = (upper / "etc/fstab").read_text()
    data = re.search(r"^LABEL=cairn-data\s+/var/lib/cairn\s+ext4\s+(\S+)\s+0\s+2$", fstab, re.M)
    assert data, fstab  # mounted as the wear benchmark measures it (noatime, commit=60)
    assert set(WEAR_MOUNT_OPTIONS.split(",")) <= set(data.group(1).split(",")), data.group(1)
    cmdline = (upper / "boot/firmware/cmdline.txt").read_text()
    assert "resize" not in cmdline.split() and "rootwait" in cmdline.split()
    assert (upper / "etc/cairn/readonly-root").exists()
    assert "cairn:" in (upper / "etc/passwd").read_text()
    assert (upper / "etc/udev/rules.d/99-cairn-serial.rules").exists()
    assert not (upper / "tmp/cairn-payload").exists()


def test_drivers_follow_the_config_files_kept_on_the_device(tmp_path):
    """cairn-drivers starts one unit per driver config, and the sync when cairn.toml has a
    [sync] section (the files outlive the read-only root's RAM, a `systemctl enable` does
    not); systemctl is a recorder here."""
    etc = tmp_path / "etc"
    (etc / "sensors").mkdir(parents=True)
    (etc / "mqtt").mkdir()
    for name in ("sensors/greenhouse.toml", "sensors/pump.toml", "mqtt/local.toml",
                 "sensors/notes.txt"):
        (etc / name).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/called\n')
    (bin_dir / "systemctl").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CAIRN_ETC": str(etc)}
    done = run(FIRSTBOOT / "cairn-drivers", env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "called").read_text().split() == [
        "start", "--no-block", "cairn-sensor@greenhouse.service", "cairn-sensor@pump.service",
        "cairn-bridge-mqtt@local.service"]
    (tmp_path / "called").unlink()
    for name in ("sensors/greenhouse.toml", "sensors/pump.toml", "mqtt/local.toml"):
        (etc / name).unlink()
    done = run(FIRSTBOOT / "cairn-drivers", env=env)
    assert done.returncode == 0 and "no driver configs" in done.stdout
    assert not (tmp_path / "called").exists()
    (etc / "cairn.toml").write_text('[router]\nlisten = "127.0.0.1:8080"\n\n[sync]\nsink = "x"\n')
    done = run(FIRSTBOOT / "cairn-drivers", env=env)
    assert (tmp_path / "called").read_text().split() == [
        "start", "--no-block", "cairn-sync.service"]
