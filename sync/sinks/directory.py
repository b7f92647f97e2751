"""``dir:/path``: a directory (a mounted share), each file written to a temporary name,
fsynced and renamed into place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cairn.base.files import write_atomically
from cairn.sync.sinks.sink import Pacer, SinkError


class DirectorySink:
    """Writes each file to a temporary name, fsyncs it and renames it into place."""

    def __init__(self, root: Path, bandwidth: int = 0) -> None:
        self.root = root
        self.pacer = Pacer(bandwidth) if bandwidth else None

    def describe(self) -> str:
        return f"dir:{self.root}"

    def put(self, name: str, data: bytes) -> None:
        target = self.root / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # the landing's readers (Spark) skip the hidden name it is written to first
            write_atomically(target, self._paced(data), mode=None)
        except OSError as e:
            raise SinkError(f"cannot write {target}: {e.strerror or e}") from e

    def _paced(self, data: bytes) -> Iterator[bytes]:
        """``data`` in chunks at the pace of ``bandwidth`` (a slow link to the landing)."""
        if self.pacer is None:
            yield data
            return
        for start in range(0, len(data), self.pacer.chunk):
            chunk = data[start:start + self.pacer.chunk]
            self.pacer.take(len(chunk))
            yield chunk


def open_sink(url: str, config: Any) -> DirectorySink:
    """The sink of ``url`` (``dir:/mnt/share/cairn``) under ``config`` (sync.cli.SyncConfig)."""
    return DirectorySink(Path(url.removeprefix("dir:")), config.bandwidth)
