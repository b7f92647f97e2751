"""The central side of system updates, for tests: an HTTP server on loopback that serves
latest.json and bundles by name (with HTTP Range), records every request, counts the bundle
bytes it has sent, and can cut a download off (a link that goes down), send a bundle that
never ends, or run a hook while it sends (the device's disk filling meanwhile)."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Callable

CHUNK = 1 << 16
ENDLESS_CAP = 64 << 20   # an endless body ends here all the same: a regression must not fill
                         # the test machine's disk


class Central:
    """Files by name (the last part of the path); ``drop_after``: the next bundle download
    is cut off after that many bytes; ``endless``: bundles sent as a body that never ends
    (no Content-Length, the file over and over until the client goes); ``while_sending``:
    called with the bytes sent so far after each chunk of a bundle; ``sent``: bundle bytes
    written so far."""

    def __init__(self, port: int = 0) -> None:
        self.files: dict[str, bytes] = {}
        self.drop_after: int | None = None
        self.endless: set[str] = set()
        self.while_sending: Callable[[int], None] | None = None
        self.sent = 0
        self.requests: list[tuple[str, str | None, str | None]] = []
        central = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                central.requests.append((name, self.headers.get("Range"),
                                         self.headers.get("Authorization")))
                body = central.files.get(name)
                if body is None:
                    self.send_error(404)
                    return
                if name in central.endless:
                    self.send_response(200)
                    self.end_headers()
                    central._send_endless(self, body)
                    return
                start = 0
                if (wanted := self.headers.get("Range")) and wanted.startswith("bytes="):
                    start = int(wanted[6:].split("-")[0])
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if name.endswith(".raucb"):
                    central._send_bundle(self, body[start:])
                else:
                    self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/gw-1/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _send_bundle(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        drop, self.drop_after = self.drop_after, None
        end = len(body) if drop is None else drop
        try:
            for at in range(0, end, CHUNK):
                block = body[at:min(at + CHUNK, end)]
                handler.wfile.write(block)
                self.sent += len(block)
                if self.while_sending:
                    self.while_sending(self.sent)
            handler.wfile.flush()
            if drop is not None:
                handler.connection.shutdown(2)   # the link goes down mid-body
        except (BrokenPipeError, ConnectionResetError):   # the client gave up on it
            pass

    def _send_endless(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        """HTTP/1.0 without Content-Length: the body ends when the connection does."""
        try:
            while self.sent < ENDLESS_CAP:
                handler.wfile.write(body)
                self.sent += len(body)
        except (BrokenPipeError, ConnectionResetError):   # the client had enough
            pass

    def offer(self, version: str, body: bytes, **index) -> str:
        """Names ``body`` as the bundle of ``version`` in latest.json; returns its name."""
        name = f"cairn-{version}-debian-trixie-arm64.raucb"
        self.files[name] = body
        self.files["latest.json"] = json.dumps({
            "version": version, "bundle": name, "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(), **index}).encode()
        return name

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
