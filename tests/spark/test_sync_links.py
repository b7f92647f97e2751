"""The uploader on a link that comes and goes (issue 33): a real TCP proxy between the
uploader (its long-running mode, in a thread) and a real HTTP landing server (test_sync's
FlakyServer, failing nothing itself), switched to drop, stall or pass. Each test then ingests
the landing with the real Spark job: every stored reading is in the table, once.

A reading is acknowledged once the store has it (what the router answers a publish with
``acknowledge`` after): the tests write the store directly, as the router does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from cairn.central import spark as jobs  # noqa: E402
from cairn.gateway.store import HistoryReader  # noqa: E402
from cairn.sync.sinks import HttpSink  # noqa: E402
from harness.tcp_proxy import TcpProxy, content_length, read_head  # noqa: E402
from tests.spark.test_spark import keys  # noqa: E402
from tests.system.test_sync import (  # noqa: E402
    GATEWAY,
    FlakyServer,
    fill_store,
    status_of,
    until_synced,
    uploading,
)

pytestmark = pytest.mark.spark

TIMEOUT = 0.5    # [sync] timeout of the uploader under test
INTERVAL = 0.5   # [sync] interval
SLACK = 1.0      # what a busy two-core machine may add to a wait
MODES = ("pass", "down", "drop", "stall", "stall_mid_body", "stall_answer")


@dataclass
class Attempt:
    at: float        # monotonic time of the connection
    mode: str        # what the link did with it
    path: str = ""   # the PUT's path ("" when the link was down)


@dataclass
class LinkProxy(TcpProxy):
    """A TCP proxy to the landing server on ``upstream``, in one of :data:`MODES` for each
    new connection: ``pass`` forwards; ``down`` resets the connection at once (no route);
    ``drop`` forwards the request's head and half its body, then closes both sides;
    ``stall`` accepts and sends nothing either way; ``stall_mid_body`` forwards the head and
    half the body, then nothing; ``stall_answer`` forwards the whole request (the server
    stores it and answers) but never the answer. A fault applies to requests whose line
    contains ``only``; the others pass."""

    mode: str = "pass"
    only: str = ""
    attempts: list[Attempt] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._closed = threading.Event()
        super().__post_init__()

    @property
    def url(self) -> str:
        return f"{self.endpoint}/landing"

    def set(self, mode: str, only: str = "") -> float:
        """Switch the link for new connections; the monotonic time it switched."""
        assert mode in MODES
        self.mode, self.only = mode, only
        return time.monotonic()

    def faulted(self, mode: str) -> list[Attempt]:
        return [a for a in self.attempts if a.mode == mode]

    def close(self) -> None:
        self._closed.set()  # held connections end
        super().close()

    def at_accept(self) -> tuple[str, str]:
        return self.mode, self.only  # what the link was when the connection came

    def serve(self, client: socket.socket, mode: str, only: str) -> None:
        at = time.monotonic()
        if mode == "down":
            self.attempts.append(Attempt(at, mode))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, as a link with no route answers
            return
        with contextlib.suppress(OSError), client:
            head, rest = read_head(client)
            if not head:
                return  # closed before the end of its head
            line = head.split(b"\r\n", 1)[0].decode()
            mode = mode if only in line else "pass"
            self.attempts.append(Attempt(at, mode, line.split()[1]))
            if mode == "stall":
                self._closed.wait()
                return
            with socket.create_connection(("127.0.0.1", self.upstream)) as upstream:
                body = content_length(head)
                whole = mode in ("pass", "stall_answer")
                _forward(client, upstream, head + rest, len(head) + (body if whole
                                                                      else body // 2))
                if mode == "pass":
                    while chunk := upstream.recv(65536):
                        client.sendall(chunk)
                elif mode != "drop":  # held: the client's deadline ends it
                    self._closed.wait()


def _forward(src: socket.socket, dst: socket.socket, start: bytes, total: int) -> None:
    """``total`` bytes to ``dst``: ``start``'s first ones, then what ``src`` sends."""
    dst.sendall(start[:total])
    sent = min(len(start), total)
    while sent < total:
        chunk = src.recv(min(65536, total - sent))
        if not chunk:
            return
        dst.sendall(chunk)
        sent += len(chunk)


# -- the setting ---------------------------------------------------------------------------

@dataclass
class Link:
    data_dir: Path
    landing: Path
    server: FlakyServer
    proxy: LinkProxy

    def sink(self) -> HttpSink:
        return HttpSink(self.proxy.url, timeout=TIMEOUT)

    def watermark(self) -> int:
        reader = HistoryReader(self.data_dir / "cairn.db")
        try:
            return reader.synced_seq()
        finally:
            reader.close()

    def until_attempts(self, mode: str, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.proxy.faulted(mode)) < count:
            assert time.monotonic() < deadline, f"{count} {mode} attempts: {self.proxy.attempts}"
            time.sleep(0.01)


@pytest.fixture
def link(tmp_path: Path) -> Iterator[Link]:
    landing = tmp_path / "landing"
    server = FlakyServer(landing).start()
    proxy = LinkProxy(server.port)
    yield Link(tmp_path / "data", landing, server, proxy)
    proxy.close()
    server.stop()


def ingested_once(spark, link: Link, seqs: list[int], tmp_path: Path) -> None:
    """The landing through the real Spark job: every reading in the table, none twice."""
    table = tmp_path / "table"
    stats = jobs.ingest(spark, str(link.landing), str(table), str(tmp_path / "quarantine"))
    assert stats.quarantined == []
    assert keys(spark, table) == [(GATEWAY, s) for s in seqs]


def faulted_then_passed(link: Link, mode: str, seqs: list[int], attempts: int = 3,
                        only: str = "", more: int = 0) -> dict[str, Any]:
    """Uploading through ``mode`` until ``attempts`` requests met it (``more`` readings
    stored meanwhile, added to ``seqs``): the watermark did not move; then through a link
    that passes, until everything is synced. The status the uploader wrote in the fault."""
    link.proxy.set(mode, only)
    with uploading(link.data_dir, link.sink(), interval=INTERVAL, batch_events=100) as worker:
        link.until_attempts(mode, 1)
        seqs += fill_store(link.data_dir, more, first_index=len(seqs)) if more else []
        link.until_attempts(mode, attempts)
        assert link.watermark() == 0
        status = status_of(link.data_dir)
        assert status["state"] == "retrying" and status["synced_seq"] == 0
        link.proxy.set("pass")
        resumed = until_synced(link.data_dir, seqs[-1], worker)
    # the try in flight when the link came back ends at its timeout (a stall) at the latest
    assert resumed <= TIMEOUT + INTERVAL + SLACK, resumed
    return status


# -- the tests -----------------------------------------------------------------------------

def test_a_put_dropped_mid_body_is_sent_again_and_every_reading_lands_once(
        spark, link, tmp_path):
    seqs = fill_store(link.data_dir, 250)
    faulted_then_passed(link, "drop", seqs)
    ingested_once(spark, link, seqs, tmp_path)


def test_a_manifest_dropped_mid_body_leaves_the_watermark_where_it_was(spark, link, tmp_path):
    """The data file landed whole; its manifest did not: no complete 2xx for the batch."""
    seqs = fill_store(link.data_dir, 250)
    faulted_then_passed(link, "drop", seqs, only=".manifest.json")
    assert link.server.stored[0].endswith(".jsonl.bz2")  # before the watermark was read
    ingested_once(spark, link, seqs, tmp_path)


def test_a_link_that_accepts_and_stays_silent_is_cut_at_the_timeout(spark, link, tmp_path):
    seqs = fill_store(link.data_dir, 250)
    status = faulted_then_passed(link, "stall", seqs)
    assert f"no answer within {TIMEOUT:g} s" in status["last_error"]
    ingested_once(spark, link, seqs, tmp_path)


def test_a_link_that_stalls_mid_body_is_cut_at_the_timeout(spark, link, tmp_path):
    seqs = fill_store(link.data_dir, 250)
    status = faulted_then_passed(link, "stall_mid_body", seqs)
    assert f"no answer within {TIMEOUT:g} s" in status["last_error"]
    ingested_once(spark, link, seqs, tmp_path)


def test_a_batch_landed_whose_answer_was_lost_is_sent_again_and_kept_once(
        spark, link, tmp_path):
    """The manifest landed whole each time, the 201 never came back: the watermark stays,
    and the batch goes again, overlapping it (readings came meanwhile: 1-50, then 1-100)."""
    seqs = fill_store(link.data_dir, 50)
    faulted_then_passed(link, "stall_answer", seqs, only=".manifest.json", more=200)
    manifests = [name for name in link.server.stored if name.endswith(".manifest.json")]
    assert len(set(manifests)) > 2 and len(manifests) > len(set(manifests))
    ingested_once(spark, link, seqs, tmp_path)


def test_a_link_back_after_several_intervals_is_used_within_one_interval(
        spark, link, tmp_path):
    seqs = fill_store(link.data_dir, 100)
    link.proxy.set("down")
    with uploading(link.data_dir, link.sink(), interval=INTERVAL, batch_events=100) as worker:
        time.sleep(8 * INTERVAL)  # down for eight intervals; readings come meanwhile
        seqs += fill_store(link.data_dir, 100, first_index=100)
        assert link.watermark() == 0
        back = link.proxy.set("pass")
        resumed = until_synced(link.data_dir, seqs[-1], worker)
    tries = [a.at for a in link.proxy.attempts]
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    retried = next(a.at for a in link.proxy.attempts if a.mode == "pass") - back
    print(f"\nlink back: first try {retried:.2f} s later, all synced in {resumed:.2f} s "
          f"(interval {INTERVAL:g} s); waits between tries: "
          f"{', '.join(f'{g:.2f}' for g in gaps)}")
    assert max(gaps) <= INTERVAL + SLACK, gaps   # it never waited longer than an interval
    assert retried <= INTERVAL + SLACK
    ingested_once(spark, link, seqs, tmp_path)
