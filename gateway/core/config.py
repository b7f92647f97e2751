"""Cairn configuration: TOML in, validated dataclasses out.

Every problem is reported as a :class:`ConfigError` naming the file, the key (a dotted path
such as ``realms[0].roles[1].permissions[0].match``) and what is wrong, so that
``cairn router --config FILE`` can exit with status 2 and a message a person can act on.
The checks themselves (:class:`Validator`, :func:`secret`) are base.config_tools', shared
with the drivers' and sync's sections.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cairn.base.config_tools import (
    ConfigError,
    Endpoint,
    Validator,
    secret,
)
from cairn.formats import health

ACTIONS = ("publish", "subscribe", "call", "register")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|[smhdw])$")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# An acknowledged publish on a rule with a commit window waits up to that long for its group
# commit; beyond a minute a driver's readings in flight would time out first.
MAX_COMMIT_WINDOW = 60.0
EMBEDDED = "<embedded default>"
# The router's own health records (gateway.shell.health): only the router publishes there, and the
# first realm keeps them in history so that they travel in the sync batches with the data.
HEALTH_TOPIC = health.TOPIC  # the router's own health records (formats.health)
# [router] settings a SIGHUP applies (field: config key): each is read where it is used, per
# request or connection. The others (listeners, data directory, limits, ...) need a restart.
RELOADABLE = {"status_token": "status_token_file", "allowed_hosts": "allowed_hosts",
              "allowed_origins": "allowed_origins"}


@dataclass(frozen=True)
class Permission:
    uri: str
    match: str = "exact"
    allow: frozenset[str] = frozenset()
    disclose: bool = False


@dataclass(frozen=True)
class Role:
    name: str
    permissions: tuple[Permission, ...] = ()


@dataclass(frozen=True)
class User:
    """A principal. ``secret`` serves ticket and wampcra (with ``salt`` it is the derived
    key, see README); ``pubkeys`` (hex Ed25519 public keys) serve cryptosign."""

    authid: str
    role: str
    secret: str | None = None
    salt: str | None = None
    iterations: int = 1000
    keylen: int = 32
    pubkeys: tuple[str, ...] = ()


@dataclass(frozen=True)
class HistoryRule:
    uri: str
    match: str = "exact"
    max_events: int = 1_000_000
    max_age: float | None = None  # seconds
    commit_window: float = 0.0  # seconds a publication may wait for its group commit


# ~100 days of records at the default interval; after the realm's own rules, since a rule's
# index is stored with its rows. A record rides along with the next commit (within a minute)
# rather than costing the card one of its own or cutting another rule's window short.
HEALTH_RULE = HistoryRule(HEALTH_TOPIC, "exact", max_events=10_000, max_age=90 * 86400.0,
                          commit_window=MAX_COMMIT_WINDOW)


@dataclass(frozen=True)
class RetentionRule:
    """Topics whose retained values are a driver's (its readings and status): when the
    realm's retained slots are full, other slots go first. ``max_payload``: the largest
    retained payload on them, in bytes (None: ``router.limits.max_retained_payload``)."""

    uri: str
    match: str = "exact"
    max_payload: int | None = None


# A realm without [[realms.retention]]: the drivers' topic convention (README, "Sensors")
DEFAULT_RETENTION = (RetentionRule("sensor", "prefix"), RetentionRule("gateway.device", "prefix"))


@dataclass(frozen=True)
class RealmConfig:
    name: str
    anonymous_role: str | None = None
    roles: tuple[Role, ...] = ()
    users: tuple[User, ...] = ()
    history: tuple[HistoryRule, ...] = ()
    retention: tuple[RetentionRule, ...] = DEFAULT_RETENTION

    def role(self, name: str) -> Role | None:
        return next((r for r in self.roles if r.name == name), None)


@dataclass(frozen=True)
class TlsConfig:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Limits:
    """What a client can make the router hold (``[router.limits]``), sized for a 1 GB Pi.
    "Network" connections are TCP ones from other hosts; "local" ones come over the Unix
    socket or loopback, from the device itself (its drivers and dashboard), and have a cap of
    their own, so a flood from the LAN cannot lock them out."""

    handshake_timeout: float = 10.0         # s from connect to WELCOME (HTTP head, handshake,
                                            # HELLO, authentication)
    max_connections: int = 1000             # network connections (an idle session ~40 KiB)
    max_connections_per_address: int = 32   # network connections from one address
    max_pending_connections: int = 64       # network connections without a session yet
    max_pending_per_address: int = 8        # of them from one address (see gateway.shell.admission)
    max_local_connections: int = 4096       # Unix socket and loopback connections
    max_subscriptions_per_session: int = 1000
    max_registrations_per_session: int = 1000
    max_history_subscriptions: int = 1000   # kept without subscribers (beyond the rules')
    max_history_subscriptions_per_client: int = 250  # of them made by one user or address
    max_history_topics: int = 10_000        # topics a realm keeps history for (drivers' past it)
    max_history_topics_per_client: int = 2_500  # of them new from one anonymous address
    max_retained: int = 10_000              # retained slots (topic x audience) in all
    max_retained_per_topic: int = 16        # audiences with a retained slot, per topic
    max_retained_bytes: int = 64 * 2**20    # their payloads (in memory and in the store)
    max_retained_per_session: int = 2_500   # slots one session (one user, across its
                                            # sessions) holds: a share, not the realm
    max_retained_payload: int = 64 * 2**10  # one retained payload (realms.retention
                                            # max_payload sets it per rule)
    max_store_queue_bytes: int = 4 * 2**20   # publications waiting for their commit: past
                                            # it, publishers that add to it are paused
    # a hard cap on what one connection may send (a second's worth at once; past it, it is
    # not read for a while), off: connections are read in turn, a quantum each
    # (gateway.shell.flow_control.FairShare), so one is held back only while others wait
    max_messages_per_second: int | None = None
    max_bytes_per_second: int | None = None
    get_events_timeout: float = 5.0         # s one get_events query may run


@dataclass(frozen=True)
class RouterConfig:
    listen: Endpoint = Endpoint("127.0.0.1", 8080)
    rawsocket: tuple[Endpoint, ...] = ()
    data_dir: Path = Path("cairn-data")
    max_message_size: int = 1024 * 1024
    send_buffer_limit: int = 4 * 1024 * 1024
    history_page_cap: int = 1000
    max_store_bytes: int = 2 * 1024**3
    log_level: str = "info"
    tls: TlsConfig | None = None
    card_endurance_tb: float = 10.0  # a 32 GB consumer card: ~300 program/erase cycles
    health_interval: float = 900.0  # s between health records (and at once on a change)
    limits: Limits = field(default_factory=Limits)
    allowed_hosts: tuple[str, ...] = ()    # names of the gateway beyond its IPs and host name
    allowed_origins: tuple[str, ...] = ()  # web pages elsewhere that may open WAMP sessions
    # bearer token for /status and /metrics from other hosts (router.status_token_file)
    status_token: str | None = field(default=None, repr=False)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return (self.listen, *self.rawsocket)


@dataclass(frozen=True)
class Config:
    source: str
    router: RouterConfig = field(default_factory=RouterConfig)
    realms: tuple[RealmConfig, ...] = ()

    def realm(self, name: str) -> RealmConfig | None:
        return next((r for r in self.realms if r.name == name), None)

    def history_rules(self, realm: RealmConfig) -> tuple[HistoryRule, ...]:
        """The rules a realm stores history by: its own, and in the first realm the
        router's health records (:data:`HEALTH_RULE`)."""
        if self.realms and realm is self.realms[0]:
            return (*realm.history, HEALTH_RULE)
        return realm.history


EMBEDDED_TOML = """
[router]
listen = "127.0.0.1:8080"
rawsocket = ["unix:cairn-data/wamp.sock"]
data_dir = "cairn-data"

[[realms]]
name = "realm1"
anonymous_role = "anonymous"

  [[realms.roles]]
  name = "anonymous"
  permissions = [
    { uri = "", match = "prefix", allow = ["publish", "subscribe", "call", "register"] },
  ]

  [[realms.history]]
  uri = "sensor"
  match = "prefix"
  max_events = 1000000
  max_age = "90d"
  commit_window = "5s"
"""


def restart_needed(running: Config, new: Config) -> list[str]:
    """The keys whose change from ``running`` to ``new`` only a restart applies (empty: a
    SIGHUP applies all of it). A reload takes users, roles and permissions of the realms
    running, and the [router] keys of :data:`RELOADABLE`; not new or removed realms, nor
    their history and retention rules, which the store and the broker are built on."""
    keys = [f"router.{f.name}" for f in fields(RouterConfig)
            if f.name not in RELOADABLE
            and getattr(new.router, f.name) != getattr(running.router, f.name)]
    if [r.name for r in new.realms] != [r.name for r in running.realms]:
        keys.append("realms")
    for i, (old, realm) in enumerate(zip(running.realms, new.realms, strict=False)):
        keys += [f"realms[{i}].{name}" for name in ("history", "retention")
                 if getattr(old, name) != getattr(realm, name)]
    return keys


# The sections a cairn.toml may have: the router reads [router] and [[realms]]; the others'
# checks are app.sections.SECTIONS (a test keeps the two equal).
SECTIONS = {"router", "realms", "driver", "sensors", "mqtt", "sync", "update"}
# what a change of the file is checked with: parse, or the whole file's check (app.sections)
Check = Callable[[dict[str, Any], str], "Config"]


def load(path: str | Path | None) -> Config:
    """Load and validate a config file; ``None`` gives the embedded default."""
    return parse(*read_document(path))


def read_document(path: str | Path | None) -> tuple[dict[str, Any], str]:
    """The TOML document (the embedded default for ``None``) and its name for messages.
    Every component (router, drivers, sync) reads its own sections of it."""
    if path is None:
        return tomllib.loads(EMBEDDED_TOML), EMBEDDED
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(source, "-", f"cannot read file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(source, "-", f"cannot read file: not UTF-8 text ({e.reason} at byte "
                                       f"{e.start})") from e
    return read_text(text, source), source


def read_text(text: str, source: str) -> dict[str, Any]:
    """The TOML document in ``text`` (of the file ``source``, for messages)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "-", f"invalid TOML: {e}") from e


def parse(data: dict[str, Any], source: str) -> Config:
    v = Validator(source)
    v.keys(data, "", SECTIONS)
    router = parse_router(v, v.table(data, "router"), "router")
    realms = tuple(
        _realm(v, table, f"realms[{i}]") for i, table in enumerate(v.tables(data, "realms"))
    )
    names = [r.name for r in realms]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(source, f"realms[{i}].name", f"duplicate realm {name!r}")
    if not realms:
        raise ConfigError(source, "realms", "at least one [[realms]] table is required")
    config = Config(source=source, router=router, realms=realms)
    _check_exposure(config)
    return config


# No client joins when its HELLO does not fit (autobahn's, with its roles and features, is
# about 1 KiB; a driver's reading a few hundred bytes): below this no one could log in to
# put the limit back (issue 45, C3: max_message_size = 1 was applied and marked good).
MIN_MESSAGE_SIZE = 4096


def _max_message_size(v: Validator, t: dict[str, Any], at: str, default: int) -> int:
    size = v.positive(t, at, "max_message_size", default)
    if size < MIN_MESSAGE_SIZE:
        raise ConfigError(v.source, f"{at}.max_message_size",
                          f"must be at least {MIN_MESSAGE_SIZE} bytes, not {size}: a client's "
                          f"HELLO must fit, or no one can log in")
    return size


def parse_router(v: Validator, t: dict[str, Any], at: str) -> RouterConfig:
    """The [router] section; public because ``cairn sync`` reads its data_dir the same way."""
    v.keys(t, at, {"listen", "rawsocket", "data_dir", "max_message_size", "send_buffer_limit",
                   "history_page_cap", "max_store_bytes", "log_level", "tls",
                   "card_endurance_tb", "limits", "allowed_hosts", "allowed_origins",
                   "status_token_file", "health_interval"})
    d = RouterConfig()
    listen = v.endpoint(v.get(t, at, "listen", str, None), f"{at}.listen", tcp_only=True)
    rawsocket = tuple(
        v.endpoint(item, f"{at}.rawsocket[{i}]")
        for i, item in enumerate(v.get(t, at, "rawsocket", list, []))
    )
    level = v.get(t, at, "log_level", str, d.log_level)
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(v.source, f"{at}.log_level",
                          f"must be debug, info, warning or error, not {level!r}")
    tls = _tls(v, v.get(t, at, "tls", dict, None), f"{at}.tls")
    for i, endpoint in enumerate((listen, *rawsocket)):
        if endpoint is not None and endpoint.tls and tls is None:
            key = f"{at}.listen" if i == 0 else f"{at}.rawsocket[{i - 1}]"
            raise ConfigError(v.source, key, "a tls: listener needs [router.tls] cert and key")
    return RouterConfig(
        tls=tls,
        listen=listen or d.listen,
        rawsocket=rawsocket,
        data_dir=Path(v.get(t, at, "data_dir", str, str(d.data_dir))),
        max_message_size=_max_message_size(v, t, at, d.max_message_size),
        send_buffer_limit=v.positive(t, at, "send_buffer_limit", d.send_buffer_limit),
        history_page_cap=v.positive(t, at, "history_page_cap", d.history_page_cap),
        max_store_bytes=v.positive(t, at, "max_store_bytes", d.max_store_bytes),
        log_level=level,
        card_endurance_tb=v.positive_number(t, at, "card_endurance_tb", d.card_endurance_tb),
        health_interval=_health_interval(v, t, at, d.health_interval),
        limits=_limits(v, v.get(t, at, "limits", dict, {}), f"{at}.limits"),
        status_token=_token(v, v.get(t, at, "status_token_file", str, None),
                            f"{at}.status_token_file"),
        allowed_hosts=tuple(v.strings(t, at, "allowed_hosts")),
        allowed_origins=tuple(_origin(v, item, f"{at}.allowed_origins[{i}]")
                              for i, item in enumerate(v.strings(t, at, "allowed_origins"))),
    )


def _health_interval(v: Validator, t: dict[str, Any], at: str, default: float) -> float:
    text = v.get(t, at, "health_interval", str, None)
    if text is None:
        return default
    seconds = parse_duration(text, v.source, f"{at}.health_interval")
    if seconds < 1:
        raise ConfigError(v.source, f"{at}.health_interval",
                          f"must be at least 1s, not {text!r}")
    return seconds


def _token(v: Validator, path: str | None, at: str) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(v.source, at, f"cannot read {path}: {e}") from None
    if len(token) < 16:
        raise ConfigError(v.source, at, f"{path} holds {'no' if not token else 'a short'} "
                                        f"token: put at least 16 characters in it")
    return token


def _origin(v: Validator, origin: str, at: str) -> str:
    parts = urlsplit(origin)
    if origin != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                          or parts.path.strip("/") or parts.query):
        raise ConfigError(v.source, at, f"expected an origin like \"https://host:port\" or "
                                        f"\"*\", got {origin!r}")
    return origin


def _limits(v: Validator, t: dict[str, Any], at: str) -> Limits:
    d = Limits()
    counts = [f.name for f in fields(Limits) if f.name.startswith("max_")]
    durations = [f.name for f in fields(Limits) if not f.name.startswith("max_")]
    v.keys(t, at, {*counts, *durations})
    values: dict[str, Any] = {name: v.positive(t, at, name, getattr(d, name))
                              for name in counts if name in t or getattr(d, name) is not None}
    for name in durations:
        if name in t:
            text = v.get(t, at, name, str, None)
            values[name] = parse_duration(text, v.source, f"{at}.{name}")
            if values[name] <= 0:
                raise ConfigError(v.source, f"{at}.{name}", f"must be longer than 0, not {text!r}")
    return Limits(**values)


def _tls(v: Validator, t: dict[str, Any] | None, at: str) -> TlsConfig | None:
    if t is None:
        return None
    v.keys(t, at, {"cert", "key"})
    paths = {}
    for name in ("cert", "key"):
        value = v.get(t, at, name, str, None)
        if value is None:
            raise ConfigError(v.source, f"{at}.{name}", "missing (a PEM file path)")
        if not Path(value).is_file():
            raise ConfigError(v.source, f"{at}.{name}", f"no such file: {value}")
        paths[name] = Path(value)
    return TlsConfig(paths["cert"], paths["key"])


def _check_exposure(config: Config) -> None:
    """Refuse a listener reachable from the network when no realm can authenticate anyone:
    it would let anyone on the LAN in anonymously."""
    exposed = [e for e in config.router.endpoints if not e.is_loopback]
    if exposed and not any(realm.users for realm in config.realms):
        raise ConfigError(
            config.source, _key_of(config, exposed[0]),
            f"{_reachable(exposed[0])} but no realm has [[realms.users]]: "
            f"add users (ticket, wampcra or cryptosign) or listen on 127.0.0.1 only")
    for i, realm in enumerate(config.realms):
        role = realm.role(realm.anonymous_role) if realm.anonymous_role else None
        writes = sorted({action for p in (role.permissions if role else ())
                         if covers_everything(p) for action in p.allow} - {"subscribe"})
        if exposed and writes:
            raise ConfigError(
                config.source, f"realms[{i}].anonymous_role",
                f"{_reachable(exposed[0])} and role "
                f"{realm.anonymous_role!r} lets anyone there {', '.join(writes)} on every URI "
                f"of realm {realm.name!r} without logging in: narrow its permissions (e.g. "
                f"subscribe to \"sensor.\") or listen on 127.0.0.1 only")


def _reachable(endpoint: Endpoint) -> str:
    if endpoint.is_host_name:
        return (f"{endpoint} names a host, not an IP address: it binds whatever the name "
                f"resolves to, so it is reachable from the network,")
    return f"{endpoint} is reachable from the network"


def _key_of(config: Config, endpoint: Endpoint) -> str:
    if endpoint is config.router.listen:
        return "router.listen"
    return f"router.rawsocket[{config.router.rawsocket.index(endpoint)}]"


def covers_everything(permission: Permission) -> bool:
    return (permission.match == "prefix" and permission.uri == "") or \
        (permission.match == "wildcard" and all(not part for part in permission.uri.split(".")))


def _realm(v: Validator, t: dict[str, Any], at: str) -> RealmConfig:
    v.keys(t, at, {"name", "anonymous_role", "roles", "users", "history", "retention"})
    name = v.get(t, at, "name", str, None)
    if name is None:
        raise ConfigError(v.source, f"{at}.name", "missing (every realm needs a name)")
    v.uri(name, f"{at}.name")
    roles = tuple(_role(v, r, f"{at}.roles[{i}]") for i, r in enumerate(v.tables(t, "roles", at)))
    _unique(v, [r.name for r in roles], f"{at}.roles", "name", "role")
    role_names = {r.name for r in roles}
    anonymous_role = v.get(t, at, "anonymous_role", str, None)
    if anonymous_role is not None and anonymous_role not in role_names:
        raise ConfigError(v.source, f"{at}.anonymous_role", f"no role named {anonymous_role!r}")
    users = tuple(_user(v, u, f"{at}.users[{i}]") for i, u in enumerate(v.tables(t, "users", at)))
    _unique(v, [u.authid for u in users], f"{at}.users", "authid", "user")
    for i, user in enumerate(users):
        if user.role not in role_names:
            raise ConfigError(v.source, f"{at}.users[{i}].role", f"no role named {user.role!r}")
    history = tuple(
        _history(v, h, f"{at}.history[{i}]") for i, h in enumerate(v.tables(t, "history", at))
    )
    retention = tuple(_retention(v, r, f"{at}.retention[{i}]")
                      for i, r in enumerate(v.tables(t, "retention", at))) or DEFAULT_RETENTION
    return RealmConfig(name, anonymous_role, roles, users, history, retention)


def _unique(v: Validator, names: list[str], at: str, key: str, what: str) -> None:
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(v.source, f"{at}[{i}].{key}", f"duplicate {what} {name!r}")


def _role(v: Validator, t: dict[str, Any], at: str) -> Role:
    v.keys(t, at, {"name", "permissions"})
    name = v.get(t, at, "name", str, None)
    if not name:
        raise ConfigError(v.source, f"{at}.name", "missing (every role needs a name)")
    permissions = []
    for i, p in enumerate(v.get(t, at, "permissions", list, [])):
        pat = f"{at}.permissions[{i}]"
        if not isinstance(p, dict):
            raise ConfigError(v.source, pat, "must be a table {uri, match, allow}")
        v.keys(p, pat, {"uri", "match", "allow", "disclose"})
        uri = v.get(p, pat, "uri", str, None)
        if uri is None:
            raise ConfigError(v.source, f"{pat}.uri", "missing")
        match = v.match(p, pat)
        v.uri(uri, f"{pat}.uri", match)
        allow = v.get(p, pat, "allow", list, [])
        for j, action in enumerate(allow):
            if action not in ACTIONS:
                raise ConfigError(v.source, f"{pat}.allow[{j}]",
                                  f"unknown action {action!r} (use {', '.join(ACTIONS)})")
        disclose = v.get(p, pat, "disclose", bool, False)
        permissions.append(Permission(uri, match, frozenset(allow), disclose))
    return Role(name, tuple(permissions))


def _user(v: Validator, t: dict[str, Any], at: str) -> User:
    v.keys(t, at, {"authid", "role", "secret", "secret_file", "secret_env", "salt",
                   "iterations", "keylen", "pubkeys"})
    authid = v.get(t, at, "authid", str, None)
    role = v.get(t, at, "role", str, None)
    if not authid:
        raise ConfigError(v.source, f"{at}.authid", "missing")
    if not role:
        raise ConfigError(v.source, f"{at}.role", "missing")
    pubkeys = []
    for i, key in enumerate(v.get(t, at, "pubkeys", list, [])):
        if not isinstance(key, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", key):
            raise ConfigError(v.source, f"{at}.pubkeys[{i}]",
                              "must be an Ed25519 public key as 64 hex digits")
        pubkeys.append(key.lower())
    return User(authid, role, secret(v, t, at), v.get(t, at, "salt", str, None),
                v.positive(t, at, "iterations", User.iterations),
                v.positive(t, at, "keylen", User.keylen), tuple(pubkeys))


def _history(v: Validator, t: dict[str, Any], at: str) -> HistoryRule:
    v.keys(t, at, {"uri", "match", "max_events", "max_age", "commit_window"})
    uri = v.get(t, at, "uri", str, None)
    if uri is None:
        raise ConfigError(v.source, f"{at}.uri", "missing")
    match = v.match(t, at)
    v.uri(uri, f"{at}.uri", match)
    max_age = v.get(t, at, "max_age", str, None)
    window = v.get(t, at, "commit_window", str, "0s")
    commit_window = parse_duration(window, v.source, f"{at}.commit_window")
    if commit_window > MAX_COMMIT_WINDOW:
        raise ConfigError(v.source, f"{at}.commit_window",
                          f"must be at most {MAX_COMMIT_WINDOW:g}s, not {window!r}")
    return HistoryRule(
        uri, match, v.positive(t, at, "max_events", HistoryRule.max_events),
        parse_duration(max_age, v.source, f"{at}.max_age") if max_age is not None else None,
        commit_window,
    )


def _retention(v: Validator, t: dict[str, Any], at: str) -> RetentionRule:
    v.keys(t, at, {"uri", "match", "max_payload"})
    uri = v.get(t, at, "uri", str, None)
    if uri is None:
        raise ConfigError(v.source, f"{at}.uri", "missing")
    match = v.match(t, at)
    v.uri(uri, f"{at}.uri", match)
    max_payload = v.positive(t, at, "max_payload", 0) if "max_payload" in t else None
    return RetentionRule(uri, match, max_payload)


def parse_duration(text: str, source: str, key: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        problem = "must not be negative" if text.strip().startswith("-") else \
            "expected a duration like '90d', '12h', '30m', '5s' or '250ms'"
        raise ConfigError(source, key, f"{problem}, not {text!r}")
    return float(m.group(1)) * _DURATION_SECONDS[m.group(2)]
