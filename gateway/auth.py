"""Authentication (who is this session) and authorization (what may its role do).

Authorization rule: of the role's permissions whose URI pattern matches, the most specific
one decides: exact beats wildcard beats prefix, and within a kind the longer pattern wins.
If that rule does not list the action, the action is denied, even when a broader rule
would allow it. No matching rule means deny.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autobahn.wamp import message as m
from autobahn.wamp.auth import compute_wcs
from autobahn.wamp.message import Hello
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.config import Permission, RealmConfig, User
from gateway.core import Session, WampError, global_id
from gateway.patterns import matches

_KIND_RANK = {"exact": 3, "wildcard": 2, "prefix": 1}


def _specificity(p: Permission) -> tuple[int, int]:
    length = len(p.uri.replace(".", "")) if p.match == "wildcard" else len(p.uri)
    return (_KIND_RANK[p.match], length)


class Authorizer:
    """Answers "may role R do action A on URI U?" and caches the answers per realm config."""

    def __init__(self, config: RealmConfig) -> None:
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
        if len(self._cache) > 50_000:
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

    def __init__(self, config: RealmConfig) -> None:
        self.config = config
        self.users = {u.authid: u for u in config.users}
        self._decoy_key = secrets.token_bytes(32)

    def hello(self, session: Session, hello: Hello) -> m.Challenge | None:
        """Identify the session (return None) or return the CHALLENGE to send.
        Raises WampError to abort."""
        offered = hello.authmethods or ["anonymous"]
        for method in offered:
            if method == "anonymous" and self.config.anonymous_role:
                # A configured user's authid must be earned by authenticating, not claimed.
                claimed = hello.authid if hello.authid not in self.users else None
                session.authid = claimed or f"anonymous-{global_id():x}"
                session.authrole = self.config.anonymous_role
                session.authmethod, session.authprovider = "anonymous", "static"
                return None
            if method in ("ticket", "wampcra", "cryptosign"):
                challenge = self._challenge(session, hello, method)
                if challenge is not None:
                    return challenge
        credential = next((m for m in offered if m in ("ticket", "wampcra", "cryptosign")),
                          None)
        if credential is not None:
            # An unknown authid gets a challenge like a known one, which no answer passes:
            # a guesser learns nothing about which users exist.
            return self._decoy(session, hello, credential)
        raise WampError("wamp.error.no_auth_method",
                        f"realm {self.config.name!r} accepts none of the authmethods {offered}")

    def _challenge(self, session: Session, hello: Hello, method: str) -> m.Challenge | None:
        user = self.users.get(hello.authid or "")
        if method == "cryptosign":
            pubkey = str((hello.authextra or {}).get("pubkey", "")).lower()
            if user is None:
                user = next((u for u in self.users.values() if pubkey in u.pubkeys), None)
            if user is None or pubkey not in user.pubkeys:
                return None
            challenge = secrets.token_bytes(32)
            session.pending_auth = _Pending(method, user, challenge=challenge, pubkey=pubkey)
            return m.Challenge("cryptosign", {"challenge": challenge.hex(),
                                              "channel_binding": None})
        if user is None or user.secret is None:
            return None
        if method == "ticket":
            session.pending_auth = _Pending(method, user, expected=user.secret.encode())
            return m.Challenge("ticket", {})
        challenge = json.dumps({
            "authid": user.authid, "authrole": user.role, "authmethod": "wampcra",
            "authprovider": "static", "session": session.id, "nonce": secrets.token_hex(16),
            "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
        })
        session.pending_auth = _Pending(method, user,
                                        expected=compute_wcs(user.secret.encode(), challenge))
        extra: dict[str, Any] = {"challenge": challenge}
        if user.salt:
            extra.update(salt=user.salt, iterations=user.iterations, keylen=user.keylen)
        return m.Challenge("wampcra", extra)

    def _decoy(self, session: Session, hello: Hello, method: str) -> m.Challenge:
        session.pending_auth = _Pending(method, None)
        if method == "ticket":
            return m.Challenge("ticket", {})
        if method == "cryptosign":
            return m.Challenge("cryptosign", {"challenge": secrets.token_hex(32),
                                              "channel_binding": None})
        authid = hello.authid or ""
        challenge = json.dumps({
            "authid": authid, "authmethod": "wampcra",
            "authrole": next((u.role for u in self.users.values()), "user"),
            "authprovider": "static", "session": session.id, "nonce": secrets.token_hex(16),
            "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
        })
        extra: dict[str, Any] = {"challenge": challenge}
        salted = next((u for u in self.users.values() if u.salt), None)
        if salted is not None:  # the same made-up salt for the same authid, every time
            fake = hmac.new(self._decoy_key, authid.encode(), "sha256").hexdigest()[:16]
            extra.update(salt=fake, iterations=salted.iterations, keylen=salted.keylen)
        return m.Challenge("wampcra", extra)

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


class AuthThrottle:
    """Slows down guessing: after ``allowed`` failed logins from one address within
    ``window`` seconds, that address is refused until the window has passed. Other
    addresses are not affected."""

    def __init__(self, allowed: int = 5, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed, self.window, self.clock = allowed, window, clock
        self._failures: dict[str, list[float]] = {}

    def _recent(self, peer: str) -> list[float]:
        cutoff = self.clock() - self.window
        recent = [t for t in self._failures.get(peer, ()) if t > cutoff]
        if recent:
            self._failures[peer] = recent
        else:
            self._failures.pop(peer, None)
        return recent

    def refused_for(self, peer: str) -> float:
        """Seconds this address must still wait, or 0."""
        recent = self._recent(peer)
        if len(recent) < self.allowed:
            return 0.0
        return max(0.0, recent[-self.allowed] + self.window - self.clock())

    def failed(self, peer: str) -> None:
        self._failures.setdefault(peer, []).append(self.clock())
        if len(self._failures) > 10_000:  # forget the oldest addresses under a flood
            for stale in list(self._failures)[:1000]:
                del self._failures[stale]
