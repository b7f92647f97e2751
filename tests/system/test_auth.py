"""Authentication seen from real autobahn-python clients over real sockets: ticket, wampcra
(plain and salted), cryptosign and anonymous; secrets from files and the environment; the
throttle of failed logins (per source and user, per LAN address, per user for the sources that
failed for it); TLS listeners; reload of users and roles on SIGHUP.

Each test proves one behaviour and is named after it. Handshakes autobahn would never do
(replayed or malformed signatures, AUTHENTICATE out of turn) are done by hand over RawSocket
with :class:`harness.wamp_client.RawSocketPeer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
from autobahn.asyncio.rawsocket import WampRawSocketClientFactory
from autobahn.asyncio.websocket import WampWebSocketClientFactory
from autobahn.wamp import auth, types
from autobahn.wamp.cryptosign import CryptosignKey
from autobahn.wamp.serializer import JsonSerializer
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core import config as cfg
from cairn.gateway.core.auth import AuthThrottle, Peer
from harness.config import EVERYTHING, permission, realm, role, user
from harness.process import ROOT, RouterProcess
from harness.wamp import ABORT, AUTHENTICATE, CHALLENGE, HELLO, WELCOME
from harness.wamp_client import Client, RawSocketPeer, connect
from tests.conftest import RunningRouter, start_router
from tests.system.test_hostile_clients import lan_address

TIMEOUT = 5

# WAMP message codes for the hand-made handshakes

AUTH_FAILED = "wamp.error.authentication_failed"


def new_key() -> CryptosignKey:
    return CryptosignKey(nacl.signing.SigningKey.generate(), can_sign=True)


@dataclass(frozen=True)
class Login:
    """A configured user and what its client holds: a secret (ticket, wampcra) or a key."""

    method: str
    authid: str
    role: str
    secret: str | None = None
    key: CryptosignKey | None = None

    def client_kwargs(self, **override: Any) -> dict[str, Any]:
        kwargs = {"authmethods": [self.method], "authid": self.authid, "secret": self.secret,
                  "cryptosign_key": self.key}
        kwargs.update(override)
        return kwargs

    def wrong(self) -> dict[str, Any]:
        """Client arguments with the right authid and a wrong secret (cryptosign: a key the
        user does not have)."""
        if self.method == "cryptosign":
            return self.client_kwargs(cryptosign_key=new_key())
        return self.client_kwargs(secret=f"wrong-{self.secret}")

    def unknown(self) -> dict[str, Any]:
        """Client arguments for an authid no realm knows."""
        if self.method == "cryptosign":
            return self.client_kwargs(authid="nobody", cryptosign_key=new_key())
        return self.client_kwargs(authid="nobody")


SALT, ITERATIONS, KEYLEN = "NaCl-and-pepper", 100, 32
LOGINS = {
    "ticket": Login("ticket", "tina", "operator", secret="ticket-secret-7f3a"),
    "wampcra": Login("wampcra", "walt", "viewer", secret="cra-secret-91bd"),
    "wampcra-salted": Login("wampcra", "sally", "operator", secret="salted-password-c4e2"),
    "cryptosign": Login("cryptosign", "cora", "viewer", key=new_key()),
}
METHODS = list(LOGINS)
TINA, WALT, SALLY, CORA = (LOGINS[k] for k in METHODS)

ROLES = (role("operator", permission("", EVERYTHING))
         + role("viewer", permission("", ["subscribe"])))


def router_toml(data_dir: Path, realms: str, listen: str = "127.0.0.1:0",
                rawsocket: str = '["127.0.0.1:0"]', extra: str = "") -> str:
    return (f'[router]\nlisten = "{listen}"\nrawsocket = {rawsocket}\n'
            f'data_dir = "{data_dir}"\n{extra}\n{realms}')


SECURE_REALM = realm(
    "secure", ROLES,
    user(TINA.authid, TINA.role, secret=TINA.secret),
    user(WALT.authid, WALT.role, secret=WALT.secret),
    user(SALLY.authid, SALLY.role,
         secret=auth.derive_key(SALLY.secret, SALT, ITERATIONS, KEYLEN).decode(),
         salt=SALT, iterations=ITERATIONS, keylen=KEYLEN),
    user(CORA.authid, CORA.role, pubkeys=[CORA.key.public_key()]),
) + realm("public", role("guest", permission("", ["subscribe"])),
          user("pat", "guest", secret="pat-secret"), anonymous_role="guest")


def parse(text: str) -> cfg.Config:
    return cfg.parse(tomllib.loads(text), "test.toml")


@pytest.fixture
async def secure(tmp_path):
    """A router with realm "secure" (the four users of LOGINS, no anonymous role) and realm
    "public" (anonymous role "guest"), on 127.0.0.1 and a Unix socket."""
    unix_path = tmp_path / "wamp.sock"
    node = await start_router(router_toml(tmp_path / "data", SECURE_REALM,
                                          rawsocket=f'["127.0.0.1:0", "unix:{unix_path}"]'))
    yield RunningRouter(node, str(unix_path))
    await node.stop()


@pytest.fixture
async def login(secure):
    """Join ``secure`` (or another realm): ``await login(realm, **client_kwargs)``; every
    session is left at teardown."""
    opened: list[Client] = []

    async def make(realm: str = "secure", transport: str = "websocket",
                   local_addr: tuple[str, int] | None = None, **kwargs: Any) -> Client:
        session = await connect(secure, transport, "json", realm=realm, local_addr=local_addr,
                                **kwargs)
        opened.append(session)
        return session

    yield make
    await leave_all(opened)


async def leave_all(sessions: list[Client]) -> None:
    for session in sessions:
        with contextlib.suppress(Exception):
            if session.is_attached():
                await asyncio.wait_for(session.leave(), 2)


async def refusal(router: Any, realm: str = "secure", transport: str = "websocket",
                  local_addr: tuple[str, int] | None = None, **kwargs: Any) -> tuple[str, str]:
    """Try to join and return (reason, message) of the ABORT that refuses the session."""
    with pytest.raises(ConnectionRefusedError) as refused:
        await connect(router, transport, "json", realm=realm, local_addr=local_addr, **kwargs)
    reason, _, message = str(refused.value).partition(": ")
    return reason, message


@pytest.fixture
async def raw(secure):
    """Hand-made RawSocket/JSON handshakes: ``peer, reply = await raw.hello(...)``."""
    peers: list[RawSocketPeer] = []

    class Raw:
        @staticmethod
        async def hello(realm: str = "secure", authmethods: list[str] | None = None,
                        authid: str | None = None,
                        authextra: dict[str, Any] | None = None) -> tuple[RawSocketPeer, Any]:
            peer = await RawSocketPeer.open(secure.rawsocket_port, "json")
            peers.append(peer)
            details: dict[str, Any] = {"roles": {"subscriber": {}, "publisher": {}}}
            if authmethods is not None:
                details["authmethods"] = authmethods
            if authid is not None:
                details["authid"] = authid
            if authextra is not None:
                details["authextra"] = authextra
            peer.send([HELLO, realm, details])
            return peer, await peer.receive(TIMEOUT)

        @staticmethod
        async def open() -> RawSocketPeer:
            peer = await RawSocketPeer.open(secure.rawsocket_port, "json")
            peers.append(peer)
            return peer

    yield Raw
    for peer in peers:
        peer.close()


async def cryptosign_challenge(raw: Any, login: Login = CORA) -> tuple[RawSocketPeer, Any]:
    assert login.key is not None
    peer, challenge = await raw.hello(authmethods=["cryptosign"], authid=login.authid,
                                      authextra={"pubkey": login.key.public_key()})
    assert challenge[:2] == [CHALLENGE, "cryptosign"], challenge
    return peer, challenge


async def cryptosign_signature(key: CryptosignKey, challenge: list[Any]) -> str:
    """What autobahn answers: hex(Ed25519 signature of the challenge + the challenge)."""
    return await key.sign_challenge(types.Challenge("cryptosign", challenge[2]))


async def wampcra_challenge(raw: Any, login: Login = WALT) -> tuple[RawSocketPeer, Any]:
    peer, challenge = await raw.hello(authmethods=["wampcra"], authid=login.authid)
    assert challenge[:2] == [CHALLENGE, "wampcra"], challenge
    return peer, challenge


def wampcra_signature(secret: str, challenge: list[Any]) -> str:
    extra = challenge[2]
    key = secret.encode()
    if "salt" in extra:
        key = auth.derive_key(secret, extra["salt"], extra["iterations"], extra["keylen"])
    return auth.compute_wcs(key, extra["challenge"]).decode("ascii")


def abort_reason(reply: Any) -> str:
    assert reply is not None and reply[0] == ABORT, reply
    return reply[2]


# -- each method: the right secret, a wrong one, an unknown user ------------------------


@pytest.mark.parametrize("method", METHODS)
async def test_login_with_the_right_secret_is_welcomed_with_authid_authrole_and_method(
        login, method):
    user = LOGINS[method]
    session = await login(**user.client_kwargs())
    details = session.welcome_details
    assert (details.authid, details.authrole, details.authmethod, details.authprovider) == \
        (user.authid, user.role, user.method, "static")


@pytest.mark.parametrize("method", METHODS)
async def test_login_with_a_wrong_secret_is_aborted_as_authentication_failed(secure, method):
    reason, _ = await refusal(secure, **LOGINS[method].wrong())
    assert reason == AUTH_FAILED


@pytest.mark.parametrize("method", METHODS)
async def test_login_of_an_unknown_user_is_refused_exactly_like_a_wrong_secret(secure, method):
    user = LOGINS[method]
    unknown = await refusal(secure, **user.unknown())
    wrong = await refusal(secure, **user.wrong())
    assert unknown == wrong
    assert unknown[0] == AUTH_FAILED
    assert "nobody" not in unknown[1] and user.authid not in wrong[1]


@pytest.mark.parametrize("method", ["ticket", "wampcra"])
async def test_an_unknown_user_is_challenged_like_a_known_one(raw, method):
    unknown, unknown_challenge = await raw.hello(authmethods=[method], authid="nobody")
    like = SALLY if "salt" in unknown_challenge[2] else WALT  # salted or not, as users are
    _, known_challenge = await raw.hello(authmethods=[method], authid=like.authid)
    assert unknown_challenge[:2] == known_challenge[:2] == [CHALLENGE, method]
    assert set(unknown_challenge[2]) == set(known_challenge[2])  # same keys: salt and all
    if method == "wampcra":
        unknown.send([AUTHENTICATE, wampcra_signature(SALLY.secret, unknown_challenge), {}])
    else:
        unknown.send([AUTHENTICATE, SALLY.secret, {}])
    assert abort_reason(await unknown.receive()) == AUTH_FAILED


async def test_salted_wampcra_challenge_carries_the_users_salt_iterations_and_keylen(raw):
    _, challenge = await wampcra_challenge(raw, SALLY)
    extra = challenge[2]
    assert (extra["salt"], extra["iterations"], extra["keylen"]) == (SALT, ITERATIONS, KEYLEN)


async def test_unsalted_wampcra_challenge_carries_no_salt(raw):
    _, challenge = await wampcra_challenge(raw, WALT)
    assert "salt" not in challenge[2]


async def test_wampcra_challenges_carry_no_role_and_the_same_fields_for_known_and_unknown(raw):
    signed = []
    for authid in (WALT.authid, SALLY.authid, "nobody"):
        _, challenge = await raw.hello(authmethods=["wampcra"], authid=authid)
        signed.append(json.loads(challenge[2]["challenge"]))
    assert {frozenset(fields) for fields in signed} == {frozenset(signed[0])}
    assert "authrole" not in signed[0]
    assert not {WALT.role, SALLY.role} & {str(value) for value in signed[0].values()}


async def test_unknown_users_are_salted_or_not_as_users_are_and_the_same_every_time(raw):
    """Realm "secure" mixes salted (sally) and unsalted (tina, walt) users: were every unknown
    authid salted (or none), an unsalted (salted) challenge would prove a user exists."""
    shapes = {}
    for i in range(32):
        authid = f"nobody-{i}"
        _, first = await raw.hello(authmethods=["wampcra"], authid=authid)
        _, again = await raw.hello(authmethods=["wampcra"], authid=authid)
        assert first[2].get("salt") == again[2].get("salt"), authid
        shapes[authid] = "salt" in first[2]
    assert set(shapes.values()) == {True, False}


async def decoy_salts(router: RouterProcess, authids: list[str]) -> dict[str, Any]:
    salts = {}
    for authid in authids:
        peer = await RawSocketPeer.open(router.rawsocket_port, "json")
        peer.send([HELLO, "secure", {"roles": {"subscriber": {}}, "authmethods": ["wampcra"],
                                     "authid": authid}])
        challenge = await peer.receive(TIMEOUT)
        peer.close()
        assert challenge is not None and challenge[0] == CHALLENGE, challenge
        salts[authid] = challenge[2].get("salt")
    return salts


async def test_unknown_users_keep_their_salts_across_a_sighup_and_a_restart(tmp_path):
    """The attack (N10): the decoy key was drawn per process, so across a reload or reboot
    unknown authids' salts changed while real users' stayed."""
    router = RouterProcess(tmp_path, SECURE_REALM).start()
    authids = [f"nobody-{i}" for i in range(16)] + [SALLY.authid]
    try:
        first = await decoy_salts(router, authids)
        router.proc.send_signal(signal.SIGHUP)
        await wait_for_log(router, RELOADED)
        reloaded = await decoy_salts(router, authids)
        router.stop()
        router.start()
        restarted = await decoy_salts(router, authids)
    finally:
        router.stop()
    assert first == reloaded == restarted
    assert any(salt is not None for salt in first.values())
    key = router.data_dir / "cra-decoy.key"
    assert key.stat().st_mode & 0o777 == 0o600


# -- cryptosign ---------------------------------------------------------------------------


async def test_cryptosign_without_authid_identifies_the_user_by_its_public_key(login):
    session = await login(authmethods=["cryptosign"], cryptosign_key=CORA.key)
    assert (session.welcome_details.authid, session.welcome_details.authrole) == \
        (CORA.authid, CORA.role)


async def test_cryptosign_signed_by_another_key_than_the_announced_one_is_refused(secure):
    reason, _ = await refusal(secure, **CORA.client_kwargs(
        cryptosign_key=new_key(), authextra={"pubkey": CORA.key.public_key()}))
    assert reason == AUTH_FAILED


@pytest.mark.parametrize("replayed", ["as-sent", "signature-only"])
async def test_cryptosign_signature_replayed_in_a_new_session_is_refused(raw, replayed):
    first, challenge = await cryptosign_challenge(raw)
    signature = await cryptosign_signature(CORA.key, challenge)
    first.send([AUTHENTICATE, signature, {}])
    welcome = await first.receive(TIMEOUT)
    assert welcome is not None and welcome[0] == WELCOME, welcome
    if replayed == "signature-only":  # without the 32 challenge bytes autobahn appends
        signature = signature[:128]

    second, _ = await cryptosign_challenge(raw)
    second.send([AUTHENTICATE, signature, {}])
    assert abort_reason(await second.receive(TIMEOUT)) == AUTH_FAILED


MALFORMED_SIGNATURES: dict[str, Callable[[str], str]] = {
    "not-hex": lambda good: "zz" * 96,
    "odd-length-hex": lambda good: good[:-1],
    "too-short": lambda good: good[:126],
    "too-long": lambda good: good + "00",
    "empty": lambda good: "",
    "signature-bit-flipped": lambda good: f"{int(good[0], 16) ^ 1:x}{good[1:]}",
}


@pytest.mark.parametrize("malformed", list(MALFORMED_SIGNATURES))
async def test_malformed_cryptosign_signature_is_refused(raw, malformed):
    peer, challenge = await cryptosign_challenge(raw)
    good = await cryptosign_signature(CORA.key, challenge)
    peer.send([AUTHENTICATE, MALFORMED_SIGNATURES[malformed](good), {}])
    assert abort_reason(await peer.receive(TIMEOUT)) == AUTH_FAILED


# -- wampcra ------------------------------------------------------------------------------


async def test_wampcra_signature_replayed_in_a_new_session_is_refused(raw):
    first, challenge = await wampcra_challenge(raw)
    signature = wampcra_signature(WALT.secret, challenge)
    first.send([AUTHENTICATE, signature, {}])
    welcome = await first.receive(TIMEOUT)
    assert welcome is not None and welcome[0] == WELCOME, welcome

    second, _ = await wampcra_challenge(raw)
    second.send([AUTHENTICATE, signature, {}])
    assert abort_reason(await second.receive(TIMEOUT)) == AUTH_FAILED


async def test_wampcra_challenge_names_the_session_and_a_fresh_nonce(raw):
    first, challenge = await wampcra_challenge(raw)
    _, other = await wampcra_challenge(raw)
    first.send([AUTHENTICATE, wampcra_signature(WALT.secret, challenge), {}])
    welcome = await first.receive(TIMEOUT)
    signed, signed_other = json.loads(challenge[2]["challenge"]), json.loads(other[2]["challenge"])
    assert signed["session"] == welcome[1]
    assert signed["nonce"] and signed["nonce"] != signed_other["nonce"]


# -- anonymous ----------------------------------------------------------------------------


async def test_anonymous_login_gets_the_realms_anonymous_role(login):
    session = await login(realm="public")
    details = session.welcome_details
    assert (details.authrole, details.authmethod) == ("guest", "anonymous")


async def test_anonymous_login_is_refused_with_no_auth_method_without_an_anonymous_role(secure):
    reason, _ = await refusal(secure, realm="secure")
    assert reason == "wamp.error.no_auth_method"


async def test_anonymous_session_cannot_take_the_authid_of_a_configured_user(login):
    session = await login(realm="public", authid="pat")
    assert session.welcome_details.authid.startswith("anonymous-")
    assert session.welcome_details.authrole == "guest"


async def test_anonymous_sessions_are_named_by_the_router_not_by_hello(login):
    """The attack (L4): HELLO with authid "anonymous-1234" and no credentials was welcomed
    under that name, which another anonymous session may have."""
    session = await login(realm="public", authid="anonymous-1234")
    other = await login(realm="public", authid="anonymous-1234")
    names = {session.welcome_details.authid, other.welcome_details.authid}
    assert "anonymous-1234" not in names and len(names) == 2
    assert all(name.startswith("anonymous-") for name in names)


async def test_ticket_falls_back_to_anonymous_when_offered_and_the_user_is_unknown(login):
    session = await login(realm="public", authmethods=["ticket", "anonymous"], authid="nobody",
                          secret="x")
    assert (session.welcome_details.authrole, session.welcome_details.authmethod) == \
        ("guest", "anonymous")


@pytest.mark.parametrize("authid", ["meter-1\nINFO cairn.router: forged", "meter-1\r",
                                    "\x1b[2Kmeter-1", "meter-1\u2028forged"])
@pytest.mark.parametrize("method", ["anonymous", "ticket"])
async def test_an_authid_with_control_characters_is_refused(secure, authid, method):
    reason, message = await refusal(secure, realm="public", authmethods=[method], authid=authid,
                                    secret="pat-secret")
    assert reason == "wamp.error.invalid_argument"
    assert "authid" in message and "control" in message


async def test_an_authid_longer_than_255_characters_is_refused(secure, login):
    reason, message = await refusal(secure, realm="public", authid="m" * 256)
    assert (reason, "authid" in message, "255" in message) == \
        ("wamp.error.invalid_argument", True, True)
    session = await login(realm="public", authid="m" * 255)
    assert session.welcome_details.authrole == "guest"


# -- protocol -----------------------------------------------------------------------------


async def test_authenticate_without_a_challenge_is_aborted(raw):
    peer = await raw.open()
    peer.send([AUTHENTICATE, "0" * 192, {}])
    assert abort_reason(await peer.receive(TIMEOUT)) == "wamp.error.protocol_violation"
    assert await peer.closed(TIMEOUT)


# -- secrets from a file or the environment -------------------------------------------------


def one_user_realm(secret_line: str) -> str:
    return realm("secure", ROLES, user("tina", "operator") + f"  {secret_line}\n")


class Routers:
    """Routers on other realm configs; each is stopped (its sessions left) at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.nodes: list[Any] = []
        self.sessions: list[Client] = []

    async def start(self, realms: str) -> RunningRouter:
        node = await start_router(router_toml(self.tmp_path / f"data{len(self.nodes)}", realms))
        self.nodes.append(node)
        return RunningRouter(node, "")

    async def join(self, router: RunningRouter, **kwargs: Any) -> Client:
        session = await connect(router, "websocket", "json", **kwargs)
        self.sessions.append(session)
        return session

    async def close(self) -> None:
        await leave_all(self.sessions)
        for node in self.nodes:
            await node.stop()


@pytest.fixture
async def routers(tmp_path):
    routers = Routers(tmp_path)
    yield routers
    await routers.close()


async def test_secret_file_holds_the_secret(routers, tmp_path):
    path = tmp_path / "tina.secret"
    path.write_text("from-a-file-5b1e\n")
    router = await routers.start(one_user_realm(f'secret_file = "{path}"'))
    session = await routers.join(router, realm="secure",
                                 **TINA.client_kwargs(secret="from-a-file-5b1e"))
    assert session.welcome_details.authid == "tina"


async def test_secret_env_holds_the_secret(routers, monkeypatch):
    monkeypatch.setenv("CAIRN_TEST_TINA_SECRET", "from-the-env-e07c")
    router = await routers.start(one_user_realm('secret_env = "CAIRN_TEST_TINA_SECRET"'))
    session = await routers.join(router, realm="secure",
                                 **TINA.client_kwargs(secret="from-the-env-e07c"))
    assert session.welcome_details.authid == "tina"


def test_missing_secret_file_is_a_config_error_naming_the_key(tmp_path):
    missing = tmp_path / "no-such.secret"
    with pytest.raises(cfg.ConfigError) as error:
        parse(router_toml(tmp_path, one_user_realm(f'secret_file = "{missing}"')))
    assert error.value.key == "realms[0].users[0].secret_file"
    assert str(missing) in error.value.problem


def test_unset_secret_env_is_a_config_error_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("CAIRN_TEST_UNSET_SECRET", raising=False)
    with pytest.raises(cfg.ConfigError) as error:
        parse(router_toml(tmp_path, one_user_realm('secret_env = "CAIRN_TEST_UNSET_SECRET"')))
    assert error.value.key == "realms[0].users[0].secret_env"
    assert "CAIRN_TEST_UNSET_SECRET" in error.value.problem


EMPTY_SECRETS = {  # how an empty secret gets into a config: the key named, the line
    "file-empty": ("secret_file", 'secret_file = "{dir}/empty.secret"'),
    "file-whitespace": ("secret_file", 'secret_file = "{dir}/blank.secret"'),
    "env-empty": ("secret_env", 'secret_env = "CAIRN_TEST_EMPTY_SECRET"'),
    "inline-empty": ("secret", 'secret = ""'),
}


def empty_secret_config(tmp_path: Path, form: str) -> tuple[str, str, dict[str, str]]:
    """(the realm with tina's empty secret, the key to name, the environment to run in)"""
    (tmp_path / "empty.secret").write_text("")
    (tmp_path / "blank.secret").write_text(" \n\t\n")
    key, line = EMPTY_SECRETS[form]
    return (one_user_realm(line.format(dir=tmp_path)), f"realms[0].users[0].{key}",
            {"CAIRN_TEST_EMPTY_SECRET": ""})


@pytest.mark.parametrize("form", list(EMPTY_SECRETS))
def test_router_refuses_to_start_with_an_empty_secret_naming_the_key(tmp_path, form):
    realm, key, env = empty_secret_config(tmp_path, form)
    router = RouterProcess(tmp_path, realm, env=env)
    try:
        with pytest.raises(RuntimeError, match="router exited with 2") as refused:
            router.start()
    finally:
        router.stop()
    assert f"{key}: " in str(refused.value) and "empty" in str(refused.value)


@pytest.mark.parametrize("form", list(EMPTY_SECRETS))
def test_check_config_refuses_an_empty_secret_naming_the_key(tmp_path, form):
    realm, key, env = empty_secret_config(tmp_path, form)
    config = tmp_path / "cairn.toml"
    config.write_text(router_toml(tmp_path / "data", realm))
    result = subprocess.run([sys.executable, "-m", "cairn.app.cli", "check-config",
                             str(config)], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert result.returncode == 2, result.stdout
    assert f"{config}: {key}: " in result.stderr and "empty" in result.stderr


# -- brute force: the throttle of failed logins ----------------------------------------------------


OTHER_ADDRESS = ("127.0.0.2", 0)  # loopback too on Linux: a second client address


async def fail_logins(router: Any, count: int, login: Login = TINA, realm: str = "secure",
                      **kwargs: Any) -> None:
    """``count`` logins with a wrong secret; ``kwargs``: where from (transport, local_addr),
    or client arguments to override (authid)."""
    for _ in range(count):
        reason, _ = await refusal(router, realm, **{**login.wrong(), **kwargs})
        assert reason == AUTH_FAILED


async def test_four_failed_logins_do_not_block_the_right_secret(secure, login):
    await fail_logins(secure, 4)
    session = await login(**TINA.client_kwargs())
    assert session.welcome_details.authid == TINA.authid


async def test_after_five_failed_logins_the_right_secret_is_refused_with_try_again_later(
        secure):
    await fail_logins(secure, 5)
    reason, message = await refusal(secure, **TINA.client_kwargs())
    assert reason == AUTH_FAILED
    assert "try again" in message


async def test_after_five_failed_logins_the_next_hello_is_aborted_at_once(secure, raw):
    await fail_logins(secure, 5)
    started = time.monotonic()
    _, reply = await raw.hello(authmethods=["ticket"], authid=TINA.authid)  # no CHALLENGE
    assert abort_reason(reply) == AUTH_FAILED and "try again" in reply[1]["message"]
    assert time.monotonic() - started < 1.0


async def test_challenges_opened_before_the_limit_get_no_more_guesses_after_it(secure, raw):
    pending = []
    for _ in range(6):
        peer, challenge = await raw.hello(authmethods=["ticket"], authid=TINA.authid)
        assert challenge[0] == CHALLENGE
        pending.append(peer)
    for peer in pending[:5]:
        peer.send([AUTHENTICATE, "a-wrong-guess", {}])
        assert abort_reason(await peer.receive(TIMEOUT)) == AUTH_FAILED
    pending[5].send([AUTHENTICATE, TINA.secret, {}])  # the sixth guess, and a right one
    reply = await pending[5].receive(TIMEOUT)
    assert abort_reason(reply) == AUTH_FAILED and "try again" in reply[1]["message"]


async def test_an_unknown_user_is_throttled_like_a_known_one(secure):
    for _ in range(5):
        await refusal(secure, **TINA.unknown())
    _, message = await refusal(secure, **TINA.unknown())
    assert "try again" in message


async def test_failed_logins_from_one_address_do_not_block_another_address(secure, login):
    await fail_logins(secure, 5)
    session = await login(local_addr=OTHER_ADDRESS, **TINA.client_kwargs())
    assert session.welcome_details.authid == TINA.authid
    _, message = await refusal(secure, **TINA.client_kwargs())  # the first one still is
    assert "try again" in message


async def hello_and_hang_up(raw: Any, authid: str) -> None:
    """Ask for a wampcra challenge and leave without answering it, as a prober would."""
    peer, challenge = await raw.hello(authmethods=["wampcra"], authid=authid)
    assert challenge[0] == CHALLENGE, challenge
    peer.writer.write_eof()
    assert await peer.closed(TIMEOUT)  # the router has seen the hang-up


async def test_challenges_left_unanswered_count_as_failed_logins(raw):
    for _ in range(5):
        await hello_and_hang_up(raw, "nobody")
    _, reply = await raw.hello(authmethods=["wampcra"], authid="nobody")
    assert abort_reason(reply) == AUTH_FAILED and "try again" in reply[1]["message"]


@pytest.mark.parametrize("transport", ["websocket", "rawsocket-unix"])
async def test_failed_logins_of_one_user_do_not_stop_another_user_on_the_same_transport(
        secure, login, transport):
    await fail_logins(secure, 5, transport=transport)
    session = await login(transport=transport, **WALT.client_kwargs())
    assert session.welcome_details.authid == WALT.authid
    _, message = await refusal(secure, transport=transport, **TINA.client_kwargs())
    assert "try again" in message  # while tina still is


@pytest.mark.parametrize("transport", ["websocket", "rawsocket-unix"])
async def test_failed_logins_do_not_stop_anonymous_sessions_on_the_same_transport(
        secure, login, transport):
    pat = Login("ticket", "pat", "guest", secret="pat-secret")
    await fail_logins(secure, 5, pat, realm="public", transport=transport)
    session = await login(realm="public", transport=transport)
    assert session.welcome_details.authmethod == "anonymous"


async def test_failed_logins_from_many_addresses_do_not_lock_the_owner_out(secure, login):
    """The attack (N7): 20 wrong tickets for one user from 4 addresses locked its owner, who
    had the right secret, out for a minute, renewable at will."""
    for last in range(2, 6):  # 5 each from 4 loopback addresses
        await fail_logins(secure, 5, local_addr=(f"127.0.0.{last}", 0))
    session = await login(**TINA.client_kwargs())  # from 127.0.0.1, which never failed
    assert session.welcome_details.authid == TINA.authid


async def test_failed_logins_on_loopback_do_not_lock_a_driver_out_of_the_unix_socket(
        secure, login, raw):
    """The attack (N7): a local process without credentials failed 20 logins for a driver's
    authid over loopback, and the driver was locked out on the Unix socket."""
    for _ in range(5):
        await hello_and_hang_up(raw, TINA.authid)  # from 127.0.0.1: no answer at all
    for last in range(2, 5):
        await fail_logins(secure, 5, local_addr=(f"127.0.0.{last}", 0))
    driver = await login(transport="rawsocket-unix", **TINA.client_kwargs())
    assert driver.welcome_details.authid == TINA.authid


@contextlib.contextmanager
def in_a_cgroup_of_its_own(name: str):
    """This process in a new cgroup of the hierarchy the router reads a Unix socket caller's
    from (gateway.shell.admission.cgroup_of), as a systemd unit of its own is; then back."""
    mine = dict(line.split(":", 2)[1:] for line in
                Path("/proc/self/cgroup").read_text().splitlines())
    hierarchy = "name=systemd" if "name=systemd" in mine else ""
    root = Path("/sys/fs/cgroup/systemd" if hierarchy else "/sys/fs/cgroup")
    home, own = root / mine[hierarchy].lstrip("/"), root / f"cairn-test-{name}-{os.getpid()}"
    try:
        own.mkdir()
        (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError as e:
        with contextlib.suppress(OSError):
            own.rmdir()
        pytest.skip(f"cannot make a cgroup here (root, a writable {root}): {e}")
    try:
        yield
    finally:
        (home / "cgroup.procs").write_text(f"{os.getpid()}\n")
        own.rmdir()


async def test_failed_logins_of_one_local_unit_do_not_lock_another_out_of_the_unix_socket(
        secure, login):
    """The attack (N7): 5 wrong guesses over the Unix socket locked that authid out of the
    socket for a minute, for every driver on the device: the socket was one source. Its
    callers are told apart by uid and cgroup, so by systemd unit."""
    with in_a_cgroup_of_its_own("guesser"):
        await fail_logins(secure, 5, transport="rawsocket-unix")
        _, message = await refusal(secure, transport="rawsocket-unix", **TINA.client_kwargs())
        assert "try again" in message  # the guessing unit itself is held back
    driver = await login(transport="rawsocket-unix", **TINA.client_kwargs())
    assert driver.welcome_details.authid == TINA.authid


async def test_once_a_user_has_20_failures_an_address_that_failed_for_it_gets_no_more_guesses(
        secure, login):
    for last in range(2, 7):  # 4 each (under the per-address limit) from 5 loopback addresses
        await fail_logins(secure, 4, local_addr=(f"127.0.0.{last}", 0))
    _, message = await refusal(secure, local_addr=("127.0.0.2", 0), **TINA.client_kwargs())
    assert "try again" in message  # even with the right secret: that address was guessing
    await fail_logins(secure, 1, local_addr=("127.0.0.7", 0))  # a new address: one guess
    _, message = await refusal(secure, local_addr=("127.0.0.7", 0), **TINA.client_kwargs())
    assert "try again" in message
    walt = await login(local_addr=("127.0.0.2", 0), **WALT.client_kwargs())  # another user
    assert walt.welcome_details.authid == WALT.authid


async def test_one_lan_host_failing_as_many_users_is_limited_across_them(secure, login):
    lan = (lan_address(), 0)
    for authid in ("u1", "u2", "u3", "u4"):  # 4 each: under the per-user limit
        await fail_logins(secure, 4, local_addr=lan, authid=authid)
    walt = await login(local_addr=lan, **WALT.client_kwargs())  # 16 failures: not yet
    assert walt.welcome_details.authid == WALT.authid
    await fail_logins(secure, 4, local_addr=lan, authid="u5")
    _, message = await refusal(secure, local_addr=lan, **WALT.client_kwargs())
    assert "try again" in message
    walt = await login(**WALT.client_kwargs())  # from the device itself: not that LAN host
    assert walt.welcome_details.authid == WALT.authid


def test_failed_logins_from_many_lan_addresses_lock_out_neither_the_owner_nor_the_device():
    """(In-process: this host has one LAN address, and the attack needs several.)"""
    throttle = AuthThrottle()
    for host in range(2, 6):  # N7: 20 wrong tickets for one user from 4 LAN addresses
        for _ in range(5):
            throttle.failed(Peer(f"tcp4:192.0.2.{host}", local=False), "bob", 0.0)
    assert throttle.refused_for(Peer("tcp4:192.0.2.2", local=False), "bob", 0.0)
    assert not throttle.refused_for(Peer("tcp4:192.0.2.99", local=False), "bob", 0.0)
    assert not throttle.refused_for(Peer("unix", local=True), "bob", 0.0)
    assert not throttle.refused_for(Peer("tcp4:127.0.0.1", local=True), "bob", 0.0)


def test_a_source_that_failed_for_a_user_under_attack_waits_until_its_failure_is_a_minute_old():
    throttle = AuthThrottle()
    for host in range(2, 7):
        for _ in range(4):
            throttle.failed(Peer(f"tcp4:192.0.2.{host}", local=False), "bob", 0.0)
    throttle.failed(Peer("tcp4:192.0.2.99", local=False), "bob", 30.0)
    assert throttle.refused_for(Peer("tcp4:192.0.2.99", local=False), "bob", 30.0) == 30.0
    # at 60 s the 20 of the attack leave the window; its own failure has not
    assert not throttle.refused_for(Peer("tcp4:192.0.2.99", local=False), "bob", 60.0)


async def test_failed_logins_are_logged_with_the_address_but_never_the_secret(
        secure, login, caplog):
    caplog.set_level(logging.DEBUG)
    await login(**TINA.client_kwargs())  # the real ticket crosses the wire too
    guesses = [f"guess-{i}-8d2f" for i in range(5)]
    for guess in guesses:
        await refusal(secure, **TINA.client_kwargs(secret=guess))
    await refusal(secure, **TINA.client_kwargs())  # throttled
    failures = [r for r in caplog.records
                if r.name.startswith("cairn") and AUTH_FAILED in r.getMessage()]
    assert len(failures) >= 6  # every refusal, the throttled one included
    assert all("127.0.0.1" in r.getMessage() for r in failures)
    for secret in (TINA.secret, *guesses):
        assert secret not in caplog.text


# -- networked listeners need users ---------------------------------------------------------

ANONYMOUS_REALM = realm("realm1", role("anonymous", permission("", ["subscribe"])),
                        anonymous_role="anonymous")


def test_listening_on_all_interfaces_without_users_is_a_config_error_naming_router_listen(
        tmp_path):
    with pytest.raises(cfg.ConfigError) as error:
        parse(router_toml(tmp_path, ANONYMOUS_REALM, listen="0.0.0.0:8080"))
    assert error.value.key == "router.listen"


def test_rawsocket_on_all_interfaces_without_users_is_a_config_error_naming_router_rawsocket(
        tmp_path):
    with pytest.raises(cfg.ConfigError) as error:
        parse(router_toml(tmp_path, ANONYMOUS_REALM, rawsocket='["0.0.0.0:9000"]'))
    assert error.value.key == "router.rawsocket[0]"


def test_listening_on_all_interfaces_with_users_loads(tmp_path):
    config = parse(router_toml(tmp_path, SECURE_REALM, listen="0.0.0.0:8080"))
    assert config.router.listen.host == "0.0.0.0"


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for CN=localhost: (cert.pem, key.pem)."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout", str(d / "key.pem"),
         "-out", str(d / "cert.pem")], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def tls_section(cert: Path, key: Path) -> str:
    return f'[router.tls]\ncert = "{cert}"\nkey = "{key}"\n'


@pytest.fixture
async def tls_router(tmp_path, tls_cert):
    cert, key = tls_cert
    node = await start_router(router_toml(
        tmp_path / "data", ANONYMOUS_REALM.replace('["subscribe"]', '["subscribe", "publish"]'),
        listen="tls:127.0.0.1:0", rawsocket='["tls:127.0.0.1:0"]',
        extra=tls_section(cert, key)))
    context = ssl.create_default_context(cafile=str(cert))
    sessions: list[Client] = []

    async def join(transport: str) -> Client:
        loop = asyncio.get_running_loop()
        session = Client(types.ComponentConfig(realm="realm1"))
        if transport == "wss":
            factory = WampWebSocketClientFactory(
                lambda: session, url=f"wss://localhost:{node.port}/ws",
                serializers=[JsonSerializer()])
            port = node.port
        else:
            factory = WampRawSocketClientFactory(lambda: session, serializer=JsonSerializer())
            port = node.rawsocket_ports[0]
        await loop.create_connection(factory, "127.0.0.1", port, ssl=context,
                                     server_hostname="localhost")
        sessions.append(session)
        await asyncio.wait_for(session.joined, TIMEOUT)
        return session

    yield node, join
    await leave_all(sessions)
    await node.stop()


@pytest.mark.parametrize("subscriber, publisher", [("wss", "rawsocket-tls"),
                                                   ("rawsocket-tls", "wss")])
async def test_tls_clients_exchange_events(tls_router, subscriber, publisher):
    _, join = tls_router
    sub, pub = await join(subscriber), await join(publisher)
    received: asyncio.Future = asyncio.get_running_loop().create_future()
    await sub.subscribe(lambda value: received.set_result(value), "com.tls.ping")
    await asyncio.wait_for(pub.publish("com.tls.ping", "over TLS",
                                       options=PublishOptions(acknowledge=True)), TIMEOUT)
    assert await asyncio.wait_for(received, TIMEOUT) == "over TLS"


@pytest.mark.parametrize("listen, rawsocket, key", [
    ("tls:127.0.0.1:0", '["127.0.0.1:0"]', "router.listen"),
    ("127.0.0.1:0", '["127.0.0.1:0", "tls:127.0.0.1:0"]', "router.rawsocket[1]"),
])
def test_tls_listener_without_router_tls_is_a_config_error_naming_the_key(
        tmp_path, listen, rawsocket, key):
    with pytest.raises(cfg.ConfigError) as error:
        parse(router_toml(tmp_path, ANONYMOUS_REALM, listen=listen, rawsocket=rawsocket))
    assert error.value.key == key


# -- SIGHUP: reload users and roles (a real router process) ---------------------------------

PLANT_V1 = realm("plant", ROLES, user("alice", "operator", secret="alice-old-secret"),
                 user("bob", "viewer", secret="bob-secret"))

PLANT_V2 = realm("plant", role("operator", permission("", EVERYTHING)),
                 user("alice", "operator", secret="alice-new-secret"))

PLANT_BROKEN = PLANT_V1.replace('role = "viewer"', 'role = "no-such-role"')


def plant_login(secret: str) -> dict[str, Any]:
    return {"realm": "plant", "authmethods": ["ticket"], "authid": "alice", "secret": secret}


async def wait_for_log(router: RouterProcess, marker: str, timeout: float = TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = router.log_path.read_text()
        if marker in text:
            return text
        await asyncio.sleep(0.02)
    raise AssertionError(f"{marker!r} not logged:\n{router.log_path.read_text()}")


@dataclass
class Plant:
    router: RouterProcess
    alice: Client
    bob: Client
    sessions: list[Client]

    async def sighup(self, new_realm: str, marker: str) -> str:
        text = self.router.config.read_text().replace(PLANT_V1, new_realm)
        self.router.config.write_text(text)
        assert self.router.proc is not None
        self.router.proc.send_signal(signal.SIGHUP)
        return await wait_for_log(self.router, marker)

    async def join(self, **kwargs: Any) -> Client:
        session = await connect(self.router, "rawsocket-tcp", "msgpack", **kwargs)
        self.sessions.append(session)
        return session


@pytest.fixture
async def plant(tmp_path):
    """A router process on PLANT_V1 with alice (operator) and bob (viewer) joined."""
    router = RouterProcess(tmp_path, PLANT_V1).start()
    sessions: list[Client] = []
    try:
        alice = await connect(router, "websocket", "json", **plant_login("alice-old-secret"))
        bob = await connect(router, "websocket", "json", realm="plant", authmethods=["ticket"],
                            authid="bob", secret="bob-secret")
        sessions += [alice, bob]
        yield Plant(router, alice, bob, sessions)
    finally:
        await leave_all(sessions)
        router.stop()


RELOADED = "SIGHUP: reloaded"


async def test_after_sighup_a_session_whose_role_remains_stays_connected(plant):
    await plant.sighup(PLANT_V2, RELOADED)
    publication = await asyncio.wait_for(plant.alice.publish(
        "plant.status", "still here", options=PublishOptions(acknowledge=True)), TIMEOUT)
    assert publication.id
    assert plant.alice.is_attached()


async def test_after_sighup_a_session_whose_role_was_removed_gets_goodbye_killed(plant):
    await plant.sighup(PLANT_V2, RELOADED)
    details = await asyncio.wait_for(plant.bob.left, TIMEOUT)
    assert details.reason == "wamp.close.killed"
    assert await asyncio.wait_for(plant.bob.disconnected, TIMEOUT)


async def test_after_sighup_the_old_secret_is_refused(plant):
    await plant.sighup(PLANT_V2, RELOADED)
    reason, _ = await refusal(plant.router, **plant_login("alice-old-secret"))
    assert reason == AUTH_FAILED


async def test_after_sighup_the_new_secret_logs_in(plant):
    await plant.sighup(PLANT_V2, RELOADED)
    session = await plant.join(**plant_login("alice-new-secret"))
    assert session.welcome_details.authrole == "operator"


async def test_sighup_with_a_broken_config_is_logged_and_the_old_config_keeps_working(plant):
    log = await plant.sighup(PLANT_BROKEN, "SIGHUP: keeping the running config")
    assert "realms[0].users[1].role" in log
    session = await plant.join(**plant_login("alice-old-secret"))
    assert session.welcome_details.authid == "alice"
    assert plant.bob.is_attached() and not plant.bob.left.done()
