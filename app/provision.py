"""``cairn provision``: personalise a device from the ``cairn/`` folder on its boot partition.

Run as root at every boot, before the router, the drivers, sshd and NetworkManager. The
folder (see images/provision/README.txt) may hold ``cairn.toml``, ``sensors/*.toml``,
``mqtt/*.toml``, ``secrets/*``, ``authorized_keys``, ``hostname``, ``network/*.toml`` and
``update-keyring.pem``. All of it is checked first, with Cairn's own config checks; if any
of it is bad nothing is applied and the folder is left as it is, to be fixed from a laptop.
Otherwise every file is written into the device's own settings (tmp + fsync + rename, the
replaced files kept in memory to be put back if a write fails midway) and the inputs are
removed from the FAT partition, which anyone who holds the card can read. Either way
``report.txt`` beside them says when, what and why (names only, never a secret's value).

Exit status: 0 applied or nothing to do, 2 refused, 1 a write failed (restored).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import grp
import json
import logging
import os
import re
import ssl
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.app import network_profiles
from cairn.gateway.config import check_whole
from cairn.gateway.config import load as cfg_load
from cairn.gateway.config_history import PROVISIONING as OUTCOME_FILE
from cairn.gateway.config_history import History, provisioning_outcome
from cairn.gateway.config_tools import ConfigError
from cairn.gateway.files import fsync_dir, write_atomically

log = logging.getLogger("cairn.provision")

BOOT_FOLDER = Path("/boot/firmware/cairn")
ETC = Path("/etc/cairn")
DATA = Path("/data")
DEVICE_SECRETS = "/etc/cairn/secrets"  # what a cairn.toml on the device names
# U-Boot's state (build-image.sh) and provisioning's own files: never read, moved or removed
RESERVED = {"boot.env", "bootargs.env", "report.txt", "report.tmp", "readme.txt"}
# what laptops leave on any FAT stick: not worth a line in the report
JUNK = {".ds_store", "system volume information", ".spotlight-v100", ".trashes",
        ".fseventsd", "thumbs.db", "desktop.ini", ".metadata_never_index"}
MAX_BYTES = 1 << 20  # no input is larger; a bigger "cairn.toml" is garbage, not config
SAFE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
EXIT_APPLIED, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


@dataclass(frozen=True)
class Problem:
    file: str
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.problem}"


@dataclass
class Change:
    """One file to write into the device's settings, from one input (``source``)."""

    source: Path | None  # in the boot folder, removed once everything is applied
    dest: Path
    data: bytes
    mode: int = 0o644
    group: str | None = None  # chgrp to it when the group exists
    note: str = ""            # for the report: never a secret value
    config: bool = False      # cairn.toml: written by install_config only
    remove: bool = False      # dest is removed (data unused)


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    not_understood: list[str] = field(default_factory=list)
    hostname: str | None = None

    def refuse(self, file: str, key: str, problem: str) -> None:
        self.problems.append(Problem(file, key, problem))


@dataclass
class Inputs:
    """The folder's entries by role: the top-level files by their lower-case name, the
    groups' files by group (secrets, sensors, mqtt, network)."""

    files: dict[str, Path] = field(default_factory=dict)    # cairn.toml, hostname, ...
    groups: dict[str, list[Path]] = field(default_factory=dict)  # sensors, mqtt, ...
    not_understood: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.files and not any(self.groups.values())


TOP_FILES = ("cairn.toml", "authorized_keys", "hostname", "update-keyring.pem")
GROUPS = {"secrets": None, "sensors": ".toml", "mqtt": ".toml", "network": ".toml"}


# -- reading the folder ----------------------------------------------------------------------

def scan(folder: Path) -> Inputs:
    """Sort the folder's entries. Names match case-insensitively, as FAT does."""
    inputs = Inputs()
    for entry in _entries(folder):
        name = entry.name.lower()
        if name in TOP_FILES:
            inputs.files[name] = entry
        elif name in GROUPS and entry.is_dir():
            inputs.groups[name] = _group(entry, GROUPS[name], inputs)
        else:
            inputs.not_understood.append(_describe(entry.name))
    return inputs


def _entries(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(e for e in folder.iterdir()
                  if not _ignored(e.name) and e.name.lower() not in RESERVED)


def _ignored(name: str) -> bool:
    return name.startswith("._") or name.lower() in JUNK


def _group(folder: Path, suffix: str | None, inputs: Inputs) -> list[Path]:
    found = []
    for entry in _entries(folder):
        if entry.is_file() and (suffix is None or entry.name.lower().endswith(suffix)):
            found.append(entry)
        else:
            inputs.not_understood.append(_describe(f"{folder.name}/{entry.name}"))
    return found


def _describe(name: str) -> str:
    if name.lower().endswith(".sample"):
        return f"{name} (an example: remove .sample from its name to use it)"
    # Windows hides extensions, so "cairn.toml" saved from Notepad is "cairn.toml.txt"
    for known in (*TOP_FILES, ".toml"):
        if name.lower().endswith(known + ".txt"):
            return f"{name} (did the editor add .txt? rename it to end in {known})"
    return name


def read_input(path: Path, label: str, plan: Plan) -> bytes | None:
    if not path.is_file():
        plan.refuse(label, "-", "is a folder, expected a file")
        return None
    if path.stat().st_size > MAX_BYTES:
        plan.refuse(label, "-", f"larger than {MAX_BYTES} bytes: not an input Cairn reads")
        return None
    return path.read_bytes()


def read_text(path: Path, label: str, plan: Plan) -> str | None:
    data = read_input(path, label, plan)
    if data is None:
        return None
    try:
        text = data.decode("utf-8-sig")  # Notepad's byte order mark
    except UnicodeDecodeError as e:
        plan.refuse(label, "-", f"not UTF-8 text (byte {e.start}): garbage, or a binary file")
        return None
    return text.replace("\r\n", "\n")


def label_of(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


# -- checking the inputs ---------------------------------------------------------------------

@dataclass
class Context:
    folder: Path
    etc: Path
    data: Path
    staging: Path  # the folder's secrets, where config checks can read them
    staged: dict[str, str] = field(default_factory=dict)  # device path -> staged path

    def unstage(self, text: str) -> str:
        """Messages name the secret's device path, not the staging copy's."""
        for device, staged in self.staged.items():
            text = text.replace(staged, device)
        return text


def make_plan(inputs: Inputs, ctx: Context) -> Plan:
    """Check every input and turn the good ones into changes. Secrets go first: a config's
    secret_file paths are read while it is checked."""
    plan = Plan(not_understood=list(inputs.not_understood))
    check_secrets(inputs.groups.get("secrets", []), ctx, plan)
    for name, check in FILE_CHECKS.items():
        if name in inputs.files:
            check(inputs.files[name], ctx, plan)
    for group, check in GROUP_CHECKS.items():
        check(inputs.groups.get(group, []), ctx, plan)
    return plan


def check_secrets(paths: list[Path], ctx: Context, plan: Plan) -> None:
    for path in paths:
        label = label_of(path, ctx.folder)
        if not _safe_name(path.name, SAFE_NAME):
            plan.refuse(label, "-", "a secret's name: letters, digits, '.', '_' and '-'")
            continue
        data = read_input(path, label, plan)
        if data is None:
            continue
        if not data.strip():
            plan.refuse(label, "-", "is empty: a secret must not be empty")
            continue
        staged = ctx.staging / path.name
        staged.write_bytes(data)
        for prefix in (DEVICE_SECRETS, str(ctx.etc / "secrets")):
            ctx.staged[f"{prefix}/{path.name}"] = str(staged)
        plan.changes.append(Change(path, ctx.etc / "secrets" / path.name, data, 0o640,
                                   "cairn", note="secret"))


def _safe_name(name: str, pattern: str) -> bool:
    return re.fullmatch(pattern, name) is not None


def load_document(path: Path, ctx: Context, plan: Plan) -> tuple[str, dict[str, Any]] | None:
    """The input's text and its TOML document, secret paths pointing at the staged copies."""
    label = label_of(path, ctx.folder)
    text = read_text(path, label, plan)
    if text is None:
        return None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        plan.refuse(label, "-", f"invalid TOML: {e}")
        return None
    return text, _staged_paths(data, ctx.staged)


def _staged_paths(value: Any, staged: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _staged_paths(v, staged) for k, v in value.items()}
    if isinstance(value, list):
        return [_staged_paths(v, staged) for v in value]
    return staged.get(value, value) if isinstance(value, str) else value


def checked(check: Callable[[dict[str, Any], str], object], data: dict[str, Any], label: str,
            ctx: Context, plan: Plan) -> bool:
    try:
        check(data, label)
    except ConfigError as e:
        plan.refuse(e.source, e.key, ctx.unstage(e.problem))
        return False
    return True


def check_cairn_toml(path: Path, ctx: Context, plan: Plan) -> None:
    loaded = load_document(path, ctx, plan)
    if loaded and checked(check_whole, loaded[1], label_of(path, ctx.folder), ctx, plan):
        plan.changes.append(Change(path, ctx.etc / "cairn.toml", loaded[0].encode(),
                                   note="the router's config", config=True))


def check_sensor(data: dict[str, Any], source: str) -> None:
    from cairn.drivers import serial_config

    serial_config.parse(data, source)


def check_mqtt(data: dict[str, Any], source: str) -> None:
    from cairn.drivers import mqtt_bridge

    mqtt_bridge.load(data, source)


def driver_checks(folder: str, check: Callable[[dict[str, Any], str], object]
                  ) -> Callable[[list[Path], Context, Plan], None]:
    """sensors/NAME.toml -> /etc/cairn/sensors/NAME.toml, run as cairn-sensor@NAME."""
    def check_all(paths: list[Path], ctx: Context, plan: Plan) -> None:
        for path in paths:
            label = label_of(path, ctx.folder)
            stem = path.name[:-len(".toml")]
            if not _safe_name(stem, r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"):
                plan.refuse(label, "-", "file name: letters, digits, '_' and '-' before .toml "
                                        "(it names the service)")
                continue
            loaded = load_document(path, ctx, plan)
            if loaded and checked(check, loaded[1], label, ctx, plan):
                plan.changes.append(Change(path, ctx.etc / folder / f"{stem}.toml",
                                           loaded[0].encode(), note=f"{folder} driver {stem}"))
    return check_all


def checked_text(path: Path, ctx: Context, plan: Plan,
                 problem_of: Callable[[str], str | None]) -> str | None:
    """The input's text, or None when it cannot be read or ``problem_of`` finds a problem
    with it as a whole (refused, naming the file)."""
    label = label_of(path, ctx.folder)
    text = read_text(path, label, plan)
    problem = None if text is None else problem_of(text)
    if problem:
        plan.refuse(label, "-", problem)
        return None
    return text


def check_authorized_keys(path: Path, ctx: Context, plan: Plan) -> None:
    """Every line a public key (as ssh-keygen reads it); the set replaces the device's."""
    text = checked_text(path, ctx, plan, lambda text: "holds a private key: put only public "
                        "keys (the lines of your .pub files) here, and make a new key: this "
                        "one was on a card anyone can read" if "PRIVATE KEY" in text else None)
    if text is None:
        return
    label = label_of(path, ctx.folder)
    keys, fingerprints = [], []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fingerprint = key_fingerprint(line)
        if fingerprint is None:
            plan.refuse(label, f"line {number}", "not an SSH public key (ssh-keygen -l cannot "
                                                 "read it)")
        keys.append(line)
        fingerprints.append(fingerprint)
    if not keys:
        plan.refuse(label, "-", "holds no key: SSH would let no one in (leave the file out to "
                                "keep the device's keys)")
    if keys and None not in fingerprints:
        plan.changes.append(Change(path, ctx.data / "etc/ssh/authorized_keys",
                                   "".join(f"{k}\n" for k in keys).encode(),
                                   note=f"{len(keys)} key(s): {', '.join(fingerprints)}"))


def key_fingerprint(line: str) -> str | None:
    """The key's SHA256 fingerprint, or None when ssh-keygen does not read it as a key."""
    with tempfile.NamedTemporaryFile("w", suffix=".pub") as f:
        f.write(line + "\n")
        f.flush()
        try:
            result = subprocess.run(["ssh-keygen", "-l", "-f", f.name], capture_output=True,
                                    text=True, timeout=10)
        except FileNotFoundError:
            raise ProvisionError("ssh-keygen is not installed: keys cannot be checked") from None
    fields = result.stdout.split()
    return fields[1] if result.returncode == 0 and len(fields) > 1 else None


class ProvisionError(Exception):
    """The device cannot check or apply inputs at all (not the inputs' fault)."""


def check_hostname(path: Path, ctx: Context, plan: Plan) -> None:
    text = checked_text(path, ctx, plan, lambda text: hostname_problem(text.strip()))
    if text is None:
        return
    plan.hostname = text.strip().lower()
    plan.changes.append(Change(path, ctx.data / "etc/hostname", f"{plan.hostname}\n".encode(),
                               note=plan.hostname))


def hostname_problem(name: str) -> str | None:
    """Why ``name`` is no RFC 1123 host name, or None."""
    if not name:
        return "is empty: write the device's name on one line"
    if any(c.isspace() for c in name):
        return "has spaces or more than one line: a host name is one word, like greenhouse-7"
    if len(name) > 253:
        return "longer than 253 characters"
    for label in name.lower().split("."):
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", label):
            return (f"{name!r} is not a host name: letters, digits and '-' (not first or last), "
                    f"1 to 63 characters between dots")
    return None


def check_keyring(path: Path, ctx: Context, plan: Plan) -> None:
    """The CA certificate(s) update bundles are signed by, as RAUC reads them."""
    text = checked_text(path, ctx, plan, keyring_problem)
    if text is None:
        return
    plan.changes.append(Change(path, ctx.etc / "update/keyring.pem", text.encode(),
                               note="the update keyring"))


def keyring_problem(text: str) -> str | None:
    if "PRIVATE KEY" in text:
        return ("holds a private key: the keyring is the CA's certificate only, and this key "
                "has been on a card anyone can read")
    if "-----BEGIN CERTIFICATE-----" not in text:
        return "no PEM certificate (-----BEGIN CERTIFICATE-----) in it"
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(text)
        f.flush()
        try:
            certificates = ssl.create_default_context(cafile=f.name).get_ca_certs()
        except ssl.SSLError as e:
            return f"not a certificate that can be loaded: {e.reason or e}"
    if not certificates:
        return "no CA certificate in it (the keyring is the CA that signs update bundles)"
    return None


def check_network(paths: list[Path], ctx: Context, plan: Plan) -> None:
    """network/NAME.toml -> NetworkManager keyfile cairn-NAME.nmconnection (0600: it holds
    passphrases) on the data partition; a Wi-Fi country to /data/etc/cairn/wifi-country.
    One holding only ``remove = true`` removes that keyfile."""
    countries: dict[str, str] = {}
    for path in paths:
        label = label_of(path, ctx.folder)
        loaded = load_document(path, ctx, plan)
        if loaded is None:
            continue
        try:
            removed = network_profiles.removal(loaded[1], label, path.name[:-5])
            if removed is not None:
                plan.changes.append(profile_removal(path, ctx, removed))
                continue
            profile = network_profiles.parse_profile(loaded[1], label, path.name[:-5])
        except ConfigError as e:
            plan.refuse(e.source, e.key, e.problem)
            continue
        plan.changes.append(Change(
            path, ctx.data / NM_CONNECTIONS / f"{profile.name}.nmconnection",
            profile.keyfile.encode(), 0o600, note=f"NetworkManager {profile.nm_type} profile "
                                                  f"{profile.name}"))
        if profile.country:
            countries[label] = profile.country
    if len(set(countries.values())) > 1:
        named = ", ".join(f"{label}: {c}" for label, c in countries.items())
        plan.refuse("network", "country", f"the profiles name different countries ({named}): "
                                          f"a device is in one")
    elif countries:
        country = next(iter(countries.values()))
        plan.changes.append(Change(None, ctx.data / "etc/cairn/wifi-country",
                                   f"{country}\n".encode(), note=country))


def profile_removal(path: Path, ctx: Context, name: str) -> Change:
    """A profile that is not there is reported, not refused: the same card for fifty sites
    removes an old profile from those that have it."""
    dest = ctx.data / NM_CONNECTIONS / f"{name}.nmconnection"
    note = f"removed network profile {name}" if dest.exists() else \
        f"no network profile {name} on this device: nothing to remove"
    return Change(path, dest, b"", note=note, remove=True)


NM_CONNECTIONS = "etc/NetworkManager/system-connections"
FILE_CHECKS: dict[str, Callable[[Path, Context, Plan], None]] = {
    "update-keyring.pem": check_keyring,
    "cairn.toml": check_cairn_toml,
    "authorized_keys": check_authorized_keys,
    "hostname": check_hostname,
}
GROUP_CHECKS: dict[str, Callable[[list[Path], Context, Plan], None]] = {
    "sensors": driver_checks("sensors", check_sensor),
    "mqtt": driver_checks("mqtt", check_mqtt),
    "network": check_network,
}


# -- applying --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """A destination as it was before provisioning replaced it (``data`` None: absent)."""

    data: bytes | None
    mode: int = 0o644
    uid: int = -1
    gid: int = -1


def snapshot(path: Path) -> Snapshot:
    try:
        st = path.stat()
        return Snapshot(path.read_bytes(), st.st_mode & 0o7777, st.st_uid, st.st_gid)
    except FileNotFoundError:
        return Snapshot(None)


def install_config(etc: Path, text: str, by: str) -> None:
    """The one place provisioning writes cairn.toml, recorded in the config history. With no
    last good configuration yet (a first boot), the one it replaces becomes it: should the
    router not start on the new one, it has the image's own to fall back to."""
    file = etc / "cairn.toml"
    history = History(file)
    with history.locked():
        if history.last_good_text() is None and file.is_file():
            with contextlib.suppress(ConfigError, OSError, UnicodeDecodeError):
                cfg_load(file)
                history.mark_good(file.read_text(encoding="utf-8"))
        write_atomically(file, text, mode=0o644)
        history.record(text, by, "the boot partition's cairn/cairn.toml", "restart")
    log.info("installed %s (%s)", file, by)


def put_back_config(etc: Path, text: str) -> None:
    """The config as it was before a run that failed midway; its change is rolled back."""
    file = etc / "cairn.toml"
    history = History(file)
    with history.locked():
        write_atomically(file, text, mode=0o644)
        latest = history.changes()
        if latest and latest[0].state == "pending":
            history.set_state(latest[0], "rolled_back",
                              "another file of the boot partition's folder could not be "
                              "written: the folder was not applied")


def apply(plan: Plan, etc: Path) -> None:
    """Write every change; if one fails, put back what the earlier ones replaced."""
    done: list[tuple[Change, Snapshot]] = []
    try:
        for change in plan.changes:
            before = snapshot(change.dest)
            write_change(change, etc)
            done.append((change, before))
    except OSError:
        for change, before in reversed(done):
            restore(change, before, etc)
        raise


def write_change(change: Change, etc: Path) -> None:
    if change.config:
        install_config(etc, change.data.decode(), "cairn provision from the boot partition")
        return
    if change.remove:
        with contextlib.suppress(FileNotFoundError):  # nothing to remove: nothing to sync
            change.dest.unlink()
            fsync_dir(change.dest.parent)
        return
    # the folders that hold secrets are no more readable than the secrets
    folder_mode = 0o750 if change.group else 0o755 if change.mode & 0o004 else 0o700
    make_parent(change.dest.parent, folder_mode, change.group)
    write_atomically(change.dest, change.data, mode=change.mode, gid=group_id(change.group))


def restore(change: Change, before: Snapshot, etc: Path) -> None:
    try:
        if before.data is None:
            change.dest.unlink(missing_ok=True)
        elif change.config:
            put_back_config(etc, before.data.decode())
        else:
            write_atomically(change.dest, before.data, mode=before.mode, uid=before.uid,
                             gid=before.gid)
    except OSError as e:  # keep putting back the others
        log.error("cannot put back %s: %s", change.dest, e)


def make_parent(folder: Path, mode: int, group: str | None) -> None:
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir()
    os.chmod(folder, mode)  # not the umask's
    gid = group_id(group)
    if gid != -1:
        os.chown(folder, -1, gid)


def group_id(name: str | None) -> int:
    if name is None:
        return -1
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:  # a development machine without the cairn group: root's
        return -1


def sync_folder(folder: Path) -> None:
    """The boot partition's folder on disk, as far as it goes (a card pulled, a file system
    that does not sync a directory)."""
    with contextlib.suppress(OSError):
        fsync_dir(folder)


def consume(plan: Plan, folder: Path) -> list[str]:
    """Remove the applied inputs from the FAT partition, overwriting them first: they may
    hold secrets, and FAT leaves a removed file's clusters as they were. Problems as text."""
    problems = []
    for source in sorted({c.source for c in plan.changes if c.source is not None}):
        try:
            _scrub(source)
            source.unlink()
        except OSError as e:
            problems.append(f"{label_of(source, folder)}: cannot remove it: {e.strerror}")
    for sub in sorted({c.source.parent for c in plan.changes if c.source is not None}):
        if sub != folder and not any(sub.iterdir()):
            with contextlib.suppress(OSError):
                sub.rmdir()
        sync_folder(sub)
    sync_folder(folder)
    return problems


def _scrub(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(b"\0" * size)
        f.flush()
        os.fsync(f.fileno())


def set_hostname(name: str) -> None:
    """The running system's name, now (the boot's own unit applies /data/etc/hostname)."""
    import socket

    try:
        socket.sethostname(name)
    except OSError as e:
        log.warning("cannot set the host name now (%s); it applies at the next boot", e)


# -- the report and the command --------------------------------------------------------------

def report(outcome: str, plan: Plan, lines: list[str] | None = None) -> str:
    """report.txt: what a person at a laptop needs, no secret values (names only)."""
    out = ["Cairn provisioning report", f"When: {_now()} (boot {_boot_id()})", "",
           outcome, *(lines or [])]
    if plan.problems:
        out += ["", "Problems (file: key: problem):", *(f"  {p}" for p in plan.problems)]
    if plan.changes and not plan.problems:
        out += ["", "Applied:" if not outcome.startswith(("FAILED", "CHECKED")) else
                "Would apply:"]
        out += [f"  {_source(c)}: {c.note} ({c.dest})" if c.remove else
                f"  {_source(c)} -> {c.dest} ({c.note})" for c in plan.changes]
    if plan.not_understood:
        out += ["", "Not understood, left alone:", *(f"  {n}" for n in plan.not_understood)]
    return "\n".join(out) + "\n"


def _source(change: Change) -> str:
    if change.source is None:
        return "network (country)"
    return f"{change.source.parent.name}/{change.source.name}" \
        if change.source.parent.name.lower() in GROUPS else change.source.name


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def write_report(folder: Path, text: str) -> None:
    """report.txt on the FAT partition, CRLF for Notepad; no chmod (FAT has none)."""
    tmp = folder / "report.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(text.replace("\n", "\r\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / "report.txt")
        sync_folder(folder)
    except OSError as e:  # a read-only or vanished card: the journal still has it
        log.error("cannot write %s: %s", folder / "report.txt", e)


def provision(folder: Path, etc: Path, data: Path, dry_run: bool = False,
              live: bool = False) -> int:
    inputs = scan(folder)
    if inputs.empty():
        return nothing_to_do(folder, etc, inputs, dry_run)
    try:
        with tempfile.TemporaryDirectory(prefix="cairn-provision-") as staging:
            plan = make_plan(inputs, Context(folder, etc, data, Path(staging)))
    except ProvisionError as e:
        record_outcome(etc, "failed", [str(e)], dry_run)
        return finish(folder, EXIT_FAILED, dry_run, report(
            f"FAILED: the files could not be checked ({e}); nothing was applied.",
            Plan(not_understood=inputs.not_understood)))
    if plan.problems:
        record_outcome(etc, "refused", plan.problems, dry_run)
        return finish(folder, EXIT_REFUSED, dry_run, report(
            "REFUSED: nothing was applied; the device runs as before. Fix the files named "
            "below on this card and boot again.", plan))
    if dry_run:
        return finish(folder, EXIT_APPLIED, dry_run, report("CHECKED (--dry-run): all good, "
                                                            "nothing written.", plan))
    try:
        apply(plan, etc)
    except OSError as e:
        record_outcome(etc, "failed", [f"writing {e.filename or 'a file'}: {e.strerror or e}"],
                       dry_run)
        return finish(folder, EXIT_FAILED, dry_run, report(
            f"FAILED: writing {e.filename or 'a file'} failed ({e.strerror or e}); what was "
            f"already written was put back and the files stay on this card.", plan))
    record_outcome(etc, "applied", [], dry_run)
    leftovers = consume(plan, folder)
    if plan.hostname and live:
        set_hostname(plan.hostname)
    return finish(folder, EXIT_APPLIED, dry_run, report(
        "APPLIED: the files below were moved into the device's settings and removed from "
        "this card.", plan, leftovers))


def record_outcome(etc: Path, outcome: str, problems: list[str], dry_run: bool) -> None:
    """The last run's outcome for the router's status and the dashboard (OUTCOME_FILE in the
    settings, readable by the router): applied, refused, failed, or cleared (a refused folder
    taken away). Names and problems only, never a secret."""
    if dry_run:
        return
    record = {"at": _now(), "boot_id": _boot_id(), "outcome": outcome,
              "problems": [str(p) for p in problems]}
    try:
        write_atomically(etc / OUTCOME_FILE, json.dumps(record, indent=1) + "\n", mode=0o644)
    except OSError as e:   # the report on the FAT still says it
        log.error("cannot record the outcome in %s: %s", etc / OUTCOME_FILE, e)


def read_outcome(etc: Path) -> dict[str, Any] | None:
    return provisioning_outcome(etc / "cairn.toml")


def nothing_to_do(folder: Path, etc: Path, inputs: Inputs, dry_run: bool) -> int:
    """Nothing to apply. Files it does not understand get a report once (e.g. a
    cairn.toml.txt): a later boot does not overwrite the report of the run that applied."""
    log.info("provision: nothing to apply in %s", folder)
    if not dry_run and (read_outcome(etc) or {}).get("outcome") in ("refused", "failed"):
        record_outcome(etc, "cleared", [], dry_run)   # the files it refused were taken away
    if inputs.not_understood and not (folder / "report.txt").exists():
        finish(folder, EXIT_APPLIED, dry_run, report(
            "NOTHING APPLIED: no file here is one Cairn reads (see README.txt).",
            Plan(not_understood=inputs.not_understood)))
    return EXIT_APPLIED


def finish(folder: Path, code: int, dry_run: bool, text: str) -> int:
    for line in text.splitlines():
        if line:
            log.log(logging.ERROR if code else logging.INFO, "%s", line)
    if not dry_run:
        write_report(folder, text)
    return code


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "provision", help="apply the cairn/ folder of the boot partition (at boot, as root)",
        description="Check the files of the cairn/ folder on the boot partition with Cairn's "
                    "own config checks and, if all are good, move them into the device's "
                    "settings; write report.txt there either way. Exit 0 applied or nothing "
                    "to do, 2 refused (nothing applied), 1 a write failed (put back).")
    parser.add_argument("--from", dest="folder", type=Path, default=BOOT_FOLDER,
                        metavar="DIR", help=f"the folder (default {BOOT_FOLDER})")
    parser.add_argument("--etc", type=Path, default=ETC, metavar="DIR",
                        help=f"Cairn's settings (default {ETC})")
    parser.add_argument("--data", type=Path, default=DATA, metavar="DIR",
                        help=f"the data partition (default {DATA}); the running host name "
                             f"is set only with the default")
    parser.add_argument("--dry-run", action="store_true",
                        help="check and print the report; write nothing, not even the report")
    parser.add_argument("--render-network", type=Path, metavar="FILE",
                        help="print the NetworkManager keyfile of one network/NAME.toml")


def main(args: argparse.Namespace) -> int:
    if args.render_network:
        return render_network(args.render_network)
    return provision(args.folder, args.etc, args.data, args.dry_run,
                     live=not args.dry_run and args.data == DATA)


def render_network(path: Path) -> int:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        stem = path.name[:-5] if path.name.lower().endswith(".toml") else path.stem
        profile = network_profiles.parse_profile(data, str(path), stem)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        print(f"cairn: cannot read {path}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ConfigError as e:
        print(f"cairn: bad network file: {e}", file=sys.stderr)
        return EXIT_REFUSED
    sys.stdout.write(profile.keyfile)
    return EXIT_APPLIED
