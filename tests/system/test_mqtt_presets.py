"""The MQTT presets (drivers.mqtt_presets) against a real Mosquitto and a real router process,
fed the payloads the projects document (each cited where it is used). Their plain values
(device ids, units, value templates) are tests/pure/test_mqtt_facts.py.

One broker and one router serve the module; every test uses its own device names and MQTT
client id, because both keep retained values from test to test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from autobahn.wamp.types import SubscribeOptions

from cairn.drivers import mqtt_cli
from cairn.drivers.mqtt_facts import device_id
from cairn.drivers.runtime import open_session
from harness.process import RouterProcess
from harness.waiting import until
from tests.system import test_mqtt_bridge
from tests.system.test_mqtt_bridge import GOOD, Mosquitto, mqtt_client, running_bridge

# its module-scoped fixtures: one Mosquitto and one router process for this module too
broker, router = test_mqtt_bridge.broker, test_mqtt_bridge.router


class Device:
    """What the router says of one device: its readings and statuses, as they arrive."""

    def __init__(self, device: str) -> None:
        self.id = device
        self.readings: asyncio.Queue = asyncio.Queue()
        self.statuses: asyncio.Queue = asyncio.Queue()
        self.session: Any = None

    async def reading(self, timeout: float = 5) -> dict[str, Any]:
        return await asyncio.wait_for(self.readings.get(), timeout)

    async def status(self, timeout: float = 5) -> tuple[str, str | None]:
        said = await asyncio.wait_for(self.statuses.get(), timeout)
        return said["status"], said["reason"]

    async def status_becomes(self, status: str, reason: str | None,
                             timeout: float = 5) -> None:
        """The device's status comes to (status, reason); a status still waiting to be sent
        is replaced by a newer one (RouterLink), so those in between may never arrive."""
        seen = []
        async with asyncio.timeout(timeout):
            while not seen or seen[-1] != (status, reason):
                seen.append(await self.status())

    async def no_reading(self, seconds: float = 0.3) -> None:
        with pytest.raises(TimeoutError):
            await self.reading(seconds)


@contextlib.asynccontextmanager
async def devices(router: RouterProcess, *ids: str) -> AsyncIterator[list[Device]]:
    """Each device's ``sensor.<id>`` and ``gateway.device.<id>.status``, from now on."""
    session = await open_session(router.ws_url, "realm1")
    watched = [Device(device) for device in ids]
    for device in watched:
        for topic, queue in ((f"sensor.{device.id}", device.readings),
                             (f"gateway.device.{device.id}.status", device.statuses)):
            await session.subscribe(lambda *a, q=queue, **kw: q.put_nowait(kw), topic)
    try:
        yield watched
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.leave(), 2)


async def retained(router: RouterProcess, topic: str) -> dict[str, Any]:
    """What a subscriber that comes now gets first: the topic's retained event."""
    session = await open_session(router.ws_url, "realm1")
    got: asyncio.Queue = asyncio.Queue()
    await session.subscribe(lambda **kw: got.put_nowait(kw), topic,
                            options=SubscribeOptions(get_retained=True))
    try:
        return await asyncio.wait_for(got.get(), 5)
    finally:
        await session.leave()


async def publish(broker: Mosquitto, *messages: tuple[str, Any], retain: bool = False) -> None:
    """Each (topic, payload) in order; a payload that is not bytes is sent as JSON."""
    async with mqtt_client(broker) as mqtt:
        for topic, payload in messages:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            await mqtt.publish(topic, data, qos=1, retain=retain)


def preset(name: str, extra: str = "") -> str:
    return f'[[mqtt.map]]\npreset = "{name}"\n{extra}\n'


# -- configuration -----------------------------------------------------------------------

@pytest.mark.parametrize(("body", "key", "problem"), [
    (preset("zwave"), "mqtt.map[0].preset", "unknown preset 'zwave' (known: zigbee2mqtt, "
                                            "tasmota, shelly, esphome, homeassistant)"),
    (preset("esphome", 'base = "x"'), "mqtt.map[0].base", "unknown key"),
    (preset("zigbee2mqtt", 'follow = ["#"]'), "mqtt.map[0].follow", "unknown key"),
    (preset("zigbee2mqtt", 'filter = "z/#"'), "mqtt.map[0].filter", "unknown key"),
    (preset("zigbee2mqtt", 'base = "z/+"'), "mqtt.map[0].base", "expected a topic"),
    (preset("homeassistant", 'follow = ["a/#/b"]'), "mqtt.map[0].follow[0]", "invalid MQTT"),
    (preset("tasmota", 'device_prefix = "a.b"'), "mqtt.map[0].device_prefix", "letters"),
    (preset("shelly", 'temperature_unit = "K"'), "mqtt.map[0].temperature_unit", "°C or °F"),
    (preset("shelly", "qos = 3"), "mqtt.map[0].qos", "0, 1 or 2"),
])
def test_bad_preset_entries_exit_2_naming_file_and_key(tmp_path, capsys, body, key, problem):
    path = tmp_path / "bridge.toml"
    path.write_text(GOOD + body)
    assert mqtt_cli.main(argparse.Namespace(config=str(path), log_level="info")) == 2
    err = capsys.readouterr().err
    assert f"{path}: {key}: " in err and problem in err, err


async def test_each_preset_subscribes_to_its_projects_topics(router, broker):
    body = (preset("zigbee2mqtt", 'base = "z2m"') + preset("tasmota") + preset("shelly")
            + preset("esphome") + preset("homeassistant", 'follow = ["office/#"]'))
    async with running_bridge(router, broker, "filters", body) as bridge:
        assert [rule.filters for rule in bridge.config.maps] == [
            ("z2m/#",), ("tele/+/SENSOR", "tele/+/LWT"),
            ("shellies/+/sensor/+", "shellies/+/ext_temperature/+", "shellies/+/ext_humidity/+",
             "shellies/+/online", "+/events/rpc", "+/online"),
            ("+/sensor/+/state", "+/status"),
            ("homeassistant/+/+/config", "homeassistant/+/+/+/config", "office/#")]


async def test_overlapping_filters_take_each_message_once(router, broker):
    # Mosquitto sends a message once per matching subscription: zigbee2mqtt/# and # here
    body = preset("zigbee2mqtt") + discovery("ha-ovl")
    async with running_bridge(router, broker, "overlap", body) as bridge, \
            devices(router, "overlap-1") as [device]:
        await publish(broker, ("zigbee2mqtt/overlap-1", {"temperature": 20.0}))
        assert await device.reading() == {"temperature": 20.0}
        await device.no_reading()
        assert bridge.stats.duplicates == 1 and bridge.presets.stats.messages == 1


async def test_overlapping_plain_filters_bridge_each_message_once(router, broker):
    body = ('[[mqtt.map]]\nfilter = "ovl/#"\ntopic = "sensor.ovl.{1}"\n'
            '[[mqtt.map]]\nfilter = "ovl/+"\ntopic = "sensor.other.{1}"\n')
    async with running_bridge(router, broker, "overlap-plain", body) as bridge, \
            devices(router, "ovl.a") as [ovl_a]:  # sensor.ovl.a
        await publish(broker, ("ovl/a", {"t": 1}))
        assert await ovl_a.reading() == {"t": 1}
        await ovl_a.no_reading()
        assert bridge.stats.duplicates == 1 and bridge.stats.bridged == 1


# -- device ids --------------------------------------------------------------------------

async def test_two_devices_that_would_share_an_id_are_not_merged(router, broker, caplog):
    body = preset("zigbee2mqtt") + preset("esphome")
    async with running_bridge(router, broker, "collide", body) as bridge, \
            devices(router, "collide-garden") as [garden]:
        await publish(broker, ("zigbee2mqtt/collide-garden", {"temperature": 20.5}),
                      ("collide-garden/sensor/soil_temperature/state", b"11.0"))
        assert await garden.reading() == {"temperature": 20.5}
        await until(lambda: bridge.presets.stats.problems.get("collision") == 1)
        await garden.no_reading()
    assert "esphome device 'collide-garden' would be 'collide-garden', which is zigbee2mqtt " \
           "device 'collide-garden'" in caplog.text


async def test_a_device_prefix_keeps_two_projects_names_apart(router, broker):
    body = preset("zigbee2mqtt", 'device_prefix = "z2m-"') + preset("esphome")
    async with running_bridge(router, broker, "prefixed", body), \
            devices(router, "z2m-prefixed", "prefixed") as [zigbee, node]:
        await publish(broker, ("zigbee2mqtt/prefixed", {"temperature": 20.5}),
                      ("prefixed/sensor/soil_temperature/state", b"11.0"))
        assert await zigbee.reading() == {"temperature": 20.5}
        assert await node.reading() == {"temperature": 11.0}


# -- zigbee2mqtt -------------------------------------------------------------------------

async def test_zigbee2mqtt_device_state_becomes_a_retained_reading(router, broker):
    # zigbee2mqtt.io/guide/usage/mqtt_topics_and_messages.html (WSDCGQ11LM, with pressure)
    state = {"temperature": 22.75, "linkquality": 97, "humidity": 55.43, "pressure": 1000.6,
             "battery": 86, "voltage": 3005, "last_seen": "2026-01-01T00:00:00Z"}
    async with running_bridge(router, broker, "z2m-state", preset("zigbee2mqtt")) as bridge, \
            devices(router, "z2m-state-1") as [device]:
        await publish(broker, ("zigbee2mqtt/z2m-state-1", state))
        assert await device.reading() == {"temperature": 22.75, "humidity": 55.43,
                                          "pressure": 1000.6, "battery": 86, "linkquality": 97}
        assert await device.status() == ("ok", None)
        await until(lambda: bridge.link.stats.published >= 3)
    assert (await retained(router, "sensor.z2m-state-1"))["temperature"] == 22.75


async def test_zigbee2mqtt_friendly_names_with_slashes_and_spaces(router, broker):
    # "You can use the / separator in friendly_name" (zigbee2mqtt.io, MQTT topics and messages)
    name = "z2m names/Living room"
    async with running_bridge(router, broker, "z2m-names", preset("zigbee2mqtt")), \
            devices(router, device_id(name)) as [device]:
        await publish(broker, (f"zigbee2mqtt/{name}", {"temperature": 27.34, "humidity": 44.72}))
        assert await device.reading() == {"temperature": 27.34, "humidity": 44.72}
    assert device.id.startswith("z2m_names_Living_room-")


async def test_zigbee2mqtt_availability_offline_and_online_are_the_status(router, broker):
    # zigbee2mqtt.io/guide/configuration/device-availability.html: retained online/offline on
    # <name>/availability; {"state": ...} with legacy_availability_payload: false and in 2.x
    async with running_bridge(router, broker, "z2m-avail", preset("zigbee2mqtt")), \
            devices(router, "z2m-avail-1") as [device]:
        await publish(broker, ("zigbee2mqtt/z2m-avail-1", {"temperature": 21.0}))
        assert await device.reading() == {"temperature": 21.0}
        await device.status_becomes("ok", None)
        await publish(broker, ("zigbee2mqtt/z2m-avail-1/availability", b"offline"))
        await device.status_becomes(
            "error", "offline: zigbee2mqtt/z2m-avail-1/availability says 'offline'")
        await publish(broker, ("zigbee2mqtt/z2m-avail-1", {"temperature": 21.5}))
        assert await device.reading() == {"temperature": 21.5}  # readings still flow
        await publish(broker, ("zigbee2mqtt/z2m-avail-1/availability", {"state": "online"}))
        await device.status_becomes("ok", None)


async def test_zigbee2mqtt_availability_before_the_first_reading_counts(router, broker):
    async with running_bridge(router, broker, "z2m-early", preset("zigbee2mqtt")), \
            devices(router, "z2m-early-1") as [device]:
        await publish(broker, ("zigbee2mqtt/z2m-early-1/availability", {"state": "offline"}),
                      ("zigbee2mqtt/z2m-early-1", {"humidity": 40}))
        assert await device.status() == (
            "error", "offline: zigbee2mqtt/z2m-early-1/availability says 'offline'")


async def test_zigbee2mqtt_bridge_topics_commands_and_lights_make_no_device(router, broker):
    # the bulb and button payloads of zigbee2mqtt.io's MQTT topics page; bridge/state, /set
    messages = [("zigbee2mqtt/bridge/state", {"state": "online"}),
                ("zigbee2mqtt/bridge/devices", [{"friendly_name": "z2m-none-t"}]),
                ("zigbee2mqtt/z2m-none-bulb", {"state": "ON", "brightness": 215,
                                               "color_temp": 325}),
                ("zigbee2mqtt/z2m-none-button", {"action": "single"}),
                ("zigbee2mqtt/z2m-none-t/set", {"temperature": 5}),
                ("zigbee2mqtt/z2m-none-bulb/availability", b"online")]
    async with running_bridge(router, broker, "z2m-none", preset("zigbee2mqtt")) as bridge:
        await publish(broker, *messages)
        await until(lambda: bridge.presets.stats.messages == len(messages))
        assert bridge.presets.devices == {} and bridge.presets.stats.problems == {}


# -- bad input ---------------------------------------------------------------------------

async def test_a_payload_of_the_wrong_shape_is_counted_and_the_status_says_why(
        router, broker, caplog):
    async with running_bridge(router, broker, "shape", preset("zigbee2mqtt")) as bridge, \
            devices(router, "shape-1") as [device]:
        await publish(broker, ("zigbee2mqtt/shape-1", {"temperature": 19.0}),
                      ("zigbee2mqtt/shape-1", b"ON"), ("zigbee2mqtt/shape-1", b"[1, 2]"))
        assert await device.reading() == {"temperature": 19.0}
        await device.status_becomes("error", "zigbee2mqtt/shape-1: not a JSON object: '[1, 2]'")
        await publish(broker, ("zigbee2mqtt/shape-1", {"temperature": 19.5}))
        assert await device.reading() == {"temperature": 19.5}  # nothing else stopped
        await device.status_becomes("ok", None)
        assert bridge.presets.stats.problems == {"payload": 2}
    # the bridge warns once (the driver's own line for the status change does not count)
    warned = [r for r in caplog.records
              if r.name == "cairn.mqtt" and "shape-1: not a JSON object" in r.getMessage()]
    assert len(warned) == 1


async def test_a_value_that_is_not_a_number_is_not_republished_as_current(router, broker):
    async with running_bridge(router, broker, "nan", preset("zigbee2mqtt")) as bridge, \
            devices(router, "nan-1") as [device]:
        await publish(broker, ("zigbee2mqtt/nan-1", {"temperature": 19.0, "humidity": 50}),
                      ("zigbee2mqtt/nan-1", {"temperature": None, "humidity": 51}))
        assert await device.reading() == {"temperature": 19.0, "humidity": 50}
        assert await device.reading() == {"humidity": 51}
        await device.status_becomes("error", "temperature is None, not a number")
        assert bridge.presets.stats.problems == {"number": 1}


# -- tasmota -----------------------------------------------------------------------------

async def test_tasmota_sensor_report_is_one_device_per_sensor(router, broker):
    # tasmota.github.io/docs/BME280/ and /DS18x20/ (the ESP32's own temperature is no sensor)
    bme280 = {"Time": "2019-11-03T19:34:28", "BME280": {"Temperature": 21.7, "Humidity": 66.6,
              "Pressure": 988.6}, "PressureUnit": "hPa", "TempUnit": "C"}
    ds18b20 = {"Time": "2019-01-01T00:00:00", "ESP32": {"Temperature": 52.2},
               "DS18B20-1": {"Id": "01144A0CB2AA", "Temperature": 22.5},
               "DS18B20-2": {"Id": "0114515F3CFF", "Temperature": 49.7}, "TempUnit": "C"}
    async with running_bridge(router, broker, "tasmota", preset("tasmota")) as bridge, \
            devices(router, "tas_bme-BME280", "tas_ds-DS18B20-1", "tas_ds-DS18B20-2") as [
                bme, ds1, ds2]:
        await publish(broker, ("tele/tas_bme/SENSOR", bme280), ("tele/tas_ds/SENSOR", ds18b20))
        assert await bme.reading() == {"temperature": 21.7, "humidity": 66.6, "pressure": 988.6,
                                       "device_time": "2019-11-03T19:34:28"}
        assert await ds1.reading() == {"temperature": 22.5, "device_time": "2019-01-01T00:00:00"}
        assert (await ds2.reading())["temperature"] == 49.7
    assert sorted(bridge.presets.devices) == ["tas_bme-BME280", "tas_ds-DS18B20-1",
                                              "tas_ds-DS18B20-2"]


async def test_tasmota_fahrenheit_and_mmhg_are_converted(router, broker):
    # tasmota.github.io/docs/AM2301/ with SetOption8 1 (°F) and SetOption24 1 (mmHg)
    report = {"Time": "2019-01-01T00:00:00", "AM2301": {"Temperature": 76.3, "Humidity": 58.2},
              "BMP280": {"Temperature": 75.2, "Pressure": 742.1}, "PressureUnit": "mmHg",
              "TempUnit": "F"}
    async with running_bridge(router, broker, "tas-f", preset("tasmota")), \
            devices(router, "tas_f-AM2301", "tas_f-BMP280") as [am2301, bmp280]:
        await publish(broker, ("tele/tas_f/SENSOR", report))
        assert await am2301.reading() == {"temperature": 24.61, "humidity": 58.2,
                                          "device_time": "2019-01-01T00:00:00"}
        assert await bmp280.reading() == {"temperature": 24.0, "pressure": 989.39,
                                          "device_time": "2019-01-01T00:00:00"}


async def test_tasmota_lwt_offline_is_every_sensors_status(router, broker):
    # tasmota.github.io/docs/MQTT/: tele/%topic%/LWT Online / Offline, retained
    report = {"Time": "2019-01-01T00:00:00", "SI7021": {"Temperature": 20.1, "Humidity": 40.0},
              "DS18B20": {"Temperature": 18.5}, "TempUnit": "C"}
    async with running_bridge(router, broker, "tas-lwt", preset("tasmota")), \
            devices(router, "tas_lwt-SI7021", "tas_lwt-DS18B20") as [si7021, ds18b20]:
        await publish(broker, ("tele/tas_lwt/SENSOR", report), ("tele/tas_lwt/LWT", b"Offline"))
        for device in (si7021, ds18b20):
            await device.status_becomes("error", "offline: tele/tas_lwt/LWT says 'Offline'")
        await publish(broker, ("tele/tas_lwt/LWT", b"Online"))
        await si7021.status_becomes("ok", None)


async def test_a_devices_own_time_is_kept_as_a_field_never_the_order(router, broker):
    # a Tasmota whose clock stepped back: the reading received last is the current one
    later, earlier = ({"Time": t, "DHT11": {"Temperature": v}, "TempUnit": "C"}
                      for t, v in (("2026-06-01T12:00:00", 20.0), ("2000-01-01T00:00:10", 21.0)))
    async with running_bridge(router, broker, "tas-time", preset("tasmota")) as bridge, \
            devices(router, "tas_time-DHT11") as [device]:
        await publish(broker, ("tele/tas_time/SENSOR", later), ("tele/tas_time/SENSOR", earlier))
        assert (await device.reading())["device_time"] == "2026-06-01T12:00:00"
        assert await device.reading() == {"temperature": 21.0,
                                          "device_time": "2000-01-01T00:00:10"}
        await until(lambda: not bridge.link.backlog)
    assert (await retained(router, "sensor.tas_time-DHT11"))["temperature"] == 21.0


async def test_a_unit_cairn_does_not_convert_is_refused_with_a_status(router, broker):
    report = {"BME280": {"Temperature": 21.7, "Humidity": 66.6, "Pressure": 0.976},
              "DS18B20": {"Temperature": 19.0}, "PressureUnit": "atm", "TempUnit": "C"}
    async with running_bridge(router, broker, "tas-unit", preset("tasmota")) as bridge, \
            devices(router, "tas_unit-BME280", "tas_unit-DS18B20") as [bme280, ds18b20]:
        await publish(broker, ("tele/tas_unit/SENSOR", report),
                      ("tele/tas_unit/SENSOR", report))
        assert await bme280.reading() == {"temperature": 21.7, "humidity": 66.6}
        assert await bme280.status() == ("error", "pressure in 'atm', a unit Cairn does not "
                                                  "convert")
        assert await ds18b20.status() == ("ok", None)  # it has no pressure
        assert bridge.presets.stats.problems == {"unit": 2}


# -- shelly ------------------------------------------------------------------------------

async def test_shelly_gen1_one_number_per_topic_makes_one_reading(router, broker):
    # shelly-api-docs.shelly.cloud/gen1/#shelly-h-amp-t-mqtt; add-on: ext_temperature/<n>
    async with running_bridge(router, broker, "shelly1", preset("shelly")), \
            devices(router, "shellyht-AA1", "shelly1-BB2-ext0") as [ht, addon]:
        await publish(broker, ("shellies/shellyht-AA1/sensor/temperature", b"22.25"),
                      ("shellies/shellyht-AA1/sensor/humidity", b"48"),
                      ("shellies/shellyht-AA1/sensor/battery", b"93"),
                      ("shellies/shellyht-AA1/sensor/act_reasons", b'["sensor"]'),
                      ("shellies/shelly1-BB2/ext_temperature/0", b"47.69"))
        assert await ht.reading() == {"temperature": 22.25}
        assert await ht.reading() == {"temperature": 22.25, "humidity": 48.0}
        assert await ht.reading() == {"temperature": 22.25, "humidity": 48.0, "battery": 93.0}
        assert await addon.reading() == {"temperature": 47.69}


async def test_shelly_gen1_in_fahrenheit_when_the_entry_says_so(router, broker):
    body = preset("shelly", 'temperature_unit = "°F"')
    async with running_bridge(router, broker, "shelly1f", body), \
            devices(router, "shellyht-CC3") as [ht]:
        await publish(broker, ("shellies/shellyht-CC3/sensor/temperature", b"72.05"))
        assert await ht.reading() == {"temperature": 22.25}


# shelly-api-docs.shelly.cloud/gen2/General/Notifications; the frame of a Plus H&T
# (gist.github.com/NelsonMinar/494a0f53785c20290b395639548349fa), on battery here
FULL = {"src": "shellyplusht-b8d6", "dst": "shellyplusht-b8d6/events",
        "method": "NotifyFullStatus",
        "params": {"ts": 1680962879.62, "ble": {}, "cloud": {"connected": False},
                   "devicepower:0": {"id": 0, "battery": {"V": 5.2, "percent": 71},
                                     "external": {"present": False}},
                   "ht_ui": {}, "humidity:0": {"id": 0, "rh": 42.2},
                   "mqtt": {"connected": True}, "sys": {"mac": "B8D61A8B17CC", "unixtime": None},
                   "temperature:0": {"id": 0, "tC": 19.8, "tF": 67.6}}}


async def test_shelly_gen2_notify_status_is_overlaid_on_the_full_status(router, broker):
    changed = {"src": "shellyplusht-b8d6", "dst": "shellyplusht-b8d6/events",
               "method": "NotifyStatus",
               "params": {"ts": 1680963479.61, "temperature:0": {"id": 0, "tC": 20.4, "tF": 68.7}}}
    wifi = {"src": "shellyplusht-b8d6", "method": "NotifyStatus",
            "params": {"ts": 1680963480.0, "wifi": {"rssi": -60}}}
    async with running_bridge(router, broker, "shelly2", preset("shelly")), \
            devices(router, "shellyplusht-b8d6") as [ht]:
        await publish(broker, ("shellyplusht-b8d6/events/rpc", FULL),
                      ("shellyplusht-b8d6/events/rpc", changed),
                      ("shellyplusht-b8d6/events/rpc", wifi))
        assert await ht.reading() == {"temperature": 19.8, "humidity": 42.2, "battery": 71,
                                      "device_time": "2023-04-08T14:07:59.620Z"}
        assert await ht.reading() == {"temperature": 20.4, "humidity": 42.2, "battery": 71,
                                      "device_time": "2023-04-08T14:17:59.610Z"}
        await ht.no_reading()  # a change of its Wi-Fi is no reading


async def test_shelly_gen2_on_usb_power_reports_no_battery(router, broker):
    full = json.loads(json.dumps(FULL).replace("shellyplusht-b8d6", "shellyplusht-usb"))
    full["params"]["devicepower:0"] = {"id": 0, "battery": {"V": 0.43, "percent": 0},
                                       "external": {"present": True}}
    async with running_bridge(router, broker, "shelly2usb", preset("shelly")), \
            devices(router, "shellyplusht-usb") as [ht]:
        await publish(broker, ("shellyplusht-usb/events/rpc", full))
        assert "battery" not in await ht.reading()


async def test_shelly_gen2_component_errors_are_the_status(router, broker):
    # the Temperature component's status: tC null and errors ["read"] when the sensor fails
    failed = {"src": "shellyplusht-e1", "method": "NotifyStatus",
              "params": {"ts": 1680963479.61,
                         "temperature:0": {"id": 0, "tC": None, "tF": None, "errors": ["read"]}}}
    full = json.loads(json.dumps(FULL).replace("shellyplusht-b8d6", "shellyplusht-e1"))
    async with running_bridge(router, broker, "shelly2e", preset("shelly")), \
            devices(router, "shellyplusht-e1") as [ht]:
        await publish(broker, ("shellyplusht-e1/events/rpc", full),
                      ("shellyplusht-e1/events/rpc", failed))
        await ht.status_becomes("error", "temperature:0 reports errors ['read']")
        await publish(broker, ("shellyplusht-e1/online", b"false"))
        await ht.status_becomes("error", "offline: shellyplusht-e1/online says 'false'")
        await publish(broker, ("shellyplusht-e1/online", b"true"))
        await ht.status_becomes("error", "temperature:0 reports errors ['read']")
        await publish(broker, ("shellyplusht-e1/events/rpc", full))
        await ht.status_becomes("ok", None)


# -- esphome -----------------------------------------------------------------------------

async def test_esphome_states_make_one_reading_per_node(router, broker):
    # esphome.io/components/mqtt.html: <node>/sensor/<object_id>/state, one number each
    async with running_bridge(router, broker, "esphome", preset("esphome")), \
            devices(router, "esp-living") as [node]:
        await publish(broker, ("esp-living/status", b"online"),
                      ("esp-living/sensor/living_room_temperature/state", b"21.5"),
                      ("esp-living/sensor/living_room_humidity/state", b"48.2"),
                      ("esp-living/sensor/internal_temperature/state", b"45.0"),
                      ("esp-living/sensor/wifi_signal/state", b"-61"),
                      ("esp-living/sensor/bme280_pressure/state", b"1012.3"))
        assert await node.reading() == {"temperature": 21.5}
        assert await node.reading() == {"temperature": 21.5, "humidity": 48.2}
        assert await node.reading() == {"temperature": 21.5, "humidity": 48.2,
                                        "pressure": 1012.3}
        await publish(broker, ("esp-living/status", b"offline"))
        await node.status_becomes("error", "offline: esp-living/status says 'offline'")


async def test_esphome_nan_is_no_reading_and_the_status_says_why(router, broker):
    # mqtt_sensor.cpp: "nan" for a sensor without a state, "None" with publish_nan_as_none
    async with running_bridge(router, broker, "esp-nan", preset("esphome")) as bridge, \
            devices(router, "esp-nan") as [node]:
        await publish(broker, ("esp-nan/sensor/dht_temperature/state", b"nan"),
                      ("esp-nan/sensor/dht_temperature/state", b"20.0"),
                      ("esp-nan/sensor/dht_temperature/state", b"None"))
        assert await node.reading() == {"temperature": 20.0}
        await node.status_becomes("error", "dht_temperature is 'None', not a number")
        assert bridge.presets.stats.problems == {"number": 2}


async def test_esphome_two_sensors_of_one_quantity_keep_the_first(router, broker):
    async with running_bridge(router, broker, "esp-two", preset("esphome")), \
            devices(router, "esp-two") as [node]:
        await publish(broker, ("esp-two/sensor/air_temperature/state", b"21.0"),
                      ("esp-two/sensor/soil_temperature/state", b"12.0"),
                      ("esp-two/sensor/air_temperature/state", b"21.5"))
        assert await node.reading() == {"temperature": 21.0}
        assert await node.reading() == {"temperature": 21.5}
        await node.status_becomes("ok", "soil_temperature looks like temperature too; "
                                        "air_temperature is the node's")


# -- home assistant discovery ------------------------------------------------------------
# Each test announces under its own discovery prefix (base): the broker keeps every test's
# retained announcements.

def discovery(base: str, extra: str = "") -> str:
    return preset("homeassistant", f'base = "{base}"\n{extra}')


async def announce(broker: Mosquitto, bridge: Any, *configs: tuple[str, Any]) -> None:
    """Discovery configs, retained, and wait until the bridge took them."""
    before = bridge.presets.stats.messages
    await publish(broker, *configs, retain=True)
    await until(lambda: bridge.presets.stats.messages == before + len(configs))


def bedroom(unit: str = "°C", **more: Any) -> dict[str, Any]:
    """home-assistant.io/integrations/mqtt/#sensors: the docs' own two-entity example."""
    return {"device_class": "temperature", "state_topic": "ha-bed/sensor/sensorBedroom/state",
            "unit_of_measurement": unit, "value_template": "{{ value_json.temperature }}",
            "unique_id": "temp01ae", "device": {"identifiers": ["bedroom01ae"],
                                                "name": "Bedroom"}, **more}


async def test_homeassistant_discovery_is_followed_into_cairn_units(router, broker):
    humidity = {**bedroom(), "device_class": "humidity", "unit_of_measurement": "%",
                "value_template": "{{ value_json.humidity }}", "unique_id": "hum01ae"}
    async with running_bridge(router, broker, "ha", discovery("ha-1")) as bridge, \
            devices(router, "bedroom01ae") as [device]:
        await announce(broker, bridge, ("ha-1/sensor/sensorBedroomT/config", bedroom("°F")),
                       ("ha-1/sensor/sensorBedroomH/config", humidity))
        await publish(broker, ("ha-bed/sensor/sensorBedroom/state",
                               {"temperature": 73.76, "humidity": 43.7}))
        assert await device.reading() == {"temperature": 23.2, "humidity": 43.7}
        assert await device.status() == ("ok", None)


async def test_homeassistant_abbreviations_and_the_base_topic(router, broker):
    # what ESPHome announces (mqtt_component.cpp send_discovery, abbreviated keys)
    config = {"dev_cla": "temperature", "unit_of_meas": "°C", "stat_cla": "measurement",
              "name": "Living Room Temperature", "~": "ha-esp",
              "stat_t": "~/sensor/living_room_temperature/state", "avty_t": "~/status",
              "uniq_id": "ESPsensorliving_room_temperature",
              "dev": {"ids": "a4cf12345678", "name": "ha-esp", "mf": "Espressif",
                      "cns": [["mac", "a4cf12345678"]]}}
    async with running_bridge(router, broker, "ha-abbr", discovery("ha-2")) as bridge, \
            devices(router, "a4cf12345678") as [device]:
        await announce(broker, bridge,
                       ("ha-2/sensor/ha-esp/living_room_temperature/config", config))
        await publish(broker, ("ha-esp/sensor/living_room_temperature/state", b"21.5"))
        assert await device.reading() == {"temperature": 21.5}
        await publish(broker, ("ha-esp/status", b"offline"))
        await device.status_becomes("error", "offline: ha-esp/status says 'offline'")


async def test_homeassistant_zigbee2mqtt_entities_are_one_device(router, broker):
    # what Zigbee2MQTT announces for a WSDCGQ11LM: one state topic, several entities, the
    # bridge's and the device's availability; its device temperature is diagnostic
    name, ieee = "ha-z2m Bedroom", "0x00158d0001a2b3c4"
    common = {"state_topic": f"ha-z2m/{name}",
              "availability": [{"topic": "ha-z2m/bridge/state",
                                "value_template": "{{ value_json.state }}"},
                               {"topic": f"ha-z2m/{name}/availability",
                                "value_template": "{{ value_json.state }}"}],
              "availability_mode": "all",
              "device": {"identifiers": [f"zigbee2mqtt_{ieee}"], "name": name}}

    def entity(key: str, **more: Any) -> tuple[str, dict[str, Any]]:
        return (f"ha-3/sensor/{ieee}/{key}/config",
                {**common, "unique_id": f"{ieee}_{key}_zigbee2mqtt",
                 "value_template": f"{{{{ value_json.{key} }}}}", **more})

    configs = [entity("temperature", device_class="temperature", unit_of_measurement="°C"),
               entity("humidity", device_class="humidity", unit_of_measurement="%"),
               entity("pressure", device_class="atmospheric_pressure", unit_of_measurement="hPa"),
               entity("battery", device_class="battery", unit_of_measurement="%",
                      entity_category="diagnostic"),
               entity("linkquality", unit_of_measurement="lqi", entity_category="diagnostic"),
               entity("device_temperature", device_class="temperature",
                      unit_of_measurement="°C", entity_category="diagnostic"),
               entity("voltage", device_class="voltage", unit_of_measurement="mV")]
    state = {"temperature": 22.75, "linkquality": 97, "humidity": 55.43, "pressure": 1000.6,
             "battery": 86, "voltage": 3005, "device_temperature": 30}
    async with running_bridge(router, broker, "ha-z2m", discovery("ha-3")) as bridge, \
            devices(router, f"zigbee2mqtt_{ieee}") as [device]:
        await announce(broker, bridge, *configs)
        await publish(broker, (f"ha-z2m/{name}", state))
        assert await device.reading() == {"temperature": 22.75, "humidity": 55.43,
                                          "pressure": 1000.6, "battery": 86, "linkquality": 97}
        await publish(broker, ("ha-z2m/bridge/state", {"state": "offline"}))
        await device.status_becomes("error", "offline: ha-z2m/bridge/state says 'offline'")
        await publish(broker, ("ha-z2m/bridge/state", {"state": "online"}))
        await device.status_becomes("ok", None)


async def test_homeassistant_state_topic_outside_follow_is_refused_with_a_status(
        router, broker, caplog):
    body = discovery("ha-4", 'follow = ["ha-out-in/#"]')
    config = bedroom(state_topic="ha-out-elsewhere/state",
                     device={"identifiers": ["ha-out-1"]})
    async with running_bridge(router, broker, "ha-out", body) as bridge, \
            devices(router, "ha-out-1") as [device]:
        await publish(broker, ("ha-4/sensor/ha-out/t/config", config), retain=True)
        reason = ("ha-4/sensor/ha-out/t/config: state_topic 'ha-out-elsewhere/state' "
                  "is outside the MQTT filters this entry follows (ha-out-in/#)")
        assert await device.status() == ("error", reason)
        assert bridge.presets.stats.problems == {"topic": 1}
    assert reason in caplog.text


async def test_homeassistant_template_it_cannot_follow_is_refused_with_a_status(router, broker):
    tenths = bedroom(value_template="{{ value_json.t / 10 }}",
                     device={"identifiers": ["ha-tpl-1"]}, state_topic="ha-tpl/state")
    humidity = {**tenths, "device_class": "humidity", "unit_of_measurement": "%",
                "value_template": "{{ value_json.h }}"}
    async with running_bridge(router, broker, "ha-tpl", discovery("ha-5")) as bridge, \
            devices(router, "ha-tpl-1") as [device]:
        await publish(broker, ("ha-5/sensor/ha-tpl/t/config", tenths),
                      ("ha-5/sensor/ha-tpl/h/config", humidity), retain=True)
        status, reason = await device.status()
        assert status == "error" and "value_template '{{ value_json.t / 10 }}' is not a form " \
                                     "Cairn follows" in reason
        await until(lambda: bridge.presets.stats.messages == 2)
        await publish(broker, ("ha-tpl/state", {"t": 215, "h": 40}))
        assert await device.reading() == {"humidity": 40}
        await device.status_becomes("ok", reason)  # the refusal stays said
        assert bridge.presets.stats.problems == {"template": 1}


async def test_homeassistant_leaves_a_topic_to_another_entry(router, broker, caplog):
    caplog.set_level(logging.INFO, "cairn.mqtt")
    # Tasmota's old discovery (SetOption19 1) announces tele/<topic>/SENSOR: the tasmota entry
    # reads it, even after the homeassistant entry in the file
    config = {"name": "AM2301 Temperature", "state_topic": "tele/ha_cov/SENSOR",
              "value_template": "{{value_json['AM2301'].Temperature}}",
              "unit_of_measurement": "°C", "device_class": "temperature",
              "unique_id": "ha_cov_AM2301_Temperature", "device": {"identifiers": ["6A3F21"]}}
    report = {"Time": "2019-01-01T00:00:00", "AM2301": {"Temperature": 24.6, "Humidity": 58.2},
              "TempUnit": "C"}
    body = discovery("ha-6") + preset("tasmota")
    async with running_bridge(router, broker, "ha-cov", body) as bridge, \
            devices(router, "ha_cov-AM2301") as [device]:
        await publish(broker, ("ha-6/sensor/6A3F21_AM2301_Temperature/config", config),
                      retain=True)
        await until(lambda: bridge.presets.stats.problems.get("covered") == 1)
        await publish(broker, ("tele/ha_cov/SENSOR", report))
        assert (await device.reading())["temperature"] == 24.6
        assert list(bridge.presets.devices) == ["ha_cov-AM2301"]
    assert "is another [[mqtt.map]] entry's" in caplog.text


async def test_homeassistant_empty_config_removes_the_entity(router, broker):
    config = bedroom(state_topic="ha-rm/state", device={"identifiers": ["ha-rm-1"]})
    async with running_bridge(router, broker, "ha-rm", discovery("ha-7")) as bridge, \
            devices(router, "ha-rm-1") as [device]:
        await announce(broker, bridge, ("ha-7/sensor/ha-rm/t/config", config))
        await publish(broker, ("ha-rm/state", {"temperature": 20}))
        assert await device.reading() == {"temperature": 20}
        await announce(broker, bridge, ("ha-7/sensor/ha-rm/t/config", b""))
        await publish(broker, ("ha-rm/state", {"temperature": 21}))
        await device.no_reading()


async def test_homeassistant_state_without_the_announced_values_is_bad_input(router, broker):
    config = bedroom(state_topic="ha-bad/state", device={"identifiers": ["ha-bad-1"]})
    async with running_bridge(router, broker, "ha-bad", discovery("ha-8")) as bridge, \
            devices(router, "ha-bad-1") as [device]:
        await announce(broker, bridge, ("ha-8/sensor/ha-bad/t/config", config))
        await publish(broker, ("ha-bad/state", {"temperature": 20}))
        assert await device.reading() == {"temperature": 20}
        await publish(broker, ("ha-bad/state", b"{nope"))
        await device.status_becomes("error", "ha-bad/state: holds none of the values "
                                             "announced: '{nope'")
        await publish(broker, ("ha-bad/state", {"temperature": "unknown"}))
        await device.status_becomes("error", "temperature is 'unknown', not a number")
        assert bridge.presets.stats.problems == {"payload": 1, "number": 1}
