"""Hypothesis strategies for the fuzzing run: WAMP frames for each serializer and
``get_events`` keyword arguments.

Built on the strategies of tests/system/test_bad_input.py (random, well-formed and mutated WAMP
messages) plus what those leave out: integers beyond 64 bits, NaN and infinities, lone
surrogates, bytes where strings go, deep nesting, the serializers' own extension types
(CBOR tags, MessagePack ext types, shared references that make cycles), and byte-level
damage to encoded frames.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import decimal
import fractions
import ipaddress
import json
import math
import re
import uuid
from collections.abc import Callable
from typing import Any

import cbor2
import msgpack
from hypothesis import strategies as st

from cairn.gateway.shell.transport import decode, serializers
from harness.fuzz import OPTION_KEYS, URIS, mutated_messages, random_messages, well_formed
from harness.fuzz import values as tame_values

SERIALIZER_NAMES = ("json", "msgpack", "cbor")


SERIALIZERS = {s.SERIALIZER_ID: s for s in serializers()}


def mix(*parts: st.SearchStrategy) -> st.SearchStrategy:
    """Each part about equally often: st.one_of mostly draws the branch whose examples are
    simplest (measured here: nine frames in ten were undamaged messages)."""
    return st.sampled_from(parts).flatmap(lambda part: part)

HISTORY_URIS = ["sensor.fuzz", "sensor.fuzz.a", "sensor"]  # publishes here reach the store

# -- values ------------------------------------------------------------------------------

huge_ints = st.sampled_from([2**53 + 1, 2**63, -(2**63) - 1, 2**64, -(2**64) - 1]) | st.builds(
    lambda digits, sign: sign * (10**digits + 7), st.integers(19, 6000), st.sampled_from([1, -1]))
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308])
surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF,
                                   categories=["Cs"]), min_size=1, max_size=2)
odd_text = surrogates.map(lambda s: f"a{s}b") | st.sampled_from(
    ["\x00", "\u2028", "\ufeff", "sensor.\x00", "\udc80", "é" * 3, ""]) | st.integers(
    1000, 70_000).map(lambda n: "x" * n)
# what only CBOR or MessagePack can carry: each serializer drops what it cannot encode
exotic = st.sampled_from([
    dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.date(2026, 1, 1), decimal.Decimal("1.5"),
    fractions.Fraction(1, 3), frozenset({1, 2}), uuid.UUID(int=7), re.compile("a+"),
    ipaddress.ip_address("10.0.0.1"), cbor2.CBORTag(9999, "x"), cbor2.undefined,
    cbor2.CBORSimpleValue(99), msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 2),
])
nasty_scalars = mix(huge_ints, odd_floats, odd_text, st.binary(max_size=20), exotic)


def nest(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def cycle() -> list:
    looped: list = [1]
    looped.append(looped)
    return looped


nasty_values = mix(
    st.recursive(
        mix(nasty_scalars, tame_values),
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(OPTION_KEYS) | st.text(max_size=6) | surrogates
                          | st.integers(-3, 3) | st.binary(max_size=3), inner, max_size=4),
        max_leaves=8),
    st.builds(nest, st.integers(1, 1500), tame_values),  # the decoders' depth limits
    st.builds(cycle),  # CBOR shared references
)

# -- messages ----------------------------------------------------------------------------

tame_messages = random_messages | mutated_messages() | well_formed
history_publish = st.builds(lambda r, u, p: [16, r, {"acknowledge": True}, u, *p],
                            st.integers(1, 2**53), st.sampled_from(HISTORY_URIS),
                            st.sampled_from([[[1]], [[], {"t": 1.5}]]))


@st.composite
def poisoned_messages(draw: Any) -> Any:
    """A plausible message with one to three fields (or payload items) made nasty."""
    msg = copy.deepcopy(draw(tame_messages | history_publish))  # samples are shared objects
    for _ in range(draw(st.integers(1, 3))):
        if not msg:
            break
        containers = [msg] + [x for x in msg if isinstance(x, list | dict) and x]
        target = draw(st.sampled_from(containers))
        if isinstance(target, list):
            target[draw(st.integers(0, len(target) - 1))] = draw(nasty_values)
        else:
            target[draw(st.sampled_from(sorted(target, key=repr)))] = draw(nasty_values)
    return msg


nasty_args = st.lists(nasty_values, max_size=3)
nasty_kwargs = st.dictionaries(st.text(max_size=6) | surrogates, nasty_values, max_size=3)
request_ids = st.integers(1, 2**53)
# well-formed messages whose payload is nasty: what the router stores and forwards
nasty_payloads = st.one_of(
    st.builds(lambda r, u, a, k: [16, r, {"acknowledge": True}, u, a, k], request_ids,
              st.sampled_from(HISTORY_URIS + ["com.fuzz.topic"]), nasty_args, nasty_kwargs),
    st.builds(lambda r, a, k: [48, r, {}, "com.fuzz.procedure", a, k], request_ids, nasty_args,
              nasty_kwargs),
    st.builds(lambda r, a, k: [70, r, {}, a, k], request_ids, nasty_args, nasty_kwargs),
    st.builds(lambda r, a, k: [8, 68, r, {}, "com.fuzz.error", a, k], request_ids, nasty_args,
              nasty_kwargs),
)
messages = mix(tame_messages, history_publish, poisoned_messages(), nasty_payloads, nasty_values)

# -- frames ------------------------------------------------------------------------------


def _json_default(value: Any) -> str:
    if isinstance(value, bytes):  # WAMP's JSON convention for binary: "\0" + base64
        return "\x00" + base64.b64encode(value).decode()
    raise TypeError(type(value).__name__)


ENCODERS: dict[str, Callable[[Any], bytes]] = {
    # ensure_ascii: lone surrogates travel as \udXXX escapes, which is valid JSON
    "json": lambda obj: json.dumps(obj, default=_json_default).encode(),
    "msgpack": lambda obj: msgpack.packb(obj, use_bin_type=True, datetime=True),
    "cbor": lambda obj: cbor2.dumps(obj, value_sharing=True, timezone=dt.UTC),
}
MAGIC = {  # bytes that mean something special to each decoder
    "json": [b"NaN", b"-Infinity", b"1e99999", b"9" * 5000, b"[" * 3000, b'"\\ud800"', b"\xff",
             b"{", b'"', b"\\u0000", b",,", b"true"],
    "msgpack": [b"\xc1", b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\x91" * 2000,
                b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xd4\xff\x00", b"\xc7\x00\x05"],
    "cbor": [b"\x9f", b"\xff", b"\x9b\xff\xff\xff\xff\xff\xff\xff\xff", b"\x81" * 500,
             b"\xc2\x59\x10\x00" + b"\x01" * 4096, b"\xd8\x1c\x81\xd8\x1d\x00", b"\xf7",
             b"\xc1\xfb\x7f\xf0\x00\x00\x00\x00\x00\x00", b"\xd9\x01\x02\x82\x01\x01",
             b"\xd8\x23\x62a(", b"\xd8\x24\x60", b"\x7f\xff"],
}


def encoded(name: str, values: st.SearchStrategy = messages) -> st.SearchStrategy[bytes]:
    def encode(obj: Any) -> bytes | None:
        try:
            return ENCODERS[name](obj)
        except Exception:  # this serializer cannot carry the value: draw another
            return None

    return values.map(encode).filter(lambda b: b is not None)


@st.composite
def damaged(draw: Any, frames: st.SearchStrategy[bytes], name: str) -> bytes:
    """An encoded frame with one to four byte-level changes."""
    data = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "magic", "repeat"]))
        if op == "flip" and i < len(data):
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[i:]
        elif op == "magic":
            data[i:i] = draw(st.sampled_from(MAGIC[name]))
        elif op == "repeat":
            data[i:i] = data[i:i + draw(st.integers(1, 16))] * draw(st.integers(2, 50))
    return bytes(data)


def frames(name: str) -> st.SearchStrategy[bytes]:
    """One WAMP frame's payload for serializer ``name``: mostly encoded messages, some of
    them damaged, some random bytes and decoder specials."""
    good = encoded(name)
    return mix(good, damaged(good, name), st.binary(max_size=64), st.sampled_from(MAGIC[name]))


def live_frames(name: str) -> st.SearchStrategy[bytes]:
    """For a running router: as ``frames``, with more well-formed messages whose nasty payload
    the router goes on to store and forward."""
    return mix(frames(name), encoded(name, nasty_payloads))


# -- get_events arguments ----------------------------------------------------------------

TIME_ARGS = ["from_time", "after_time", "before_time", "until_time"]
PUBLICATION_ARGS = ["from_publication", "after_publication", "before_publication",
                    "until_publication"]
KNOWN_ARGS = ["reverse", "limit", "topic", *TIME_ARGS, *PUBLICATION_ARGS]

datetimes = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
offsets = st.sampled_from(["Z", "z", "+00:00", "-00:00", "+05:30", "-12:00", "+14:00", "",
                           "+23:59", "-23:59", "+24:00", "+99:99", "+0530", "+05"])
stamps = st.builds(lambda d, spec, off: d.isoformat(timespec=spec) + off, datetimes,
                   st.sampled_from(["auto", "hours", "minutes", "seconds", "milliseconds",
                                    "microseconds"]), offsets)


@st.composite
def mangled_stamps(draw: Any) -> str:
    text = list(draw(stamps))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        text[i:i + draw(st.integers(0, 2))] = draw(st.sampled_from(
            ["", " ", "t", "T", "60", "9" * 30, ".", "-", ":", "\x00", "٣", "Z", "+", "W"]))
    return "".join(text)


ids = st.sampled_from([0, 1, 2, 2**53 - 1, 2**53, 2**53 + 1, -1, True, False, 1.0]) | \
    st.integers(-(2**64), 2**64) | huge_ints
arg_values = st.one_of(stamps, mangled_stamps(), ids, st.booleans(), st.none(),
                       st.sampled_from(URIS + HISTORY_URIS), nasty_values)
events_kwargs = st.dictionaries(st.sampled_from(KNOWN_ARGS) | st.text(max_size=10),
                                arg_values, max_size=6)


def _through_the_wire(name: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` as the router hands them to get_events: in a CALL encoded by serializer
    ``name`` and decoded by the router's parser; None if either refuses them."""
    try:
        frame = ENCODERS[name]([48, 1, {}, "wamp.subscription.get_events", [1], kwargs])
        ((call, _),) = decode(SERIALIZERS[name], frame)
    except Exception:
        return None
    return call.kwargs or {}


# What decode lets through (no integers beyond 64 bits, no CBOR-only types), which is all
# that can reach EventsQuery.parse.
events_kwargs_from_the_wire = st.builds(
    _through_the_wire, st.sampled_from(SERIALIZER_NAMES), events_kwargs,
).filter(lambda kwargs: kwargs is not None)
