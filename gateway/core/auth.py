"""Authentication (who is this session) and authorization (what may its role do).

Authorization rule: of the role's permissions whose URI pattern matches, the most specific
one decides: exact beats wildcard beats prefix, and within a kind the longer pattern wins.
If that rule does not list the action, the action is denied, even when a broader rule
would allow it. No matching rule means deny.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import string
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from autobahn.wamp import message as m
from autobahn.wamp.auth import compute_wcs
from autobahn.wamp.message import Hello
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cairn.base.clock_readings import Reading, rfc3339
from cairn.gateway.core.config import Permission, RealmConfig, User
from cairn.gateway.core.patterns import CACHED_URIS, matches
from cairn.gateway.core.session import Session, WampError, global_id

_KIND_RANK = {"exact": 3, "wildcard": 2, "prefix": 1}


def _specificity(p: Permission) -> tuple[int, int]:
    length = len(p.uri.replace(".", "")) if p.match == "wildcard" else len(p.uri)
    return (_KIND_RANK[p.match], length)


class Authorizer:
    """Answers "may role R do action A on URI U?" and caches the answers per realm config."""

    def __init__(self, config: RealmConfig) -> None:
        self.update(config)

    def update(self, config: RealmConfig) -> None:
        """New roles and permissions (SIGHUP): the broker and dealer, which hold this
        authorizer, decide by them from the next message on, with a fresh cache."""
        self._permissions = {
            role.name: sorted(role.permissions, key=_specificity, reverse=True)
            for role in config.roles
        }
        self._cache: dict[tuple[str | None, str, str], Permission | None] = {}

    def rule_for(self, role: str | None, uri: str) -> Permission | None:
        for permission in self._permissions.get(role or "", ()):
            if matches(permission.uri, permission.match, uri):
                return permission
        return None

    def allowed(self, role: str | None, uri: str, action: str) -> Permission | None:
        """The deciding rule if it allows ``action``, else None."""
        key = (role, uri, action)
        try:
            return self._cache[key]
        except KeyError:
            pass
        rule = self.rule_for(role, uri)
        decision = rule if rule is not None and action in rule.allow else None
        if len(self._cache) >= CACHED_URIS:
            self._cache.clear()
        self._cache[key] = decision
        return decision

    def require(self, session: Session, uri: str, action: str) -> Permission:
        rule = self.allowed(session.authrole, uri, action)
        if rule is None:
            raise WampError(
                "wamp.error.not_authorized",
                f"session {session.id} (authrole {session.authrole!r}) may not {action} {uri!r}",
            )
        return rule


AUTH_FAILED = "wamp.error.authentication_failed"


@dataclass
class _Pending:
    """What the router asked in CHALLENGE, kept until AUTHENTICATE."""

    method: str
    user: User | None  # None: a decoy for an unknown authid, which no answer passes
    authid: str  # whom the login is for: failures are counted against it
    expected: bytes = b""  # ticket: the secret; wampcra: the signature
    challenge: bytes = b""  # cryptosign: the 32 random bytes
    pubkey: str = ""


class Authenticator:
    """HELLO -> identity (anonymous) or CHALLENGE; AUTHENTICATE -> identity or refusal.

    Methods, tried in the client's order of preference: ``cryptosign`` (Ed25519; the user
    lists ``pubkeys``), ``wampcra`` (HMAC-SHA256 over a challenge; salted when the user
    has ``salt``, in which case ``secret`` holds the derived key), ``ticket`` (the secret
    itself) and ``anonymous`` (when the realm has an ``anonymous_role``).
    """

    def __init__(self, config: RealmConfig, decoy_key: bytes | None = None) -> None:
        """``decoy_key``: keys the made-up salts of unknown authids; the shell keeps it in
        the data directory, so they look the same after a reload or restart as users' do."""
        self.config = config
        self.users = {u.authid: u for u in config.users}
        self._decoy_key = decoy_key or secrets.token_bytes(32)

    def hello(self, session: Session, hello: Hello, now: Reading) -> m.Challenge | None:
        """Identify the session (return None) or return the CHALLENGE to send (``now``: the
        time a WAMP-CRA challenge names). Raises WampError to abort."""
        check_authid(hello.authid)
        offered = hello.authmethods or ["anonymous"]
        for method in offered:
            if method == "anonymous" and self.config.anonymous_role:
                # The router names anonymous sessions: a name one could claim could be
                # another's (a user's, or another anonymous session's), in logs, history
                # and the authid lists of publications.
                session.authid = f"anonymous-{global_id():x}"
                session.authrole = self.config.anonymous_role
                session.authmethod, session.authprovider = "anonymous", "static"
                return None
            if method in ("ticket", "wampcra", "cryptosign"):
                challenge = self._challenge(session, hello, method, now)
                if challenge is not None:
                    return challenge
        credential = next((m for m in offered if m in ("ticket", "wampcra", "cryptosign")),
                          None)
        if credential is not None:
            # An unknown authid gets a challenge like a known one, which no answer passes:
            # a guesser learns nothing about which users exist.
            return self._decoy(session, hello, credential, now)
        raise WampError("wamp.error.no_auth_method",
                        f"realm {self.config.name!r} accepts none of the authmethods {offered}")

    def _challenge(self, session: Session, hello: Hello, method: str,
                   now: Reading) -> m.Challenge | None:
        user = self.users.get(hello.authid or "")
        if method == "cryptosign":
            pubkey = str((hello.authextra or {}).get("pubkey", "")).lower()
            if user is None:
                user = next((u for u in self.users.values() if pubkey in u.pubkeys), None)
            if user is None or pubkey not in user.pubkeys:
                return None
            challenge = secrets.token_bytes(32)
            session.pending_auth = _Pending(method, user, user.authid, challenge=challenge,
                                            pubkey=pubkey)
            return m.Challenge("cryptosign", {"challenge": challenge.hex(),
                                              "channel_binding": None})
        if user is None or user.secret is None:
            return None
        if method == "ticket":
            session.pending_auth = _Pending(method, user, user.authid,
                                            expected=user.secret.encode())
            return m.Challenge("ticket", {})
        challenge = _cra_challenge(session, user.authid, now)
        session.pending_auth = _Pending(method, user, user.authid,
                                        expected=compute_wcs(user.secret.encode(), challenge))
        extra: dict[str, Any] = {"challenge": challenge}
        if user.salt:
            extra.update(salt=user.salt, iterations=user.iterations, keylen=user.keylen)
        return m.Challenge("wampcra", extra)

    def _decoy(self, session: Session, hello: Hello, method: str, now: Reading) -> m.Challenge:
        authid = hello.authid or ""
        session.pending_auth = _Pending(method, None, authid)
        if method == "ticket":
            return m.Challenge("ticket", {})
        if method == "cryptosign":
            return m.Challenge("cryptosign", {"challenge": secrets.token_hex(32),
                                              "channel_binding": None})
        return m.Challenge("wampcra", {"challenge": _cra_challenge(session, authid, now),
                                       **self._decoy_salt(authid)})

    def _decoy_salt(self, authid: str) -> dict[str, Any]:
        """The salt fields of an unknown authid's wampcra challenge: those of a user the
        authid's keyed hash picks, so unknown authids are salted as often as the realm's
        users are, and one authid looks the same every time."""
        digest = hmac.new(self._decoy_key, authid.encode(), "sha256").digest()
        with_secret = [u for u in self.users.values() if u.secret is not None]
        if not with_secret:
            return {}
        model = with_secret[int.from_bytes(digest[:4]) % len(with_secret)]
        if not model.salt:
            return {}
        return {"salt": _salt_like(model.salt, digest[4:]), "iterations": model.iterations,
                "keylen": model.keylen}

    def authenticate(self, session: Session, msg: m.Authenticate) -> None:
        """Check the answer to our CHALLENGE; fill in the identity or raise WampError."""
        pending: _Pending | None = session.pending_auth
        session.pending_auth = None
        if pending is None:
            raise WampError(AUTH_FAILED, "AUTHENTICATE without a CHALLENGE")
        if pending.user is None or not _answer_ok(pending, msg.signature):
            raise WampError(AUTH_FAILED, "authentication failed")
        session.authid = pending.user.authid
        session.authrole = pending.user.role
        session.authmethod = pending.method
        session.authprovider = "static"
        if pending.method == "cryptosign":
            session.authextra = {"pubkey": pending.pubkey}


MAX_AUTHID = 255  # characters: longer is no one's name, only a way to fill logs and memory


def check_authid(authid: str | None) -> None:
    """Refuse an authid that would forge log lines (control characters) or is too long."""
    if authid is None:
        return
    if len(authid) > MAX_AUTHID:
        raise WampError("wamp.error.invalid_argument",
                        f"authid is {len(authid)} characters long; at most {MAX_AUTHID}")
    if not authid.isprintable():
        raise WampError("wamp.error.invalid_argument",
                        "authid contains control or other non-printable characters")


def _cra_challenge(session: Session, authid: str, now: Reading) -> str:
    # No authrole: a decoy would have to make one up, and a real one tells a guesser both
    # that the user exists and what it may do. Clients only compute an HMAC over this text.
    return json.dumps({
        "authid": authid, "authmethod": "wampcra", "authprovider": "static",
        "session": session.id, "nonce": secrets.token_hex(16),
        "timestamp": rfc3339(now.wall_ms),
    })


def _salt_like(salt: str, seed: bytes) -> str:
    """A made-up salt as long as ``salt`` and of its alphabet (hex or not)."""
    material = hashlib.shake_256(seed).digest(len(salt))
    if all(c in string.hexdigits for c in salt):
        return material.hex()[:len(salt)]
    return base64.urlsafe_b64encode(material).decode()[:len(salt)]


def _answer_ok(pending: _Pending, signature: Any) -> bool:
    if not isinstance(signature, str):
        return False
    if pending.method == "cryptosign":
        return _cryptosign_ok(pending, signature)
    return hmac.compare_digest(signature.encode(), pending.expected)


def _cryptosign_ok(pending: _Pending, signature_hex: str) -> bool:
    """autobahn sends hex(signature (64 bytes) + the signed challenge (32 bytes))."""
    try:
        raw = bytes.fromhex(signature_hex)
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(pending.pubkey))
    except ValueError:
        return False
    if len(raw) not in (64, 96) or (len(raw) == 96 and raw[64:] != pending.challenge):
        return False
    try:
        key.verify(raw[:64], pending.challenge)
    except InvalidSignature:
        return False
    return True


# Failed logins (refused answers and challenges left unanswered) are counted over a window
# and penalise where they come from, never the account, as fail2ban bans addresses and not
# users: whoever holds the right secret and has not failed logs in, however many others
# guessed. A source is a network address, one loopback address, or one caller on the Unix
# socket (its uid and cgroup: each systemd unit apart; never penalised for what was tried
# elsewhere, loopback included). Three counts:
THROTTLE_WINDOW = 60.0  # seconds
# per source and authid: someone mistyping a password, or one guesser against one account
FAILURES_PER_LOGIN = 5
# per authid from all network sources (and apart from all local ones): once it is full, a
# source that failed for the authid within the window gets no more guesses for it, so
# rotating addresses buys a guesser one guess per address, not FAILURES_PER_LOGIN
FAILURES_PER_AUTHID = 4 * FAILURES_PER_LOGIN
# per network address over all authids: one LAN host spraying a password over many users, or
# probing which exist. Not for local peers: the Unix socket and loopback are every driver on
# the device, which must not be locked out together.
FAILURES_PER_ADDRESS = 4 * FAILURES_PER_LOGIN
THROTTLE_KEYS = 10_000  # per count: a flood of made-up authids costs bounded memory


@dataclass(frozen=True)
class Peer:
    """Where a login comes from: the address without the port (``unix`` for the Unix
    socket); ``local`` for the Unix socket and loopback, which only the device reaches."""

    address: str
    local: bool


def login_peer(peer: str | None) -> Peer:
    """'tcp4:10.0.0.7:53211' -> 'tcp4:10.0.0.7', not local: failed logins are counted per
    address, and the device's own peers (Unix socket, loopback) apart. A Unix socket peer
    is its uid and cgroup, as the shell names it (``unix:uid=987:/system.slice/...``), so
    that each local unit is a source of its own."""
    if not peer:
        return Peer("unknown", False)
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return Peer(peer if rest.startswith("uid=") else "unix", True)
    if kind.startswith("tcp") and ":" in rest:
        host = rest.rpartition(":")[0]
        return Peer(f"{kind}:{host}", _is_loopback(host))
    return Peer(peer, False)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


class _Failures:
    """Times of the latest failures per key: no more than ``allowed`` of them (no more are
    needed to tell the wait), for at most THROTTLE_KEYS keys (the least recent go first).
    Times are seconds of a clock no step of the wall clock moves (``Reading.monotonic_s``)."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self._times: dict[Hashable, deque[float]] = {}

    def wait(self, key: Hashable, now: float) -> float:
        """Seconds until the key has fewer than ``allowed`` failures in the window."""
        times = self._times.get(key)
        if times is None or len(times) < self.allowed:
            return 0.0
        return max(0.0, times[0] + THROTTLE_WINDOW - now)

    def recent(self, key: Hashable, now: float) -> float:
        """Seconds until the key's latest failure leaves the window (0: none in it)."""
        times = self._times.get(key)
        return max(0.0, times[-1] + THROTTLE_WINDOW - now) if times else 0.0

    def add(self, key: Hashable, now: float) -> None:
        times = self._times.pop(key, None) or deque(maxlen=self.allowed)
        times.append(now)
        self._times[key] = times  # (re)inserted last: the dict is in order of last failure
        if len(self._times) > THROTTLE_KEYS:
            for stale in list(islice(self._times, THROTTLE_KEYS // 10)):
                del self._times[stale]


class AuthThrottle:
    """Slows down guessing and probing (see FAILURES_PER_*): a login is refused while its
    source has failed too often, for this authid or over all; or has failed for this authid
    at all while the authid is under attack. Anonymous logins are never refused. ``now``:
    seconds of a clock no step of the wall clock moves (``Reading.monotonic_s``)."""

    def __init__(self) -> None:
        self._per_login = _Failures(FAILURES_PER_LOGIN)
        self._per_authid = _Failures(FAILURES_PER_AUTHID)
        self._per_address = _Failures(FAILURES_PER_ADDRESS)

    def refused_for(self, peer: Peer, authid: str, now: float) -> float:
        """Seconds a login for ``authid`` from ``peer`` must still wait, or 0."""
        login = (peer.address, authid)
        waits = [self._per_login.wait(login, now),
                 min(self._per_login.recent(login, now),
                     self._per_authid.wait((authid, peer.local), now))]
        if not peer.local:
            waits.append(self._per_address.wait(peer.address, now))
        return max(waits)

    def failed(self, peer: Peer, authid: str, now: float) -> None:
        self._per_login.add((peer.address, authid), now)
        self._per_authid.add((authid, peer.local), now)
        if not peer.local:
            self._per_address.add(peer.address, now)
