"""The ``homeassistant`` preset: devices that announce themselves by Home Assistant's MQTT
discovery (home-assistant.io/integrations/mqtt/#mqtt-discovery), followed without a field
map and without a template engine.

Each entity is announced, retained, on ``<prefix>/<component>/[<node_id>/]<object_id>/config``
(an empty payload removes it). Cairn follows the ``sensor`` entities whose ``device_class``
is temperature, humidity, (atmospheric_)pressure or battery, or whose unit is ``lqi``
(Zigbee2MQTT's link quality): it reads their ``state_topic`` through their
``value_template`` (:func:`template`), converts from their ``unit_of_measurement``, and
watches their availability (``availability_topic`` or the ``availability`` list, with
``payload_available`` / ``payload_not_available``: offline while any says so, Home
Assistant's ``availability_mode: all``). Abbreviated keys and the ``~`` base are spelled
out. The entities of one device (``device.identifiers``) are one Cairn device. A device's own
temperature (``entity_category: diagnostic``, a chip or a plug) is not a reading.

A state topic is followed only when it is within the entry's ``follow`` filters and no other
``[[mqtt.map]]`` entry takes it (an explicit entry wins over discovery, whatever the order):
outside ``follow`` the entity is refused and its device's status says so; another entry's is
left to that entry (counted as ``covered``, logged once, no status).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cairn.drivers.mqtt_facts import (
    HPA_PER,
    MAX_REMEMBERED,
    TO_CELSIUS,
    Announced,
    Elsewhere,
    Fact,
    Fields,
    PresetEntry,
    Problem,
    availability,
    celsius,
    hpa,
    number,
    parse_json,
    shown,
    text,
    values,
)

# The abbreviations discovery allows (home-assistant.io/integrations/mqtt/#discovery-messages)
# of the keys read here.
ABBREVIATIONS = {
    "stat_t": "state_topic", "val_tpl": "value_template", "unit_of_meas": "unit_of_measurement",
    "dev_cla": "device_class", "uniq_id": "unique_id", "dev": "device",
    "ent_cat": "entity_category", "avty_t": "availability_topic",
    "avty_tpl": "availability_template", "avty": "availability",
    "pl_avail": "payload_available", "pl_not_avail": "payload_not_available",
    "ids": "identifiers", "cns": "connections", "t": "topic"}
QUANTITIES = {"temperature": "temperature", "humidity": "humidity", "pressure": "pressure",
              "atmospheric_pressure": "pressure", "battery": "battery"}


# -- value templates ---------------------------------------------------------------------

MISSING = object()


@dataclass(frozen=True)
class Template:
    """``{{ value }}`` (``path`` None) or ``{{ value_json<path> }}``, then ``filters``."""

    path: tuple[str | int, ...] | None
    filters: tuple[tuple[str, int], ...] = ()

    def render(self, payload_text: str, value_json: Any) -> Any:
        """The value, or :data:`MISSING` when the payload does not hold the path."""
        value = payload_text if self.path is None else value_json
        for step in self.path or ():
            try:
                value = value[step]
            except (KeyError, IndexError, TypeError):
                return MISSING
        for name, digits in self.filters:
            as_number = number(value)
            if as_number is None:
                return value  # not a number: the caller says so
            value = (float(as_number) if name == "float" else int(as_number) if name == "int"
                     else round(as_number, digits))
        return value


_STEP = r"\.\s*[A-Za-z_]\w*|\[\s*(?:'[^']*'|\"[^\"]*\"|\d+)\s*\]"
_EXPRESSION = re.compile(
    rf"\{{\{{\s*(value_json|value)((?:\s*(?:{_STEP}))*)\s*((?:\|\s*\w+(?:\(\s*\d+\s*\))?\s*)*)\}}\}}")
_STEPS = re.compile(r"\.\s*([A-Za-z_]\w*)|\[\s*(?:'([^']*)'|\"([^\"]*)\"|(\d+))\s*\]")
_FILTERS = re.compile(r"\|\s*(\w+)(\(\s*(\d+)\s*\))?")


def template(source: str | None) -> Template | None:
    """The value_template forms Cairn follows: ``{{ value }}``, ``{{ value_json.a.b }}``,
    ``{{ value_json['a'] }}`` (or ``["a"]``, ``[0]``), each with ``| float``, ``| int``,
    ``| round`` / ``| round(n)``; None for anything else (arithmetic, conditions, other
    filters, a filter's default, text around the expression), which is refused, not guessed."""
    if source is None:
        return Template(None)
    found = _EXPRESSION.fullmatch(source.strip())
    if found is None or (found[1] == "value" and found[2].strip()):
        return None
    filters = []
    for name, call, digits in _FILTERS.findall(found[3]):
        if name not in ("float", "int", "round") or (call and name != "round"):
            return None
        filters.append((name, int(digits or 0)))
    path = tuple(int(m[4]) if m[4] is not None else next(g for g in m.groups() if g is not None)
                 for m in _STEPS.finditer(found[2]))
    return Template(path if found[1] == "value_json" else None, tuple(filters))


# -- the preset --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Watch:
    topic: str
    template: Template
    online: str
    offline: str


@dataclass(frozen=True)
class _Entity:
    device: str
    quantity: str
    unit: str | None
    template: Template
    watches: tuple[_Watch, ...]

    @property
    def availability(self) -> tuple[str, ...]:
        return tuple(watch.topic for watch in self.watches)

    def convert(self, value: float) -> float | None:
        if self.quantity == "temperature":
            return celsius(value, self.unit)
        return hpa(value, self.unit) if self.quantity == "pressure" else value


class HomeAssistant:
    name, keys, base = "homeassistant", frozenset({"base", "follow"}), "homeassistant"

    def __init__(self, entry: PresetEntry, elsewhere: Elsewhere) -> None:
        self.entry, self.elsewhere = entry, elsewhere
        self.entities: dict[str, _Entity] = {}               # config topic -> entity
        self.on_topic: dict[str, dict[str, _Entity]] = {}    # state topic -> config -> entity
        self.watches: dict[str, _Watch] = {}                 # availability topic -> how
        self.claims: dict[tuple[str, str], str] = {}         # (device, quantity) -> config

    @staticmethod
    def topics(entry: PresetEntry) -> tuple[str, ...]:
        """What it takes by itself: discovery (the state topics it may follow are
        ``entry.follow``)."""
        return (f"{entry.base}/+/+/config", f"{entry.base}/+/+/+/config")

    def takes(self, topic: str) -> bool:
        """Discovery, and the state and availability topics learned from it."""
        return topic in self.on_topic or topic in self.watches or self.entry.claims(topic)

    def read(self, topic: str, payload: bytes) -> list[Fact]:
        if self.entry.claims(topic):
            return self._announce(topic, topic.split("/"), payload)
        facts = self._available(topic, payload) if topic in self.watches else []
        return facts + (self._state(topic, payload) if topic in self.on_topic else [])

    # -- discovery ------------------------------------------------------------------------

    def _announce(self, topic: str, levels: list[str], payload: bytes) -> list[Fact]:
        self._forget(topic)
        if not payload:
            return []  # the entity was removed
        config = parse_json(payload)
        if not isinstance(config, dict):
            return [Problem(None, "payload", f"{topic}: not a JSON object: {shown(payload)}")]
        config = expanded(config)
        quantity = _quantity(levels[1], config)
        if quantity is None:
            return []
        device = device_name(config, levels)
        refusal = self._refusal(topic, device, quantity, config)
        if refusal is not None:
            kind, reason = refusal
            if kind == "covered":  # another entry bridges that device already
                return [Problem(None, kind, f"{topic}: {reason}")]
            return [Announced(device), Problem(device, kind, f"{topic}: {reason}",
                                               lasting=topic)]
        if len(self.entities) >= MAX_REMEMBERED:
            return [Problem(None, "limit", f"{topic}: over {MAX_REMEMBERED} entities")]
        entity = _Entity(device, quantity, config.get("unit_of_measurement"),
                         template(config.get("value_template")), self._watches(config))
        self.entities[topic] = entity
        self.on_topic.setdefault(config["state_topic"], {})[topic] = entity
        self.claims[(device, quantity)] = topic
        self.watches.update((watch.topic, watch) for watch in entity.watches)
        return [Announced(device, entity.availability, topic)]

    def _refusal(self, topic: str, device: str, quantity: str,
                 config: dict[str, Any]) -> tuple[str, str] | None:
        """(kind, reason) when the entity cannot be followed, else None."""
        state_topic = config.get("state_topic")
        if not isinstance(state_topic, str) or not state_topic or \
                "+" in state_topic or "#" in state_topic:
            return "config", f"state_topic {state_topic!r} is not an MQTT topic"
        if self.elsewhere(state_topic):
            return "covered", f"state_topic {state_topic!r} is another [[mqtt.map]] entry's"
        if not self.entry.follows(state_topic):
            return "topic", (f"state_topic {state_topic!r} is outside the MQTT filters this "
                             f"entry follows ({', '.join(self.entry.follow)})")
        value_template = config.get("value_template")
        if not isinstance(value_template, str | None) or template(value_template) is None:
            return "template", (f"value_template {value_template!r} is not a form Cairn "
                                "follows ({{ value }}, {{ value_json.x }}, "
                                "{{ value_json['x'] }}, with | float, | int, | round(n))")
        unit = config.get("unit_of_measurement")
        if not _unit_known(quantity, unit):
            return "unit", f"{quantity} in {unit!r}, a unit Cairn does not convert"
        claimed = self.claims.get((device, quantity))
        if claimed not in (None, topic):
            return "ambiguous", f"device {device} has a {quantity} already ({claimed})"
        return None

    def _watches(self, config: dict[str, Any]) -> tuple[_Watch, ...]:
        """The entity's availability topics that this entry may follow."""
        items = config.get("availability")
        if not isinstance(items, list):
            items = [{"topic": config.get("availability_topic"),
                      "value_template": config.get("availability_template"),
                      **{k: config[k] for k in ("payload_available", "payload_not_available")
                         if k in config}}]
        found = []
        for item in items:
            topic = item.get("topic") if isinstance(item, dict) else None
            how = template(item.get("value_template")) if isinstance(topic, str) else None
            if how is not None and self.entry.follows(topic) and not self.elsewhere(topic):
                found.append(_Watch(topic, how, str(item.get("payload_available", "online")),
                                    str(item.get("payload_not_available", "offline"))))
        return tuple(found)

    def _forget(self, topic: str) -> None:
        entity = self.entities.pop(topic, None)
        if entity is None:
            return
        for state_topic, entities in list(self.on_topic.items()):
            if entities.pop(topic, None) is not None and not entities:
                del self.on_topic[state_topic]
        self.claims.pop((entity.device, entity.quantity), None)

    # -- what the followed topics say -----------------------------------------------------

    def _available(self, topic: str, payload: bytes) -> list[Fact]:
        watch = self.watches[topic]
        said = watch.template.render(text(payload) or "", parse_json(payload))
        return availability(topic, None if said is MISSING else str(said), watch.online,
                            watch.offline)

    def _state(self, topic: str, payload: bytes) -> list[Fact]:
        """Each entity's value from one state message; one Reading per device."""
        payload_text, value_json = text(payload) or "", parse_json(payload)
        found: dict[str, tuple[dict[str, Any], Fields, tuple[str, ...]]] = {}
        entities = self.on_topic[topic].values()
        for entity in entities:
            value = entity.template.render(payload_text, value_json)
            if value is not MISSING:  # else a partial state (Zigbee2MQTT without cache_state)
                rendered, fields, watch = found.setdefault(entity.device, ({}, {}, ()))
                rendered[entity.quantity] = value
                fields[entity.quantity] = (entity.quantity, entity.convert)
                found[entity.device] = (rendered, fields, watch + entity.availability)
        facts: list[Fact] = []
        for device, (rendered, fields, watch) in found.items():
            facts += values(device, rendered, fields, tuple(dict.fromkeys(watch)))
        if not facts:
            return [Problem(device, "payload", f"{topic}: holds none of the values announced: "
                                               f"{shown(payload)}")
                    for device in sorted({entity.device for entity in entities})]
        return facts


def _quantity(component: str, config: dict[str, Any]) -> str | None:
    if component != "sensor":
        return None
    quantity = QUANTITIES.get(config.get("device_class")) or \
        ("linkquality" if config.get("unit_of_measurement") == "lqi" else None)
    if quantity in ("temperature", "humidity", "pressure") and \
            config.get("entity_category") in ("diagnostic", "config"):
        return None
    return quantity


def _unit_known(quantity: str, unit: Any) -> bool:
    if quantity == "temperature":
        return unit in TO_CELSIUS
    if quantity == "pressure":
        return unit in HPA_PER
    return quantity == "linkquality" or unit in (None, "%")


def expanded(config: dict[str, Any]) -> dict[str, Any]:
    """Abbreviated keys spelled out, in the device and availability tables too, and ``~`` at
    the start or end of a ``*_topic`` (or an availability ``topic``) replaced by the base."""
    out = {ABBREVIATIONS.get(k, k): v for k, v in config.items()}
    base = out.get("~")
    if isinstance(out.get("device"), dict):
        out["device"] = {ABBREVIATIONS.get(k, k): v for k, v in out["device"].items()}
    if isinstance(out.get("availability"), list):
        out["availability"] = [expanded({**item, "~": base}) if isinstance(item, dict)
                               else item for item in out["availability"]]
    if isinstance(base, str):
        for key, value in out.items():
            if (key.endswith("_topic") or key == "topic") and isinstance(value, str):
                out[key] = (base + value[1:] if value.startswith("~")
                            else value[:-1] + base if value.endswith("~") else value)
    return out


def device_name(config: dict[str, Any], levels: list[str]) -> str:
    """The device's first identifier (what Home Assistant groups entities by), else its
    first connection, else the entity's unique_id, else its node and object id."""
    device = config.get("device") if isinstance(config.get("device"), dict) else {}
    ids = device.get("identifiers")
    ids = [ids] if isinstance(ids, str) else ids if isinstance(ids, list) else []
    connections = [c[1] for c in device.get("connections") or ()
                   if isinstance(c, list) and len(c) == 2]
    for candidate in [*ids, *connections, config.get("unique_id")]:
        if isinstance(candidate, str) and candidate:
            return candidate
    return "_".join(levels[2:-1])
