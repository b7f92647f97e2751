"""Rows a damaged card has changed: every read of the store takes its rows one at a time,
leaves out the ones it cannot decode and counts them, so a bad row costs that row, never
the store (nor the router, nor ``cairn sync``).

Python's sqlite3 fails a whole fetch on one text value that is not UTF-8 ("Could not
decode to UTF-8"). Every connection that reads the store decodes text with :func:`text`
instead (its ``text_factory``, set by :func:`reading`): such a value comes back as
:class:`Undecodable`, its bytes, which is no ``str``. Each reader then checks its rows
against the :class:`Shape` of what it selects (:meth:`Shape.fault`: a text that is not
UTF-8, text where an integer belongs, a NULL...) and decodes the rest (JSON, msgpack) in a
``try``; what fails is reported to a :class:`Damage`, which counts it once per row and logs
the first of each table. ``cairn doctor`` and ``cairn repair`` read with the same shapes
(:mod:`.check`)."""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger("cairn.store")


class Undecodable(bytes):
    """Stored text that is not UTF-8, as its bytes: never a ``str``, so it is never taken
    for one (a topic, a realm), and every :class:`Shape` refuses it."""

    def __repr__(self) -> str:
        return f"Undecodable({bytes(self)[:40]!r})"


def text(raw: bytes) -> str | Undecodable:
    """The ``text_factory`` of the connections that read the store."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return Undecodable(raw)


Connection = TypeVar("Connection")


def reading(db: Connection) -> Connection:
    """``db`` (sqlite3 or aiosqlite) reads text that is not UTF-8 as :class:`Undecodable`."""
    db.text_factory = text  # type: ignore[attr-defined]
    return db


def readable_text(value: Any) -> str | None:
    """A value for a log line, a gap record or a report: text as it is, anything else
    (damaged) as None."""
    return value if type(value) is str else None


_KINDS = {"i": int, "s": str, "b": bytes}
_NAMES = {int: "an integer", str: "text", bytes: "a blob"}


def describe(value: Any) -> str:
    """What a damaged value holds, briefly (for logs and ``cairn doctor``)."""
    if isinstance(value, Undecodable):
        return f"text that is not UTF-8 ({bytes(value)[:24]!r})"
    if isinstance(value, str):
        return f"the text {value[:24]!r}"
    if isinstance(value, bytes):
        return f"a blob of {len(value)} bytes"
    if isinstance(value, float):
        return f"the real number {value:g}"
    return "NULL" if value is None else f"the integer {value}"


@dataclass(frozen=True)
class Shape:
    """What a read selects: its columns and their kinds, a letter each: ``i`` integer,
    ``s`` text, ``b`` blob; upper case when NULL is allowed too."""

    columns: tuple[str, ...]
    kinds: str
    # every tuple of value types a readable row may have (at most 2**5: five nullable
    # columns), so that checking a row is one set lookup
    _readable: frozenset[tuple[type, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        assert len(self.columns) == len(self.kinds), (self.columns, self.kinds)
        object.__setattr__(self, "_readable", frozenset(itertools.product(*(
            (_KINDS[k.lower()], type(None)) if k.isupper() else (_KINDS[k],)
            for k in self.kinds))))

    @classmethod
    def of(cls, columns: str, kinds: str) -> Shape:
        return cls(tuple(c.strip() for c in columns.split(",")), kinds)

    @property
    def select(self) -> str:
        return ", ".join(self.columns)

    def fault(self, row: Sequence[Any]) -> str | None:
        """Why ``row`` cannot be read as this shape (``"topic holds text that is not
        UTF-8 (...), not text"``), or None when every value is of its kind."""
        if tuple(map(type, row)) in self._readable:
            return None
        for value, kind, name in zip(row, self.kinds, self.columns, strict=True):
            want = _KINDS[kind.lower()]
            if type(value) is not want and not (kind.isupper() and value is None):
                return f"{name.split('.')[-1]} holds {describe(value)}, not {_NAMES[want]}"
        raise AssertionError(f"{row!r} is of its shape")  # not reached


def why(error: Exception) -> str:
    """A decoding error as a reason: ``"ErrorType: message"``, at most 200 characters."""
    return (f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)[:200]


class Unreadable(Exception):
    """A row that cannot be read; the message says why."""


T = TypeVar("T")


def decoded(shape: Shape, row: Sequence[Any], decode: Callable[[Sequence[Any]], T]) -> T:
    """``decode(row)`` once the row is of ``shape``; Unreadable, saying why, if it is not
    or its decoding fails (what a damaged value makes it raise is anyone's guess)."""
    fault = shape.fault(row)
    if fault is not None:
        raise Unreadable(fault)
    try:
        return decode(row)
    except Exception as e:
        raise Unreadable(why(e)) from e


class Damage:
    """The rows the store's reads left out, by table: each counted once however often it
    is read again (a history row in many pages), the first of each table logged with what
    to do about it, the others only counted (``cairn_store_damaged_rows_total{table}``)."""

    _remembered = 100_000  # rows whose key is kept, so they are counted once

    def __init__(self) -> None:
        self.rows: Counter[str] = Counter()
        self._seen: set[tuple[str, Hashable]] = set()

    def found(self, table: str, key: Hashable, reason: str) -> None:
        """A row of ``table`` (``key``: its seq, rowid or meta key) that cannot be read."""
        if (table, key) in self._seen:
            return
        if len(self._seen) < self._remembered:
            self._seen.add((table, key))
        self.rows[table] += 1
        if self.rows[table] == 1:
            log.error("a damaged row of %s cannot be read (%s: %s): it is left out, the "
                      "rest is read; further damaged rows of %s are counted, not logged. "
                      "`cairn doctor` lists them, `cairn repair` (router stopped) writes a "
                      "clean store", table, key, reason, table)
