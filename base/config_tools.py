"""The config toolkit every component's sections are checked with: :class:`ConfigError`
(file, dotted key, problem), :class:`Validator` (types, tables, URIs, endpoints),
:func:`secret` (inline, file or environment) and :func:`describe`. Public, so drivers/ and
sync/ validate their own sections the way gateway.core.config does, without its private
names."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# how a URI pattern matches (gateway.core.patterns implements them)
MATCH_POLICIES = ("exact", "prefix", "wildcard")
_URI_COMPONENT = re.compile(r"^[^\s.#]+$")


class ConfigError(Exception):
    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


@dataclass(frozen=True)
class Endpoint:
    """Where a listener binds: TCP ``host:port`` (``tls:host:port`` for TLS) or
    ``unix:/path``."""

    host: str | None = None
    port: int | None = None
    path: str | None = None
    tls: bool = False

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        return f"{'tls:' if self.tls else ''}{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """A Unix socket, ``localhost`` or a loopback IP address. Any other name is not,
        whatever it looks like: ``127.0.0.1.example.invalid`` binds what DNS makes of it."""
        if self.path:
            return True
        return self.host is not None and (self.host.lower() == "localhost" or
                                          _loopback_address(self.host))

    @property
    def is_host_name(self) -> bool:
        """A TCP listener given by a name (other than ``localhost``), not an IP address."""
        if self.host is None or self.host.lower() == "localhost":
            return False
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return True
        return False


def _loopback_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return False


class Validator:
    def __init__(self, source: str) -> None:
        self.source = source

    def keys(self, table: dict[str, Any], at: str, allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                where = f"{at}.{key}" if at else key
                raise ConfigError(self.source, where,
                                  f"unknown key (allowed here: {', '.join(sorted(allowed))})")

    def get(self, table: dict[str, Any], at: str, key: str, kind: type, default: Any) -> Any:
        if key not in table:
            return default
        value = table[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(self.source, f"{at}.{key}" if at else key,
                              f"expected {_KIND_NAMES[kind]}, got {describe(value)}")
        return value

    def positive(self, table: dict[str, Any], at: str, key: str, default: int) -> int:
        value = self.get(table, at, key, int, default)
        if value <= 0:
            raise ConfigError(self.source, f"{at}.{key}",
                              f"must be a positive integer, not {value}")
        return value

    def positive_number(self, table: dict[str, Any], at: str, key: str,
                        default: float) -> float:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(self.source, f"{at}.{key}",
                              f"must be a positive number, not {describe(value)}")
        return float(value)

    def strings(self, table: dict[str, Any], at: str, key: str) -> list[str]:
        items = self.get(table, at, key, list, [])
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item:
                raise ConfigError(self.source, f"{at}.{key}[{i}]",
                                  f"expected a non-empty string, got {describe(item)}")
        return items

    def table(self, data: dict[str, Any], key: str) -> dict[str, Any]:
        return self.get(data, "", key, dict, {}) if key in data else {}

    def tables(self, data: dict[str, Any], key: str, at: str = "") -> list[dict[str, Any]]:
        items = self.get(data, at, key, list, [])
        where = f"{at}.{key}" if at else key
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ConfigError(self.source, f"{where}[{i}]",
                                  f"expected a table ([[{where}]]), got {describe(item)}")
        return items

    def match(self, table: dict[str, Any], at: str) -> str:
        match = self.get(table, at, "match", str, "exact")
        if match not in MATCH_POLICIES:
            raise ConfigError(self.source, f"{at}.match",
                              f"must be exact, prefix or wildcard, not {match!r}")
        return match

    def uri(self, uri: str, at: str, match: str = "exact") -> None:
        if match == "prefix" and uri == "":
            return
        parts = uri.split(".")
        for i, part in enumerate(parts):
            if part == "" and match == "wildcard":
                continue
            if part == "" and match == "prefix" and i == len(parts) - 1:
                continue
            if not _URI_COMPONENT.match(part):
                raise ConfigError(self.source, at, f"invalid URI {uri!r} for match={match}")

    def endpoint(self, text: str | None, at: str, tcp_only: bool = False) -> Endpoint | None:
        if text is None:
            return None
        if not isinstance(text, str):
            raise ConfigError(self.source, at, f"expected a string, got {describe(text)}")
        if text.startswith("unix:"):
            if tcp_only:
                raise ConfigError(self.source, at, "must be host:port")
            if len(text) == 5:
                raise ConfigError(self.source, at, "unix: needs a socket path")
            return Endpoint(path=text[5:])
        host, sep, port = text.rpartition(":")
        host = host.strip("[]")
        tls = text.startswith("tls:")
        host, sep, port = text.removeprefix("tls:").rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(self.source, at,
                              f"expected 'host:port', 'tls:host:port' or 'unix:/path', "
                              f"not {text!r}")
        return Endpoint(host=host, port=int(port), tls=tls)


def secret(v: Validator, t: dict[str, Any], at: str) -> str | None:
    """The secret inline, or read from a file or an environment variable (so the config
    file itself can be world-readable)."""
    given = [k for k in ("secret", "secret_file", "secret_env") if k in t]
    if len(given) > 1:
        raise ConfigError(v.source, f"{at}.{given[1]}", f"give only one of {', '.join(given)}")
    if "secret_file" in t:
        path = v.get(t, at, "secret_file", str, None)
        try:
            secret = Path(path).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(v.source, f"{at}.secret_file",
                              f"cannot read {path}: {e.strerror}") from e
        return _non_empty(v, secret, f"{at}.secret_file", path)
    if "secret_env" in t:
        name = v.get(t, at, "secret_env", str, None)
        if name not in os.environ:
            raise ConfigError(v.source, f"{at}.secret_env",
                              f"environment variable {name} is not set")
        return _non_empty(v, os.environ[name], f"{at}.secret_env", f"environment variable {name}")
    secret = v.get(t, at, "secret", str, None)
    return None if secret is None else _non_empty(v, secret, f"{at}.secret", "the secret")


def optional_secret(v: Validator, t: dict[str, Any], at: str, name: str) -> str | None:
    """:func:`secret` under keys of its own name: ``NAME``, ``NAME_file`` or ``NAME_env``
    (``token``, ``password``, ``secret_access_key``), its errors naming the key written."""
    keys = {name: "secret", f"{name}_file": "secret_file", f"{name}_env": "secret_env"}
    renamed = {keys[k]: value for k, value in t.items() if k in keys}
    try:
        return secret(v, renamed, at)
    except ConfigError as e:  # name the key the user wrote
        key = e.key.replace("secret", name)
        raise ConfigError(e.source, key, e.problem) from None


def _non_empty(v: Validator, secret: str, key: str, origin: str) -> str:
    # An empty secret is a login anyone can type (ticket), or compute (wampcra).
    if not secret.strip():
        raise ConfigError(v.source, key, f"{origin} is empty: a secret must not be empty or "
                                          f"only whitespace")
    return secret


_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "an array",
               dict: "a table", float: "a number"}


def describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]
