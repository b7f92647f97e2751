"""The dealer (RPC) end to end: real autobahn-python sessions, and hand-rolled raw WAMP peers
where a test needs exact control of the messages, against a real router on real sockets.

Notes on autobahn-python 26.x that shape these tests:
- ``CallOptions(timeout=...)`` is documented in seconds but is put on the wire unchanged, and
  ``message.Call`` asserts it is an int: WAMP wants milliseconds, so tests pass ``timeout=300``.
- Cancelling the future of ``session.call()`` sends ``[CANCEL, request, {}]`` without a mode, so
  the router's default (killnowait) applies; the modes are tested with a raw peer as the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, CallResult, RegisterOptions

from harness.config import EVERYTHING, permission, realm, role, router_table
from harness.wamp import ERROR, HELLO, WELCOME
from harness.wamp_client import TRANSPORTS, RawSocketPeer, connect
from tests.conftest import RunningRouter, start_router

SERIALIZERS = ("json", "msgpack", "cbor")

# WAMP message codes, for the raw peers
CALL, CANCEL, RESULT = 48, 49, 50
REGISTER, REGISTERED, UNREGISTER = 64, 65, 66
INVOCATION, INTERRUPT, YIELD = 68, 69, 70

CALLER_ROLES = {"caller": {"features": {"call_canceling": True,
                                        "progressive_call_results": True}}}
CALLEE_ROLES = {"callee": {"features": {"call_canceling": True,
                                        "progressive_call_results": True}}}
# a callee that does not announce call_canceling: the router may not INTERRUPT it
PLAIN_CALLEE_ROLES = {"callee": {"features": {}}}


def future() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()


async def wait(aw: Any, timeout: float = 2) -> Any:
    return await asyncio.wait_for(aw, timeout)


async def call_error(aw: Any) -> ApplicationError:
    """The ApplicationError a call, register or unregister fails with."""
    with pytest.raises(ApplicationError) as info:
        await wait(aw)
    return info.value


class Cancellable:
    """An async procedure that does not answer until released and records being cancelled."""

    def __init__(self) -> None:
        self.started = future()
        self.cancelled = future()
        self._release = future()

    async def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.started.set_result(args)
        try:
            await asyncio.wait_for(asyncio.shield(self._release), 30)
        except asyncio.CancelledError:
            self.cancelled.set_result(True)
            raise
        return "finished"

    async def release(self) -> None:
        """Let the procedure return (so no task is left behind for the loop to cancel)."""
        self._release.set_result(None)
        await asyncio.sleep(0)


@pytest.fixture
async def raw(router):
    """A factory of raw WAMP peers on RawSocket/JSON, joined to realm1 with the given roles."""
    peers: list[RawSocketPeer] = []

    async def join(roles: dict[str, Any]) -> RawSocketPeer:
        peer = await RawSocketPeer.open(router.rawsocket_port, "json")
        peers.append(peer)
        peer.send([HELLO, "realm1", {"roles": roles}])
        welcome = await peer.receive(2)
        assert welcome is not None and welcome[0] == WELCOME, welcome
        return peer

    yield join
    for peer in peers:
        peer.close()


async def raw_register(peer: RawSocketPeer, procedure: str, request: int = 1) -> int:
    peer.send([REGISTER, request, {}, procedure])
    registered = await peer.receive(2)
    assert registered is not None and registered[:2] == [REGISTERED, request], registered
    return registered[2]


async def nothing_more(peer: RawSocketPeer, within: float = 0.2) -> bool:
    """True if the router sends the peer nothing for ``within`` seconds."""
    try:
        msg = await peer.receive(within)
    except TimeoutError:
        return True
    pytest.fail(f"unexpected message from the router: {msg!r}")


# -- register / call / result ----------------------------------------------------------------


async def test_call_returns_the_callee_result_with_args_and_kwargs(client):
    callee = await client()
    caller = await client()
    seen = future()

    def proc(a, b, *, scale):
        seen.set_result((a, b, scale))
        return CallResult(a + b, [a, b], total=(a + b) * scale)

    await callee.register(proc, "com.math.add")
    result = await wait(caller.call("com.math.add", 2, 3, scale=10))
    assert await wait(seen) == (2, 3, 10)
    assert list(result.results) == [5, [2, 3]]
    assert result.kwresults == {"total": 50}


@pytest.mark.parametrize(("caller_transport", "caller_serializer"),
                         list(itertools.product(TRANSPORTS, SERIALIZERS)))
async def test_call_relays_args_and_kwargs_between_every_transport_and_serializer(
        client, caller_transport, caller_serializer):
    """The caller on one transport x serializer calls a callee on each of the nine pairs."""
    caller = await client(caller_transport, caller_serializer)
    args = [1, -2.5, "ünï", [True, None], {"nested": [1, {"x": "y"}]}, b"\x00\xffbytes"]
    kwargs = {"flag": False, "blob": b"\x01\x02", "text": "t"}
    for transport, serializer in itertools.product(TRANSPORTS, SERIALIZERS):
        callee = await client(transport, serializer)
        procedure = f"com.echo.{transport}.{serializer}"
        await callee.register(lambda *a, **kw: CallResult(*a, **kw), procedure)
        result = await wait(caller.call(procedure, *args, **kwargs))
        assert (list(result.results), result.kwresults) == (args, kwargs), (transport, serializer)


async def test_callee_application_error_reaches_the_caller_with_uri_args_and_kwargs(client):
    callee = await client("rawsocket-tcp", "cbor")
    caller = await client("websocket", "msgpack")

    def fail():
        raise ApplicationError("com.err", 1, x=2)

    await callee.register(fail, "com.fail")
    error = await call_error(caller.call("com.fail"))
    assert error.error == "com.err"
    assert error.args == (1,)
    assert error.kwargs == {"x": 2}


# -- registration errors ---------------------------------------------------------------------


async def test_registering_an_already_registered_procedure_gets_procedure_already_exists(client):
    first = await client()
    second = await client()
    await first.register(lambda: 1, "com.taken")
    error = await call_error(second.register(lambda: 2, "com.taken"))
    assert error.error == "wamp.error.procedure_already_exists"
    assert await wait(second.call("com.taken")) == 1


async def test_joining_a_shared_registration_twice_from_one_session_is_refused(client):
    callee = await client()
    options = RegisterOptions(invoke="roundrobin")
    await callee.register(lambda: 1, "com.twice", options=options)
    error = await call_error(callee.register(lambda: 2, "com.twice", options=options))
    assert error.error == "wamp.error.procedure_already_exists"


async def test_calling_after_unregister_gets_no_such_procedure(client):
    callee = await client()
    caller = await client()
    registration = await callee.register(lambda: 1, "com.gone")
    assert await wait(caller.call("com.gone")) == 1
    await wait(registration.unregister())
    error = await call_error(caller.call("com.gone"))
    assert error.error == "wamp.error.no_such_procedure"


async def test_unregistering_an_unknown_registration_gets_no_such_registration(raw):
    peer = await raw(CALLEE_ROLES)
    peer.send([UNREGISTER, 7, 123456789])
    error = await peer.receive(2)
    assert error[:5] == [ERROR, UNREGISTER, 7, {}, "wamp.error.no_such_registration"]


async def test_unregistering_another_sessions_registration_gets_no_such_registration(
        client, raw):
    owner = await client()
    registration = await owner.register(lambda: "still here", "com.owned")
    intruder = await raw(CALLEE_ROLES)
    intruder.send([UNREGISTER, 3, registration.id])
    error = await intruder.receive(2)
    assert error[:5] == [ERROR, UNREGISTER, 3, {}, "wamp.error.no_such_registration"]
    assert await wait(owner.call("com.owned")) == "still here"


async def test_registering_under_wamp_prefix_is_refused(client):
    callee = await client()
    error = await call_error(callee.register(lambda: 1, "wamp.my.procedure"))
    assert error.error == "wamp.error.invalid_uri"


async def test_only_the_invoked_callee_can_answer_an_invocation(client, raw):
    callee = await raw(CALLEE_ROLES)
    await raw_register(callee, "com.mine")
    impostor = await raw(CALLEE_ROLES)
    caller = await client()
    call = asyncio.ensure_future(caller.call("com.mine"))
    invocation = await callee.receive(2)
    impostor.send([YIELD, invocation[1], {}, ["forged"]])
    impostor.send([ERROR, INVOCATION, invocation[1], {}, "com.forged"])
    await asyncio.sleep(0.05)
    assert not call.done()
    callee.send([YIELD, invocation[1], {}, ["genuine"]])
    assert await wait(call) == "genuine"


# -- pattern-based registrations -------------------------------------------------------------


async def test_prefix_registration_receives_calls_and_sees_the_called_procedure(client):
    callee = await client()
    caller = await client()

    def proc(x, details):
        return [x, details.procedure]

    await callee.register(proc, "com.prefix",
                          options=RegisterOptions(match="prefix", details_arg="details"))
    assert await wait(caller.call("com.prefix.a.b", 1)) == [1, "com.prefix.a.b"]
    assert await wait(caller.call("com.prefixed", 2)) == [2, "com.prefixed"]


async def test_wildcard_registration_receives_calls_and_sees_the_called_procedure(client):
    callee = await client()
    caller = await client()

    def proc(details):
        return details.procedure

    await callee.register(proc, "com..status",
                          options=RegisterOptions(match="wildcard", details_arg="details"))
    assert await wait(caller.call("com.pump.status")) == "com.pump.status"
    error = await call_error(caller.call("com.pump.x.status"))
    assert error.error == "wamp.error.no_such_procedure"


# -- shared registrations and which registration wins: tests/core/test_core.py (in memory) ------


# -- caller identification and authorization (a router with a custom config) ---------------

def custom_config(unix_path: Path, data_dir: Path) -> str:
    """com.disclosed* discloses its callers, com.callonly* may be called but not registered,
    com.closed* allows nothing; everything else, everything."""
    anonymous = role("anonymous",
                     permission("com.disclosed", ["call", "register"], disclose=True),
                     permission("com.callonly", ["call"]), permission("com.closed", []),
                     permission("", EVERYTHING))
    return (router_table(data_dir, rawsocket=["127.0.0.1:0", f"unix:{unix_path}"])
            + realm("realm1", anonymous, anonymous_role="anonymous"))


@pytest.fixture
async def custom_router(tmp_path):
    """Discloses callers of com.disclosed*, forbids registering com.callonly* and any
    action on com.closed*."""
    unix_path = tmp_path / "custom.sock"
    node = await start_router(custom_config(unix_path, tmp_path / "data"))
    sessions: list[Any] = []

    async def join(transport: str = "websocket", serializer: str = "json", **kwargs: Any):
        session = await connect(running, transport, serializer, **kwargs)
        sessions.append(session)
        return session

    running = RunningRouter(node, str(unix_path))
    running.join = join
    yield running
    for session in sessions:
        with contextlib.suppress(Exception):
            await wait(session.leave())
    await node.stop()


def whoami(details):
    return [details.caller, details.caller_authid, details.caller_authrole]


async def test_disclose_permission_gives_the_callee_the_caller_identity(custom_router):
    callee = await custom_router.join()
    caller = await custom_router.join("rawsocket-unix", "cbor")
    await callee.register(whoami, "com.disclosed.who",
                          options=RegisterOptions(details_arg="details"))
    assert await wait(caller.call("com.disclosed.who")) == [
        caller.session_id, caller.welcome_details.authid, "anonymous"]


async def test_callee_sees_no_caller_identity_without_disclose(custom_router):
    callee = await custom_router.join()
    caller = await custom_router.join("rawsocket-unix", "cbor")
    await callee.register(whoami, "com.private.who",
                          options=RegisterOptions(details_arg="details"))
    assert await wait(caller.call("com.private.who")) == [None, None, None]


async def test_caller_disclose_me_option_gives_the_callee_the_caller_identity(client, raw):
    callee = await client()
    await callee.register(whoami, "com.who", options=RegisterOptions(details_arg="details"))
    caller = await raw(CALLER_ROLES)
    caller.send([CALL, 1, {"disclose_me": True}, "com.who"])
    result = await caller.receive(2)
    assert result[:3] == [RESULT, 1, {}]
    session_id, authid, authrole = result[3][0]
    assert isinstance(session_id, int) and authid.startswith("anonymous-")
    assert authrole == "anonymous"


async def test_registering_without_register_permission_gets_not_authorized(custom_router):
    callee = await custom_router.join()
    error = await call_error(callee.register(lambda: 1, "com.callonly.proc"))
    assert error.error == "wamp.error.not_authorized"


async def test_calling_without_call_permission_gets_not_authorized(custom_router):
    caller = await custom_router.join()
    error = await call_error(caller.call("com.closed.proc"))
    assert error.error == "wamp.error.not_authorized"


# -- progressive call results ----------------------------------------------------------------


async def test_progressive_results_arrive_in_order_before_the_final_result(client):
    callee = await client("rawsocket-tcp", "msgpack")
    caller = await client("websocket", "cbor")
    events: list[Any] = []

    async def count(n, details):
        for i in range(n):
            details.progress(i, step=i)
            await asyncio.sleep(0)
        return "done"

    await callee.register(count, "com.count", options=RegisterOptions(details_arg="details"))
    result = await wait(caller.call(
        "com.count", 5,
        options=CallOptions(on_progress=lambda *a, **kw: events.append((a, kw)))))
    events.append(result)
    assert events == [((i,), {"step": i}) for i in range(5)] + ["done"]


async def test_callee_gets_no_progress_function_when_the_caller_did_not_ask(client):
    callee = await client()
    caller = await client()
    await callee.register(lambda details: details.progress is None, "com.progress.none",
                          options=RegisterOptions(details_arg="details"))
    assert await wait(caller.call("com.progress.none")) is True


async def test_progress_is_dropped_for_a_caller_that_did_not_ask(client, raw):
    """A callee that sends progressive YIELDs anyway: the caller gets only the final RESULT."""
    callee = await raw(CALLEE_ROLES)
    await raw_register(callee, "com.progress.pushy")
    caller = await client()
    result = asyncio.ensure_future(caller.call("com.progress.pushy"))
    invocation = await callee.receive(2)
    assert invocation[0] == INVOCATION
    callee.send([YIELD, invocation[1], {"progress": True}, ["partial"]])
    callee.send([YIELD, invocation[1], {}, ["final"]])
    assert await wait(result) == "final"


# -- call timeout ----------------------------------------------------------------------------


async def test_call_timeout_gives_the_caller_wamp_error_timeout_quickly(client):
    callee = await client()
    caller = await client()
    await callee.register(Cancellable(), "com.slow")
    started = time.monotonic()
    error = await call_error(caller.call("com.slow", options=CallOptions(timeout=300)))
    assert error.error == "wamp.error.timeout"
    assert 0.25 < time.monotonic() - started < 1.5


async def test_call_timeout_sends_killnowait_interrupt_and_drops_the_late_answer(raw):
    callee = await raw(CALLEE_ROLES)
    await raw_register(callee, "com.slow.raw")
    caller = await raw(CALLER_ROLES)
    caller.send([CALL, 1, {"timeout": 200}, "com.slow.raw"])
    invocation = await callee.receive(2)
    assert invocation[0] == INVOCATION and invocation[3] == {"timeout": 200}
    assert await callee.receive(2) == [INTERRUPT, invocation[1],
                                       {"mode": "killnowait", "reason": "wamp.error.timeout"}]
    assert (await caller.receive(2))[:5] == [ERROR, CALL, 1, {}, "wamp.error.timeout"]
    callee.send([YIELD, invocation[1], {}, ["too late"]])
    assert await nothing_more(caller)


# -- call cancel -----------------------------------------------------------------------------


async def test_cancelling_an_autobahn_call_cancels_the_future_and_interrupts_the_callee(client):
    callee = await client()
    caller = await client("rawsocket-tcp", "msgpack")
    slow = Cancellable()
    await callee.register(slow, "com.slow")
    call = caller.call("com.slow", 1)
    assert await wait(slow.started) == (1,)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await wait(slow.cancelled) is True
    # the caller session is still healthy (the router's ERROR for the CANCEL was absorbed)
    await callee.register(lambda: "ok", "com.after")
    assert await wait(caller.call("com.after")) == "ok"


async def test_cancelling_one_call_leaves_the_other_calls_of_the_caller_running(client):
    callee = await client()
    caller = await client()
    slow = Cancellable()
    release = future()

    async def held():
        return await release

    await callee.register(slow, "com.slow")
    await callee.register(held, "com.held")
    kept = caller.call("com.held")
    canceled = caller.call("com.slow")
    await wait(slow.started)
    canceled.cancel()
    assert await wait(slow.cancelled) is True
    release.set_result("kept")
    assert await wait(kept) == "kept"


async def raw_call_in_progress(client, raw, callee_roles: dict[str, Any] | None = None):
    """A raw caller with a CALL (request 1) pending on a callee. The callee is an autobahn
    session running a Cancellable, or with ``callee_roles`` a raw peer that holds the call."""
    if callee_roles is None:
        callee = await client()
        slow = Cancellable()
        await callee.register(slow, "com.slow")
    else:
        callee = await raw(callee_roles)
        await raw_register(callee, "com.slow")
        slow = None
    caller = await raw(CALLER_ROLES)
    caller.send([CALL, 1, {}, "com.slow", ["x"]])
    if slow is not None:
        assert await wait(slow.started) == ("x",)
    return caller, callee, slow


# -- sessions leaving mid-call ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["goodbye", "disconnect"])
async def test_callee_leaving_mid_call_gives_the_caller_wamp_error_canceled(client, how):
    callee = await client("rawsocket-unix", "cbor")
    caller = await client()
    slow = Cancellable()
    await callee.register(slow, "com.slow")
    call = caller.call("com.slow")
    await wait(slow.started)
    if how == "goodbye":
        await wait(callee.leave())
    else:
        callee.disconnect()
    assert (await call_error(call)).error == "wamp.error.canceled"
    assert (await call_error(caller.call("com.slow"))).error == "wamp.error.no_such_procedure"
    await slow.release()


async def test_caller_leaving_mid_call_interrupts_the_callee(client):
    callee = await client()
    caller = await client("rawsocket-tcp", "json")
    slow = Cancellable()
    await callee.register(slow, "com.slow")
    call = caller.call("com.slow")
    await wait(slow.started)
    await wait(caller.leave())
    assert await wait(slow.cancelled) is True
    with contextlib.suppress(BaseException):
        await wait(call)


async def test_router_keeps_serving_the_callee_after_a_caller_left_mid_call(client, raw):
    callee = await raw(PLAIN_CALLEE_ROLES)
    await raw_register(callee, "com.held")
    leaving = await client()
    call = leaving.call("com.held")
    invocation = await callee.receive(2)
    leaving.disconnect()
    await wait(leaving.disconnected)
    with contextlib.suppress(BaseException):
        await wait(call)
    callee.send([YIELD, invocation[1], {}, ["nobody listens"]])  # must be dropped quietly
    caller = await client()
    second = asyncio.ensure_future(caller.call("com.held", 2))
    invocation2 = await callee.receive(2)
    assert invocation2[0] == INVOCATION and invocation2[4] == [2]
    callee.send([YIELD, invocation2[1], {}, ["served"]])
    assert await wait(second) == "served"
