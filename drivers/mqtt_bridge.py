"""The MQTT bridge: MQTT topics into WAMP, and chosen WAMP topics out to MQTT.

```toml
[mqtt]
broker = "127.0.0.1:1883"
client_id = "cairn-bridge"         # default cairn-bridge-<hostname>
username = "cairn"                 # optional; password / password_file / password_env
keepalive = 60
backlog = 1000                     # messages kept for MQTT while the broker is away

[[mqtt.map]]                       # MQTT -> WAMP; the first matching entry wins
filter = "tele/+/SENSOR"           # {1}, {2}, ... are the wildcard levels, {0} the whole topic
topic = "sensor.{1}"
fields = { temperature = "AM2301.Temperature", humidity = "AM2301.Humidity" }

[[mqtt.map]]                       # a project's devices as sensors (drivers.mqtt_presets)
preset = "zigbee2mqtt"             # tasmota, shelly, esphome, homeassistant

[[mqtt.forward]]                   # WAMP -> MQTT, current values first (get_retained)
topic = "sensor."
match = "prefix"                   # {1}, {2}, ... are the components after the prefix
mqtt = "cairn/{1}"
```

Inbound, a JSON object becomes the event's kwargs; an MQTT retained message becomes a WAMP
retained publication, and so does any other unless the entry says ``retain = false``. Every
publication goes through :class:`drivers.runtime.RouterLink` (bounded backlog, reconnect).

Loop guard: what the bridge publishes to MQTT carries the MQTT 5 user property
``cairn-bridge = <client_id>`` and its subscriptions use No Local, so the bridge never takes
its own messages back in (not even as retained messages after a restart); and it does not
forward to an MQTT topic a value it has just bridged in from that same topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import re
import socket
import string
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
from autobahn.wamp import types
from autobahn.wamp.exception import ApplicationError, TransportLost
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from cairn.base.config_tools import ConfigError, Validator, secret
from cairn.drivers.config import DriverConfig, parse_driver
from cairn.drivers.mqtt_presets import PresetEntry, PresetInput, parse_entry
from cairn.drivers.runtime import DeviceStatus, RouterLink, open_session

log = logging.getLogger("cairn.mqtt")

ORIGIN = "cairn-bridge"       # MQTT 5 user property naming the bridge that published
_DETAILS = "cairn_details"    # where autobahn hands us event details (not a likely kwarg)
_RESERVED = ("topic", "options")  # kwargs autobahn's publish() cannot carry: renamed to x_
_NOT_URI = re.compile(r"[^0-9A-Za-z_-]+")


# -- configuration -----------------------------------------------------------------------

@dataclass(frozen=True)
class MapRule:
    """MQTT -> WAMP: ``filter`` (MQTT topic filter) to ``topic`` (WAMP URI template)."""

    filter: str
    topic: str
    retain: bool = True
    qos: int = 1
    fields: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (kwarg, dotted path split)
    preset: PresetEntry | None = None  # a preset's entry: it maps, not filter/topic/fields

    @property
    def filters(self) -> tuple[str, ...]:
        return self.preset.filters if self.preset else (self.filter,)

    def takes(self, mqtt_topic: str) -> bool:
        """By its filters (a preset's own, not what Home Assistant discovery learns)."""
        return self.preset.claims(mqtt_topic) if self.preset else \
            self.wamp_topic(mqtt_topic) is not None

    def wamp_topic(self, mqtt_topic: str) -> str | None:
        """The WAMP topic for ``mqtt_topic``, or None when the filter does not match."""
        levels, captures = mqtt_topic.split("/"), [_components(mqtt_topic.split("/"))]
        for i, f in enumerate(self.filter.split("/")):
            if f == "#":
                captures.append(_components(levels[i:]))
                return self.topic.format(*captures)
            if i >= len(levels) or f not in ("+", levels[i]):
                return None
            if f == "+":
                captures.append(_components(levels[i:i + 1]))
        return self.topic.format(*captures) if len(levels) == i + 1 else None

    def select(self, value: Any) -> dict[str, Any] | None:
        """The configured fields of a JSON object (those present), or None if none is."""
        if not isinstance(value, dict):
            return None
        out = {}
        for name, path in self.fields:
            found = value
            for key in path:
                if not isinstance(found, dict) or key not in found:
                    break
                found = found[key]
            else:
                out[name] = found
        return out or None


@dataclass(frozen=True)
class ForwardRule:
    """WAMP -> MQTT: events on ``topic`` (exact or prefix) to the ``mqtt`` topic template."""

    topic: str
    mqtt: str
    match: str = "exact"
    retain: bool = True
    qos: int = 1

    def mqtt_topic(self, wamp_topic: str) -> str:
        rest = wamp_topic[len(self.topic):].strip(".") if self.match == "prefix" else ""
        return self.mqtt.format(wamp_topic.replace(".", "/"), *(rest.split(".") if rest else ()))


@dataclass(frozen=True)
class MqttConfig:
    host: str = "127.0.0.1"
    port: int = 1883
    client_id: str = field(default_factory=lambda: f"cairn-bridge-{socket.gethostname()}")
    username: str | None = None
    password: str | None = None
    keepalive: int = 60
    backlog: int = 1000
    maps: tuple[MapRule, ...] = ()
    forwards: tuple[ForwardRule, ...] = ()


def parse_mqtt(data: dict[str, Any], source: str) -> MqttConfig:
    v, at = Validator(source), "mqtt"
    if "mqtt" not in data:
        raise ConfigError(source, at, "missing: the bridge needs an [mqtt] table")
    t = v.table(data, at)
    v.keys(t, at, {"broker", "client_id", "username", "password", "password_file",
                   "password_env", "keepalive", "backlog", "map", "forward"})
    text = v.get(t, at, "broker", str, "127.0.0.1:1883")
    try:
        broker = v.endpoint(text, f"{at}.broker", tcp_only=True)
    except ConfigError:
        broker = None
    if broker is None or broker.tls:
        raise ConfigError(source, f"{at}.broker", f"expected 'host:port', not {text!r} "
                                                  f"(TLS to the broker is not supported yet)")
    maps = tuple(_map(v, m, f"{at}.map[{i}]") for i, m in enumerate(v.tables(t, "map", at)))
    forwards = tuple(_forward(v, f, f"{at}.forward[{i}]")
                     for i, f in enumerate(v.tables(t, "forward", at)))
    if not maps and not forwards:
        raise ConfigError(source, at, "nothing to bridge: add [[mqtt.map]] or [[mqtt.forward]]")
    client_id = v.get(t, at, "client_id", str, None) or MqttConfig().client_id
    return MqttConfig(host=broker.host, port=broker.port, client_id=client_id,
                      username=v.get(t, at, "username", str, None), password=_password(v, t, at),
                      keepalive=v.positive(t, at, "keepalive", 60),
                      backlog=v.positive(t, at, "backlog", 1000), maps=maps, forwards=forwards)


def _map(v: Validator, t: dict[str, Any], at: str) -> MapRule:
    if "preset" in t:  # its keys and filters: drivers.mqtt_presets
        entry = parse_entry(v, t, at, _qos(v, t, at))
        return MapRule(entry.filters[0], "sensor", entry.retain, entry.qos, preset=entry)
    v.keys(t, at, {"filter", "topic", "retain", "qos", "fields"})
    mqtt_filter, topic = _required(v, t, at, "filter"), _required(v, t, at, "topic")
    levels = mqtt_filter.split("/")
    for i, level in enumerate(levels):
        if ("+" in level or "#" in level) and level not in ("+", "#") or \
                level == "#" and i != len(levels) - 1:
            raise ConfigError(v.source, f"{at}.filter",
                              f"invalid MQTT filter {mqtt_filter!r}: + and # stand for whole "
                              f"levels, # only last")
    wildcards = levels.count("+") + levels.count("#")
    _template(v, topic, f"{at}.topic", wildcards, wamp=True,
              why=f"the filter has {wildcards} wildcard level(s)")
    if topic.startswith("wamp."):
        raise ConfigError(v.source, f"{at}.topic", "topics under 'wamp.' are the router's")
    fields = []
    for name, path in v.get(t, at, "fields", dict, {}).items():
        if not isinstance(path, str) or not all(path.split(".")):
            raise ConfigError(v.source, f"{at}.fields.{name}",
                              f"expected a dotted path like \"AM2301.Temperature\", got {path!r}")
        fields.append((name, tuple(path.split("."))))
    return MapRule(mqtt_filter, topic, v.get(t, at, "retain", bool, True), _qos(v, t, at),
                   tuple(fields))


def _forward(v: Validator, t: dict[str, Any], at: str) -> ForwardRule:
    v.keys(t, at, {"topic", "match", "mqtt", "retain", "qos"})
    topic, mqtt_topic = _required(v, t, at, "topic"), _required(v, t, at, "mqtt")
    match = v.get(t, at, "match", str, "exact")
    if match not in ("exact", "prefix"):
        raise ConfigError(v.source, f"{at}.match", f"must be exact or prefix, not {match!r}")
    v.uri(topic, f"{at}.topic", match)
    _template(v, mqtt_topic, f"{at}.mqtt", None if match == "prefix" else 0, wamp=False,
              why="an exact match has only {0}, the whole topic")
    return ForwardRule(topic, mqtt_topic, match, v.get(t, at, "retain", bool, True),
                       _qos(v, t, at))


def _required(v: Validator, t: dict[str, Any], at: str, key: str) -> str:
    value = v.get(t, at, key, str, None)
    if not value:
        raise ConfigError(v.source, f"{at}.{key}", "missing")
    return value


def _qos(v: Validator, t: dict[str, Any], at: str) -> int:
    qos = v.get(t, at, "qos", int, 1)
    if qos not in (0, 1, 2):
        raise ConfigError(v.source, f"{at}.qos", f"must be 0, 1 or 2, not {qos}")
    return qos


def _template(v: Validator, template: str, at: str, wildcards: int | None, wamp: bool,
              why: str) -> None:
    """Placeholders are {0} (the whole topic) and {1}..{wildcards}; the rest must be a valid
    WAMP URI (``wamp``) or MQTT topic."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(v.source, at, f"bad template {template!r}: {e}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isdigit() or spec or conversion:
            raise ConfigError(v.source, at, f"unknown placeholder {{{name}}} in {template!r} "
                                            f"(use {{0}}, {{1}}, ...)")
        if wildcards is not None and int(name) > wildcards:
            raise ConfigError(v.source, at, f"nothing fills {{{name}}} in {template!r}: {why}")
    sample = "".join(text + ("x" if name is not None else "") for text, name, _, _ in parsed)
    if wamp:
        try:
            v.uri(sample, at)
        except ConfigError:
            raise ConfigError(v.source, at, f"invalid WAMP URI template {template!r}") from None
    elif not sample or "+" in sample or "#" in sample:
        raise ConfigError(v.source, at, f"invalid MQTT topic {template!r} (no wildcards)")


def _password(v: Validator, t: dict[str, Any], at: str) -> str | None:
    """password / password_file / password_env, read the way ``secret`` is."""
    renamed = {k.replace("password", "secret"): t[k]
               for k in ("password", "password_file", "password_env") if k in t}
    try:
        return secret(v, renamed, at)
    except ConfigError as e:
        raise ConfigError(e.source, e.key.replace(f"{at}.secret", f"{at}.password"),
                          e.problem.replace("secret", "password")) from None


def load(data: dict[str, Any], source: str) -> tuple[DriverConfig, MqttConfig]:
    return parse_driver(data, source), parse_mqtt(data, source)


def _components(levels: list[str]) -> str:
    """MQTT topic levels as dot-separated WAMP URI components."""
    return ".".join(_NOT_URI.sub("_", level) or "_" for level in levels)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- the bridge --------------------------------------------------------------------------

@dataclass
class BridgeStats:
    received: int = 0     # MQTT messages in
    bridged: int = 0      # ... handed to the RouterLink
    invalid: int = 0      # ... skipped: not JSON
    skipped: int = 0      # ... skipped: no configured field, or no valid topic
    echoes: int = 0       # messages not bridged back to where they came from (loop guard)
    duplicates: int = 0   # second copies of a message that overlapping filters both matched
    forwarded: int = 0    # WAMP events published to MQTT
    dropped: int = 0      # ... lost because the MQTT backlog was full
    mqtt_connects: int = 0
    wamp_connects: int = 0


@dataclass
class _Outgoing:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class MqttBridge:
    def __init__(self, driver: DriverConfig, config: MqttConfig) -> None:
        self.driver, self.config = driver, config
        self.stats = BridgeStats()
        self.link = RouterLink(driver.router, driver.realm, authid=driver.authid,
                               secret=driver.secret, backlog=driver.backlog,
                               backlog_total=driver.backlog_total)
        self.status = DeviceStatus(_components([config.client_id]), self.link)
        self.client = aiomqtt.Client(
            config.host, config.port, identifier=config.client_id, username=config.username,
            password=config.password, keepalive=config.keepalive,
            protocol=aiomqtt.ProtocolVersion.V5)
        self.origin = Properties(PacketTypes.PUBLISH)
        self.origin.UserProperty = [(ORIGIN, config.client_id)]
        self.outbox: deque[_Outgoing] = deque()
        self._outbox_ready = asyncio.Event()
        self._sent: dict[str, tuple[bytes, int]] = {}  # retained topic -> what we last sent
        self._came_in: dict[str, deque[tuple[str, Any]]] = {}  # wamp topic -> (mqtt, value)
        self.presets = PresetInput(self.link, [r.preset for r in config.maps if r.preset],
                                   self._taken_elsewhere)
        # each filter once, numbered (its MQTT 5 subscription identifier), at the highest QoS
        # an entry asks of it
        qos: dict[str, int] = {}
        for rule in config.maps:
            for mqtt_filter in rule.filters:
                qos[mqtt_filter] = max(qos.get(mqtt_filter, 0), rule.qos)
        self.subscriptions = list(qos.items())

    async def run(self) -> None:
        """Bridge until cancelled; each side reconnects on its own."""
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self.link.run())
                tasks.create_task(self._mqtt())
                if self.config.forwards:
                    tasks.create_task(self._wamp())
        finally:
            await self.link.close()
            log.info("stopped: %s %s %s", self.stats, self.presets.stats, self.link.stats)

    # -- MQTT side -----------------------------------------------------------------------

    async def _mqtt(self) -> None:
        where = f"mqtt://{self.config.host}:{self.config.port}"
        async for _ in _backoff():
            try:
                async with self.client as client:
                    for number, (mqtt_filter, qos) in enumerate(self.subscriptions, 1):
                        numbered = Properties(PacketTypes.SUBSCRIBE)
                        numbered.SubscriptionIdentifier = number
                        await client.subscribe(mqtt_filter, options=SubscribeOptions(
                            qos=qos, noLocal=True, retainAsPublished=True),
                            properties=numbered)
                    log.info("connected to %s as %s", where, self.config.client_id)
                    self.stats.mqtt_connects += 1
                    self.status.set("ok")
                    async with asyncio.TaskGroup() as tasks:
                        tasks.create_task(self._send(client))
                        async for message in client.messages:
                            self.bridge_in(message)
            except* aiomqtt.MqttError as group:
                error = f"MQTT broker {where}: {group.exceptions[0]}"
                if self.status.reason != error:
                    log.warning("%s; retrying", error)
                self.status.set("error", error)

    def bridge_in(self, message: aiomqtt.Message) -> None:
        """One MQTT message to the RouterLink, if a map entry takes it."""
        self.stats.received += 1
        mqtt_topic = message.topic.value
        if (ORIGIN, self.config.client_id) in getattr(message.properties, "UserProperty", ()):
            self.stats.echoes += 1
            return
        if self._second_copy(message):
            self.stats.duplicates += 1
            return
        for rule in self.config.maps:
            if rule.preset is not None:  # -- a preset's entry: drivers.mqtt_presets
                if self.presets.takes(rule.preset, mqtt_topic):
                    self.presets.take(rule.preset, mqtt_topic, message.payload, message.retain)
                    return
                continue
            wamp_topic = rule.wamp_topic(mqtt_topic)
            if wamp_topic is not None:
                break
        else:
            return
        try:
            value = json.loads(message.payload, parse_constant=_reject_constant)
        except ValueError as e:
            self.stats.invalid += 1
            _log_count(self.stats.invalid, "skipping %s: invalid JSON (%s); %d so far",
                       mqtt_topic, e, self.stats.invalid)
            return
        if rule.fields:
            value = rule.select(value)
        if value is None or "" in wamp_topic.split("."):
            self.stats.skipped += 1
            _log_count(self.stats.skipped, "skipping %s: %s; %d so far", mqtt_topic,
                       "no configured field" if value is None else "no WAMP topic",
                       self.stats.skipped)
            return
        # Until RouterLink publishes args too, a JSON value that is not an object travels
        # as {"value": ...}.
        kwargs = ({f"{k}_" if k in _RESERVED else k: x for k, x in value.items()}
                  if isinstance(value, dict) else {"value": value})
        self.link.publish(wamp_topic, kwargs, retain=message.retain or rule.retain,
                          device=mqtt_topic)  # a backlog of its own: drivers.backlog
        self.stats.bridged += 1
        if self.config.forwards:
            self._came_in.setdefault(wamp_topic, deque(maxlen=16)).append((mqtt_topic, kwargs))
            if len(self._came_in) > 10_000:
                del self._came_in[next(iter(self._came_in))]

    def _second_copy(self, message: aiomqtt.Message) -> bool:
        """Mosquitto sends a message once per subscription it matches (a preset's ``#`` and
        another entry's filter): only the copy of the first matching filter is taken."""
        numbers = getattr(message.properties, "SubscriptionIdentifier", None)
        if not numbers or len(self.subscriptions) == 1:
            return False
        first = next((number for number, (mqtt_filter, _) in enumerate(self.subscriptions, 1)
                      if message.topic.matches(mqtt_filter)), None)
        return first is not None and first not in numbers

    def _taken_elsewhere(self, entry: PresetEntry, mqtt_topic: str) -> bool:
        return any(rule.takes(mqtt_topic) for rule in self.config.maps if rule.preset is not entry)

    async def _send(self, client: aiomqtt.Client) -> None:
        # A restarted broker may have lost what we retained there: say it again, then the
        # newer messages that waited.
        for topic, (payload, qos) in list(self._sent.items()):
            await client.publish(topic, payload, qos, retain=True, properties=self.origin)
        while True:
            if not self.outbox:
                self._outbox_ready.clear()
                await self._outbox_ready.wait()
                continue
            out = self.outbox[0]
            await client.publish(out.topic, out.payload, out.qos, out.retain,
                                 properties=self.origin)
            if out.retain:
                self._sent[out.topic] = (out.payload, out.qos)
            if self.outbox and self.outbox[0] is out:
                self.outbox.popleft()
                self.stats.forwarded += 1

    # -- WAMP side -----------------------------------------------------------------------

    async def _wamp(self) -> None:
        d, last_error = self.driver, None
        async for _ in _backoff():
            try:
                session = await open_session(d.router, d.realm, d.authid, d.secret)
            except (TimeoutError, OSError, ConnectionError, ValueError) as e:
                error = f"forwarding: cannot reach the router at {d.router}: {e}"
                if error != last_error:
                    log.warning("%s", error)
                last_error = error
                continue
            last_error = None
            try:
                for rule in self.config.forwards:
                    await session.subscribe(
                        functools.partial(self._event, rule), rule.topic,
                        options=types.SubscribeOptions(match=rule.match, get_retained=True,
                                                       details_arg=_DETAILS))
                self.stats.wamp_connects += 1
                log.info("forwarding %d WAMP subscription(s) to MQTT",
                         len(self.config.forwards))
                await session.gone
                log.warning("forwarding: lost the router; reconnecting")
            except ApplicationError as e:
                log.error("forwarding: the router refused a subscription: %s %s; retrying",
                          e.error, e.args[0] if e.args else "")
            except TransportLost:
                log.warning("forwarding: lost the router; reconnecting")
            finally:
                if session.is_attached():
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(session.leave(), 2)

    def _event(self, rule: ForwardRule, /, *args: Any, **kwargs: Any) -> None:
        details = kwargs.pop(_DETAILS)
        wamp_topic = details.topic or rule.topic
        value = kwargs or (args[0] if len(args) == 1 else list(args) if args else None)
        try:
            mqtt_topic = rule.mqtt_topic(wamp_topic)
            payload = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (IndexError, TypeError, ValueError) as e:
            self.stats.skipped += 1
            _log_count(self.stats.skipped, "not forwarding %s: %s; %d so far", wamp_topic, e,
                       self.stats.skipped)
            return
        if not mqtt_topic or "+" in mqtt_topic or "#" in mqtt_topic:
            self.stats.skipped += 1
            log.warning("not forwarding %s: no valid MQTT topic (%r)", wamp_topic, mqtt_topic)
            return
        if (mqtt_topic, value) in self._came_in.get(wamp_topic, ()):
            self.stats.echoes += 1
            return
        if len(self.outbox) >= self.config.backlog:
            self.outbox.popleft()
            self.stats.dropped += 1
            _log_count(self.stats.dropped, "MQTT backlog full (%d): %d oldest dropped so far",
                       self.config.backlog, self.stats.dropped)
        self.outbox.append(_Outgoing(mqtt_topic, payload, rule.qos, rule.retain))
        self._outbox_ready.set()


async def _backoff(first: float = 0.2, limit: float = 10.0):
    """Yield at once, then after growing, jittered pauses (reset by a long-lived try)."""
    delay = first
    while True:
        started = asyncio.get_running_loop().time()
        yield
        if asyncio.get_running_loop().time() - started > limit:
            delay = first
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, limit)


def _log_count(count: int, msg: str, *args: Any) -> None:
    """Warn for the 1st, 10th, 100th and every 1000th occurrence; debug otherwise."""
    level = logging.WARNING if count in (1, 10, 100) or count % 1000 == 0 else logging.DEBUG
    log.log(level, msg, *args)
