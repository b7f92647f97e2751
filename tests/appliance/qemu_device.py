"""A Cairn device for the appliance tests: the Debian image built by
images/debian/build-image.sh, booted in qemu-system-aarch64 (-M virt, TCG) the way a board
boots it: U-Boot (Debian's u-boot-qemu, of the same release as the Pi's u-boot-rpi) runs the
image's boot.scr, which chooses root slot A or B and starts that slot's own kernel and
initrd. The whole image is a virtio disk grown like a card larger than the image (so first
boot makes the data partition in the free space); SSH and the router's port are forwarded to
127.0.0.1.

The guest network is QEMU's user mode with ``restrict=on``: the guest reaches nothing but
the forwarded ports (no NTP, no package archive), as an off-grid device would."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "image" / "debian-test"
BOOT_TIMEOUT = 900          # s: first boot under TCG (data partition, host keys, a reboot)
# systemd 257 gives up for good when its generators run over 90 s ("Failed to start up
# manager", then "Freezing execution."): seen about once in 25 boots here, after 25 s of
# boot, cause not found (images/README.md). The image arms the hardware watchdog (an i6300esb
# here) before the generators run, so the guest resets itself 2 min later; the tests
# power-cycle such a boot sooner, at most twice per wait, and say so in their output and as a
# warning.
SYSTEMD_FROZE = "Freezing execution."
FREEZE_RESTARTS = 2
GENERATOR_SECONDS: list[float] = []   # each ready boot's generators (_record_generators)
FROZEN_BOOTS: list[str] = []          # the boots that froze, as _power_cycle_frozen_boot said
# for failure messages: where a boot starts on the console, and systemd's status lines that
# say something went wrong ([FAILED], [DEPEND] and [ TIME ] on a colour console)
KERNEL_BANNER = "Linux version"
SYSTEMD_PROBLEM = re.compile(r"\[(FAILED|DEPEND| TIME )\]|Dependency failed|Timed out|"
                             r"Failed to (start|mount)|fsck.*(error|fail)|FAT-fs")
ANSI = re.compile(r"\x1b\[[0-9;:?!]*[A-Za-z]")  # (256-colour codes have colons)
SSH_USER = "admin"
ADMIN_SECRET = "an admin's secret, for the tests only"


# a $THS line sensor on the guest's second UART (ttyS0), read by cairn-sensor@uart
SERIAL_SENSOR_CONFIG = """[driver]
router = "rawsocket+unix:/run/cairn/wamp.sock"
realm = "realm1"

[[sensors]]
id = "uart-1"
kind = "line"
port = "/dev/ttyS0"
baudrate = 9600
"""

# What the shared appliance device finds in its boot partition's cairn/ folder at first boot
# (besides its SSH key): its site's settings, as a person flashing many cards writes them.
# The config is the shipped one with an admin (cairn.admin.config.* over WAMP).
PROVISIONED = {
    "hostname": "pump-station-7\n",
    "sensors/uart.toml": SERIAL_SENSOR_CONFIG,
    "secrets/admin": ADMIN_SECRET + "\n",
    "network/site-wifi.toml": 'type = "wifi"\nssid = "pump station"\n'
                              'passphrase = "correct horse battery"\ncountry = "DE"\n',
    "network/modem.toml": 'type = "cellular"\napn = "iot.example"\npin = "1234"\n',
    "cairn.toml": (ROOT / "images/config/cairn.toml").read_text() + """
  # provisioned for the appliance tests: an admin who may change the configuration
  [[realms.roles]]
  name = "admin"
  permissions = [{ uri = "cairn.admin", match = "prefix", allow = ["call"] }]

  [[realms.users]]
  authid = "admin"
  role = "admin"
  secret_file = "/etc/cairn/secrets/admin"
""",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the test image is made of (the payload's sources, the units, the recipe): a change
# elsewhere (a test) does not rebuild it.
IMAGE_SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "docs", "base",
                 "formats", "gateway", "drivers", "sync", "central", "app", "systemd", "images"]


def _source_key() -> str:
    """The committed trees of IMAGE_SOURCES, their uncommitted changes and untracked files."""
    git = ["git", "-C", str(ROOT)]
    parts = [subprocess.run(git + ["rev-parse"] + [f"HEAD:{p}" for p in IMAGE_SOURCES],
                            capture_output=True, text=True).stdout,
             subprocess.run(git + ["diff", "HEAD", "--"] + IMAGE_SOURCES, capture_output=True,
                            text=True).stdout,
             subprocess.run(git + ["status", "--porcelain", "--"] + IMAGE_SOURCES,
                            capture_output=True, text=True).stdout]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def test_key() -> Path:
    key = WORK / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cairn-test",
                        "-f", str(key)], check=True)
    return key


def make_ca(directory: Path, name: str) -> dict[str, Path]:
    """A throwaway update CA and a bundle signer it certifies (openssl; nothing of it is
    committed): ``keyring`` (the CA's certificate, what a device trusts), ``cert`` and
    ``key`` (what a builder signs bundles with)."""
    files = {"keyring": directory / "ca.cert.pem", "cert": directory / "signer.cert.pem",
             "key": directory / "signer.key.pem"}
    if all(path.exists() for path in files.values()):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, csr, ext = directory / "ca.key.pem", directory / "signer.csr", directory / "ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=emailProtection,codeSigning\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for cmd in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", files["keyring"], "-days", "3650",
         "-subj", f"/CN={name} CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *ec, "-keyout", files["key"], "-out", csr, "-subj", f"/CN={name} signer"],
        ["x509", "-req", "-in", csr, "-CA", files["keyring"], "-CAkey", ca_key,
         "-CAcreateserial", "-out", files["cert"], "-days", "3650", "-extfile", ext],
    ):
        subprocess.run(["openssl", *map(str, cmd)], capture_output=True, check=True)
    return files


def build_test_image(log: Path) -> tuple[Path, Path]:
    """The raw test image and its boot files, built unless the same sources built them
    already (the base root file system is cached by build-image.sh itself). One build at a
    time: the appliance modules run in parallel, each asking for the image."""
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_test_image(log)


def _build_test_image(log: Path) -> tuple[Path, Path]:
    stamp = WORK / "built-from"
    source = _source_key()
    made = WORK / "out"
    if stamp.exists() and stamp.read_text().split("\n")[0] == source:
        prefix = Path(stamp.read_text().split("\n")[1])
        if prefix.with_name(prefix.name + ".img").exists():
            return prefix.with_name(prefix.name + ".img"), prefix.with_name(prefix.name + ".boot")
    ca = make_ca(WORK / "ca", "Cairn test updates")
    env = {**os.environ, "CAIRN_IMAGE_WORK": str(WORK),
           # no SSH key in the image: each Guest provisions its own (cairn/authorized_keys)
           "CAIRN_SSH_PUBKEY": "",
           "CAIRN_UPDATE_KEYRING": str(ca["keyring"]), "CAIRN_BUNDLE_CERT": str(ca["cert"]),
           "CAIRN_BUNDLE_KEY": str(ca["key"])}
    with open(log, "w") as out:
        done = subprocess.run([str(ROOT / "images/debian/build-image.sh"), "--no-xz",
                               "--out", str(made)], env=env, stdout=subprocess.PIPE,
                              stderr=out, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"image build failed ({done.returncode}): see {log}\n"
                           + log.read_text()[-3000:])
    prefix = Path(done.stdout.strip().splitlines()[-1])
    stamp.write_text(f"{source}\n{prefix}\n")
    return prefix.with_name(prefix.name + ".img"), prefix.with_name(prefix.name + ".boot")


class Guest:
    """One device: its disk (a copy of the image, grown to ``disk_mib``) and the QEMU
    process that boots it. ``start`` again after ``kill`` or ``poweroff`` boots the same disk."""

    def __init__(self, image: Path, boot: Path, workdir: Path, disk_mib: int = 5120,
                 sensor_uart: bool = True, host_services: dict[str, int] | None = None,
                 provision: dict[str, str] | None = None) -> None:
        self.image, self.boot, self.workdir = image, boot, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.disk = workdir / "disk.img"
        subprocess.run(["cp", "--sparse=always", str(image), str(self.disk)], check=True)
        os.truncate(self.disk, disk_mib * 2**20)
        self.set_board_cmdline()
        self.key = test_key()
        # flashed, then personalised as a person does on a laptop: the image has no SSH key
        self.provision({"authorized_keys": self.key.with_suffix(".pub").read_text(),
                        **(provision or {})})
        # SSH's master sockets: a short path (a Unix socket's is at most 107 bytes, and
        # pytest's directories under xdist are long)
        self.ssh_dir = Path(tempfile.mkdtemp(prefix="cairn-ssh-"))
        self.ssh_port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.boots = 0
        self.sensor_uart = sensor_uart
        self.serial_pty: str | None = None
        self.host_services = host_services or {}
        self.rtc_base: str | None = None
        self.freezes = 0   # boots power-cycled because systemd froze (SYSTEMD_FROZE)

    # -- the machine ---------------------------------------------------------------------
    def set_board_cmdline(self) -> None:
        """The board's kernel arguments in the card's cairn/bootargs.env (boot.scr adds them
        to root= and the slot): the console on QEMU's PL011 instead of the Pi's UART and
        HDMI. TCG on a shared 2-core host: udev's coldplug alone took over 90 s (systemd's
        default wait for a device) in some boots. A kernel that finds no root gives up after
        10 s and restarts at once (the board's 30 s and 10 s: emulated, each of the three
        tries of a slot that never boots waited 40 s); the boot counting is the same."""
        words = ("console=ttyAMA0 systemd.default_device_timeout_sec=600 rootwait=10 panic=1")
        self.write_boot_file("cairn/bootargs.env", f"cairn_cmdline={words}\n".encode())

    def _fat(self) -> str:
        return f"{self.disk}@@{partitions(self.disk)[0]['start'] * 512}"

    def write_boot_file(self, path: str, data: bytes) -> None:
        """A file on the card's FAT boot partition (the guest powered off)."""
        local = self.workdir / "boot-file"
        local.write_bytes(data)
        subprocess.run(["mcopy", "-o", "-i", self._fat(), str(local), f"::{path}"], check=True)

    def provision(self, files: dict[str, str]) -> None:
        """Files into the boot partition's cairn/ folder (``sensors/uart.toml``, ...), as a
        person with a card reader would put them there; the device applies them at boot."""
        for name, text in files.items():
            parent = ""
            for part in f"cairn/{name}".split("/")[:-1]:
                parent = f"{parent}/{part}" if parent else part
                subprocess.run(["mmd", "-i", self._fat(), f"::{parent}"], capture_output=True)
            self.write_boot_file(f"cairn/{name}", text.encode())

    def read_boot_file(self, path: str) -> bytes:
        return subprocess.run(["mcopy", "-n", "-i", self._fat(), f"::{path}", "-"],
                              capture_output=True, check=True).stdout

    def start(self, rtc_base: str | None = None, host_services: dict[str, int] | None = None
              ) -> None:
        """Boot. ``rtc_base``: where the guest's RTC starts (QEMU's ``-rtc base=``).
        ``host_services``: guest address ``IP:PORT`` -> a port on the host's loopback, the
        only host services the guest can reach (QEMU's guestfwd); kept for later boots."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if host_services is not None:
            self.host_services = host_services
        if rtc_base is not None:
            self.rtc_base = rtc_base
        self.boots += 1
        for stale in self.ssh_dir.iterdir():   # the last boot's SSH master and monitor sockets
            stale.unlink()
        self.console = self.workdir / f"console-{self.boots}.log"
        cmd = [
            "qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-smp", "2",
            "-m", "1024", "-display", "none",
            "-monitor", f"unix:{self.ssh_dir / 'monitor'},server,nowait",
            "-serial", f"file:{self.console}",
            "-bios", str(self.boot / "u-boot-qemu.bin"),
            "-drive", f"if=none,id=card,file={self.disk},format=raw",
            "-device", "virtio-blk-pci,drive=card",
            "-netdev", "user,id=lan,restrict=on,"
                       f"hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22,"
                       f"hostfwd=tcp:127.0.0.1:{self.http_port}-:8080"
                       # cmd: a socat per connection (a chardev would be one connection,
                       # made once when QEMU starts)
                       + "".join(f",guestfwd=tcp:{guest}-cmd:socat - TCP:127.0.0.1:{port}"
                                 for guest, port in self.host_services.items()),
            "-device", "virtio-net-pci,netdev=lan,id=nic",
            "-device", "virtio-rng-pci",
            # the board's watchdog (systemd's RuntimeWatchdogSec feeds it) and a USB bus for
            # sticks (plug_usb_stick)
            "-device", "i6300esb", "-device", "qemu-xhci,id=usb",
        ]
        if self.rtc_base:
            # the guest's RTC starts there and runs on; the host clock is untouched
            cmd += ["-rtc", f"base={self.rtc_base},clock=vm"]
        if self.sensor_uart:
            # a second UART (a 16550 on PCI, ttyS0 in the guest) wired to a host pty
            cmd += ["-chardev", "pty,id=sensor", "-device", "pci-serial,chardev=sensor"]
        self.qemu_log = self.workdir / f"qemu-{self.boots}.log"
        with open(self.qemu_log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        self.serial_pty = None
        if self.sensor_uart:
            # QEMU names the pty ("char device redirected to /dev/pts/N") as it starts
            deadline = time.monotonic() + 30
            while self.serial_pty is None:
                m = re.search(r"(/dev/pts/\d+)", self.qemu_log.read_text())
                if m:
                    self.serial_pty = m.group(1)
                elif not self.alive() or time.monotonic() > deadline:
                    raise AssertionError("QEMU named no pty: " + self.qemu_log.read_text())
                else:
                    time.sleep(0.05)

    def monitor(self, command: str) -> str:
        """One command on QEMU's human monitor (e.g. ``set_link nic off``: the network
        cable pulled); returns its answer."""
        with socket.socket(socket.AF_UNIX) as mon:
            mon.settimeout(10)
            mon.connect(str(self.ssh_dir / "monitor"))
            answer = b""
            for send in (b"", command.encode() + b"\n"):
                mon.sendall(send)
                while not answer.endswith(b"(qemu) "):
                    answer += mon.recv(4096)
                if send:
                    return answer.decode(errors="replace").split("\r\n", 1)[-1]
                answer = b""
        return ""

    def plug_usb_stick(self, image: Path, name: str = "stick") -> None:
        """A USB stick (a disk image, read-only) plugged into the running guest."""
        self.monitor(f"drive_add 0 if=none,id={name},file={image},format=raw,readonly=on")
        answer = self.monitor(f"device_add usb-storage,bus=usb.0,drive={name},id={name}-dev")
        assert "rror" not in answer, answer

    def unplug_usb_stick(self, name: str = "stick") -> None:
        self.monitor(f"device_del {name}-dev")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def console_tail(self, chars: int = 3000) -> str:
        try:
            return self.console.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def console_report(self, chars: int = 3000) -> str:
        """For a failure: what systemd said went wrong in the last boot on the console (a
        unit failed, a dependency failed, a wait timed out: often long before the tail),
        then the console's tail, without colour codes."""
        text = ANSI.sub("", self.console_tail(chars=10_000_000))
        boot = text[text.rfind(KERNEL_BANNER):] if KERNEL_BANNER in text else text
        problems = [line.strip() for line in boot.splitlines() if SYSTEMD_PROBLEM.search(line)]
        said = "\n".join(problems[-40:]) or "(none)"
        return (f"systemd's problems in the last boot:\n{said}\n"
                f"--- the console's last {chars} characters:\n{text[-chars:]}")

    def kill(self) -> None:
        """Power cut: SIGKILL, nothing of the guest's page cache reaches the disk."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def poweroff(self, timeout: float = 180) -> None:
        self.ssh("sudo systemctl --no-block poweroff", check=False, timeout=30)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("the guest did not power off:\n"
                                 + self.console_report()) from None

    # -- inside the guest ----------------------------------------------------------------
    def ssh_command(self, *extra: str, shared: bool = True) -> list[str]:
        """ssh to the guest. ``shared``: through one master connection per boot (a key
        exchange costs the emulated CPU seconds; polling with a new one each time starved
        the guest's first boot)."""
        mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.ssh_dir}/%C",
               "-o", "ControlPersist=120"] if shared else ["-o", "ControlPath=none"]
        return ["ssh", "-i", str(self.key), "-p", str(self.ssh_port),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                *mux, *extra, f"{SSH_USER}@127.0.0.1"]

    def ssh(self, command: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        done = subprocess.run(self.ssh_command() + [command], capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{command!r} in the guest exited {done.returncode}:\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def ssh_stdin(self, command: str, stdin, timeout: float = 300) -> None:
        done = subprocess.run(self.ssh_command() + [command], stdin=stdin,
                              capture_output=True, text=False, timeout=timeout)
        assert done.returncode == 0, done.stderr.decode(errors="replace")

    def wait_ready(self, timeout: float = BOOT_TIMEOUT, read_only_root: bool = True,
                   after_boot: str | None = None) -> float:
        """Until the root is the read-only overlay (from the first boot on) and
        systemd reports cairn-router active (Type=notify: READY=1 from the router). Asks
        the guest over SSH; each try is bounded by SSH's own connect timeout. Returns the
        seconds it took. ``after_boot``: a boot id that must have been left behind."""
        started = time.monotonic()
        probe = ("findmnt -no FSTYPE /; systemctl is-active cairn-router.service; "
                 "cat /proc/sys/kernel/random/boot_id")
        last = ""
        restarts = 0
        while time.monotonic() - started < timeout:
            if not self.alive():
                raise AssertionError(f"QEMU exited ({self.proc.returncode}):\n"
                                     + self.console_report())
            if restarts < FREEZE_RESTARTS and self._systemd_froze():
                restarts += 1
                self._power_cycle_frozen_boot()
                continue
            try:
                done = self.ssh(probe, check=False, timeout=30)
            except subprocess.TimeoutExpired:
                continue
            last = done.stdout + done.stderr
            lines = done.stdout.split()
            if len(lines) == 3 and lines[1] == "active" and lines[2] != after_boot and \
                    (lines[0] == "overlay" or not read_only_root):
                self._record_generators()
                return time.monotonic() - started
            if done.returncode == 255:
                # sshd not up yet (connection refused or reset by QEMU's forwarder): the
                # connect itself returned at once, so do not spin
                time.sleep(1)
            else:
                # up, but the router not active yet or first boot not over (it reboots
                # into the read-only root): wait for the unit inside the guest, then look
                # again (also at the root and the boot id)
                self.ssh("timeout 30 sh -c 'until systemctl is-active -q cairn-router; "
                         "do sleep 1; done'", check=False, timeout=60)
        raise AssertionError(f"not ready after {timeout} s (last answer {last!r}):\n"
                             + self.console_report())

    def _record_generators(self) -> None:
        """How long this boot's systemd generators took (PID 1 gives up past 90 s: the boot
        that freezes, images/README.md), printed and kept in GENERATOR_SECONDS, so the boots
        the tests make anyway measure how near each came."""
        done = self.ssh("systemctl show -p GeneratorsStartTimestampMonotonic "
                        "-p GeneratorsFinishTimestampMonotonic", check=False, timeout=60)
        times = dict(line.split("=", 1) for line in done.stdout.split() if "=" in line)
        try:
            took = (int(times["GeneratorsFinishTimestampMonotonic"])
                    - int(times["GeneratorsStartTimestampMonotonic"])) / 1e6
        except (KeyError, ValueError):
            return
        GENERATOR_SECONDS.append(took)
        print(f"\n[appliance] boot {self.boots}: systemd's generators took {took:.1f} s "
              f"(host load {os.getloadavg()[0]:.1f})", flush=True)

    def _systemd_froze(self) -> bool:
        # console_tail: QEMU may not have created this boot's console file yet
        return SYSTEMD_FROZE in self.console_tail(chars=100_000)

    def _power_cycle_frozen_boot(self) -> None:
        self.freezes += 1
        said = [line for line in self.console_tail(600).splitlines() if "systemd" in line]
        message = (f"boot {self.boots} froze in systemd ({' / '.join(said[-2:])}): "
                   "power-cycled, as a hardware watchdog would (none is armed yet)")
        FROZEN_BOOTS.append(message)
        print(f"\n[appliance] {message}", flush=True)
        warnings.warn(message, stacklevel=3)
        self.kill()
        self.start()

    def step_clock_to_host_time(self) -> float:
        """What NTP does at its first answer: step the guest's wall clock to this host's
        time and say it is synchronized (the flag file timesyncd writes). The host's time is
        sent once the guest's side is running and waiting for it, so the step is off by
        the SSH session's one-way latency only. Returns the step in seconds."""
        script = ("import os, sys, time\n"
                  "print('ready', flush=True)\n"
                  "now = float(sys.stdin.readline())\n"
                  "step = now - time.time()\n"
                  "time.clock_settime(time.CLOCK_REALTIME, now)\n"
                  "os.makedirs('/run/systemd/timesync', exist_ok=True)\n"
                  "open('/run/systemd/timesync/synchronized', 'w').close()\n"
                  "print(step)\n")
        proc = subprocess.Popen(self.ssh_command() + [f"sudo python3 -c {shlex.quote(script)}"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            proc.stdin.write(f"{time.time():.6f}\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        return float(out)

    @contextlib.contextmanager
    def tunnel(self, guest_port: int = 8080, timeout: float = 120):
        """An SSH tunnel to the router's loopback listener, as the README tells an admin to
        reach a device: ``ssh -L PORT:127.0.0.1:8080``. Yields the local port."""
        port = free_port()
        proc = self._open_tunnel(port, guest_port, time.monotonic() + timeout)
        try:
            yield port
        finally:
            _stop(proc)

    def _open_tunnel(self, port: int, guest_port: int, deadline: float) -> subprocess.Popen:
        """Starts ssh -L and waits for the local port. An ssh that gives up (the emulated
        CPU, busy just after a boot, can take longer than ConnectTimeout to answer the key
        exchange) is started again until ``deadline``."""
        while True:
            proc = subprocess.Popen(
                self.ssh_command("-N", "-o", "ExitOnForwardFailure=yes",
                                 "-L", f"127.0.0.1:{port}:127.0.0.1:{guest_port}",
                                 shared=False),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True)
            while proc.poll() is None:
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), timeout=2):
                    return proc
                if time.monotonic() > deadline:
                    _stop(proc)
                    raise AssertionError("the SSH tunnel did not open")
                time.sleep(0.2)
            error = proc.stderr.read()
            if time.monotonic() > deadline:
                raise AssertionError(f"ssh -L exited: {error}")
            time.sleep(1)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.ssh_dir, ignore_errors=True)


# where the device reaches "the central side" (an update server the tests run on this host)
CENTRAL = "10.0.2.100:8000"


def booted(image: tuple[Path, Path], workdir: Path,
           host_services: dict[str, int] | None = None,
           provision: dict[str, str] | None = None):
    """A device for the tests (a generator for a fixture): first boot (the data partition,
    the device's settings and host keys, under the read-only root), then ready."""
    guest = Guest(*image, workdir, host_services=host_services, provision=provision)
    guest.start()
    took = guest.wait_ready()
    print(f"\n[appliance] first boot to cairn-router ready: {took:.0f} s")
    try:
        yield guest
    finally:
        guest.close()


def http_get(port: int, path: str, timeout: float = 30) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    if proc.poll() is None:
        proc.kill()


def partitions(disk: Path) -> list[dict]:
    return json.loads(subprocess.run(["sfdisk", "--json", str(disk)], capture_output=True,
                                     text=True, check=True).stdout)["partitiontable"]["partitions"]


@contextlib.contextmanager
def partition_device(disk: Path, number: int, read_only: bool = True):
    """A loop device of one partition of a (powered off) guest's disk."""
    part = partitions(disk)[number - 1]
    cmd = ["losetup", "--find", "--show", "--offset", str(part["start"] * 512),
           "--sizelimit", str(part["size"] * 512)] + (["--read-only"] if read_only else [])
    dev = subprocess.run(cmd + [str(disk)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def appliance_marks() -> list:
    """An appliance test module's marks: ``appliance``, and skipped without the tools or root
    (the image build needs mmdebstrap and chroot, the fsck a loop device)."""
    import pytest

    missing = tools_missing()
    if missing or os.geteuid() != 0:
        return [pytest.mark.appliance, pytest.mark.skip(
            reason=f"{missing} is not installed" if missing else "needs root")]
    return [pytest.mark.appliance]


def tools_missing() -> str | None:
    for tool in ("qemu-system-aarch64", "mmdebstrap", "ssh", "sfdisk", "mkfs.vfat", "mcopy",
                 "losetup", "e2fsck", "socat", "mkimage", "mkenvimage", "rauc"):
        if not shutil.which(tool):
            return tool
    return None


if __name__ == "__main__":
    # `python -m tests.qemu_device`: build the test image now (the base too, on a cold
    # cache), so that .ci/run can do it while `make test` runs; the appliance tests then
    # find it built from the same sources
    log = WORK.parent / "debian-test-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    image, _ = build_test_image(log)
    print(f"test image {image} ready in {time.monotonic() - started:.0f} s")
