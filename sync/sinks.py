"""Where batches go: a directory (a mounted share) or an HTTP(S) endpoint taking PUT.

A sink either confirms a batch (both files are complete where they landed) or raises
:class:`SinkError`; the uploader advances its watermark only after a confirmation. The
manifest is written last, so a reader that sees a manifest can trust the data file.
"""

from __future__ import annotations

import base64
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class SinkError(Exception):
    """The batch did not land; try again later."""


class DirectorySink:
    """Writes each file to a temporary name, fsyncs it and renames it into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        return f"dir:{self.root}"

    def put(self, name: str, data: bytes) -> None:
        target = self.root / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f".{target.name}.part")
            with temp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, target)
            directory = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as e:
            raise SinkError(f"cannot write {target}: {e.strerror or e}") from e


@dataclass
class HttpSink:
    """PUTs each file to ``url`` + name (WebHDFS/HttpFS, S3-style presigned prefixes, or any
    server that answers 2xx). ``{name}`` in the URL is replaced instead when present."""

    url: str
    token: str | None = None
    username: str | None = None
    password: str | None = None
    timeout: float = 30.0
    verify_tls: bool = True

    def describe(self) -> str:
        return self.url

    def _target(self, name: str) -> str:
        if "{name}" in self.url:
            return self.url.replace("{name}", name)
        return self.url.rstrip("/") + "/" + name

    def put(self, name: str, data: bytes) -> None:
        request = urllib.request.Request(self._target(name), data=data, method="PUT")
        request.add_header("Content-Type", "application/octet-stream")
        request.add_header("Content-Length", str(len(data)))
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        elif self.username is not None:
            pair = f"{self.username}:{self.password or ''}".encode()
            request.add_header("Authorization", f"Basic {base64.b64encode(pair).decode()}")
        context = None if self.verify_tls else ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as reply:
                if not 200 <= reply.status < 300:
                    raise SinkError(f"PUT {name}: HTTP {reply.status}")
        except urllib.error.HTTPError as e:
            raise SinkError(f"PUT {name}: HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise SinkError(f"PUT {name}: {reason}") from e
