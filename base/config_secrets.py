"""Inline secrets of a config text: hidden when the text is shown, put back when it returns.

A role that may read the configuration (``cairn.admin.config.get``) need not learn the
credentials in it, above all over ``ws://`` on the LAN (Home Assistant's ``!secret``,
Grafana's provisioning). :func:`redact` shows every inline secret as :data:`REDACTED`;
:func:`restore` reads :data:`REDACTED` at a secret's key as "the value the current file has
there", so get, edit, apply round-trips without the secret leaving the device. A secret is
found by its address, not its line: a user moved within ``[[realms.users]]`` keeps its own
(array entries are told apart by their ``name`` or ``authid``).

Secrets in files or the environment (``secret_file``, ``token_env``, ...) are names, not
values, and are shown as they are.
"""

from __future__ import annotations

import re
import tomllib
import uuid
from typing import Any

from cairn.base.config_tools import ConfigError

# The inline secret keys of every section (base.config_tools.secret and optional_secret's
# names: users' and the driver's secret, sync and update tokens and passwords, the MQTT
# bridge's password, the S3 sink's secret_access_key)
SECRET_KEYS = frozenset({"secret", "token", "password", "secret_access_key"})
REDACTED = "<redacted>"
IDENTITIES = ("name", "authid")  # what tells entries of an array of tables apart

_KEY = "|".join(sorted(SECRET_KEYS, key=len, reverse=True))
_STRING = r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\''
_INLINE = re.compile(rf"(?<![\w\"'-])((?:{_KEY})\s*=\s*)({_STRING})", re.S)
_MARKER = re.compile(re.escape(f'"{REDACTED}"') + "|" + re.escape(f"'{REDACTED}'"))

KeyPath = tuple[Any, ...]  # keys, and indexes for array entries
Address = tuple[Any, ...]  # keys, and (identity key, value) or an index for array entries


class Unredactable(Exception):
    """The text writes a secret in a way :func:`redact` cannot hide, or is not TOML."""


def redact(text: str) -> str:
    """``text`` with each inline secret's value replaced by :data:`REDACTED`, the rest as it
    was (comments, order, spacing). Unredactable when the result would not be exactly the
    document with those values hidden: a secret under a quoted key, a text that is not TOML."""
    hidden = _INLINE.sub(lambda m: f'{m.group(1)}"{REDACTED}"', text)
    try:
        document, shown = tomllib.loads(text), tomllib.loads(hidden)
    except tomllib.TOMLDecodeError as e:
        raise Unredactable(f"not valid TOML ({e})") from None
    if shown != _hidden(document):
        raise Unredactable("a secret is written in a way get cannot hide (a quoted key?)")
    return hidden


def restore(text: str, current: str, source: str) -> str:
    """``text`` with each :data:`REDACTED` at a secret's key replaced by the value ``current``
    (the file running) has at the same address, written as it is there. ConfigError naming
    the key when it has none there (a new user needs its secret written out). A text that is
    not TOML is returned as it is, for validation to say why."""
    start, kept = 0, None
    while found := _MARKER.search(text, start):
        located = _locate(text, found.start(), found.end())
        if located is None:
            return text
        document, path = located
        if path is None or path[-1] not in SECRET_KEYS:  # a comment, or another key's text
            start = found.end()
            continue
        if kept is None:
            kept = _written_secrets(current)
        written = kept.get(_address(document, path))
        if written is None:
            raise ConfigError(source, _dotted(path),
                              f"{REDACTED!r} keeps the current secret, but the running file "
                              f"has none here: write the secret out")
        text = f"{text[:found.start()]}{written}{text[found.end():]}"
        start = found.start() + len(written)
    return text


def _locate(text: str, start: int, end: int) -> tuple[dict[str, Any], KeyPath | None] | None:
    """The document of ``text`` and the path of the value written at ``start:end`` (None:
    no value is, it is in a comment or a part of one); None when ``text`` is not TOML."""
    probe = f"cairn-probe-{uuid.uuid4().hex}"
    try:
        document = tomllib.loads(f'{text[:start]}"{probe}"{text[end:]}')
    except tomllib.TOMLDecodeError:
        return None
    return document, _path_to(document, probe)


def _written_secrets(current: str) -> dict[Address, str]:
    """Each inline secret of ``current`` by its address, as it is written there (quotes and
    all): a text applied as get showed it is the file, byte for byte."""
    found = {}
    for match in _INLINE.finditer(current):
        located = _locate(current, match.start(2), match.end(2))
        if located is not None and located[1] is not None:
            found[_address(located[0], located[1])] = match.group(2)
    return found


def _hidden(document: dict[str, Any]) -> dict[str, Any]:
    def hide(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: REDACTED if k in SECRET_KEYS and isinstance(v, str) else hide(v)
                    for k, v in value.items()}
        return [hide(v) for v in value] if isinstance(value, list) else value
    return hide(document)


def _path_to(value: Any, wanted: str, path: KeyPath = ()) -> KeyPath | None:
    if value == wanted:
        return path
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        if (found := _path_to(inner, wanted, (*path, key))) is not None:
            return found
    return None


def _address(document: Any, path: KeyPath) -> Address:
    """``path`` with each array index replaced by the entry's identity, when it has one."""
    steps, value = [], document
    for step in path:
        inner = value[step]
        if isinstance(step, int):
            identity = next((k for k in IDENTITIES if isinstance(inner, dict)
                             and isinstance(inner.get(k), str)), None)
            step = (identity, inner[identity]) if identity else step
        steps.append(step)
        value = inner
    return tuple(steps)


def _dotted(path: KeyPath) -> str:
    """('realms', 0, 'users', 1, 'secret') -> realms[0].users[1].secret"""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else f"{'.' if out else ''}{step}"
    return out
