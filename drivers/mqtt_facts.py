"""What the MQTT presets (:mod:`drivers.mqtt_presets`) make of a message, in Cairn's terms.

A preset reads one MQTT message and returns facts: a :class:`Reading` (a device's values in
Cairn's units: temperature °C, humidity %RH, pressure hPa, battery %, linkquality LQI, and
the device's own clock as ``device_time``, a field, never the order), an
:class:`Availability` (what a project's online/offline topic said), an :class:`Announced`
device (Home Assistant discovery) or a :class:`Problem` (bad input, counted by ``kind``).
Here too: the units, the device-id rule, a preset's ``[[mqtt.map]]`` entry
(:class:`PresetEntry`), and the small payload readers the presets share.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MAX_DEVICES = 1000       # devices one bridge makes: a client cannot make it hold more
MAX_REMEMBERED = 10_000  # availability topics, discovery entities, sensors kept per bridge

# Does another [[mqtt.map]] entry take this topic (by its filters)?
Elsewhere = Callable[[str], bool]


# -- numbers and units -------------------------------------------------------------------

def number(value: Any) -> float | None:
    """A finite number, from a JSON number or its text ("21.5"), else None: null, true,
    "nan", "None", "unavailable" are no readings."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, int | float) and math.isfinite(value):
        return value
    return None


def _from_fahrenheit(value: float) -> float:
    return round((value - 32) * 5 / 9, 2)  # a unit conversion adds no precision


TO_CELSIUS: dict[str, Callable[[float], float]] = {
    "°C": lambda v: v, "C": lambda v: v, "°F": _from_fahrenheit, "F": _from_fahrenheit,
    "K": lambda v: round(v - 273.15, 2)}
HPA_PER: dict[str, float] = {"hPa": 1, "mbar": 1, "Pa": 0.01, "kPa": 10, "cbar": 100,
                             "bar": 1000, "mmHg": 1.333224, "inHg": 33.86389, "psi": 68.94757}


def celsius(value: float, unit: str) -> float | None:
    """``value`` in °C, or None when ``unit`` is not one Cairn converts."""
    convert = TO_CELSIUS.get(unit)
    return None if convert is None else convert(value)


def hpa(value: float, unit: str) -> float | None:
    """``value`` in hPa, or None when ``unit`` is not one Cairn converts."""
    factor = HPA_PER.get(unit)
    return None if factor is None else value if factor == 1 else round(value * factor, 2)


def utc(seconds: Any) -> str | None:
    """A device's Unix time (Shelly's ``ts``) as RFC 3339 UTC text, as Cairn writes times
    (``2023-04-08T14:07:59.620Z``): the same instant, and no number among the readings."""
    value = number(seconds)
    if value is None or not 0 <= value < 1e11:
        return None
    moment = datetime.fromtimestamp(value, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- device ids --------------------------------------------------------------------------

SAFE = re.compile(r"[0-9A-Za-z_-]+")
_UNSAFE_RUN = re.compile(r"[^0-9A-Za-z_-]+")


def device_id(name: str, prefix: str = "") -> str:
    """``name`` as one WAMP URI component (``sensor.<id>``, ``gateway.device.<id>.status``):
    itself when it holds only letters, digits, ``_`` and ``-``; otherwise each run of other
    characters becomes ``_`` and a short hash of the whole name is appended (``Living
    Room/T1`` -> ``Living_Room_T1-<4 hex>``), so names that differ only there ("a/b", "a b",
    "a_b") stay distinct, and an id never depends on the order devices appeared in."""
    if SAFE.fullmatch(name):
        return prefix + name
    slug = _UNSAFE_RUN.sub("_", name).strip("_") or "device"
    return f"{prefix}{slug}-{hashlib.blake2s(name.encode(), digest_size=2).hexdigest()}"


# -- a [[mqtt.map]] entry with a preset (checked by mqtt_presets.parse_entry) ------------

@dataclass(frozen=True)
class PresetEntry:
    preset: str
    base: str = ""
    follow: tuple[str, ...] = ()
    device_prefix: str = ""
    temperature_unit: str = "°C"
    retain: bool = True
    qos: int = 1
    taken: tuple[str, ...] = ()  # the preset's own filters (PRESETS[preset].topics)

    @property
    def filters(self) -> tuple[str, ...]:
        """What the bridge subscribes to for this entry."""
        return self.taken + self.follow

    def claims(self, topic: str) -> bool:
        return _matches_any(self.taken, topic)

    def follows(self, topic: str) -> bool:
        return _matches_any(self.follow, topic)


def _matches_any(filters: tuple[str, ...], topic: str) -> bool:
    """MQTT matching: ``+`` one level, ``#`` the rest; neither matches a ``$`` topic."""
    levels = topic.split("/")
    for mqtt_filter in filters:
        wanted = mqtt_filter.split("/")
        if levels[0].startswith("$") and wanted[0] in ("+", "#"):
            continue
        for i, level in enumerate(wanted):
            if level == "#":
                return True
            if i >= len(levels) or level not in ("+", levels[i]):
                break
        else:
            if len(levels) == len(wanted):
                return True
    return False


# -- facts -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reading:
    name: str                           # the device's stable name in its project
    values: dict[str, Any]              # in Cairn's units
    availability: tuple[str, ...] = ()  # the topics whose online/offline are this device's


@dataclass(frozen=True)
class Availability:
    topic: str
    online: bool
    said: str


@dataclass(frozen=True)
class Announced:
    """Home Assistant: a device announced an entity Cairn follows; ``entity`` (its config
    topic) has no lasting problem any more."""

    name: str
    availability: tuple[str, ...] = ()
    entity: str = ""


@dataclass(frozen=True)
class Problem:
    name: str | None    # the device it is about (None: no device can be named)
    kind: str           # what is counted: payload, number, unit, template, topic, ...
    reason: str
    quantity: str | None = None  # a value that is bad now: not republished as current
    lasting: str = ""   # a discovery entity's config topic: lasts until that entity changes
    watchers: str = ""  # an availability topic: the problem of every device that watches it


Fact = Reading | Availability | Announced | Problem


# -- reading payloads --------------------------------------------------------------------

NOT_JSON = object()


def parse_json(payload: bytes) -> Any:
    """The payload's JSON value, or :data:`NOT_JSON` (NaN and Infinity are not JSON)."""
    try:
        return json.loads(payload, parse_constant=_no_constant)
    except ValueError:
        return NOT_JSON


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def text(payload: bytes) -> str | None:
    try:
        return payload.decode().strip()
    except UnicodeDecodeError:
        return None


def shown(payload: bytes) -> str:
    """A payload in a log line or a status reason: its start, quoted."""
    return repr(payload[:40].decode(errors="replace")) + ("..." if len(payload) > 40 else "")


def availability(topic: str, said: str | None, online: str, offline: str) -> list[Fact]:
    if said in (online, offline):
        return [Availability(topic, said == online, said)]
    return [Problem(None, "payload", f"{topic}: expected {online!r} or {offline!r}, "
                                     f"not {said!r}")]


Fields = dict[str, tuple[str, Callable[[float], float | None] | None]]


def values(name: str, found: dict[str, Any], fields: Fields, watch: tuple[str, ...],
           extra: dict[str, Any] | None = None) -> list[Fact]:
    """``found``'s ``fields`` (its key -> Cairn's name and unit conversion) as a Reading,
    after a Problem for each value that is not a number; nothing when it holds none."""
    facts: list[Fact] = []
    good: dict[str, Any] = {}
    for key, (quantity, convert) in fields.items():
        if key not in found:
            continue
        value = number(found[key])
        if value is None:
            facts.append(Problem(name, "number", f"{key} is {found[key]!r}, not a number",
                                 quantity))
        else:
            good[quantity] = convert(value) if convert else value
    if good:
        facts.append(Reading(name, {**good, **(extra or {})}, watch))
    return facts
