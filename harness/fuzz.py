"""Fuzzing the router's protocol handling: hypothesis strategies for WAMP messages (random,
mutated from valid ones, well formed with fuzzed fields) and the check that a fuzzed
session was answered or aborted cleanly. Used by tests/system/test_bad_input.py and soak/."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from harness.wamp import ABORT, ERROR, GOODBYE, MESSAGE_TYPES, RESULT, WELCOME
from harness.wamp_client import RawSocketPeer

HELLO_MESSAGE = [1, "realm1", {"roles": {"publisher": {}, "subscriber": {}, "caller": {},
                                          "callee": {}}}]

PROBE = 4_242_424_242  # the request id of the CALL that checks a fuzzed session still works
OPTION_KEYS = ["match", "acknowledge", "receive_progress", "timeout", "exclude", "eligible",
               "exclude_authid", "eligible_authrole", "disclose_me", "exclude_me", "roles",
               "authmethods", "authid", "invoke", "mode", "progress", "retain"]
URIS = ["com.fuzz.topic", "com.fuzz", "com.fuzz.procedure", "a..b", "", "com.x y", "realm1",
        "wamp.session.count", "wamp.session.get", "wamp.subscription.lookup",
        "wamp.subscription.match", "wamp.registration.list_callees", "wamp.session.list"]
ids = st.sampled_from([0, 1, 2, 3, -1, 2**53, 2**53 + 1]) | st.integers(-(2**63), 2**64 - 1)
scalars = st.one_of(
    st.none(), st.booleans(), ids, st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12), st.binary(max_size=6),
    st.sampled_from([*URIS, "exact", "prefix", "wildcard", "roundrobin", "kill", "skip"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(OPTION_KEYS) | st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)
options = st.dictionaries(st.sampled_from(OPTION_KEYS), values, max_size=3)
uris = st.sampled_from(URIS) | st.text(max_size=10)
payload = st.sampled_from([[], [[]], [[], {}]]) | st.tuples(st.lists(values, max_size=3)).map(
    list) | st.tuples(st.lists(values, max_size=3),
                      st.dictionaries(st.text(max_size=5), values, max_size=3)).map(list)

# messages of any type with any fields
random_messages = st.builds(lambda kind, fields: [kind, *fields],
                            st.sampled_from(MESSAGE_TYPES) | st.integers(-3, 260) | values,
                            st.lists(values, max_size=6))
# the right shape for what a client sends, with fuzzed ids, options, URIs and payloads
well_formed = st.one_of(
    st.builds(lambda r, o, u, p: [16, r, o, u, *p], ids, options, uris, payload),
    st.builds(lambda r, o, u: [32, r, o, u], ids, options, uris),
    st.builds(lambda r, s: [34, r, s], ids, ids),
    st.builds(lambda r, o, u, p: [48, r, o, u, *p], ids, options, uris, payload),
    st.builds(lambda r, o: [49, r, o], ids, options),
    st.builds(lambda r, o, u: [64, r, o, u], ids, options, uris),
    st.builds(lambda r, g: [66, r, g], ids, ids),
    st.builds(lambda r, o, p: [70, r, o, *p], ids, options, payload),
    st.builds(lambda t, r, u, p: [8, t, r, {}, u, *p], st.sampled_from([68, 48, 16]) | ids, ids,
              uris, payload),
    st.builds(lambda u: [6, {}, u], uris),
)
TEMPLATES = [
    HELLO_MESSAGE,
    [16, 11, {"acknowledge": True}, "com.fuzz.topic", [1, "two"], {"k": 3.5}],
    [48, 12, {"timeout": 1000}, "wamp.session.count", [], {}],
    [32, 13, {"match": "prefix"}, "com.fuzz"],
    [64, 14, {"invoke": "roundrobin"}, "com.fuzz.procedure"],
]


@st.composite
def mutated_messages(draw: Any) -> list[Any]:
    """A valid HELLO, PUBLISH, CALL, SUBSCRIBE or REGISTER with a few things changed."""
    msg = json.loads(json.dumps(draw(st.sampled_from(TEMPLATES))))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "delete", "insert", "option", "truncate"]))
        i = draw(st.integers(0, len(msg)))
        if op == "replace" and i < len(msg):
            msg[i] = draw(values)
        elif op == "delete" and i < len(msg):
            del msg[i]
        elif op == "insert":
            msg.insert(i, draw(values))
        elif op == "truncate":
            msg = msg[:i]
        elif op == "option":
            dicts = [x for x in msg if isinstance(x, dict)]
            if dicts:
                target = draw(st.sampled_from(dicts))
                target[draw(st.sampled_from(OPTION_KEYS) | st.text(max_size=8))] = draw(values)
    return msg


async def answered_or_aborted(peer: RawSocketPeer, sent: list[Any]) -> str:
    """Read until the router answers the probe, or aborts (or says goodbye) and closes."""
    while True:
        msg = await peer.receive(timeout=5)
        assert msg is not None, f"connection closed without ABORT after {sent!r:.300}"
        if msg[0] in (ABORT, GOODBYE):
            assert isinstance(msg[2], str) and msg[2].startswith("wamp."), msg
            assert msg[2] != "wamp.error.internal_error", f"router bug on {sent!r:.300}: {msg}"
            if msg[0] == ABORT:
                assert msg[1].get("message"), f"ABORT without a reason: {msg}"
            assert await peer.closed(), f"not closed after {msg!r:.100} for {sent!r:.300}"
            return "closed"
        if msg[0] in (RESULT, ERROR) and PROBE in msg[1:3]:
            return "answered"
        if msg[0] == WELCOME:
            peer.send([48, PROBE, {}, "wamp.session.count", []])
