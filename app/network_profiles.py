"""``network/NAME.toml`` on the boot partition -> a NetworkManager keyfile.

A small schema of Cairn's own, so that a person with a laptop writes four lines instead of a
keyfile (whose key names, enum numbers and escaping are NetworkManager's business):

```toml
type = "wifi"                 # "ethernet", "wifi" or "cellular"
ssid = "Greenhouse"
passphrase = "correct horse"  # WPA-PSK, 8-63 characters; leave it out for an open network
country = "DE"                # regulatory domain (ISO 3166 alpha-2)
```

Every problem is a :class:`ConfigError` naming the file and key. A profile's uuid is derived
from its name, so provisioning the same name again replaces the profile instead of adding a
second one. A file that holds only ``remove = true`` removes the profile of its name.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from dataclasses import dataclass
from typing import Any

from cairn.base.config_tools import ConfigError, Validator

TYPES = ("ethernet", "wifi", "cellular")
NM_TYPES = {"ethernet": "ethernet", "wifi": "wifi", "cellular": "gsm"}
COMMON_KEYS = {"type", "interface", "autoconnect", "priority", "metered"}
IP_KEYS = {"dhcp", "address", "gateway", "dns"}
KEYS = {
    "ethernet": COMMON_KEYS | IP_KEYS,
    "wifi": COMMON_KEYS | IP_KEYS | {"ssid", "passphrase", "hidden", "country"},
    "cellular": COMMON_KEYS | {"apn", "pin", "username", "password"},
}
# a fixed namespace: uuid5(NAMESPACE, name) is the same on every device and every run
NAMESPACE = uuid.UUID("6f1c2a4e-3b7d-5e8f-9a0b-c1d2e3f4a5b6")
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,47}")
INTERFACE = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # Linux IFNAMSIZ - 1
# SSIDs written as plain text; any other is written as its bytes (NM's own fallback)
_SSID_CHAR = r"[A-Za-z0-9_.,:@+()!?/=-]"
PLAIN_SSID = re.compile(rf"{_SSID_CHAR}([A-Za-z0-9 _.,:@+()!?/=-]*{_SSID_CHAR})?")


@dataclass(frozen=True)
class Profile:
    """One rendered profile: the keyfile's text and what provisioning reports of it."""

    name: str           # cairn-<file stem>
    nm_type: str
    keyfile: str
    country: str | None = None  # a Wi-Fi profile's regulatory domain


def profile_name(stem: str) -> str:
    return f"cairn-{stem.lower()}"


def profile_uuid(name: str) -> str:
    return str(uuid.uuid5(NAMESPACE, name))


def _check_stem(source: str, stem: str) -> None:
    if not PROFILE_NAME.fullmatch(stem.lower()):
        raise ConfigError(source, "-", f"file name {stem!r}: use letters, digits, '-' and '_' "
                                       f"(it names the profile cairn-NAME)")


def removal(data: dict[str, Any], source: str, stem: str) -> str | None:
    """The name of the profile a ``remove = true`` file removes; None for a profile."""
    if "remove" not in data:
        return None
    if data["remove"] is not True:
        raise ConfigError(source, "remove", f"only remove = true (it removes the profile "
                                            f"cairn-NAME), not {data['remove']!r}")
    others = sorted(set(data) - {"remove"})
    if others:
        raise ConfigError(source, others[0], "not with remove = true: a file either removes "
                                             "its profile or describes it")
    _check_stem(source, stem)
    return profile_name(stem)


def parse_profile(data: dict[str, Any], source: str, stem: str) -> Profile:
    """Validate one network file's document and render its keyfile."""
    v = Validator(source)
    _check_stem(source, stem)
    kind = data.get("type")
    if kind not in TYPES:
        got = "missing" if kind is None else f"unknown type {kind!r}"
        raise ConfigError(source, "type", f"{got} (use {', '.join(map(repr, TYPES))})")
    v.keys(data, "", KEYS[kind])
    name = profile_name(stem)
    sections: dict[str, dict[str, str]] = {"connection": _connection(v, data, name, kind)}
    country = None
    if kind == "wifi":
        sections.update(_wifi(v, data))
        country = _country(v, data)
    elif kind == "ethernet":
        sections["ethernet"] = {}
    else:
        sections.update(_cellular(v, data))
    sections["ipv4"] = _ipv4(v, data) if kind != "cellular" else {"method": "auto"}
    sections["ipv6"] = {"method": "auto"}
    return Profile(name, NM_TYPES[kind], render_keyfile(sections), country)


def _connection(v: Validator, t: dict[str, Any], name: str, kind: str) -> dict[str, str]:
    # NM's connection.metered is an enum in a keyfile: 1 yes, 2 no (0 would let NM guess)
    metered = v.get(t, "", "metered", bool, kind == "cellular")
    priority = v.get(t, "", "priority", int, 0)
    if not -999 <= priority <= 999:
        raise ConfigError(v.source, "priority", f"must be between -999 and 999, not {priority}")
    section = {"id": name, "uuid": profile_uuid(name), "type": NM_TYPES[kind]}
    # NetworkManager's defaults (autoconnect, priority 0) are left out, as it does itself
    if not v.get(t, "", "autoconnect", bool, True):
        section["autoconnect"] = "false"
    if priority:
        section["autoconnect-priority"] = str(priority)
    section["metered"] = "1" if metered else "2"
    interface = v.get(t, "", "interface", str, None)
    if interface is not None:
        if not INTERFACE.fullmatch(interface):
            raise ConfigError(v.source, "interface",
                              f"{interface!r} is not an interface name (e.g. wlan0, eth0)")
        section["interface-name"] = interface
    return section


def _wifi(v: Validator, t: dict[str, Any]) -> dict[str, dict[str, str]]:
    ssid = v.get(t, "", "ssid", str, None)
    if not ssid:
        raise ConfigError(v.source, "ssid", "missing (the Wi-Fi network's name)")
    if len(ssid.encode()) > 32:
        raise ConfigError(v.source, "ssid", "longer than 32 bytes: not a Wi-Fi network name")
    wifi = {"mode": "infrastructure", "ssid": _ssid(ssid)}
    if v.get(t, "", "hidden", bool, False):
        wifi["hidden"] = "true"
    sections = {"wifi": wifi}
    passphrase = v.get(t, "", "passphrase", str, None)
    if passphrase is not None:
        sections["wifi-security"] = {"key-mgmt": "wpa-psk", "psk": _psk(v, passphrase)}
    return sections


def _psk(v: Validator, passphrase: str) -> str:
    # the value is never echoed: the report and the log name the key only
    if re.fullmatch(r"[0-9a-fA-F]{64}", passphrase):
        return passphrase  # a raw 256-bit key
    if not 8 <= len(passphrase) <= 63 or not all(" " <= c <= "~" for c in passphrase):
        raise ConfigError(v.source, "passphrase", "a WPA passphrase is 8 to 63 printable ASCII "
                                                  "characters (or 64 hex digits); leave it out "
                                                  "for an open network")
    return _escape(passphrase)


def _ssid(ssid: str) -> str:
    if PLAIN_SSID.fullmatch(ssid) and not ssid.isdigit():
        return ssid
    return "".join(f"{b};" for b in ssid.encode())


def _country(v: Validator, t: dict[str, Any]) -> str | None:
    country = v.get(t, "", "country", str, None)
    if country is not None and not re.fullmatch(r"[A-Za-z]{2}", country):
        raise ConfigError(v.source, "country",
                          f"{country!r} is not a two-letter country code (e.g. DE, US, GB)")
    return country.upper() if country else None


def _cellular(v: Validator, t: dict[str, Any]) -> dict[str, dict[str, str]]:
    apn = v.get(t, "", "apn", str, None)
    if not apn:
        raise ConfigError(v.source, "apn", "missing (the access point name your SIM's "
                                           "provider gives, e.g. \"internet\")")
    if not re.fullmatch(r"[A-Za-z0-9.-]{1,100}", apn):
        raise ConfigError(v.source, "apn", f"{apn!r} is not an APN (letters, digits, '.', '-')")
    gsm = {"apn": apn}
    pin = v.get(t, "", "pin", str, None)
    if pin is not None:
        if not re.fullmatch(r"\d{4,8}", pin):
            raise ConfigError(v.source, "pin", "a SIM PIN is 4 to 8 digits, written as a "
                                               "string (pin = \"1234\")")
        gsm["pin"] = pin
    for key in ("username", "password"):
        value = v.get(t, "", key, str, None)
        if value is not None:
            if not all(" " <= c <= "~" for c in value):
                raise ConfigError(v.source, key, "must be printable ASCII")
            gsm[key] = _escape(value)
    return {"gsm": gsm}


def _ipv4(v: Validator, t: dict[str, Any]) -> dict[str, str]:
    dhcp = v.get(t, "", "dhcp", bool, "address" not in t)
    if dhcp:
        for key in ("address", "gateway", "dns"):
            if key in t:
                raise ConfigError(v.source, key, "only with a static address (dhcp = false)")
        return {"method": "auto"}
    text = v.get(t, "", "address", str, None)
    if text is None:
        raise ConfigError(v.source, "address", "missing: dhcp = false needs an address "
                                               "like \"192.168.1.20/24\"")
    address = _interface_address(v, text)
    section = {"method": "manual", "address1": str(address)}
    gateway = v.get(t, "", "gateway", str, None)
    if gateway is not None:
        if _ip(v, "gateway", gateway) not in address.network:
            raise ConfigError(v.source, "gateway", f"{gateway} is not in {address.network}")
        section["address1"] += f",{gateway}"
    dns = v.strings(t, "", "dns")
    if dns:
        section["dns"] = "".join(f"{_ip(v, f'dns[{i}]', d)};" for i, d in enumerate(dns))
    return section


def _interface_address(v: Validator, text: str) -> ipaddress.IPv4Interface:
    try:
        address = ipaddress.IPv4Interface(text)
    except ValueError:
        address = None
    if address is None or "/" not in text:
        raise ConfigError(v.source, "address", f"{text!r} is not an IPv4 address with its "
                                               f"prefix length, like \"192.168.1.20/24\"")
    return address


def _ip(v: Validator, key: str, text: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        raise ConfigError(v.source, key, f"{text!r} is not an IPv4 address") from None


def _escape(value: str) -> str:
    """A GLib key file string: backslashes doubled, and spaces at either end kept (GLib
    would strip a leading one)."""
    value = value.replace("\\", "\\\\")
    stripped = value.strip(" ")
    if not stripped:
        return "\\s" * len(value)
    lead = len(value) - len(value.lstrip(" "))
    trail = len(value) - len(value.rstrip(" "))
    return "\\s" * lead + stripped + "\\s" * trail


def render_keyfile(sections: dict[str, dict[str, str]]) -> str:
    lines = []
    for section, values in sections.items():
        lines += [f"[{section}]", *(f"{key}={value}" for key, value in values.items()), ""]
    return "\n".join(lines)
