"""Where batches go: a directory (a mounted share) or an HTTP(S) endpoint taking PUT.

A sink either confirms a batch (both files are complete where they landed) or raises
:class:`SinkError`; the uploader advances its watermark only after a confirmation. The
manifest is written last, so a reader that sees a manifest can trust the data file.

``bandwidth`` (bytes/s, 0 = no cap) paces the bytes as they are written or sent, in small
chunks, so a large batch never bursts over a slow uplink at full speed.
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


class SinkError(Exception):
    """The batch did not land; try again later."""


class Pacer:
    """A token bucket: :meth:`take` sleeps as needed to keep the average at ``rate`` bytes/s,
    with bursts of at most a quarter of a second's worth."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.chunk = max(1024, min(64 * 1024, rate // 8))
        self._allowance = 0.0
        self._last = time.monotonic()

    def take(self, n: int) -> None:
        now = time.monotonic()
        self._allowance = min(self.rate / 4, self._allowance + (now - self._last) * self.rate)
        self._last = now
        self._allowance -= n
        if self._allowance < 0:
            time.sleep(-self._allowance / self.rate)


class _PacedBody:
    """A file-like request body that lets a :class:`Pacer` set the pace of ``http.client``."""

    def __init__(self, data: bytes, pacer: Pacer) -> None:
        self._view = memoryview(data)
        self._pos = 0
        self._pacer = pacer

    def read(self, size: int = -1) -> bytes:
        size = self._pacer.chunk if size < 0 else min(size, self._pacer.chunk)
        chunk = self._view[self._pos:self._pos + size].tobytes()
        self._pos += len(chunk)
        if chunk:
            self._pacer.take(len(chunk))
        return chunk


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
            temp = target.with_name(f".{target.name}.part")
            with temp.open("wb") as f:
                if self.pacer is None:
                    f.write(data)
                else:
                    for start in range(0, len(data), self.pacer.chunk):
                        self.pacer.take(len(data[start:start + self.pacer.chunk]))
                        f.write(data[start:start + self.pacer.chunk])
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
    bandwidth: int = 0
    pacer: Pacer | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.bandwidth:
            self.pacer = Pacer(self.bandwidth)

    def describe(self) -> str:
        return self.url

    def _target(self, name: str) -> str:
        if "{name}" in self.url:
            return self.url.replace("{name}", name)
        return self.url.rstrip("/") + "/" + name

    def put(self, name: str, data: bytes) -> None:
        url = self._target(name)
        for _ in range(3):  # WebHDFS answers a CREATE with 307 to a datanode: follow it
            location = self._put(url, name, data)
            if location is None:
                return
            url = location
        raise SinkError(f"PUT {name}: too many redirects")

    def _put(self, url: str, name: str, data: bytes) -> str | None:
        """One PUT; the Location of a 307/308 answer, or None once the server took it."""
        body = data if self.pacer is None else _PacedBody(data, self.pacer)
        request = urllib.request.Request(url, data=body, method="PUT")
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
                return None
        except urllib.error.HTTPError as e:
            if e.code in (307, 308) and e.headers.get("Location"):
                return urllib.parse.urljoin(url, e.headers["Location"])
            raise SinkError(f"PUT {name}: HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", None) or f"{type(e).__name__} {e}".strip()
            raise SinkError(f"PUT {name}: {reason}") from e
