"""Authentication (who is this session) and authorization (what may its role do).

Authorization rule: of the role's permissions whose URI pattern matches, the most specific
one decides: exact beats wildcard beats prefix, and within a kind the longer pattern wins.
If that rule does not list the action, the action is denied, even when a broader rule
would allow it. No matching rule means deny.
"""

from __future__ import annotations

from autobahn.wamp.message import Hello

from gateway.config import Permission, RealmConfig
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


class Authenticator:
    """Decides HELLO: welcome (with authid/role), challenge, or refuse."""

    def __init__(self, config: RealmConfig) -> None:
        self.config = config

    def hello(self, session: Session, hello: Hello) -> None:
        """Fill in the session's identity, or raise WampError to abort."""
        methods = hello.authmethods or ["anonymous"]
        if "anonymous" in methods and self.config.anonymous_role:
            session.authid = hello.authid or f"anonymous-{global_id():x}"
            session.authrole = self.config.anonymous_role
            session.authmethod = "anonymous"
            session.authprovider = "static"
            return
        raise WampError(
            "wamp.error.no_auth_method",
            f"realm {self.config.name!r} offers none of the authmethods {methods}",
        )
