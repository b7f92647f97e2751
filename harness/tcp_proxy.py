"""A TCP proxy on loopback for the tests' faults: :class:`TcpProxy` listens on a free port and
serves each connection it accepts in a thread of its own, doing with it what a subclass's
:meth:`TcpProxy.serve` does (harness.s3_server's FaultProxy, tests/spark/test_sync_links's
LinkProxy); and the reading of an HTTP head that such a proxy does."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class TcpProxy:
    """A proxy to the loopback port ``upstream``. A subclass's ``__post_init__`` sets what
    :meth:`serve` needs before it calls this one's, which starts accepting."""

    upstream: int

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Accept no more connections (those being served go on)."""
        self._listener.close()

    def at_accept(self) -> tuple[Any, ...]:
        """What :meth:`serve` is handed besides the connection, read as it is accepted."""
        return ()

    def serve(self, client: socket.socket, *accepted: Any) -> None:
        """One connection from a client, in a thread of its own."""
        raise NotImplementedError

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self.serve, args=(client, *self.at_accept()),
                             daemon=True).start()


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """A request's or an answer's head (up to its blank line, included) and what came after
    it in the same reads; ``(b"", b"")`` when the other side closed before its end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def content_length(head: bytes) -> int:
    """The Content-Length a head says (0 when it says none)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0
