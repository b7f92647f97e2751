"""URLs as they may be shown, and the deadline of a request: here, in the base package, so
``cairn doctor`` (gateway.ops.maintenance) and the uploader's sinks (sync) share them without
gateway importing sync."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.parse


def redact_url(url: str) -> str:
    """``url`` as it may be shown and logged: without a user, password or query values
    (a presigned URL's signature, a token), which only the uploader needs."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = ("***@" if parts.username or parts.password else "") + \
        (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    query = "&".join(f"{key}=***" if value else key
                     for key, value in urllib.parse.parse_qsl(parts.query, True))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def cut_connection(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The deadline: shut the socket, so a blocked send or read returns at once."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
