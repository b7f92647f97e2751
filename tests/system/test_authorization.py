"""Authorization seen from real autobahn-python clients over real sockets: which role may
publish, subscribe, call and register where, which rule decides (the most specific one),
disclosure of publishers and callers, the meta API, and reload of permissions.

Each test proves one behaviour and is named after it. Every session authenticates by ticket
as one of the users of AUTHZ (one user per role). The worker role carries the rules under
test; admin may do anything, and serves as the other end (subscriber, callee, caller).
URIs use short codes (pub, sub, rpc, reg) so that a denial's message naming the action is
not satisfied by the URI alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import tomllib
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import (
    CallDetails,
    EventDetails,
    PublishOptions,
    RegisterOptions,
    SubscribeOptions,
)

from cairn.gateway.core import config as cfg
from cairn.gateway.core.session import Outbox
from harness.wamp_client import Client, connect
from tests.conftest import RunningRouter, start_router

TIMEOUT = 30  # s: a guard against a hang, never a negative wait (2 s failed on a loaded CI)
NOT_AUTHORIZED = "wamp.error.not_authorized"
ACTIONS = ("publish", "subscribe", "call", "register")
KINDS = ("exact", "prefix", "wildcard")
CODE = {"publish": "pub", "subscribe": "sub", "call": "rpc", "register": "reg"}


def rule(uri: str, match: str, allow: tuple[str, ...] | list[str],
         disclose: bool = False) -> str:
    actions = ", ".join(f'"{a}"' for a in allow)
    return (f'{{ uri = "{uri}", match = "{match}", allow = [{actions}]'
            f'{", disclose = true" if disclose else ""} }}')


# -- action x rule kind: a "yes" rule allows only the action, a "no" rule all but it -------


def pattern(kind: str, action: str, verdict: str) -> str:
    code = CODE[action]
    return {"exact": f"ex.{code}.{verdict}", "prefix": f"pre.{code}.{verdict}.",
            "wildcard": f"wild.{code}..{verdict}"}[kind]


def concrete(kind: str, action: str, verdict: str) -> str:
    """A URI the pattern matches (and no other rule does)."""
    p = pattern(kind, action, verdict)
    return {"exact": p, "prefix": f"{p}x", "wildcard": p.replace("..", ".x.")}[kind]


MATRIX = [
    r for kind in KINDS for action in ACTIONS for r in (
        rule(pattern(kind, action, "yes"), kind, [action]),
        rule(pattern(kind, action, "no"), kind, [a for a in ACTIONS if a != action]),
    )
]

SPECIFICITY = [
    # exact beats wildcard
    rule("ew..t", "wildcard", ["publish", "subscribe"]),
    rule("ew.a.t", "exact", ["subscribe"]),
    # wildcard beats prefix, even a longer one
    rule("wp.", "prefix", ["publish", "subscribe"]),
    rule("wp.long.", "prefix", ["publish", "subscribe"]),
    rule("wp..t", "wildcard", ["subscribe"]),
    # exact beats prefix
    rule("ep.", "prefix", ["publish", "subscribe"]),
    rule("ep.t", "exact", ["subscribe"]),
    # the longer prefix beats the shorter
    rule("pp.", "prefix", ["publish", "subscribe"]),
    rule("pp.ro.", "prefix", ["subscribe"]),
    # the wildcard with more fixed text beats the one with less
    rule("ww..", "wildcard", ["publish", "subscribe"]),
    rule("ww.a.", "wildcard", ["subscribe"]),
    # a narrower rule grants what the broader one does not
    rule("grant.", "prefix", ["subscribe"]),
    rule("grant.open", "exact", ["publish"]),
    # a narrower rule with no actions denies everything under it
    rule("lock.", "prefix", ACTIONS),
    rule("lock.down", "exact", []),
]

DISCLOSURE = [
    rule("disc.on.", "prefix", ["publish", "call"], disclose=True),
    rule("disc.off.", "prefix", ["publish", "call"]),
    rule("disc.on.quiet.", "prefix", ["publish", "call"]),
    rule("disc.off.loud.", "prefix", ["publish", "call"], disclose=True),
]

PATTERNS = [
    # may register a pattern under svc., but may not register anything under svc.admin.
    rule("svc.", "prefix", ["register"]),
    rule("svc.admin.", "prefix", []),
]

WORKER_RULES = MATRIX + SPECIFICITY + DISCLOSURE + PATTERNS

ROLES = {
    "admin": [rule("", "prefix", ACTIONS)],
    "monitor": [rule("wamp.", "prefix", ["call"]), rule("sensor", "prefix", ["subscribe"])],
    "outsider": [rule("wamp.", "prefix", ["call"]), rule("other.", "prefix", ["subscribe"])],
}


def authz_toml(data_dir: Path, worker_rules: list[str]) -> str:
    roles = {**ROLES, "worker": worker_rules}
    text = (f'[router]\nlisten = "127.0.0.1:0"\nrawsocket = ["127.0.0.1:0"]\n'
            f'data_dir = "{data_dir}"\n\n[[realms]]\nname = "authz"\n')
    for name, rules in roles.items():
        text += (f'\n  [[realms.roles]]\n  name = "{name}"\n  permissions = [\n'
                 + "".join(f"    {r},\n" for r in rules) + "  ]\n")
    for name in roles:
        text += (f'\n  [[realms.users]]\n  authid = "{name}"\n  role = "{name}"\n'
                 f'  secret = "{name}-secret"\n')
    return text + '\n  [[realms.history]]\n  uri = "sensor"\n  match = "prefix"\n'


class Authz:
    """One in-process router on AUTHZ; ``await authz.join(role)`` logs in as that role."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.sessions: list[Client] = []
        self.node: Any = None

    async def start(self) -> Authz:
        self.node = await start_router(authz_toml(self.data_dir, WORKER_RULES))
        self.running = RunningRouter(self.node, "")
        return self

    async def join(self, role: str) -> Client:
        session = await connect(self.running, "websocket", "json", realm="authz",
                                authmethods=["ticket"], authid=role, secret=f"{role}-secret")
        self.sessions.append(session)
        return session

    def reload(self, worker_rules: list[str]) -> None:
        """What SIGHUP does, with the worker's permissions replaced."""
        config = cfg.parse(tomllib.loads(authz_toml(self.data_dir, worker_rules)), "test.toml")
        out = Outbox(self.node.state.clock.now)
        self.node.router.reload(config, out)
        self.node.flush(out)

    async def close(self) -> None:
        for session in self.sessions:
            with contextlib.suppress(Exception):
                if session.is_attached():
                    await asyncio.wait_for(session.leave(), 2)
        await self.node.stop()


@pytest.fixture
async def authz(tmp_path):
    router = await Authz(tmp_path / "data").start()
    yield router
    await router.close()


@pytest.fixture
async def worker_and_admin(authz):
    return await authz.join("worker"), await authz.join("admin")


async def perform(action: str, uri: str, actor: Client, admin: Client) -> None:
    """Do ``action`` on ``uri`` as ``actor``; raises ApplicationError when refused. A call
    goes to a procedure ``admin`` registered, so a refusal is not for want of a callee."""
    if action == "publish":
        await asyncio.wait_for(
            actor.publish(uri, "x", options=PublishOptions(acknowledge=True)), TIMEOUT)
    elif action == "subscribe":
        await asyncio.wait_for(actor.subscribe(lambda *args: None, uri), TIMEOUT)
    elif action == "call":
        await asyncio.wait_for(admin.register(lambda: "pong", uri), TIMEOUT)
        assert await asyncio.wait_for(actor.call(uri), TIMEOUT) == "pong"
    else:
        await asyncio.wait_for(actor.register(lambda: None, uri), TIMEOUT)


async def refusal(action: str, uri: str, actor: Client, admin: Client) -> str:
    """The message of the not_authorized error ``action`` on ``uri`` fails with."""
    with pytest.raises(ApplicationError) as refused:
        await perform(action, uri, actor, admin)
    assert refused.value.error == NOT_AUTHORIZED, refused.value
    return refused.value.args[0]


async def allowed(action: str, uri: str, actor: Client, admin: Client) -> bool:
    try:
        await perform(action, uri, actor, admin)
    except ApplicationError as e:
        assert e.error == NOT_AUTHORIZED, e
        return False
    return True


CELLS = [pytest.param(action, kind, id=f"{action}-{kind}") for action in ACTIONS
         for kind in KINDS]


# -- each action x each rule kind ---------------------------------------------------------


@pytest.mark.parametrize("action, kind", CELLS)
async def test_a_rule_listing_the_action_allows_it(worker_and_admin, action, kind):
    worker, admin = worker_and_admin
    await perform(action, concrete(kind, action, "yes"), worker, admin)


@pytest.mark.parametrize("action, kind", CELLS)
async def test_a_rule_not_listing_the_action_denies_it_naming_uri_and_action(
        worker_and_admin, action, kind):
    worker, admin = worker_and_admin
    uri = concrete(kind, action, "no")
    message = await refusal(action, uri, worker, admin)
    assert uri in message and action in message


@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_no_rule_matches_is_denied(worker_and_admin, action):
    worker, admin = worker_and_admin
    message = await refusal(action, "nowhere.at.all", worker, admin)
    assert "nowhere.at.all" in message and action in message


# -- the most specific rule decides ---------------------------------------------------------


# (the URI the more specific rule refuses to publish on, one only the broader rule matches)
MORE_SPECIFIC = [
    pytest.param("ew.a.t", "ew.b.t", id="an_exact_rule_beats_a_wildcard_rule"),
    pytest.param("wp.a.t", "wp.a.u", id="a_wildcard_rule_beats_a_prefix_rule"),
    pytest.param("wp.long.t", "wp.long.u", id="a_wildcard_rule_beats_even_a_longer_prefix_rule"),
    pytest.param("ep.t", "ep.u", id="an_exact_rule_beats_a_prefix_rule"),
    pytest.param("pp.ro.x", "pp.rw.x", id="a_longer_prefix_beats_a_shorter_one"),
    pytest.param("ww.a.x", "ww.b.x", id="a_wildcard_with_more_fixed_text_beats_one_with_less"),
]


@pytest.mark.parametrize("specific, broader", MORE_SPECIFIC)
async def test_the_more_specific_rule_decides(worker_and_admin, specific, broader):
    worker, admin = worker_and_admin
    assert not await allowed("publish", specific, worker, admin)
    assert await allowed("publish", broader, worker, admin)


async def test_the_more_specific_rule_still_allows_what_it_lists(worker_and_admin):
    worker, admin = worker_and_admin
    for uri in (case.values[0] for case in MORE_SPECIFIC):
        assert await allowed("subscribe", uri, worker, admin), uri


async def test_a_narrower_rule_grants_what_the_broader_one_does_not(worker_and_admin):
    worker, admin = worker_and_admin
    assert await allowed("publish", "grant.open", worker, admin)
    assert not await allowed("publish", "grant.other", worker, admin)


@pytest.mark.parametrize("action", ACTIONS)
async def test_a_narrower_rule_without_actions_denies_what_a_broader_one_allows(
        worker_and_admin, action):
    worker, admin = worker_and_admin
    await refusal(action, "lock.down", worker, admin)


# -- pattern registrations ------------------------------------------------------------------


async def test_a_pattern_registration_gets_calls_to_procedures_its_role_may_register(
        worker_and_admin):
    worker, admin = worker_and_admin
    await worker.register(lambda *args: "served", "svc.",
                          options=RegisterOptions(match="prefix"))
    assert await asyncio.wait_for(admin.call("svc.status"), TIMEOUT) == "served"


async def test_a_pattern_registration_gets_no_calls_to_procedures_its_role_may_not_register(
        worker_and_admin):
    worker, admin = worker_and_admin
    invoked: list[tuple[Any, ...]] = []
    await worker.register(lambda *args: invoked.append(args), "svc.",
                          options=RegisterOptions(match="prefix"))
    with pytest.raises(ApplicationError) as refused:
        await asyncio.wait_for(admin.call("svc.admin.reset", "admin-token"), TIMEOUT)
    assert refused.value.error == "wamp.error.no_such_procedure"
    assert invoked == []


# -- disclosure ---------------------------------------------------------------------------


async def published_event(worker: Client, admin: Client, topic: str) -> EventDetails:
    """The details of the event ``admin`` receives when ``worker`` publishes to ``topic``."""
    received: asyncio.Future = asyncio.get_running_loop().create_future()
    await admin.subscribe(lambda *args, details: received.set_result(details), topic,
                          options=SubscribeOptions(details_arg="details"))
    await asyncio.wait_for(
        worker.publish(topic, "x", options=PublishOptions(acknowledge=True)), TIMEOUT)
    return await asyncio.wait_for(received, TIMEOUT)


async def invocation(worker: Client, admin: Client, procedure: str) -> CallDetails:
    """The details of the invocation ``admin`` gets when ``worker`` calls ``procedure``."""
    got: list[CallDetails] = []

    def callee(*args: Any, details: CallDetails) -> None:
        got.append(details)

    await admin.register(callee, procedure, options=RegisterOptions(details_arg="details"))
    await asyncio.wait_for(worker.call(procedure), TIMEOUT)
    return got[0]


def publisher(details: EventDetails) -> tuple[Any, Any, Any]:
    return details.publisher, details.publisher_authid, details.publisher_authrole


def caller(details: CallDetails) -> tuple[Any, Any, Any]:
    return details.caller, details.caller_authid, details.caller_authrole


def who(session: Client) -> tuple[int, str, str]:
    return session.session_id, "worker", "worker"


# what admin is told of the worker when it publishes or calls: the event's or the
# invocation's details, and who they name
TOLD = {"publish": (published_event, publisher), "call": (invocation, caller)}


@pytest.mark.parametrize("action, uri, disclosed", [
    pytest.param("publish", "disc.on.t", True, id="a_disclosing_rule_reveals_the_publisher"),
    pytest.param("publish", "disc.off.t", False,
                 id="without_a_disclosing_rule_the_publisher_is_absent"),
    pytest.param("call", "disc.on.p", True, id="a_disclosing_rule_reveals_the_caller"),
    pytest.param("call", "disc.off.p", False, id="without_a_disclosing_rule_the_caller_is_absent"),
    pytest.param("publish", "disc.on.quiet.t", False,
                 id="a_narrower_rule_without_disclose_hides_the_publisher_a_broader_rule_discloses"),
    pytest.param("call", "disc.off.loud.p", True,
                 id="a_narrower_disclosing_rule_reveals_the_caller_a_broader_rule_hides"),
])
async def test_the_deciding_rule_says_whether_the_worker_is_disclosed(worker_and_admin, action,
                                                                      uri, disclosed):
    worker, admin = worker_and_admin
    details_of, named = TOLD[action]
    details = await details_of(worker, admin, uri)
    assert named(details) == (who(worker) if disclosed else (None, None, None))


# -- the meta API -------------------------------------------------------------------------

META_PROCEDURES = ["wamp.session.count", "wamp.session.list", "wamp.session.get",
                   "wamp.subscription.list", "wamp.subscription.lookup",
                   "wamp.registration.list", "wamp.subscription.get_events"]


@pytest.mark.parametrize("procedure", META_PROCEDURES)
async def test_a_role_without_permission_on_wamp_cannot_call_the_meta_api(authz, procedure):
    worker = await authz.join("worker")
    with pytest.raises(ApplicationError) as refused:
        await asyncio.wait_for(worker.call(procedure), TIMEOUT)
    assert refused.value.error == NOT_AUTHORIZED
    assert procedure in refused.value.args[0] and "call" in refused.value.args[0]


async def test_a_role_granted_the_wamp_prefix_can_call_the_meta_api(authz):
    monitor = await authz.join("monitor")
    await authz.join("worker")
    assert await asyncio.wait_for(monitor.call("wamp.session.count"), TIMEOUT) == 2
    details = await asyncio.wait_for(monitor.call("wamp.session.get", monitor.session_id),
                                     TIMEOUT)
    assert details["authid"] == "monitor"


async def history_subscription(authz: Authz) -> tuple[int, Client]:
    """The id of the history subscription on ``sensor`` (prefix), after admin published a
    reading there; and admin."""
    admin = await authz.join("admin")
    await asyncio.wait_for(
        admin.publish("sensor.t1", 21.5, options=PublishOptions(acknowledge=True)), TIMEOUT)
    sub_id = await asyncio.wait_for(
        admin.call("wamp.subscription.lookup", "sensor", {"match": "prefix"}), TIMEOUT)
    assert isinstance(sub_id, int)
    return sub_id, admin


async def test_get_events_is_refused_without_subscribe_permission_on_the_topic(authz):
    sub_id, _ = await history_subscription(authz)
    outsider = await authz.join("outsider")
    with pytest.raises(ApplicationError) as refused:
        await asyncio.wait_for(outsider.call("wamp.subscription.get_events", sub_id), TIMEOUT)
    assert refused.value.error == NOT_AUTHORIZED
    assert "sensor" in refused.value.args[0]


async def test_get_events_returns_history_with_subscribe_permission_on_the_topic(authz):
    sub_id, _ = await history_subscription(authz)
    monitor = await authz.join("monitor")
    result = await asyncio.wait_for(monitor.call("wamp.subscription.get_events", sub_id),
                                    TIMEOUT)
    assert [e["args"] for e in result.results[0]] == [[21.5]]


# -- reload -------------------------------------------------------------------------------


async def test_reload_forgets_cached_decisions_so_a_revoked_action_is_denied(authz):
    worker, admin = await authz.join("worker"), await authz.join("admin")
    uri = concrete("exact", "publish", "yes")
    await perform("publish", uri, worker, admin)  # allowed, and now cached
    authz.reload(without(uri))
    await refusal("publish", uri, worker, admin)
    assert worker.is_attached()


async def test_reload_forgets_cached_denials_so_a_granted_action_is_allowed(authz):
    worker, admin = await authz.join("worker"), await authz.join("admin")
    uri = concrete("exact", "publish", "no")
    await refusal("publish", uri, worker, admin)  # denied, and now cached
    authz.reload([rule(uri, "exact", ACTIONS) if f'"{uri}"' in r else r for r in WORKER_RULES])
    await perform("publish", uri, worker, admin)


def without(uri: str) -> list[str]:
    """The worker's rules without the one for ``uri``."""
    return [r for r in WORKER_RULES if f'"{uri}"' not in r]


SENTINEL = "--sentinel--"


async def acked(session: Client, topic: str, value: Any) -> None:
    await asyncio.wait_for(
        session.publish(topic, value, options=PublishOptions(acknowledge=True)), TIMEOUT)


async def test_reload_revoking_subscribe_stops_events_to_an_existing_exact_subscription(authz):
    worker, admin = await authz.join("worker"), await authz.join("admin")
    revoked, kept = concrete("exact", "subscribe", "yes"), concrete("prefix", "subscribe", "yes")
    inbox: asyncio.Queue = asyncio.Queue()
    await worker.subscribe(inbox.put_nowait, revoked)
    await worker.subscribe(inbox.put_nowait, kept)
    authz.reload(without(revoked))
    await acked(admin, revoked, "after the revocation")
    await acked(admin, kept, SENTINEL)
    assert await asyncio.wait_for(inbox.get(), TIMEOUT) == SENTINEL


async def test_reload_revoking_subscribe_stops_events_to_an_existing_pattern_subscription(
        authz):
    worker, admin = await authz.join("worker"), await authz.join("admin")
    pattern_uri = pattern("prefix", "subscribe", "yes")
    kept = concrete("exact", "subscribe", "yes")
    inbox: asyncio.Queue = asyncio.Queue()
    await worker.subscribe(inbox.put_nowait, pattern_uri,
                           options=SubscribeOptions(match="prefix"))
    await worker.subscribe(inbox.put_nowait, kept)
    authz.reload(without(pattern_uri))
    await acked(admin, f"{pattern_uri}x", "after the revocation")
    await acked(admin, kept, SENTINEL)
    assert await asyncio.wait_for(inbox.get(), TIMEOUT) == SENTINEL


async def test_reload_revoking_register_stops_calls_to_an_existing_registration(authz):
    worker, admin = await authz.join("worker"), await authz.join("admin")
    uri = concrete("exact", "register", "yes")
    invoked: list[tuple[Any, ...]] = []
    await worker.register(lambda *args: invoked.append(args), uri)
    authz.reload(without(uri))
    with pytest.raises(ApplicationError) as refused:
        await asyncio.wait_for(admin.call(uri), TIMEOUT)
    assert refused.value.error == "wamp.error.no_such_procedure"
    assert invoked == []
