"""``http://`` and ``https://``: an HTTP(S) endpoint taking PUT (WebHDFS/HttpFS, S3-style
presigned URLs), and the same HTTP(S) rules for what the device fetches from the central side
(update bundles: :class:`HttpSource`)."""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cairn.base.urls import cut_connection, redact_url
from cairn.sync.sinks.sink import Pacer, SinkError


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


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


@dataclass
class HttpEndpoint:
    """The central side over HTTP(S), with the rules every request of Cairn's follows. A
    307/308 answer is followed only within the endpoint's own origin or to a host of
    ``redirect_hosts`` (named in ``{section}.redirect_hosts``), never from https to http, and
    credentials (a bearer ``token``, or ``username`` and ``password``) go to the endpoint's
    origin only: the token never leaves. ``timeout``: see each request."""

    url: str
    token: str | None = None
    username: str | None = None
    password: str | None = None
    timeout: float = 30.0
    verify_tls: bool = True
    redirect_hosts: tuple[str, ...] = ()
    # for messages: the config section, what the endpoint is, and why a person would list
    # another host in redirect_hosts (each kind of endpoint says its own)
    section: ClassVar[str] = ""
    role: ClassVar[str] = "endpoint"
    redirect_hint: ClassVar[str] = ""

    def describe(self) -> str:
        return redact_url(self.url)

    def _target(self, name: str) -> str:
        if "{name}" in self.url:
            return self.url.replace("{name}", name)
        return self.url.rstrip("/") + "/" + name

    def _follow(self, url: str, location: str, what: str) -> str:
        target = urllib.parse.urljoin(url, location)
        scheme, host, _ = _origin(target)
        if urllib.parse.urlsplit(url).scheme == "https" and scheme != "https":
            raise SinkError(f"{what}: redirected from https to {redact_url(target)}: "
                            f"refused (it would leave TLS)")
        if _origin(target) != _origin(self.url) and host not in self.redirect_hosts:
            raise SinkError(f"{what}: redirected to {redact_url(target)}, not the "
                            f"{self.role}'s host: refused (list it in "
                            f"{self.section}.redirect_hosts {self.redirect_hint})")
        return target

    def _connection(self, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            context = ssl.create_default_context() if self.verify_tls else \
                ssl._create_unverified_context()
            connection = http.client.HTTPSConnection(parts.hostname, parts.port,
                                                     timeout=self.timeout, context=context)
        else:
            connection = http.client.HTTPConnection(parts.hostname, parts.port,
                                                    timeout=self.timeout)
        connection.response_class = WholeHeadResponse
        return connection

    def _credentials(self, url: str) -> dict[str, str]:
        """The Authorization header, for the endpoint's own origin only."""
        if _origin(url) != _origin(self.url):
            return {}
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.username is not None:
            pair = f"{self.username}:{self.password or ''}".encode()
            return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
        return {}


@dataclass
class HttpSink(HttpEndpoint):
    """PUTs each file to ``url`` + name (WebHDFS/HttpFS, S3-style presigned prefixes, or any
    server that answers 2xx). ``{name}`` in the URL is replaced instead when present.

    Redirects (WebHDFS hands a CREATE to a datanode with a 307) and credentials follow
    :class:`HttpEndpoint`'s rules: the watermark advances on what the configured sink (or a
    host the operator named) confirmed. ``timeout`` bounds each whole request (connect,
    upload, answer), plus the time the ``bandwidth`` cap itself needs for the upload: a
    server that answers a byte at a time cannot hold a PUT longer."""

    bandwidth: int = 0
    sent: int = 0  # bytes put on the wire: every PUT's head and body, every try and redirect
    pacer: Pacer | None = field(default=None, init=False, repr=False)
    section: ClassVar[str] = "sync"
    role: ClassVar[str] = "sink"
    redirect_hint: ClassVar[str] = "if it stores the batches, as a WebHDFS datanode does"

    def __post_init__(self) -> None:
        if self.bandwidth:
            self.pacer = Pacer(self.bandwidth)

    def put(self, name: str, data: bytes) -> None:
        url = self._target(name)
        for _ in range(3):
            location = self._put(url, name, data)
            if location is None:
                return
            url = self._follow(url, location, f"PUT {name}")
        raise SinkError(f"PUT {name}: too many redirects")

    def _put(self, url: str, name: str, data: bytes) -> str | None:
        """One PUT; the Location of a 307/308 answer, or None once the server took it."""
        headers = {"Content-Type": "application/octet-stream",
                   "Content-Length": str(len(data)), **self._credentials(url)}
        reply, _ = self.send_put(url, name, data, headers)
        if 200 <= reply.status < 300:
            return None
        location = reply.getheader("Location")
        if reply.status in (307, 308) and location:
            return location
        moved = f" to {redact_url(urllib.parse.urljoin(url, location))}" if location else ""
        raise SinkError(f"PUT {name}: HTTP {reply.status} {reply.reason}{moved}")

    def send_put(self, url: str, name: str, data: bytes, headers: dict[str, str]
                  ) -> tuple[http.client.HTTPResponse, bytes]:
        """One PUT of ``data`` with ``headers`` within the deadline; the answer and up to
        64 KiB of its body (an S3 error document: sync.sinks.s3 sends its signed PUTs here)."""
        parts = urllib.parse.urlsplit(url)
        connection = self._connection(parts)
        self._count_sends(connection)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        body = data if self.pacer is None else _PacedBody(data, self.pacer)
        limit = self.timeout + (len(data) / self.bandwidth if self.bandwidth else 0.0)
        expired = threading.Event()
        deadline = threading.Timer(limit, cut_connection, [connection, expired])
        deadline.start()
        try:
            connection.request("PUT", path, body=body, headers=headers)
            reply = connection.getresponse()
            answer = reply.read(64 * 1024)
        except (OSError, http.client.HTTPException) as e:
            # the deadline's cut, or the socket's own timeout when it comes first (a loaded
            # machine runs the timer late): either way the sink did not answer in time
            if expired.is_set() or isinstance(e, TimeoutError):
                raise SinkError(f"PUT {name}: no answer within {limit:g} s "
                                f"(sync.timeout)") from e
            raise SinkError(f"PUT {name}: {type(e).__name__} {e}".strip()) from e
        finally:
            deadline.cancel()
            connection.close()
        return reply, answer

    def _count_sends(self, connection: http.client.HTTPConnection) -> None:
        """Adds to ``sent`` what ``http.client`` hands the socket (the head it made, then the
        body), before it goes: a send the link cuts short counts whole, as it may have
        gone out (the data budget must not be spent past its end uncounted)."""
        send = connection.send

        def counted(data: Any) -> None:
            self.sent += len(data)
            send(data)

        connection.send = counted


@dataclass
class HttpSource(HttpEndpoint):
    """GETs files from ``url`` + name (update bundles and their index), with
    :class:`HttpEndpoint`'s rules. ``timeout`` bounds each network wait (connect, each
    read), not a whole download: a bundle of hundreds of MB over a cellular link takes as
    long as it takes, but a link that stops moving ends it. A download picks up where the
    last one stopped (HTTP Range)."""

    section: ClassVar[str] = "update"
    role: ClassVar[str] = "update source"
    redirect_hint: ClassVar[str] = "if it serves the bundles"

    def fetch(self, name: str, limit: int = 1 << 20) -> bytes:
        """A small file, whole (at most ``limit`` bytes)."""
        reply, connection = self._get(name, {})
        try:
            data = reply.read(limit + 1)
        except (OSError, http.client.HTTPException) as e:
            raise SinkError(f"GET {name}: {type(e).__name__} {e}".strip()) from e
        finally:
            connection.close()
        if len(data) > limit:
            raise SinkError(f"GET {name}: larger than {limit} bytes")
        return data

    def download(self, name: str, target: Path, size: int, spare: int = 0,
                 chunk: int = 1 << 16) -> None:
        """Into ``target``, appending to what an earlier download left there, until it holds
        ``size`` bytes: a body that goes on past them raises :class:`TooLong` (curl's
        ``--max-filesize``), and one that would leave less than ``spare`` bytes free on the
        target's filesystem stops with :class:`NoRoom` before the write that would."""
        have = target.stat().st_size if target.exists() else 0
        reply, connection = self._get(name, {"Range": f"bytes={have}-"} if have else {})
        try:
            if reply.status == 416:   # nothing after what is here: the file is whole
                return
            if have and reply.status != 206:   # the server sends the whole file again
                have = 0
            if reply.length is not None and have + reply.length > size:
                raise TooLong(f"GET {name}: {have + reply.length} bytes, more than {size}")
            with open(target, "r+b" if have else "wb") as out:
                out.seek(have)
                self._copy(name, reply, out, target.parent, size - have, spare, chunk)
            if reply.length:   # the body ended before its Content-Length: the link went
                raise SinkError(f"GET {name}: the connection closed {reply.length} bytes "
                                f"before the end")
        except (OSError, http.client.HTTPException) as e:
            raise SinkError(f"GET {name}: {type(e).__name__} {e}".strip()) from e
        finally:
            connection.close()

    @staticmethod
    def _copy(name: str, reply: http.client.HTTPResponse, out: Any, where: Path, left: int,
              spare: int, chunk: int) -> None:
        """At most ``left`` bytes of ``reply`` into ``out`` (then fsynced), keeping ``spare``
        bytes free on the filesystem of ``where``; one byte more is :class:`TooLong`."""
        try:
            while left > 0 and (block := reply.read(min(chunk, left))):
                free = shutil.disk_usage(where).free
                if free - len(block) < spare:
                    raise NoRoom(f"GET {name}: {free} bytes free, {spare} kept free")
                out.write(block)
                left -= len(block)
            if left == 0 and reply.read(1):
                raise TooLong(f"GET {name}: more bytes than expected")
        finally:
            out.flush()
            os.fsync(out.fileno())

    def _get(self, name: str, headers: dict[str, str]
             ) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        url = self._target(name)
        for _ in range(4):
            parts = urllib.parse.urlsplit(url)
            connection = self._connection(parts)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            try:
                connection.request("GET", path, headers={**headers, **self._credentials(url)})
                reply = connection.getresponse()
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                raise SinkError(f"GET {name}: {type(e).__name__} {e}".strip()) from e
            location = reply.getheader("Location")
            if reply.status in (301, 302, 303, 307, 308) and location:
                connection.close()
                url = self._follow(url, location, f"GET {name}")
                continue
            if reply.status in (200, 206) or (reply.status == 416 and "Range" in headers):
                return reply, connection
            connection.close()
            raise SinkError(f"GET {name}: HTTP {reply.status} {reply.reason}")
        raise SinkError(f"GET {name}: too many redirects")


class TooLong(SinkError):
    """The server sent more than the download may hold."""


class NoRoom(SinkError):
    """The download stopped where the space kept free beside it begins."""


class TornHead(http.client.HTTPException):
    """The answer's status line or head ended before its end of line or blank line."""


class _HeadLines:
    """The answer's stream while its head is read: notes a line that ended without its
    newline (the connection closed, or the deadline cut it, in the middle of the head)."""

    def __init__(self, fp: Any) -> None:
        self.fp = fp
        self.torn = False

    def readline(self, limit: int = -1) -> bytes:
        line = self.fp.readline(limit)
        self.torn = self.torn or not line.endswith(b"\n")
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fp, name)


class WholeHeadResponse(http.client.HTTPResponse):
    """An answer whose head is whole or refused: ``http.client`` takes the end of the stream
    for the end of the head, so "HTTP/1.1 200 OK" and half a header, cut by a deadline,
    would count as a 2xx and a batch as delivered."""

    def begin(self) -> None:
        if self.headers is not None:
            return
        lines = _HeadLines(self.fp)
        self.fp = lines
        try:
            super().begin()
        finally:
            if self.fp is lines:
                self.fp = lines.fp
        if lines.torn:
            self.close()
            raise TornHead("the answer ended in the middle of its head")


def open_sink(url: str, config: Any) -> HttpSink:
    """The sink of ``url`` under ``config`` (sync.cli.SyncConfig): its credentials, timeout,
    TLS check, bandwidth and the hosts a redirect may hand a batch to."""
    return HttpSink(url, token=config.token, username=config.username,
                    password=config.password, timeout=config.timeout,
                    verify_tls=config.verify_tls, bandwidth=config.bandwidth,
                    redirect_hosts=config.redirect_hosts)
