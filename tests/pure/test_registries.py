"""The registries a new kind of thing is added to with one module and one line: sensor kinds
(drivers.kinds.KINDS), sinks by URL scheme (sync.sinks.SCHEMES) and the sections of
cairn.toml with their checks (app.sections.SECTIONS)."""

from __future__ import annotations

import importlib

from cairn.app.sections import SECTIONS
from cairn.drivers.kinds import KINDS
from cairn.gateway.core import config as router_config
from cairn.sync.sinks import SCHEMES, scheme_of


def test_each_sensor_kind_is_one_module_named_for_it():
    for name, kind in KINDS.items():
        assert kind.name == name
        assert importlib.import_module(f"cairn.drivers.kinds.{name}").KIND is kind


def test_each_sink_is_named_by_its_url_scheme():
    for scheme, entry in SCHEMES.items():
        assert entry.prefix.startswith(f"{scheme}:")
        assert scheme_of(entry.prefix + "x") is entry
    assert scheme_of("ftp://example/") is None


def test_the_sections_checked_are_the_sections_the_file_may_have():
    assert set(SECTIONS) == router_config.SECTIONS
    assert SECTIONS["sync"] is not None and SECTIONS["update"] is not None
