"""Hostile neighbours for the mixed load (issue 19): a slowloris, a publish storm on a history
topic and a subscription flood, running alongside the well-behaved actors. Each checks that
the router answers it as documented; the mixed-load test checks that nobody else lost
anything and that the router did not grow."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

import msgpack
from autobahn.wamp.exception import ApplicationError

from harness.process import RouterProcess
from harness.wamp_client import Client, connect
from soak.knobs import ROOT
from soak.load import Problems, leave, sleep_or_stop

HANDSHAKE_TIMEOUT = 2.0  # the soak router's router.limits.handshake_timeout
STORM_TOPIC = "storm.x"  # under a history rule of its own, pruned to STORM_KEPT events
STORM_KEPT = 500


@dataclass
class Slowloris:
    """Opens ``per_second`` connections a second that send half an HTTP head and nothing
    more; each must be closed by the router within the handshake timeout (and a margin)."""

    router: RouterProcess
    problems: Problems
    per_second: int = 10
    opened: int = 0
    closed: int = 0
    _held: set[asyncio.Task] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, 1.0):
            for _ in range(self.per_second):
                task = asyncio.create_task(self._one())
                self._held.add(task)
                task.add_done_callback(self._held.discard)
        await asyncio.gather(*self._held, return_exceptions=True)

    async def _one(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.router.port)
        self.opened += 1
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")
        try:
            while await asyncio.wait_for(reader.read(4096), HANDSHAKE_TIMEOUT + 3):
                pass
            self.closed += 1
        except TimeoutError:
            self.problems.note(f"slowloris: a half HTTP head stayed open over "
                               f"{HANDSHAKE_TIMEOUT + 3:g} s")
        except OSError:
            self.closed += 1
        finally:
            writer.close()


@dataclass
class Storm:
    """A session pipelining 4 KiB publishes to a history topic for ``burst`` seconds every
    ``every`` seconds, as fast as the router reads them (it pauses reading while its store
    queue is over its bound). It runs in a process of its own: in the test's event loop it
    would starve the well-behaved actors, not the router."""

    router: RouterProcess
    problems: Problems
    burst: float = 3.0
    every: float = 30.0
    sent: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.every):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "soak.hostile", str(self.router.rawsocket_port),
                str(self.burst), cwd=ROOT, stdout=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            if proc.returncode != 0:
                self.problems.note(f"storm: exited {proc.returncode}: {out.decode()[-300:]}")
                continue
            self.sent += int(out.split()[-1])


def storm_burst(port: int, seconds: float) -> int:
    """HELLO, then PUBLISH as fast as the socket takes them for ``seconds``; how many."""
    packer = msgpack.Packer()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(bytes([0x7F, 0xF2, 0, 0]))
        s.recv(4)
        s.sendall(_frame(packer.pack([1, "realm1", {"roles": {"publisher": {}}}])))
        s.settimeout(30)  # the router pauses reading; never for this long
        payload, sent = "x" * 4096, 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            s.sendall(_frame(packer.pack([16, sent + 1, {}, STORM_TOPIC, [sent, payload]])))
            sent += 1
    return sent


def _frame(payload: bytes) -> bytes:
    return struct.pack("!L", len(payload)) + payload


@dataclass
class SubscriptionFlood:
    """Every ``every`` seconds a session subscribes to ``topics`` topics, past the
    1,000-per-session limit, and leaves: the ones past the limit must be refused with
    cairn.error.limit_reached, the rest accepted."""

    router: RouterProcess
    problems: Problems
    topics: int = 1100
    every: float = 20.0
    refused: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.every):
            session = await connect(self.router, "rawsocket-tcp", "msgpack")
            try:
                errors = await asyncio.gather(*(
                    self._subscribe(session, f"flood.t{i}") for i in range(self.topics)))
            finally:
                await leave(session)
            refused = [e for e in errors if e is not None]
            self.refused += len(refused)
            wrong = {e for e in refused if e != "cairn.error.limit_reached"}
            if len(refused) != self.topics - 1000 or wrong:
                self.problems.note(f"subscription flood: {len(refused)} of {self.topics} "
                                   f"refused ({wrong or 'limit_reached'}), expected "
                                   f"{self.topics - 1000}")

    @staticmethod
    async def _subscribe(session: Client, topic: str) -> str | None:
        """None, or the error URI SUBSCRIBE got."""
        try:
            await asyncio.wait_for(session.subscribe(lambda *a: None, topic), 30)
        except ApplicationError as e:
            return e.error
        return None


if __name__ == "__main__":
    print(storm_burst(int(sys.argv[1]), float(sys.argv[2])))
