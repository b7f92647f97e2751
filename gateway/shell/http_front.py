"""The HTTP/1.1 front on the router's main port: reads one request head, hands WebSocket
upgrades on /ws to autobahn and answers everything else through an :data:`HttpHandler`
(gateway.shell.web), refusing browsers that are not on this gateway's page
(gateway.shell.origins)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from autobahn.asyncio.websocket import WampWebSocketServerFactory

from cairn.gateway.shell.admission import Admission, Ticket, peer_of
from cairn.gateway.shell.origins import BrowserGuard

log = logging.getLogger("cairn.transport")  # the logger these lines had in gateway.shell.transport

# (method, path, headers, local: from the device itself) -> (status, content type, body)
HttpHandler = Callable[[str, str, dict[str, str], bool], Awaitable[tuple[int, str, bytes]]]
_MAX_HEAD = 16 * 1024


class HttpFront(asyncio.Protocol):
    """Reads one HTTP request head; hands WebSocket upgrades on /ws to autobahn, and answers
    everything else through ``handler(method, path, headers, local)`` (HttpHandler)."""

    def __init__(self, ws_factory: WampWebSocketServerFactory, handler: HttpHandler,
                 admission: Admission, guard: BrowserGuard) -> None:
        self.ws_factory = ws_factory
        self.handler = handler
        self.admission = admission
        self.guard = guard
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.ticket: Ticket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ticket = self.admission.admit(transport)
        if self.ticket is None:  # refused: its file descriptor goes at once
            transport.abort()
            return
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or end > _MAX_HEAD:
            if len(self.buffer) > _MAX_HEAD:
                self._reply(431, "text/plain", b"request header too large\n")
            return
        try:
            method, path, headers = _parse_head(self.buffer[:end].decode("latin-1"))
        except ValueError as e:
            self._reply(400, "text/plain", f"bad request: {e}\n".encode())
            return
        upgrade = path.split("?")[0] == "/ws" and \
            headers.get("upgrade", "").lower() == "websocket"
        if self._refused(headers, upgrade):
            return
        self.transport.pause_reading()
        if upgrade:
            ws = self.ws_factory()
            ws._ticket, self.ticket = self.ticket, None
            ws.connection_made(self.transport)
            self.transport.set_protocol(ws)
            self.transport.resume_reading()
            ws.data_received(self.buffer)
            return
        asyncio.ensure_future(self._serve(method, path, headers))

    def _refused(self, headers: dict[str, str], upgrade: bool) -> bool:
        """Answer 403 to a browser that is not on this gateway's page (gateway.shell.origins)."""
        host = headers.get("host")
        why = self.guard.host_refused(host)
        limit = "allowed_hosts"
        if why is None and upgrade:
            why, limit = self.guard.origin_refused(headers.get("origin"), host), "allowed_origins"
        if why is None:
            return False
        self.admission.hits.hit(limit, why)
        self._reply(403, "text/plain", f"forbidden: {why}\n".encode())
        return True

    async def _serve(self, method: str, path: str, headers: dict[str, str]) -> None:
        try:
            local = self.transport is not None and peer_of(self.transport)[1]
            status, content_type, body = await self.handler(method, path, headers, local)
        except Exception:
            log.exception("HTTP %s %s failed", method, path)
            status, content_type, body = 500, "text/plain", b"internal error\n"
        self._reply(status, content_type, body, head_only=method == "HEAD")

    def _reply(self, status: int, content_type: str, body: bytes, head_only: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        reason = _REASONS.get(status, "")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nCache-Control: no-cache\r\n"
                f"Connection: close\r\n\r\n")
        self.transport.write(head.encode("latin-1") + (b"" if head_only else body))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.ticket is not None:
            self.ticket.release()


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 426: "Upgrade Required",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


def _parse_head(head: str) -> tuple[str, str, dict[str, str]]:
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError("malformed request line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers
