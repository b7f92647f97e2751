"""Is the way out metered (a cellular link, paid by the byte)? ``on_metered`` decides what
sync and update pulls do then: ``"send"`` (the default) or ``"wait"`` for an unmetered one.

NetworkManager knows: its Metered property is the primary connection's (NMMetered: a profile
says yes or no, or NM guesses from the device type, a cellular modem being "guess yes").
Without NetworkManager (a development machine, systemd-networkd) the answer is "unknown",
taken as not metered: nothing would ever go otherwise.
"""

from __future__ import annotations

import subprocess
from typing import Any

from cairn.base.config_tools import ConfigError, Validator

# NMMetered (libnm): 0 unknown, 1 yes, 2 no, 3 guess yes, 4 guess no. GUESS_YES is to be
# treated as YES, says its documentation.
METERED = {1: "yes", 3: "guess yes"}
POLICIES = ("send", "wait")
BUSCTL = ("busctl", "get-property", "org.freedesktop.NetworkManager",
          "/org/freedesktop/NetworkManager", "org.freedesktop.NetworkManager", "Metered")


def parse_metered(output: str) -> int | None:
    """``busctl get-property``'s answer ("u 1") as NMMetered, None if it is not one."""
    parts = output.split()
    if len(parts) == 2 and parts[0] == "u" and parts[1].isdigit():
        return int(parts[1])
    return None


def read_metered(command: tuple[str, ...] = BUSCTL, timeout: float = 5.0) -> int | None:
    """NetworkManager's Metered now; None when it cannot be asked (not running, no bus)."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_metered(result.stdout) if result.returncode == 0 else None


def holds_back(policy: str, metered: int | None) -> bool:
    """Whether to wait now: told to wait, and the link is metered (unknown is not)."""
    return policy == "wait" and metered in METERED


def parse_policy(v: Validator, t: dict[str, Any], at: str) -> str:
    """The section's ``on_metered`` key."""
    policy = v.get(t, at, "on_metered", str, "send")
    if policy not in POLICIES:
        raise ConfigError(v.source, f"{at}.on_metered",
                          f"must be \"send\" or \"wait\" (for an unmetered link), not {policy!r}")
    return policy
