"""Hostile neighbours for the mixed load (issue 19): a slowloris, a publish storm on a history
topic and a subscription flood; and issue 31's: a session taking retained slots, retained
payloads at the size bound on the dashboards' topics, and guessed logins for real users.
They run alongside the well-behaved actors. Each checks that the router answers it as
documented; the mixed-load test checks that nobody else lost anything and that the router
did not grow."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

import msgpack
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from cairn.gateway.core.auth import THROTTLE_WINDOW
from harness.process import RouterProcess
from harness.wamp_client import Client, connect
from soak.knobs import ROOT
from soak.load import Problems, leave, sleep_or_stop

HANDSHAKE_TIMEOUT = 2.0  # the soak router's router.limits.handshake_timeout
# The soak router's retained bounds, a quarter of the defaults (the same share per session),
# so that the retained-slot attacker fills the realm in seconds, not minutes of the soak
MAX_RETAINED = 2500
MAX_RETAINED_PER_SESSION = 625
RETAINED_PAYLOAD = 64 * 2**10  # router.limits.max_retained_payload (default): sensor. too
# The soak router's send buffer: below what the big-retained attacker's values add up to,
# so that only pacing keeps the dashboards from being cut off on subscribe
SEND_BUFFER_LIMIT = 384 * 2**10
LIMIT_REACHED = "cairn.error.limit_reached"
AUTH_FAILED = "wamp.error.authentication_failed"
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
    ``every`` seconds, as fast as the router reads them (at its read budget, 1 MiB a second,
    and not while the store's queue is over its bound). It runs in a process of its own: in
    the test's event loop it would starve the well-behaved actors, not the router."""

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


async def _publish_all(session: Client, items: list[tuple[str, dict]]) -> list[str | None]:
    """Publish each (topic, kwargs) retained and acknowledged, all at once; per item None
    (accepted) or the error URI."""
    options = PublishOptions(retain=True, acknowledge=True)

    async def one(topic: str, kwargs: dict) -> str | None:
        try:
            await asyncio.wait_for(session.publish(topic, options=options, **kwargs), 60)
        except ApplicationError as e:
            return e.error
        return None

    return await asyncio.gather(*(one(topic, kwargs) for topic, kwargs in items))


async def retained_topics(router: RouterProcess, prefix: str) -> set[str]:
    """The topics under ``prefix`` a new subscriber with get_retained gets a value of."""
    session = await connect(router, "rawsocket-tcp", "msgpack")
    got: set[str] = set()
    try:
        await session.subscribe(lambda *a, details, **kw: got.add(details.topic), prefix,
                                options=SubscribeOptions(match="prefix", get_retained=True,
                                                         details_arg="details"))
        await session.call("wamp.session.count")  # retained events come before the answer
    finally:
        await leave(session)
    return got


@dataclass
class Neighbour:
    """Issue 31's hostile neighbours: the router they attack, where they note what is wrong."""

    router: RouterProcess
    problems: Problems


# how each round of the retained-slot attacker publishes: sessions at once, topics each
SLOT_SESSIONS, SLOT_TOPICS = 2, 800


@dataclass
class RetainedSlotAttacker(Neighbour):
    """N5: every ``every`` seconds SLOT_SESSIONS anonymous sessions each publish retained to
    SLOT_TOPICS junk topics of their own at once. Each must have what is past its share
    (MAX_RETAINED_PER_SESSION) refused with limit_reached, and once the realm is full of
    junk, all of it (junk does not evict junk). Meanwhile the real sensors' retained values
    are served to a new subscriber, and a new sensor (on a retention rule's topic) still
    gets its value retained: junk is what makes room."""

    sensor_topics: frozenset[str]
    every: float = 20.0
    rounds: int = 0
    accepted: int = 0
    refused: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.every):
            await asyncio.gather(*(self._burst(k) for k in range(SLOT_SESSIONS)))
            await self._check_sensors()
            self.rounds += 1

    async def _burst(self, k: int) -> None:
        session = await connect(self.router, "rawsocket-tcp", "msgpack")
        try:
            errors = await _publish_all(session, [
                (f"junk.r{self.rounds}.s{k}.t{i}", {"junk": i}) for i in range(SLOT_TOPICS)])
        finally:
            await leave(session)
        refused = [e for e in errors if e is not None]
        self.accepted += len(errors) - len(refused)
        self.refused += len(refused)
        wrong = {e for e in refused if e != LIMIT_REACHED}
        if wrong or len(errors) - len(refused) > MAX_RETAINED_PER_SESSION:
            self.problems.note(f"retained slots: a session had {len(errors) - len(refused)} "
                               f"of {SLOT_TOPICS} retained (its share "
                               f"{MAX_RETAINED_PER_SESSION}), refusals {wrong or LIMIT_REACHED}")

    async def _check_sensors(self) -> None:
        missing = self.sensor_topics - await retained_topics(self.router, "sensor.")
        if missing:
            self.problems.note(f"retained slots: sensors' values not served: {missing}")
        session = await connect(self.router, "rawsocket-tcp", "msgpack")
        topic = f"gateway.device.soak-new-{self.rounds}.status"  # a retention rule's topic
        try:
            error, = await _publish_all(session, [(topic, {"status": "ok"})])
        finally:
            await leave(session)
        if error is not None or topic not in await retained_topics(self.router, topic):
            self.problems.note(f"retained slots: a new sensor's value was not retained "
                               f"({error})")


@dataclass
class BigRetained(Neighbour):
    """N3: every ``every`` seconds retained values just under the payload bound on ``values``
    topics under ``sensor.`` (together over SEND_BUFFER_LIMIT: every dashboard subscribing
    gets them all), one a second, then two over the bound, which must be refused at publish
    with limit_reached (and stay live events). No dashboard may be cut off meanwhile (the
    dashboards check that)."""

    values: int = 8
    every: float = 30.0
    near: int = 0
    over_refused: int = 0

    @property
    def topics(self) -> set[str]:
        return {f"sensor.big-{i}" for i in range(self.values)}

    async def run(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.every):
            session = await connect(self.router, "websocket", "json")
            try:
                await self._round(session, stop)
            finally:
                await leave(session)

    async def _round(self, session: Client, stop: asyncio.Event) -> None:
        for topic in sorted(self.topics):
            error, = await _publish_all(session, [(topic, _blob(RETAINED_PAYLOAD - 256))])
            if error is not None:
                self.problems.note(f"big retained: a value under the bound refused: {error}")
            self.near += 1
            if await sleep_or_stop(stop, 1.0):
                return
        for size in (RETAINED_PAYLOAD + 256, 2 * RETAINED_PAYLOAD):
            error, = await _publish_all(session, [("sensor.big-0", _blob(size))])
            if error != LIMIT_REACHED:
                self.problems.note(f"big retained: {size} bytes over the bound got {error}")
            else:
                self.over_refused += 1


def _blob(packed_size: int) -> dict[str, str]:
    """kwargs whose packed retained payload ([args, kwargs]) is about ``packed_size``
    bytes."""
    return {"blob": "x" * (packed_size - 16)}


# where the lockout attacker guesses from (other loopback addresses than the owners'), and
# how many guesses per source and user each round: past the throttle's 5
LOCKOUT_SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
LOCKOUT_GUESSES = 6
OWNER_CHECK_EVERY = 3.0  # s between the real users' logins


@dataclass
class Lockout(Neighbour):
    """N7: every ``every`` seconds LOCKOUT_GUESSES wrong tickets and WAMP-CRA answers for
    each real user from each of LOCKOUT_SOURCES, past the throttle; every one must be
    refused as authentication_failed, those past 5 per source and user saying to try again
    later. Every OWNER_CHECK_EVERY seconds the users log in from 127.0.0.1 with
    their right secrets, which must always work: the throttle penalises the guessers'
    sources, never the account."""

    users: tuple[tuple[str, str, str], ...]  # (authid, secret, authmethod)
    every: float = 15.0
    refused: int = 0
    throttled: int = 0
    unanswered: int = 0  # guesses the router closed (or did not answer) before refusing
    owner_logins: int = 0
    owner_waited: int = 0  # refused within a minute of the user's own failed login

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(self._guess(stop), self._owners(stop))

    async def _guess(self, stop: asyncio.Event) -> None:
        while not await sleep_or_stop(stop, self.every):
            throttled = self.throttled
            await asyncio.gather(*(self._wrong_ones(source, authid, method)
                                   for source in LOCKOUT_SOURCES
                                   for authid, _, method in self.users))
            least = len(LOCKOUT_SOURCES) * len(self.users) * (LOCKOUT_GUESSES - 5)
            if self.throttled - throttled < least:
                self.problems.note(f"lockout: {self.throttled - throttled} guesses told to "
                                   f"try again later, expected at least {least}")

    async def _wrong_ones(self, source: str, authid: str, method: str) -> None:
        for _ in range(LOCKOUT_GUESSES):  # one after the other, as a guesser awaits each answer
            await self._wrong(source, authid, method)

    async def _wrong(self, source: str, authid: str, method: str) -> None:
        try:
            session = await connect(self.router, "websocket", "json", local_addr=(source, 0),
                                    authmethods=[method], authid=authid, secret="a-guess")
        except ConnectionRefusedError as e:
            reason, _, message = str(e).partition(": ")
            self.refused += 1
            self.throttled += "try again" in message
            if reason != AUTH_FAILED:
                self.problems.note(f"lockout: a wrong {method} for {authid} got {reason}")
            return
        except (ConnectionError, TimeoutError):  # the handshake timeout, on a loaded machine
            self.unanswered += 1
            return
        await leave(session)
        self.problems.note(f"lockout: a wrong {method} for {authid} was let in")

    async def _owners(self, stop: asyncio.Event) -> None:
        transports = [("websocket", "json"), ("rawsocket-tcp", "msgpack")]
        failed_at: dict[str, float] = {}  # a user's last login that failed on its own side
        while not await sleep_or_stop(stop, OWNER_CHECK_EVERY):
            for authid, secret, method in self.users:
                transport, serializer = transports[self.owner_logins % 2]
                try:
                    session = await connect(self.router, transport, serializer,
                                            authmethods=[method], authid=authid, secret=secret)
                except (ConnectionError, TimeoutError) as e:
                    self._owner_refused(authid, method, e, failed_at)
                    continue
                await leave(session)
                self.owner_logins += 1

    def _owner_refused(self, authid: str, method: str, e: Exception,
                       failed_at: dict[str, float]) -> None:
        """A login of a real user with its secret did not succeed: a problem, unless the
        throttle refused it within a minute of that user's own failed login from 127.0.0.1
        (cut by the handshake timeout on a loaded machine): a source that failed for a user
        under attack waits until its failure is a minute old, as documented."""
        throttled = isinstance(e, ConnectionRefusedError) and "try again" in str(e)
        if throttled and time.monotonic() - failed_at.get(authid, -1e9) < THROTTLE_WINDOW:
            self.owner_waited += 1
            return
        if not isinstance(e, ConnectionRefusedError):
            failed_at[authid] = time.monotonic()
        self.problems.note(f"lockout: {authid} with the right secret ({method}) was "
                           f"refused: {e!r}")

if __name__ == "__main__":
    print(storm_burst(int(sys.argv[1]), float(sys.argv[2])))
