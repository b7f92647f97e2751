"""The MQTT presets' plain values (drivers.mqtt_facts, drivers.mqtt_discovery): device ids,
unit conversions and Home Assistant value templates. The presets on a real Mosquitto and
router are tests/system/test_mqtt_presets.py."""

from __future__ import annotations

import pytest

from cairn.drivers.mqtt_discovery import Template, template
from cairn.drivers.mqtt_facts import celsius, device_id, hpa

# -- device ids --------------------------------------------------------------------------

def test_a_name_of_letters_digits_underscores_and_dashes_is_its_own_device_id():
    assert device_id("0x00158d00036c1821") == "0x00158d00036c1821"
    assert device_id("shellyplusht-b8d61a8b17cc") == "shellyplusht-b8d61a8b17cc"
    assert device_id("garden", "z2m-") == "z2m-garden"


def test_names_with_slashes_or_spaces_get_readable_ids_that_never_collide():
    names = ["kitchen/floor", "kitchen floor", "kitchen_floor", "kitchen-floor",
             "kitchen//floor", "Küche/Boden"]
    ids = [device_id(name) for name in names]
    assert len(set(ids)) == len(names)
    assert ids[0].startswith("kitchen_floor-") and ids[2] == "kitchen_floor"
    assert ids[5].startswith("K_che_Boden-")
    assert ids == [device_id(name) for name in names]  # the same on every run
    assert all(set(i) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
               for i in ids)


# -- units and templates -----------------------------------------------------------------

def test_temperatures_and_pressures_are_converted_to_celsius_and_hpa():
    assert [celsius(v, u) for v, u in ((21.5, "°C"), (70.7, "°F"), (294.15, "K"), (70, "F"))] \
        == [21.5, 21.5, 21.0, 21.11]
    assert [hpa(v, u) for v, u in ((1013.2, "hPa"), (101320, "Pa"), (101.32, "kPa"),
                                    (760, "mmHg"), (29.92, "inHg"))] == \
        [1013.2, 1013.2, 1013.2, 1013.25, 1013.21]
    assert celsius(20, "Rankine") is None and hpa(1, "atm") is None


@pytest.mark.parametrize(("source", "expected"), [
    (None, Template(None)),
    ("{{ value }}", Template(None)),
    ("{{value}}", Template(None)),
    ("{{ value_json.temperature }}", Template(("temperature",))),   # Zigbee2MQTT's
    ("{{value_json['AM2301'].Temperature}}", Template(("AM2301", "Temperature"))),  # Tasmota's
    ('{{ value_json["temperature:0"].tC }}', Template(("temperature:0", "tC"))),
    ("{{ value_json.sensors[0].t }}", Template(("sensors", 0, "t"))),
    ("{{ value_json.temperature | float }}", Template(("temperature",), (("float", 0),))),
    ("{{ value | int }}", Template(None, (("int", 0),))),
    ("{{ value_json.t | float | round(1) }}", Template(("t",), (("float", 0), ("round", 1)))),
])
def test_value_templates_cairn_follows(source, expected):
    assert template(source) == expected


@pytest.mark.parametrize("source", [
    "{{ value_json.t / 10 }}", "{{ (value_json.t | float) * 1.8 + 32 }}",
    "{{ value_json.t | float(0) }}", "{{ value_json.t | multiply(0.1) }}",
    "{{ value_json.t if value_json.ok else 0 }}", "{{ value_json.t }} °C",
    "{% if value %}1{% endif %}", "{{ states('sensor.x') }}", "{{ value.x }}", "value_json.t",
])
def test_value_templates_cairn_refuses(source):
    assert template(source) is None


def test_a_template_reads_its_path_then_applies_its_filters():
    value_json = {"AM2301": {"Temperature": "24.66"}, "list": [3]}
    assert template("{{ value_json['AM2301'].Temperature | float | round(1) }}").render(
        "", value_json) == 24.7
    assert template("{{ value_json.list[0] }}").render("", value_json) == 3
    assert template("{{ value | int }}").render("21.9", None) == 21
    assert template("{{ value_json.nope }}").render("", value_json) is not None  # MISSING
