"""``kind = "line"``: line-oriented text sensors, a reading per line of text (the $THS
sentence, or a configured regex), read by one :class:`~cairn.drivers.line.LinePort` per port;
several sensors may share a port when each names the id its sentences carry."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from cairn.base.config_tools import ConfigError, Validator
from cairn.drivers.kinds.kind import OnError, OnReading, SensorKind, serial_port
from cairn.drivers.line import MAX_LINE, THS, LineParser, LinePort, LineTarget, RegexFormat
from cairn.drivers.simulator import SimLineSensor

KEYS = frozenset({"format", "regex", "match_id", "max_line"})
THS_FIELDS = ("temperature", "humidity")


def parse(v: Validator, t: dict[str, Any], at: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    regex = v.get(t, at, "regex", str, None)
    fmt = v.get(t, at, "format", str, "regex" if regex is not None else THS)
    if fmt not in (THS, "regex"):
        raise ConfigError(v.source, f"{at}.format", f"must be ths or regex, not {fmt!r}")
    if fmt == "regex" and regex is None:
        raise ConfigError(v.source, f"{at}.regex", "missing (format = \"regex\" needs one)")
    if fmt == THS and regex is not None:
        raise ConfigError(v.source, f"{at}.regex", "only used with format = \"regex\"")
    fields: tuple[str, ...] = THS_FIELDS
    if regex is not None:
        try:
            fields = tuple(RegexFormat(regex).fields)
        except re.error as e:
            raise ConfigError(v.source, f"{at}.regex", f"not a valid regex: {e}") from e
        except ValueError as e:
            raise ConfigError(v.source, f"{at}.regex", str(e)) from e
    options = dict(format=fmt, regex=regex, match_id=v.get(t, at, "match_id", str, None),
                   max_line=v.positive(t, at, "max_line", MAX_LINE))
    return options, fields


def check_shared(v: Validator, at: str, sensor: Any, other: Any, k: int) -> None:
    if sensor.match_id is None or other.match_id is None:
        bad = at if sensor.match_id is None else f"sensors[{k}]"
        raise ConfigError(v.source, f"{bad}.match_id",
                          f"missing: several line sensors share {sensor.port}, so "
                          f"each needs the id its sentences carry")
    if sensor.match_id == other.match_id:
        raise ConfigError(v.source, f"{at}.match_id",
                          f"{sensor.match_id!r} is already sensors[{k}] on {sensor.port}")


def task(sensors: list[Any], on_reading: OnReading, on_error: OnError) -> LinePort:
    first = sensors[0]
    fmt = RegexFormat(first.regex) if first.regex is not None else first.format
    return LinePort(serial_port(first), LineParser(fmt, first.max_line),
                    [LineTarget(s.id, s.match_id) for s in sensors], on_reading, on_error)


def stats(port: LinePort) -> dict[str, Any]:
    return {**dataclasses.asdict(port.parser.stats), "unmatched": port.unmatched}


KIND = SensorKind("line", KEYS, parse, port_keys=("format", "regex", "max_line"),
                  check_shared=check_shared, stale_margin=lambda options: 0.0, task=task,
                  stats=stats, simulator=SimLineSensor)
