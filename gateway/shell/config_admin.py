"""``cairn.admin.config.get`` and ``cairn.admin.config.apply``: the configuration over WAMP.

Only an authenticated session may call them, and only through a permission that names
``cairn.admin`` (the exact URI or a pattern starting with it): the catch-all permission of an
open realm (``{uri = "", match = "prefix"}``), which the device's anonymous ``local`` role
has, does not reach them. The router validates a new text but cannot write ``/etc/cairn``
(its sandbox): it leaves a request in its data directory, which ``cairn config apply
--pending`` (root) carries out with the same checks, reload or restart, and rollback as
``cairn config apply FILE``; the outcome shows in ``get``'s ``changes``.

``get`` shows every inline secret as ``"<redacted>"`` (base.config_secrets), and ``apply``
takes that marker at a secret's key as "keep the value the file has": a role allowed to read
the configuration does not learn the credentials in it, and get, edit, apply round-trips.
(Rather than granting ``get`` only with ``apply``: the file still never crosses a ``ws://``
link with its secrets in it.)

``apply`` refuses a text after which its caller could not apply another: its realm gone, its
user gone or without the credential it logged in with, its role no longer granted ``apply``,
or (a caller on another machine) no listener of its transport that machine reaches
(``cairn.error.would_lock_out``). Such a change is still made on the device, as root, with
``cairn config apply FILE``; the drivers' own joins are checked there (app.config_gate).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairn.base.config_secrets import Unredactable, redact, restore
from cairn.gateway.core.auth import Authorizer, login_peer
from cairn.gateway.core.config import (
    Check,
    Config,
    ConfigError,
    Permission,
    covers_everything,
    parse,
    read_text,
    restart_needed,
)
from cairn.gateway.core.session import WampError
from cairn.gateway.ops.config_history import (
    History,
    pending_requests,
    refused_requests,
    write_request,
)

if TYPE_CHECKING:
    from cairn.base.clock_readings import Reading
    from cairn.gateway.core.router import Realm
    from cairn.gateway.core.session import Session
    from cairn.gateway.shell.shell_state import ShellState

ADMIN = "cairn.admin"
GET = "cairn.admin.config.get"
APPLY = "cairn.admin.config.apply"
INVALID = "cairn.error.invalid_config"
WOULD_LOCK_OUT = "cairn.error.would_lock_out"
# the key of a user that each authentication method needs (gateway.core.auth.Authenticator)
CREDENTIALS = {"ticket": "secret", "wampcra": "secret", "cryptosign": "pubkeys"}


def names_admin(permission: Permission) -> bool:
    """A permission that grants admin procedures: one written for them, not a catch-all."""
    return permission.uri.startswith(ADMIN) and not covers_everything(permission)


def require_admin(realm: Realm, caller: Session, uri: str) -> None:
    rule = realm.authorizer.allowed(caller.authrole, uri, "call")
    if caller.authmethod == "anonymous" or rule is None or not names_admin(rule):
        raise WampError("wamp.error.not_authorized",
                        f"{uri} needs an authenticated session whose role is granted call on "
                        f"it by a permission naming {ADMIN!r} (session {caller.id}, authrole "
                        f"{caller.authrole!r})")


def validate(text: str, source: str, check: Check = parse) -> Config:
    """``text`` as the file ``source`` would be, checked by ``check`` (the router's own
    sections, or every section's: app.sections.check_whole): ConfigError naming the key if
    bad."""
    return check(read_text(text, source), source)


def lockout(new: Config, caller: Session, realm: str) -> str | None:
    """Why ``caller``, in ``realm``, could not log in as it did and call ``apply`` again once
    ``new`` is running (None: it could)."""
    config = next((r for r in new.realms if r.name == realm), None)
    if config is None:
        return f"realm {realm!r}, the one you are in, is not in it"
    user = next((u for u in config.users if u.authid == caller.authid), None)
    if user is None:
        return f"it has no user {caller.authid!r} in realm {realm!r}"
    credential = CREDENTIALS.get(caller.authmethod or "")
    if credential is not None and not getattr(user, credential):
        return (f"user {caller.authid!r} has no {credential} in it, which {caller.authmethod} "
                f"logs in with")
    rule = Authorizer(config).allowed(user.role, APPLY, "call")
    if rule is None or not names_admin(rule):
        return (f"role {user.role!r} of user {caller.authid!r} is not granted call on {APPLY} "
                f"in it by a permission naming {ADMIN!r}")
    return unreachable(new, caller)


def unreachable(new: Config, caller: Session) -> str | None:
    """Why ``caller``, which came from another machine, could no longer reach a listener of
    its transport under ``new`` (one that listens only on loopback or a Unix socket)."""
    kind, peer = caller.transport.get("type"), caller.transport.get("peer")
    if login_peer(peer).local:
        return None
    router = new.router
    listeners = [router.listen] if kind == "websocket" else list(router.rawsocket)
    if any(not listener.is_loopback for listener in listeners):
        return None
    return (f"you came from {peer} over {kind}, and it has no {kind} listener other "
            f"machines reach (only loopback or a Unix socket)")


def invalid(e: ConfigError) -> WampError:
    return WampError(INVALID, str(e), file=e.source, key=e.key, problem=e.problem)


class ConfigAdmin:
    def __init__(self, state: ShellState) -> None:
        self.state = state

    @property
    def file(self) -> Path:
        running = self.state.running
        if running is None or running.file is None:
            raise WampError("cairn.error.no_config_file",
                            "the router runs on its embedded default, not a config file")
        return Path(running.file)

    def get(self) -> dict[str, Any]:
        file, running = self.file, self.state.running
        try:
            text = redact(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            text = None
            problem = f"{file}: cannot read it: {e}"
        except Unredactable as e:  # never shown with a secret in it
            text = None
            problem = f"{file}: not shown: {e}"
        else:
            problem = running.problem
        data_dir = self.state.config.router.data_dir
        return {"text": text, "file": str(file), "running": running.running,
                "problem": problem,
                "changes": [c.as_dict() for c in History(file).changes()],
                "requests": [{"id": r.id, "by": r.by, "at": r.at, "action": r.action}
                             for r in pending_requests(data_dir)],
                "refused": refused_requests(data_dir)}

    def apply(self, caller: Session, realm: Realm, text: Any) -> dict[str, Any]:
        if not isinstance(text, str):
            raise WampError("wamp.error.invalid_argument",
                            "cairn.admin.config.apply takes one argument: the TOML text")
        file = self.file
        try:
            text = restore(text, _current_text(file), str(file))
            new = validate(text, str(file), self.state.check)
        except ConfigError as e:
            raise invalid(e) from None
        if (why := lockout(new, caller, realm.name)) is not None:
            raise WampError(WOULD_LOCK_OUT, f"not applied: you could not apply another change "
                            f"after it: {why} (apply it on the device: cairn config apply FILE)")
        action = "restart" if restart_needed(self.state.config, new) else "reload"
        request = write_request(self.state.config.router.data_dir, text,
                                f"{caller.authid}@{realm.name} over WAMP", action)
        return {"request": request.id, "state": "pending", "action": action}


def _current_text(file: Path) -> str:
    """The file whose secrets a ``"<redacted>"`` keeps ("" when it cannot be read: then
    the marker names no secret, and apply says so)."""
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def admin_procedures(state: ShellState) -> dict[str, Callable[[Realm], Any]]:
    """The procedures, made per realm as :class:`~gateway.core.router.Router` takes them."""
    admin = ConfigAdmin(state)

    def make_get(realm: Realm):
        async def get(caller: Session, args: list, kwargs: dict, now: Reading) -> dict[str, Any]:
            require_admin(realm, caller, GET)
            return await asyncio.to_thread(admin.get)
        return get

    def make_apply(realm: Realm):
        async def apply(caller: Session, args: list, kwargs: dict, now: Reading) -> dict[str, Any]:
            require_admin(realm, caller, APPLY)
            text = args[0] if args else kwargs.get("text")
            return await asyncio.to_thread(admin.apply, caller, realm, text)
        return apply

    return {GET: make_get, APPLY: make_apply}
