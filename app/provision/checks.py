"""Every input checked with Cairn's own checks; each good one becomes a change of the plan,
each bad one a problem (``file: key: problem``)."""

from __future__ import annotations

import re
import ssl
import subprocess
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.app import network_profiles
from cairn.app.provision.folder import (
    DEVICE_SECRETS,
    SAFE_NAME,
    Change,
    Inputs,
    Plan,
    label_of,
    read_input,
    read_text,
)
from cairn.app.sections import check_whole
from cairn.base.config_tools import ConfigError

MAX_KEYS = 100  # lines of authorized_keys: a team's laptops, not a junk file's thousands
_KEY_TYPE = re.compile(r"(ssh-|ecdsa-|sk-)[\w.@-]+\s")  # a line that starts with its key


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
    for link in inputs.links:
        plan.refuse(link, "-", "a symbolic link: provisioning reads regular files only and "
                               "never follows a link")
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
    """Every line a public key (as ssh-keygen reads it); the set replaces the device's. At
    most MAX_KEYS of them, checked in one ssh-keygen run: a junk file costs two runs, not
    one a line (2,000 lines took 18 s; a 1 MiB one would outlast the boot unit's 5 minutes,
    on every boot, with SSH and the network waiting behind it)."""
    text = checked_text(path, ctx, plan, lambda text: "holds a private key: put only public "
                        "keys (the lines of your .pub files) here, and make a new key: this "
                        "one was on a card anyone can read" if "PRIVATE KEY" in text else None)
    if text is None:
        return
    label = label_of(path, ctx.folder)
    keys = [(number, line.strip()) for number, line in enumerate(text.split("\n"), 1)
            if line.strip() and not line.strip().startswith("#")]
    if not keys:
        plan.refuse(label, "-", "holds no key: SSH would let no one in (leave the file out to "
                                "keep the device's keys)")
    elif len(keys) > MAX_KEYS:
        plan.refuse(label, "-", f"{len(keys)} lines of keys, more than the {MAX_KEYS} a device "
                                f"takes: not checked (a file of something else?)")
    elif (fingerprints := key_fingerprints([line for _, line in keys])) is None:
        plan.refuse(label, f"line {first_bad(keys)}", "not an SSH public key (ssh-keygen -l "
                                                       "cannot read it); the lines after it "
                                                       "were not checked")
    else:
        plan.changes.append(Change(path, ctx.data / "etc/ssh/authorized_keys",
                                   "".join(f"{line}\n" for _, line in keys).encode(),
                                   note=keys_note(keys, fingerprints)))


def keys_note(keys: list[tuple[int, str]], fingerprints: list[str]) -> str:
    """The report's line: the fingerprints, and the options of the keys that have them (a
    forced command, a source address, environment variables: sshd applies them at each
    login with that key, so the person who wrote the card sees them said)."""
    note = f"{len(keys)} key(s): {', '.join(fingerprints)}"
    optioned = [f"line {number} ({fingerprint}): {', '.join(options)}"
                for (number, line), fingerprint in zip(keys, fingerprints, strict=True)
                if (options := key_options(line))]
    return note + (f"; with options sshd applies at each login: {'; '.join(optioned)}"
                   if optioned else "")


def key_options(line: str) -> list[str]:
    """The names of the options written before the key (``command``, ``from``,
    ``environment``, ``no-pty``, ...), as sshd reads them: comma-separated, up to the first
    blank outside double quotes."""
    if _KEY_TYPE.match(line):
        return []
    options, current, quoted, escaped = [], "", False, False
    for c in line:
        if c in " \t" and not quoted:
            break
        if c == "," and not quoted:
            options, current = [*options, current], ""
            continue
        quoted ^= c == '"' and not escaped
        escaped = c == "\\" and not escaped
        current += c
    return [o.split("=", 1)[0].lower() for o in [*options, current] if o]


def key_fingerprints(lines: list[str]) -> list[str] | None:
    """The SHA256 fingerprint of each key, from one ssh-keygen run; None when it does not
    read every line as a key (it prints one line a key it reads, and skips the others)."""
    with tempfile.NamedTemporaryFile("w", suffix=".pub") as f:
        f.write("".join(f"{line}\n" for line in lines))
        f.flush()
        try:
            result = subprocess.run(["ssh-keygen", "-l", "-f", f.name], capture_output=True,
                                    text=True, timeout=30)
        except FileNotFoundError:
            raise ProvisionError("ssh-keygen is not installed: keys cannot be checked") from None
    read = [fields[1] for fields in map(str.split, result.stdout.splitlines())
            if len(fields) > 1]
    return read if result.returncode == 0 and len(read) == len(lines) else None


def first_bad(keys: list[tuple[int, str]]) -> int:
    """The number of the first line ssh-keygen does not read as a key, checked one at a
    time up to it (at most MAX_KEYS runs)."""
    return next((number for number, line in keys if key_fingerprints([line]) is None),
                keys[-1][0])


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
