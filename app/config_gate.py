"""What ``cairn config apply`` asks of a router on a new configuration before the change is
marked good, beyond its own answer (ready on the file, its store open): that the clients the
device depends on get in. Each driver configured beside the file (``sensors/*.toml``,
``mqtt/*.toml``) joins as it will, with its own router URL, realm and credentials, so a
change that renames its realm, drops the role its anonymous session gets, removes its user
or its listener is rolled back rather than kept as the last good one (issue 45, C3): the
way JunOS's ``commit confirmed`` or RouterOS's safe mode keep a change that cuts the
operator off from being kept. The dashboard's page, too, must still be usable in one of
the realms if it was before: it joins over WebSocket and JSON on ``/ws`` of ``listen``, from
the page's own origin, or signs in by ticket.

The applier runs as root (the path unit), so it reads the drivers' secret files as systemd
will start them; a driver whose secret comes from an environment variable this process does
not have, or whose file is broken, is not joined (its own start says what is wrong)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from autobahn.asyncio.wamp import ApplicationSession
from autobahn.asyncio.websocket import WampWebSocketClientFactory
from autobahn.wamp import types
from autobahn.wamp.serializer import JsonSerializer

from cairn.base.config_tools import ConfigError
from cairn.drivers.config import DriverConfig, parse_driver, read_toml
from cairn.drivers.runtime import open_session
from cairn.gateway.core.config import Config, Endpoint, RealmConfig
from cairn.gateway.ops.maintenance import local_authority, local_tls_context

DRIVER_FOLDERS = ("sensors", "mqtt")
JOIN_TIMEOUT = 10.0  # s per driver: a join on a loaded Pi takes well under one
DASHBOARD_REALM = "realm1"  # what the page joins without ?realm= (gateway/dashboard/app.js)


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


# -- the dashboard ---------------------------------------------------------------------------


def dashboard_realms(config: Config | None, timeout: float = JOIN_TIMEOUT) -> list[str]:
    """The realms of the running ``config`` the dashboard's page gets into now: taken before
    a change, as for the drivers."""
    if config is None:
        return []
    return [realm.name for realm in config.realms
            if asyncio.run(dashboard_problem(config.router.listen, realm, timeout)) is None]


def dashboard_shut_out(config: Config, timeout: float = JOIN_TIMEOUT) -> str | None:
    """Why the dashboard's page gets into none of the realms of ``config``, or None. One is
    enough: a realm renamed or removed on purpose is no lockout while another takes the page
    (``?realm=NAME``)."""
    problems = []
    for realm in config.realms:
        why = asyncio.run(dashboard_problem(config.router.listen, realm, timeout))
        if why is None:
            return None
        problems.append(f"{realm.name}: {why}")
    return (f"the dashboard (ws://{local_authority(config.router.listen)}/ws) gets into none "
            f"of the realms: {'; '.join(problems)}")


async def dashboard_problem(listen: Endpoint, realm: RealmConfig, timeout: float
                            ) -> str | None:
    """Why the dashboard's page on ``listen`` cannot be used in ``realm``, or None. The page
    joins anonymously, as here; refused that, it offers sign-in by ticket, which a user with
    a ``secret`` can pass (the router challenges unknown names too, so asking it would tell
    nothing)."""
    refused = await _anonymous_hello(listen, realm.name, timeout)
    if refused is None or (refused.startswith(NO_AUTH_METHOD)
                           and any(user.secret is not None for user in realm.users)):
        return None
    if refused.startswith(NO_AUTH_METHOD):
        return f"{refused}, and no user of the realm has a secret to sign in with by ticket"
    return refused


NO_AUTH_METHOD = "wamp.error.no_auth_method"


class _AnonymousHello(ApplicationSession):
    """The first HELLO of the dashboard's page: its answer is None on WELCOME, else why."""

    def __init__(self, realm: str) -> None:
        super().__init__(types.ComponentConfig(realm=realm))
        self.answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def _settle(self, problem: str | None) -> None:
        if not self.answer.done():
            self.answer.set_result(problem)

    def onConnect(self) -> None:
        self.join(self.config.realm, authmethods=["anonymous"])

    def onJoin(self, details: types.SessionDetails) -> None:
        self._settle(None)
        self.leave()

    def onLeave(self, details: types.CloseDetails) -> None:
        self._settle(f"{details.reason}: {details.message}")
        self.disconnect()

    def onDisconnect(self) -> None:
        self._settle("the connection closed before WELCOME")


async def _anonymous_hello(listen: Endpoint, realm: str, timeout: float) -> str | None:
    """Join as the page does, over WebSocket and JSON on ``/ws``, from its own origin."""
    authority = local_authority(listen)
    hello = _AnonymousHello(realm)
    factory = WampWebSocketClientFactory(
        lambda: hello, url=f"{'wss' if listen.tls else 'ws'}://{authority}/ws",
        origin=f"{'https' if listen.tls else 'http'}://{authority}",
        serializers=[JsonSerializer()])
    connecting = asyncio.get_running_loop().create_connection(
        factory, factory.host, factory.port, ssl=local_tls_context() if listen.tls else None)
    transport = None
    try:
        transport, _ = await asyncio.wait_for(connecting, timeout)
        return await asyncio.wait_for(hello.answer, timeout)
    except (TimeoutError, OSError) as e:
        return str(e) or type(e).__name__
    finally:
        if transport is not None:
            transport.close()
