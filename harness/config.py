"""Router configuration for tests, benchmarks and soak runs, built instead of copied: the
realm most of them use (anonymous sessions may do everything on every URI), its history
rules, and the ``[router]`` table of a router on given ports."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EVERYTHING = ("publish", "subscribe", "call", "register")


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    return "[" + ", ".join(_value(v) for v in value) + "]"  # a list or tuple


def history_rule(uri: str, match: str = "prefix", **settings: object) -> str:
    """A ``[[realms.history]]`` table, e.g. ``history_rule("sensor", max_events=500)``."""
    lines = [f'  uri = "{uri}"', f'  match = "{match}"']
    lines += [f"  {key} = {_value(value)}" for key, value in settings.items()]
    return "\n  [[realms.history]]\n" + "\n".join(lines) + "\n"


def retention_rule(uri: str, match: str = "prefix", **settings: object) -> str:
    """A ``[[realms.retention]]`` table, e.g. ``retention_rule("sensor", max_payload=2**20)``."""
    lines = [f'  uri = "{uri}"', f'  match = "{match}"']
    lines += [f"  {key} = {_value(value)}" for key, value in settings.items()]
    return "\n  [[realms.retention]]\n" + "\n".join(lines) + "\n"


def open_realm(name: str = "realm1", allow: Iterable[str] = EVERYTHING,
               history: Iterable[str] = (), extra: str = "") -> str:
    """A realm where anonymous sessions may ``allow`` on every URI, with ``history``
    (:func:`history_rule` tables) and ``extra`` TOML inside it (users, more roles)."""
    return (f'\n[[realms]]\nname = "{name}"\nanonymous_role = "anonymous"\n\n'
            f'  [[realms.roles]]\n  name = "anonymous"\n'
            f'  permissions = [\n    {{ uri = "", match = "prefix", allow = {_value(allow)} }},\n'
            f'  ]\n' + "".join(history) + extra)


# Lines of [router.limits] that set the optional hard cap on what each connection may send a
# second far above anything: the benchmarks' "lifted" config. (There is no cap by default,
# connections are read in fair shares; it was 1,000 messages and 1 MiB a second.)
NO_READ_BUDGET = "max_messages_per_second = 1000000000\nmax_bytes_per_second = 1099511627776\n"


def router_table(data_dir: Path | str, listen: str = "127.0.0.1:0",
                 rawsocket: Iterable[str] = (), log_level: str = "info", extra: str = "") -> str:
    """A ``[router]`` table: WebSocket on ``listen``, RawSocket on each of ``rawsocket``
    (``host:port`` or ``unix:PATH``), the store in ``data_dir``; ``extra`` more keys."""
    return (f'[router]\nlisten = "{listen}"\nrawsocket = {_value(list(rawsocket))}\n'
            f'data_dir = "{data_dir}"\nlog_level = "{log_level}"\n{extra}')


def permission(uri: str, allow: Iterable[str], match: str = "prefix", **settings: object) -> str:
    """One entry of a role's ``permissions``,
    e.g. ``permission("app.", ["call"], disclose=True)``."""
    more = "".join(f", {key} = {_value(value)}" for key, value in settings.items())
    return f'{{ uri = "{uri}", match = "{match}", allow = {_value(list(allow))}{more} }}'


def role(name: str, *permissions: str) -> str:
    """A ``[[realms.roles]]`` table with the :func:`permission` entries ``permissions``."""
    entries = "".join(f"    {p},\n" for p in permissions)
    return f'\n  [[realms.roles]]\n  name = "{name}"\n  permissions = [\n{entries}  ]\n'


def user(authid: str, role: str, **settings: object) -> str:
    """A ``[[realms.users]]`` table, e.g. ``user("alice", "operator", secret="s3cret")``."""
    lines = [f'  authid = "{authid}"', f'  role = "{role}"']
    lines += [f"  {key} = {_value(value)}" for key, value in settings.items()]
    return "\n  [[realms.users]]\n" + "\n".join(lines) + "\n"


def ticket_of(authid: str) -> str:
    """The ticket of a :func:`named_users` user."""
    return f"{authid}-ticket"


def named_users(role: str, *authids: str) -> str:
    """Users of ``role`` who log in by ticket (:func:`ticket_of`): a test's sessions that
    need a name of their own, since the router names anonymous sessions itself."""
    return "".join(user(authid, role, secret=ticket_of(authid)) for authid in authids)


def realm(name: str, *tables: str, anonymous_role: str | None = None) -> str:
    """A ``[[realms]]`` table holding ``tables`` (:func:`role`, :func:`user`,
    :func:`history_rule`), whose anonymous sessions get ``anonymous_role`` (none: no
    anonymous sessions)."""
    anonymous = "" if anonymous_role is None else f'anonymous_role = "{anonymous_role}"\n'
    return f'\n[[realms]]\nname = "{name}"\n{anonymous}' + "".join(tables)
