"""The fuzzing run: the WAMP message parser and the ``get_events`` argument parser take
anything without failing in a way the router does not expect, and a live router fed
thousands of random and damaged frames loses no well-behaved client an event.

CAIRN_SOAK_FUZZ_EXAMPLES examples per offline target (default 20,000),
CAIRN_SOAK_LIVE_FUZZ_EXAMPLES connections per live transport (default 2,000).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from autobahn.exception import Disconnected
from autobahn.wamp import message as m
from autobahn.wamp.exception import ProtocolError
from autobahn.wamp.types import PublishOptions
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cairn.gateway.core.history import EventsQuery
from cairn.gateway.core.session import WampError
from cairn.gateway.shell.transport import decode
from harness.config import history_rule, open_realm
from harness.fuzz import HELLO_MESSAGE, PROBE, answered_or_aborted
from harness.process import RouterProcess
from harness.wamp import SUBSCRIBED, WELCOME
from harness.wamp_client import Client, RawSocketPeer, WsPeer, connect, raw_websocket
from soak import fuzz
from soak.knobs import FUZZ_EXAMPLES, LIVE_FUZZ_EXAMPLES
from soak.load import log_errors

SERIALIZERS = fuzz.SERIALIZERS
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large, HealthCheck.large_base_example],
    # no "explain" phase: it traces every line, and under a tracer a deep recursion in the
    # code under test (a cyclic CBOR value, a 1,000-deep list) overflowed the C stack
    phases=[phase for phase in Phase if phase is not Phase.explain])
WITH_PAYLOAD = (m.Publish, m.Call, m.Yield, m.Error)


# Frames left when the router's event loop calls decode (asyncio.run, the selector loop,
# the transport's data_received, autobahn's framing: about 20 deep). Hypothesis raises the
# recursion limit while it runs a test; decode must meet the limit the router meets.
ROUTER_HEADROOM = sys.getrecursionlimit() - 20


@contextlib.contextmanager
def routers_recursion_limit() -> Iterator[None]:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + ROUTER_HEADROOM)
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def _check_decoded(frame: bytes, decoded: Any) -> None:
    assert isinstance(decoded, list) and decoded, f"decode returned {decoded!r:.100}"
    for msg, extra in decoded:
        assert isinstance(msg, m.Message) and isinstance(extra, dict)
        if isinstance(msg, WITH_PAYLOAD):  # it will be forwarded: every serializer must carry it
            for name, serializer in SERIALIZERS.items():
                try:
                    serializer._serializer.serialize([msg.args or [], msg.kwargs or {}])
                except Exception as e:
                    raise AssertionError(f"accepted {frame!r:.200} but {name} cannot carry its "
                                         f"payload: {e!r:.200}") from e


@pytest.mark.parametrize("name", fuzz.SERIALIZER_NAMES)
def test_message_parser_returns_messages_or_raises_protocol_error(name):
    """Whatever the bytes, ``decode`` returns messages or raises ProtocolError (which aborts
    the session with a reason); and a payload it accepts, every serializer can carry, as the
    router promises (else subscribers on another serializer, and the store, lose it)."""
    serializer = SERIALIZERS[name]
    counts = {"accepted": 0, "refused": 0}

    @FUZZ_SETTINGS
    @given(frame=fuzz.frames(name))
    def parse(frame: bytes) -> None:
        try:
            with routers_recursion_limit():
                decoded = decode(serializer, frame)
        except ProtocolError as e:
            assert str(e), "a ProtocolError without a reason"
            counts["refused"] += 1
            return
        _check_decoded(frame, decoded)
        counts["accepted"] += 1

    _run_counted(parse, counts, name, "frames", "ProtocolError")


def _check_query(kwargs: dict[str, Any], query: EventsQuery) -> None:
    assert set(kwargs) <= set(fuzz.KNOWN_ARGS)
    assert isinstance(query.reverse, bool)
    assert query.limit is None or (type(query.limit) is int and query.limit > 0)
    assert query.topic is None or (isinstance(query.topic, str) and query.topic)
    assert len(query.times) == len(set(kwargs) & set(fuzz.TIME_ARGS))
    assert all(type(ms) is int for _, ms in query.times)
    assert len(query.publications) == len(set(kwargs) & set(fuzz.PUBLICATION_ARGS))
    assert all(type(p) is int and 1 <= p <= 2**53 for _, p in query.publications)


def test_get_events_argument_parser_returns_a_query_or_invalid_argument():
    """Whatever keyword arguments a CALL can carry to ``get_events`` (generated nasty, then
    passed through a serializer and the router's parser, as on the wire), EventsQuery.parse
    returns a consistent query or raises ``wamp.error.invalid_argument`` naming one."""
    counts = {"valid": 0, "invalid": 0}

    @FUZZ_SETTINGS
    @given(kwargs=fuzz.events_kwargs_from_the_wire)
    def parse(kwargs: dict[str, Any]) -> None:
        try:
            query = EventsQuery.parse(kwargs)
        except WampError as e:
            assert e.uri == "wamp.error.invalid_argument", e.uri
            assert any(repr(name) in e.message for name in kwargs), e.message
            counts["invalid"] += 1
            return
        _check_query(kwargs, query)
        counts["valid"] += 1

    _run_counted(parse, counts, "get_events", "argument sets", "wamp.error.invalid_argument")


def _run_counted(fuzzer: Callable[[], None], counts: dict[str, int], what: str, inputs: str,
                refusal: str) -> None:
    """Run ``fuzzer``, which tallies each input in ``counts``: taken (its first key) or
    refused with ``refusal`` (its second); print the tally, and check that each outcome came
    often enough (a fuzzer whose inputs are all refused at the first check tests nothing
    past it)."""
    try:
        fuzzer()
    finally:
        (taken, n_taken), (_, n_refused) = counts.items()
        print(f"\n{what}: {sum(counts.values())} {inputs}, {n_taken} {taken}, {n_refused} "
              f"refused with {refusal}")
    total = sum(counts.values())
    for outcome, n in counts.items():
        assert n >= 0.02 * total, f"only {n} of {total} inputs were {outcome}"



# -- live: a running router fed garbage while a well-behaved client keeps going ------------

REALM = open_realm(history=[history_rule("sensor")])


class LiveWsPeer(WsPeer):
    """tests/system/test_bad_input.py's raw WebSocket peer, for all three serializers."""

    def send(self, raw_message: list[Any]) -> None:
        self.send_bytes(SERIALIZERS[self.serializer]._serializer.serialize(raw_message))

    def send_bytes(self, payload: bytes) -> None:
        # JSON travels in text frames, which must be UTF-8: anything else goes binary.
        # Like a socket write, a send after the router closed is lost, not an error.
        with contextlib.suppress(Disconnected):
            self.proto.sendMessage(payload,
                                   isBinary=self.serializer != "json" or not _utf8(payload))

    async def receive(self, timeout: float = 5) -> list[Any] | None:
        payload = await asyncio.wait_for(self.inbox.get(), timeout)
        if payload is None:
            return None
        return SERIALIZERS[self.serializer]._serializer.unserialize(payload)[0]


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def _open(router: RouterProcess, transport: str, serializer: str) -> Any:
    if transport == "rawsocket":
        return await RawSocketPeer.open(router.rawsocket_port, serializer)
    proto, inbox = await raw_websocket(router, f"wamp.2.{serializer}")
    return LiveWsPeer(proto, inbox, serializer)


async def _fuzz_one(router: RouterProcess, transport: str, serializer: str, established: bool,
                    frames: list[bytes]) -> str:
    """Send the frames on a fresh connection (after HELLO if ``established``), then a probe
    CALL: the router must answer the probe, or ABORT (or GOODBYE) and close."""
    peer = await _open(router, transport, serializer)
    try:
        if established:
            peer.send(HELLO_MESSAGE)
            welcome = await peer.receive()
            assert welcome is not None and welcome[0] == WELCOME, welcome
        for frame in frames:
            peer.send_bytes(frame)
        if established:
            peer.send([48, PROBE, {}, "wamp.session.count", []])
        return await answered_or_aborted(peer, frames)
    finally:
        peer.close()


@dataclass
class Witness:
    """A well-behaved publisher (acknowledged, retained, to a history topic) and two
    subscribers on other transports and serializers that must get every event, in order."""

    publisher: Client
    subscribers: list[Client]
    topic: str = f"sensor.witness.{uuid.uuid4().hex}"
    sent: int = 0
    failures: list[str] = field(default_factory=list)
    received: list[list[int]] = field(default_factory=lambda: [[], []])

    @classmethod
    async def join(cls, router: RouterProcess) -> Witness:
        publisher = await connect(router, "rawsocket-tcp", "msgpack")
        subscribers = [await connect(router, "websocket", "json"),
                       await connect(router, "rawsocket-tcp", "cbor")]
        witness = cls(publisher, subscribers)
        for inbox, session in zip(witness.received, subscribers, strict=True):
            await session.subscribe(lambda n, inbox=inbox: inbox.append(n), witness.topic)
        return witness

    async def pump(self, stop: asyncio.Event) -> None:
        options = PublishOptions(acknowledge=True, retain=True)
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.publisher.publish(self.topic, self.sent,
                                                              options=options), 5)
            except Exception as e:
                self.failures.append(f"publish {self.sent}: {e!r}")
                return
            self.sent += 1
            await asyncio.sleep(0.02)

    async def problems(self) -> list[str]:
        for _ in range(250):
            if all(len(r) >= self.sent for r in self.received):
                break
            await asyncio.sleep(0.02)
        out = [f"witness: {failure}" for failure in self.failures]
        for name, inbox in zip(["json", "cbor"], self.received, strict=True):
            # the publication whose PUBLISHED never came may have been delivered: hence + 1
            if inbox[:self.sent] != list(range(self.sent)) or len(inbox) > self.sent + 1:
                out.append(f"the witness's {name} subscriber got {len(inbox)} of {self.sent} "
                           f"events, or out of order")
        return out


@dataclass
class Bystander:
    """Subscribed to where the garbage publishes go (prefixes ``sensor`` and ``com.fuzz``)
    and reading raw frames without decoding them: every EVENT the router builds from a
    garbage payload gets serialized for it, on each serializer, whatever a client library
    could parse. The router must not fail doing so, nor drop the bystander."""

    name: str
    peer: Any
    frames: int = 0

    @classmethod
    async def join(cls, router: RouterProcess, transport: str, serializer: str) -> Bystander:
        peer = await _open(router, transport, serializer)
        peer.send(HELLO_MESSAGE)
        assert (await peer.receive())[0] == WELCOME
        for request, prefix in enumerate(["sensor", "com.fuzz"], 1):
            peer.send([32, request, {"match": "prefix"}, prefix])
            assert (await peer.receive())[0] == SUBSCRIBED
        return cls(f"{transport} {serializer}", peer)

    async def drain(self) -> None:
        """Count frames until the connection closes."""
        while await self._next_frame():
            self.frames += 1

    async def _next_frame(self) -> bool:
        if isinstance(self.peer, RawSocketPeer):
            try:
                header = await self.peer.reader.readexactly(4)
                await self.peer.reader.readexactly(int.from_bytes(header, "big") & 0xFFFFFF)
            except (asyncio.IncompleteReadError, ConnectionError):
                return False
            return True
        return await self.peer.inbox.get() is not None


@dataclass
class LiveFuzz:
    """Garbage connections and how they ended. A connection the router mishandles is
    recorded, not raised: a soak run goes on and reports each kind of failure once, with
    the first example, instead of stopping (and shrinking against a router whose state has
    moved on)."""

    router: RouterProcess
    outcomes: Counter = field(default_factory=Counter)
    failures: dict[str, tuple[int, str]] = field(default_factory=dict)  # kind -> (n, example)

    def run(self) -> None:
        """Hypothesis, in a worker thread: one connection (and event loop) per example."""

        @settings(FUZZ_SETTINGS, max_examples=2 * LIVE_FUZZ_EXAMPLES,
                  suppress_health_check=list(HealthCheck))
        @given(transport=st.sampled_from(["rawsocket", "websocket"]),
               established=st.sampled_from([True, True, False]), data=st.data())
        def garbage(transport: str, established: bool, data: st.DataObject) -> None:
            serializer = data.draw(st.sampled_from(fuzz.SERIALIZER_NAMES))
            frames = data.draw(st.lists(fuzz.live_frames(serializer), min_size=1, max_size=3))
            try:
                outcome = asyncio.run(
                    _fuzz_one(self.router, transport, serializer, established, frames))
            except Exception as e:
                outcome = "mishandled"
                self._note(e, f"{transport} {serializer} established={established} "
                              f"frames={frames!r:.300}")
            self.outcomes[f"{transport} {outcome}"] += 1

        garbage()

    def _note(self, error: Exception, example: str) -> None:
        # the kind of failure without the frames the message quotes
        kind = f"{type(error).__name__}: " + re.split(r" after | on | for |: ", str(error))[0]
        n, first = self.failures.get(kind, (0, example))
        self.failures[kind] = (n + 1, first)

    def problems(self) -> list[str]:
        return [f"{n} garbage connections mishandled: {kind}; first: {example}"
                for kind, (n, example) in self.failures.items()]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
async def test_garbage_on_both_transports_costs_a_well_behaved_client_nothing(tmp_path):
    """(The witness's client library uses ``random`` in the main thread while Hypothesis
    runs in another: hence the filtered warning about random in strategies.)"""
    router = RouterProcess(tmp_path, REALM).start()
    live = LiveFuzz(router)
    problems: list[str] = []
    try:
        witness = await Witness.join(router)
        bystanders = [await Bystander.join(router, "websocket", "json"),
                      await Bystander.join(router, "rawsocket", "msgpack"),
                      await Bystander.join(router, "websocket", "cbor")]
        draining = [asyncio.create_task(b.drain()) for b in bystanders]
        stop = asyncio.Event()
        pumping = asyncio.create_task(witness.pump(stop))
        try:
            await asyncio.to_thread(live.run)
        finally:
            stop.set()
            await pumping
            print(f"\n{sum(live.outcomes.values())} garbage connections: "
                  f"{dict(live.outcomes)}; the witness published {witness.sent} events "
                  f"meanwhile; bystanders got "
                  f"{', '.join(f'{b.frames} ({b.name})' for b in bystanders)}")
        problems += live.problems() + await witness.problems()
        problems += [f"the router dropped the {b.name} bystander"
                     for b, task in zip(bystanders, draining, strict=True) if task.done()]
        if router.proc.poll() is not None:
            problems.append(f"the router died with exit code {router.proc.returncode}")
        elif (n := await witness.publisher.call("wamp.session.count")) != 6:
            problems.append(f"{n - 6} garbage sessions linger")
    finally:
        exit_code = router.stop()
        logged = dict.fromkeys(log_errors(router.log_path))
        problems += [f"router log: {line}" for line in logged][:20]
        if exit_code != 0:
            problems.append(f"the router exited {exit_code} on SIGTERM")
        print("\n".join(problems))
    assert not problems, "\n".join(problems)
