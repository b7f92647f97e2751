"""MQTT presets: the devices of Zigbee2MQTT, Tasmota, Shelly, ESPHome and Home Assistant MQTT
discovery as Cairn sensors, without a field map.

```toml
[[mqtt.map]]
preset = "zigbee2mqtt"        # or tasmota, shelly, esphome, homeassistant
# base = "zigbee2mqtt"        # zigbee2mqtt: its mqtt.base_topic; tasmota: its tele prefix;
#                             # homeassistant: the discovery prefix
# follow = ["#"]              # homeassistant: the state topics it may follow
# device_prefix = ""          # put before every device id of this entry
# temperature_unit = "°C"     # esphome, shelly (Gen1): what the devices send, °C or °F
# retain = true               # qos = 1, as every [[mqtt.map]] entry
```

Each preset is one class in :data:`PRESETS`: the MQTT filters it takes (``topics``) and a
``read(topic, payload)`` that turns one message into facts (:mod:`drivers.mqtt_facts`).
:class:`PresetInput` turns the facts into what every driver publishes: the device's merged
values, retained, on ``sensor.<id>``, its status (:class:`drivers.runtime.DeviceStatus`) on
``gateway.device.<id>.status``.

- A device id is the device's stable name in its project (a Zigbee2MQTT friendly name, a
  Tasmota topic and sensor, a Shelly id, an ESPHome node, a Home Assistant device identifier)
  made one WAMP URI component by :func:`drivers.mqtt_facts.device_id`; two names that would
  make one id are not merged: the second is refused (counted, logged).
- A topic becomes a device only once it carried a reading (Home Assistant: once announced),
  so lights, plugs and noise make no tiles; at most ``MAX_DEVICES`` devices per bridge.
- A reading carries every value the device gave so far (one number per topic, Shelly's
  NotifyStatus) except one that was bad since; a value that is bad now is not republished.
- Bad input (a payload of the wrong shape, a value that is not a number, a unit Cairn does
  not convert, a discovery entry it cannot follow) is counted by kind
  (:class:`PresetStats`), logged once per kind and device or topic, and the device's status
  says why (``error``, ``ok`` again with its next good reading); nothing else stops.
- A device whose availability topic says offline has status ``error`` ("offline: ...") until
  it says online again; its readings still flow.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cairn.base.config_tools import ConfigError, Validator
from cairn.drivers.mqtt_discovery import HomeAssistant
from cairn.drivers.mqtt_facts import (
    HPA_PER,
    MAX_DEVICES,
    MAX_REMEMBERED,
    SAFE,
    TO_CELSIUS,
    Announced,
    Availability,
    Elsewhere,
    Fact,
    Fields,
    PresetEntry,
    Problem,
    Reading,
    availability,
    celsius,
    device_id,
    hpa,
    parse_json,
    shown,
    text,
    utc,
    values,
)
from cairn.drivers.runtime import DeviceStatus, RouterLink, reading_topic

log = logging.getLogger("cairn.mqtt")


class Preset(Protocol):
    name: str
    keys: frozenset[str]  # the optional keys of its [[mqtt.map]] entry
    base: str             # the default of ``base`` ("" when it has none)

    def __init__(self, entry: PresetEntry, elsewhere: Elsewhere) -> None: ...

    @staticmethod
    def topics(entry: PresetEntry) -> tuple[str, ...]: ...

    def read(self, topic: str, payload: bytes) -> list[Fact]: ...


# -- the presets -------------------------------------------------------------------------

class Zigbee2Mqtt:
    """zigbee2mqtt.io/guide/usage/mqtt_topics_and_messages.html: a device's state is a flat
    JSON object on ``<base>/<friendly name>`` (the name may hold ``/``), in Cairn's units
    already (°C, %, hPa, %, LQI); ``<base>/<name>/availability`` is ``online``/``offline``
    (``{"state": "online"}`` with ``legacy_availability_payload: false``, and in 2.x).
    ``<base>/bridge/...`` is Zigbee2MQTT's own, ``.../set`` and ``.../get`` are commands."""

    name, keys, base = "zigbee2mqtt", frozenset({"base"}), "zigbee2mqtt"
    FIELDS: Fields = {q: (q, None) for q in ("temperature", "humidity", "pressure", "battery",
                                             "linkquality")}

    def __init__(self, entry: PresetEntry, elsewhere: Elsewhere) -> None:
        self.base = entry.base

    @staticmethod
    def topics(entry: PresetEntry) -> tuple[str, ...]:
        return (f"{entry.base}/#",)

    def read(self, topic: str, payload: bytes) -> list[Fact]:
        name = topic[len(self.base) + 1:]
        levels = name.split("/")
        if levels[0] == "bridge" or {"set", "get"} & set(levels[1:]):
            return []
        if levels[-1] == "availability" and len(levels) > 1:
            said = parse_json(payload)
            said = said.get("state") if isinstance(said, dict) else text(payload)
            return availability(topic, said, "online", "offline")
        state = parse_json(payload)
        if not isinstance(state, dict):
            return [Problem(name, "payload", f"{topic}: not a JSON object: {shown(payload)}")]
        return values(name, state, self.FIELDS, (f"{topic}/availability",))


class Tasmota:
    """tasmota.github.io/docs/MQTT/ (FullTopic ``%prefix%/%topic%/``): every TelePeriod
    ``tele/<topic>/SENSOR`` carries ``{"Time": <device local time>, "<sensor>":
    {"Temperature": .., "Humidity": .., "Pressure": ..}, "TempUnit": "C"|"F",
    "PressureUnit": "hPa"|"mmHg"}`` (tasmota.github.io/docs/AM2301/, /BME280/);
    ``tele/<topic>/LWT`` is ``Online``/``Offline``, retained. Each sensor of a Tasmota is a
    Cairn device ``<topic>-<sensor>`` (``DS18B20-1``, a BLE ``ATC1a2b3c``...), as Home
    Assistant's Tasmota integration makes one entity per sensor; the ESP32's own chip
    temperature is not one."""

    name, keys, base = "tasmota", frozenset({"base"}), "tele"
    NOT_SENSORS = ("ESP32",)

    def __init__(self, entry: PresetEntry, elsewhere: Elsewhere) -> None:
        pass

    @staticmethod
    def topics(entry: PresetEntry) -> tuple[str, ...]:
        return (f"{entry.base}/+/SENSOR", f"{entry.base}/+/LWT")

    def read(self, topic: str, payload: bytes) -> list[Fact]:
        prefix, device, kind = topic.rsplit("/", 2)
        if kind == "LWT":
            return availability(topic, text(payload), "Online", "Offline")
        lwt = f"{prefix}/{device}/LWT"
        report = parse_json(payload)
        if not isinstance(report, dict):
            return [Problem(None, "payload", f"{topic}: not a JSON object: {shown(payload)}",
                            watchers=lwt)]
        fields, unknown = self._fields(report)
        extra = {"device_time": report["Time"]} if "Time" in report else {}
        facts: list[Fact] = []
        for sensor, found in report.items():
            if isinstance(found, dict) and sensor not in self.NOT_SENSORS:
                name = f"{device}-{sensor}"
                facts += [Problem(name, "unit", reason, quantity)
                          for key, (quantity, reason) in unknown.items() if key in found]
                facts += values(name, found, fields, (lwt,), extra)
        return facts

    @staticmethod
    def _fields(report: dict[str, Any]) -> tuple[Fields, dict[str, tuple[str, str]]]:
        """The sensor fields read, in the report's units, and those left out for a unit
        Cairn does not convert (key -> quantity and why)."""
        temperature, pressure = report.get("TempUnit", "C"), report.get("PressureUnit", "hPa")
        fields: Fields = {"Temperature": ("temperature", lambda v: celsius(v, temperature)),
                          "Humidity": ("humidity", None),
                          "Pressure": ("pressure", lambda v: hpa(v, pressure)),
                          "Battery": ("battery", None)}
        unknown = {}
        for key, unit, known in (("Temperature", temperature, TO_CELSIUS),
                                 ("Pressure", pressure, HPA_PER)):
            if unit not in known:
                quantity = fields.pop(key)[0]
                unknown[key] = (quantity, f"{quantity} in {unit!r}, a unit Cairn does not "
                                          f"convert")
        return fields, unknown


class Shelly:
    """Gen1 (shelly-api-docs.shelly.cloud/gen1/#shelly-h-amp-t-mqtt): one number per topic,
    ``shellies/<id>/sensor/temperature`` (in the unit set on the device: ``temperature_unit``),
    ``.../humidity``, ``.../battery``; an add-on's ``shellies/<id>/ext_temperature/<n>`` (°C)
    and ``ext_humidity/<n>``, the Cairn device ``<id>-ext<n>``; ``shellies/<id>/online``
    ``true``/``false``.
    Gen2/Gen3 (shelly-api-docs.shelly.cloud/gen2/General/Notifications): JSON-RPC frames on
    ``<prefix>/events/rpc``: ``NotifyFullStatus`` carries every component, ``NotifyStatus``
    only what changed, overlaid here on the last full status; ``temperature:<n>.tC``,
    ``humidity:<n>.rh``, ``devicepower:<n>.battery.percent``; component 0 is the device
    ``<prefix>``, an add-on's ``temperature:100`` is ``<prefix>-100``; ``params.ts`` is the
    device's clock (kept as RFC 3339 UTC text); a component's ``errors`` (``["read"]``) are
    its status; ``<prefix>/online`` ``true``/``false``."""

    name, keys, base = "shelly", frozenset({"temperature_unit"}), ""
    GEN1 = {"sensor/temperature": "temperature", "sensor/humidity": "humidity",
            "sensor/battery": "battery", "ext_temperature": "temperature",
            "ext_humidity": "humidity"}
    GEN2 = {"temperature": ("tC", "temperature"), "humidity": ("rh", "humidity"),
            "devicepower": ("percent", "battery")}

    def __init__(self, entry: PresetEntry, elsewhere: Elsewhere) -> None:
        self.unit = entry.temperature_unit
        self.full: dict[str, dict[str, Any]] = {}  # <prefix> -> its status, overlaid

    @staticmethod
    def topics(entry: PresetEntry) -> tuple[str, ...]:
        return ("shellies/+/sensor/+", "shellies/+/ext_temperature/+",
                "shellies/+/ext_humidity/+", "shellies/+/online", "+/events/rpc", "+/online")

    def read(self, topic: str, payload: bytes) -> list[Fact]:
        levels = topic.split("/")
        if levels[-1] == "online":
            return availability(topic, text(payload), "true", "false")
        if levels[0] == "shellies":
            return self._gen1(levels, payload)
        return self._gen2(levels[0], topic, payload)

    def _gen1(self, levels: list[str], payload: bytes) -> list[Fact]:
        _, shelly, kind, what = levels
        key = f"{kind}/{what}"
        quantity = self.GEN1.get(key if kind == "sensor" else kind)
        if quantity is None:
            return []  # sensor/error, sensor/act_reasons, ...: no readings
        name, unit = (shelly, self.unit) if kind == "sensor" else (f"{shelly}-ext{what}", "°C")
        convert = (lambda v: celsius(v, unit)) if quantity == "temperature" else None
        return values(name, {key: text(payload)}, {key: (quantity, convert)},
                      (f"shellies/{shelly}/online",))

    def _gen2(self, prefix: str, topic: str, payload: bytes) -> list[Fact]:
        frame = parse_json(payload)
        frame = frame if isinstance(frame, dict) else {}
        params, method = frame.get("params"), frame.get("method")
        if not isinstance(params, dict) or not isinstance(method, str):
            return [Problem(None, "payload", f"{topic}: not a JSON-RPC notification: "
                                             f"{shown(payload)}", watchers=f"{prefix}/online")]
        if method not in ("NotifyFullStatus", "NotifyStatus"):
            return []  # NotifyEvent: button presses and the like
        if method == "NotifyFullStatus" or prefix not in self.full:
            if prefix not in self.full and len(self.full) >= MAX_REMEMBERED:
                return [Problem(None, "limit", f"{topic}: over {MAX_REMEMBERED} Shellies")]
            self.full[prefix] = {}
        status = self.full[prefix]
        _overlay(status, params)
        moment = utc(params.get("ts"))
        extra = {"device_time": moment} if moment else {}
        facts: list[Fact] = []
        for key, changed in params.items():  # this notification's components, now whole
            kind, _, n = key.partition(":")
            if kind in self.GEN2 and isinstance(status.get(key), dict):
                facts += self._component(prefix, kind, n, status[key], changed, extra)
        return facts

    def _component(self, prefix: str, kind: str, n: str, component: dict[str, Any],
                   changed: Any, extra: dict[str, Any]) -> list[Fact]:
        name = prefix if n in ("", "0") else f"{prefix}-{n}"
        key, quantity = self.GEN2[kind]
        errors = changed.get("errors") if isinstance(changed, dict) else None
        if errors:  # only this notification's: NotifyStatus may never say they are gone
            return [Problem(name, "device", f"{kind}:{n} reports errors {errors}", quantity)]
        found = component.get("battery") if kind == "devicepower" else component
        if not isinstance(found, dict):
            return [Problem(name, "payload", f"{kind}:{n}.battery is {found!r}, not an object")]
        external = component.get("external")
        if kind == "devicepower" and isinstance(external, dict) and external.get("present"):
            return []  # on USB power an H&T says {"V": 0.43, "percent": 0}: no battery reading
        return values(name, found, {key: (quantity, None)}, (f"{prefix}/online",), extra)


def _overlay(status: dict[str, Any], changes: dict[str, Any]) -> None:
    """NotifyStatus on a known status: each changed key replaces the known one, objects key
    by key."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(status.get(key), dict):
            _overlay(status[key], value)
        else:
            status[key] = json.loads(json.dumps(value)) if isinstance(value, dict) else value


class EspHome:
    """esphome.io/components/mqtt.html (``mqtt_component.cpp``, ``mqtt_sensor.cpp``): a
    sensor's state is one number on ``<node>/sensor/<object_id>/state`` (``nan``, or ``None``
    with ``publish_nan_as_none``, when the sensor gave no reading); ``<node>/status`` is
    ``online``/``offline`` (birth and will). The topic says nothing of quantity or unit: the
    object id's last word does (``living_room_temperature``, ``..._humidity``,
    ``..._pressure`` in hPa, ``..._battery``), the temperature in ``temperature_unit``; the
    chip's own (``internal_temperature``) is not one. When two sensors of a node claim one
    quantity, the first keeps it and the node's status says so. Nodes that also announce
    Home Assistant discovery (ESPHome's default) give their units and classes to the
    homeassistant preset."""

    name, keys, base = "esphome", frozenset({"temperature_unit"}), ""
    SUFFIXES = {"temperature": "temperature", "temp": "temperature", "humidity": "humidity",
                "pressure": "pressure", "battery": "battery", "battery_level": "battery"}
    NOT_AMBIENT = frozenset({"internal", "cpu", "chip", "esp", "dew", "dewpoint"})

    def __init__(self, entry: PresetEntry, elsewhere: Elsewhere) -> None:
        self.unit = entry.temperature_unit
        self.claims: dict[tuple[str, str], str] = {}  # (node, quantity) -> object id

    @staticmethod
    def topics(entry: PresetEntry) -> tuple[str, ...]:
        return ("+/sensor/+/state", "+/status")

    def read(self, topic: str, payload: bytes) -> list[Fact]:
        levels = topic.split("/")
        if levels[-1] == "status":
            return availability(topic, text(payload), "online", "offline")
        node, object_id = levels[0], levels[2]
        quantity = self.quantity(object_id)
        if quantity is None:
            return []
        claimed = self.claims.get((node, quantity))
        if claimed is None:
            if len(self.claims) >= MAX_REMEMBERED:
                return [Problem(None, "limit", f"{topic}: over {MAX_REMEMBERED} sensors")]
            claimed = self.claims[(node, quantity)] = object_id
        if claimed != object_id:
            return [Problem(node, "ambiguous", f"{object_id} looks like {quantity} too; "
                                               f"{claimed} is the node's", lasting=topic)]
        convert = (lambda v: celsius(v, self.unit)) if quantity == "temperature" else None
        return values(node, {object_id: text(payload)}, {object_id: (quantity, convert)},
                      (f"{node}/status",))

    def quantity(self, object_id: str) -> str | None:
        if self.NOT_AMBIENT & set(object_id.split("_")):
            return None
        for suffix, quantity in self.SUFFIXES.items():
            if object_id == suffix or object_id.endswith(f"_{suffix}"):
                return quantity
        return None


PRESETS: dict[str, type[Preset]] = {preset.name: preset for preset in (
    Zigbee2Mqtt, Tasmota, Shelly, EspHome, HomeAssistant)}


# -- the [[mqtt.map]] entry (PresetEntry, in mqtt_facts) ---------------------------------

def parse_entry(v: Validator, t: dict[str, Any], at: str, qos: int) -> PresetEntry:
    """A ``[[mqtt.map]]`` entry with ``preset``: its keys checked, its filters worked out."""
    name = v.get(t, at, "preset", str, "")
    preset = PRESETS.get(name)
    if preset is None:
        raise ConfigError(v.source, f"{at}.preset",
                          f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    v.keys(t, at, {"preset", "retain", "qos", "device_prefix"} | preset.keys)
    base = v.get(t, at, "base", str, preset.base)
    if "base" in t and (not _is_filter(base) or "+" in base or "#" in base):
        raise ConfigError(v.source, f"{at}.base", f"expected a topic like {preset.base!r}, "
                                                  f"not {base!r}")
    follow = tuple(v.strings(t, at, "follow")) or (("#",) if "follow" in preset.keys else ())
    for i, mqtt_filter in enumerate(follow):
        if not _is_filter(mqtt_filter):
            raise ConfigError(v.source, f"{at}.follow[{i}]",
                              f"invalid MQTT filter {mqtt_filter!r}")
    prefix = v.get(t, at, "device_prefix", str, "")
    if prefix and not SAFE.fullmatch(prefix):
        raise ConfigError(v.source, f"{at}.device_prefix",
                          f"letters, digits, _ and - only, not {prefix!r}")
    unit = v.get(t, at, "temperature_unit", str, "°C")
    if unit not in ("°C", "°F", "C", "F"):
        raise ConfigError(v.source, f"{at}.temperature_unit", f"°C or °F, not {unit!r}")
    entry = PresetEntry(name, base, follow, prefix, unit, v.get(t, at, "retain", bool, True),
                        qos)
    return dataclasses.replace(entry, taken=preset.topics(entry))


def _is_filter(text: str) -> bool:
    levels = text.split("/")
    return bool(text) and "#" not in levels[:-1] and all(
        level in ("+", "#") or ("+" not in level and "#" not in level) for level in levels)


# -- facts to publications ---------------------------------------------------------------

@dataclass
class PresetStats:
    messages: int = 0     # MQTT messages a preset's entry took
    readings: int = 0     # readings published
    skipped: int = 0      # messages that were no reading (a light's state, NotifyEvent, ...)
    problems: dict[str, int] = field(default_factory=dict)  # bad input and refusals, by kind


@dataclass
class _Device:
    id: str
    owner: tuple[str, str, str]        # (preset, base, name): what it came from
    status: DeviceStatus
    availability: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None        # the last bad input; a good reading clears it
    notes: dict[str, str] = field(default_factory=dict)  # discovery entity -> lasting problem


class PresetInput:
    """The presets' facts as readings and statuses, through the bridge's RouterLink.
    ``elsewhere(entry, topic)``: whether an entry other than ``entry`` takes ``topic``."""

    def __init__(self, link: RouterLink, entries: Iterable[PresetEntry],
                 elsewhere: Callable[[PresetEntry, str], bool]) -> None:
        self.link = link
        self.stats = PresetStats()
        self.handlers: dict[int, Preset] = {
            id(entry): PRESETS[entry.preset](entry, lambda t, e=entry: elsewhere(e, t))
            for entry in entries}
        self.devices: dict[str, _Device] = {}
        self.watching: dict[str, list[_Device]] = {}  # availability topic -> its devices
        self.offline: dict[str, str | None] = {}      # availability topic -> why offline
        self.logged: set[tuple[str, str]] = set()

    def takes(self, entry: PresetEntry, topic: str) -> bool:
        handler = self.handlers[id(entry)]
        return handler.takes(topic) if isinstance(handler, HomeAssistant) else \
            entry.claims(topic)

    def take(self, entry: PresetEntry, topic: str, payload: bytes, retained: bool) -> None:
        """One MQTT message of ``entry``'s: its facts applied, each device's status once."""
        self.stats.messages += 1
        facts = self.handlers[id(entry)].read(topic, payload)
        if not facts:
            self.stats.skipped += 1
            return
        touched: dict[str, _Device] = {}
        for fact in facts:  # devices first: a problem of this message finds its device
            if isinstance(fact, Reading | Announced):
                device = self._device(entry, fact.name, fact.availability)
                if device is not None:
                    touched[device.id] = device
                    if isinstance(fact, Reading):
                        device.problem = None
                    else:
                        device.notes.pop(fact.entity, None)
        for fact in facts:
            if isinstance(fact, Problem):
                touched.update((d.id, d) for d in self._problem(entry, topic, fact))
            elif isinstance(fact, Availability):
                touched.update((d.id, d) for d in self._availability(fact))
        readings: dict[str, tuple[_Device, dict[str, Any]]] = {}
        for fact in facts:  # one publication per device and message
            device = self._find(entry, fact.name) if isinstance(fact, Reading) else None
            if device is not None:  # (None: refused, a collision or over the limit)
                readings.setdefault(device.id, (device, {}))[1].update(fact.values)
        for device, found in readings.values():
            self._reading(entry, device, found, retained)
        for device in touched.values():
            self._refresh(device)

    # -- devices ------------------------------------------------------------------------

    def _device(self, entry: PresetEntry, name: str,
                watch: tuple[str, ...]) -> _Device | None:
        owner = (entry.preset, entry.base, name)
        wanted = device_id(name, entry.device_prefix)
        device = self.devices.get(wanted)
        if device is not None and device.owner != owner:
            self._count("collision", wanted, f"{entry.preset} device {name!r} would be "
                        f"{wanted!r}, which is {device.owner[0]} device {device.owner[2]!r}; "
                        f"not bridged (rename one, or give an entry a device_prefix)")
            return None
        if device is None:
            if len(self.devices) >= MAX_DEVICES:
                self._count("limit", "", f"over {MAX_DEVICES} devices: {wanted} not bridged")
                return None
            device = _Device(wanted, owner, DeviceStatus(wanted, self.link))
            self.devices[wanted] = device
        for topic in watch:
            if topic not in device.availability and len(self.watching) < MAX_REMEMBERED:
                device.availability += (topic,)
                self.watching.setdefault(topic, []).append(device)
        return device

    def _find(self, entry: PresetEntry, name: str | None) -> _Device | None:
        device = self.devices.get(device_id(name, entry.device_prefix)) if name else None
        return device if device and device.owner == (entry.preset, entry.base, name) else None

    # -- facts --------------------------------------------------------------------------

    def _problem(self, entry: PresetEntry, topic: str, problem: Problem) -> list[_Device]:
        self._count(problem.kind, problem.name or topic, problem.reason)
        devices = (self.watching.get(problem.watchers, []) if problem.watchers else
                   [device for device in [self._find(entry, problem.name)] if device])
        for device in devices:
            if problem.lasting:
                device.notes[problem.lasting] = problem.reason
            else:
                device.problem = problem.reason
            device.values.pop(problem.quantity or "", None)
        return devices

    def _availability(self, fact: Availability) -> list[_Device]:
        if fact.topic not in self.offline and len(self.offline) >= MAX_REMEMBERED:
            return []
        self.offline[fact.topic] = None if fact.online else \
            f"offline: {fact.topic} says {fact.said!r}"
        return self.watching.get(fact.topic, [])

    def _reading(self, entry: PresetEntry, device: _Device, found: dict[str, Any],
                 retained: bool) -> None:
        device.values.update(found)
        self.link.publish(reading_topic(device.id), dict(device.values),
                          retain=retained or entry.retain)
        self.stats.readings += 1

    def _refresh(self, device: _Device) -> None:
        """Offline first (its project says so), then its last bad input, else ok; a lasting
        discovery problem is the reason of an ok device, the error of one with no value."""
        offline = next((self.offline[t] for t in device.availability if self.offline.get(t)),
                       None)
        note = next(iter(device.notes.values()), None)
        if offline or device.problem:
            device.status.set("error", offline or device.problem)
        elif device.values:
            device.status.set("ok", note)
        elif note:
            device.status.set("error", note)

    def _count(self, kind: str, subject: str, reason: str) -> None:
        """Counted always; logged once per kind and subject (a device, else the topic)."""
        problems = self.stats.problems
        problems[kind] = problems.get(kind, 0) + 1
        key = (kind, subject)
        if key in self.logged:
            return
        if len(self.logged) >= MAX_REMEMBERED:  # then the 1st, 10th, 100th... of each kind
            if problems[kind] not in (1, 10, 100) and problems[kind] % 1000:
                return
        else:
            self.logged.add(key)
        log.log(logging.INFO if kind == "covered" else logging.WARNING,
                "preset: %s (%s; %d so far)", reason, kind, problems[kind])
