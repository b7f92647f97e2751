"""Where batches go, one module per kind of sink, each named by the URL scheme of
``[sync] sink`` in :data:`SCHEMES`: ``dir:`` a directory (a mounted share), ``http://`` and
``https://`` an HTTP(S) endpoint taking PUT, ``s3://`` an S3 bucket (signed by
:mod:`.sigv4`). A new sink is a module beside these, with an ``open_sink(url, config)``, and
a line in :data:`SCHEMES` (with its own ``[sync]`` keys and their check, if it has any).
What a sink promises is in :mod:`.sink`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from cairn.base.config_tools import Validator
from cairn.sync.sinks import directory, http, s3
from cairn.sync.sinks.directory import DirectorySink
from cairn.sync.sinks.http import HttpEndpoint, HttpSink, HttpSource, NoRoom, TooLong
from cairn.sync.sinks.sink import Pacer, Sink, SinkError


class Scheme(NamedTuple):
    prefix: str                                # how a sink URL of it starts
    open: Callable[[str, Any], Sink]           # (url, sync.cli.SyncConfig) -> the sink
    keys: frozenset[str] = frozenset()         # its own [sync] keys (an error with another)
    # (validator, the [sync] table, "sync", url) -> its own settings, checked when the config
    # is parsed (SyncConfig.sink_settings, which its open then takes)
    parse: Callable[[Validator, dict[str, Any], str, str], Any] | None = None


SCHEMES: dict[str, Scheme] = {
    "dir": Scheme("dir:", directory.open_sink),
    "http": Scheme("http://", http.open_sink),
    "https": Scheme("https://", http.open_sink),
    "s3": Scheme("s3://", s3.open_sink, s3.KEYS, s3.parse),
}


def scheme_of(url: str) -> Scheme | None:
    return next((s for s in SCHEMES.values() if url.startswith(s.prefix)), None)


def prefixes() -> str:
    """"dir:, http://, https:// or s3://": how a sink URL may start, for messages."""
    names = [s.prefix for s in SCHEMES.values()]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def open_sink(url: str, config: Any) -> Sink:
    """The sink ``url`` names (its scheme checked when the config was parsed)."""
    scheme = scheme_of(url)
    if scheme is None:
        raise ValueError(f"no sink for {url!r}: it must start with {prefixes()}")
    return scheme.open(url, config)


__all__ = ["SCHEMES", "DirectorySink", "HttpEndpoint", "HttpSink", "HttpSource", "NoRoom",
           "Pacer", "Scheme", "Sink", "SinkError", "TooLong", "open_sink", "prefixes",
           "scheme_of"]
