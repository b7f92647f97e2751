"""What ``cairn config apply`` asks of a router on a new configuration before the change is
marked good, beyond its own answer (ready on the file, its store open): that the clients the
device depends on get in. Each driver configured beside the file (``sensors/*.toml``,
``mqtt/*.toml``) joins as it will, with its own router URL, realm and credentials, so a
change that renames its realm, drops the role its anonymous session gets, removes its user
or its listener is rolled back rather than kept as the last good one (issue 45, C3): the
way JunOS's ``commit confirmed`` or RouterOS's safe mode keep a change that cuts the
operator off from being kept.

The applier runs as root (the path unit), so it reads the drivers' secret files as systemd
will start them; a driver whose secret comes from an environment variable this process does
not have, or whose file is broken, is not joined (its own start says what is wrong)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from cairn.base.config_tools import ConfigError
from cairn.drivers.config import DriverConfig, parse_driver, read_toml
from cairn.drivers.runtime import open_session

DRIVER_FOLDERS = ("sensors", "mqtt")
JOIN_TIMEOUT = 10.0  # s per driver: a join on a loaded Pi takes well under one


def driver_configs(etc: Path) -> list[tuple[str, DriverConfig]]:
    """(``sensors/NAME.toml``, its [driver]) of every driver config beside the file that
    can be read."""
    found = []
    for folder in DRIVER_FOLDERS:
        for path in sorted((etc / folder).glob("*.toml")):
            try:
                found.append((f"{folder}/{path.name}", parse_driver(*read_toml(path))))
            except (ConfigError, OSError):
                continue
    return found


def joining(drivers: list[tuple[str, DriverConfig]], timeout: float = JOIN_TIMEOUT
            ) -> list[tuple[str, DriverConfig]]:
    """The drivers that can join the router now: taken before a change, so that only what
    worked on the old configuration must work on the new one (a driver broken on its own
    must not hold every change back)."""
    return [(name, driver) for name, driver in drivers
            if asyncio.run(join_problem(driver, timeout)) is None]


def locked_out(drivers: list[tuple[str, DriverConfig]], timeout: float = JOIN_TIMEOUT
               ) -> str | None:
    """Why some of ``drivers`` cannot join the router now, or None."""
    problems = [f"{name} cannot join ({driver.router}, realm {driver.realm}): {why}"
                for name, driver in drivers
                if (why := asyncio.run(join_problem(driver, timeout)))]
    return "; ".join(problems) or None


async def join_problem(driver: DriverConfig, timeout: float) -> str | None:
    try:
        session = await open_session(driver.router, driver.realm, driver.authid,
                                     driver.secret, timeout=timeout)
    except (TimeoutError, OSError, ValueError) as e:
        return str(e) or type(e).__name__
    session.leave()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(session.gone, timeout)
    return None
