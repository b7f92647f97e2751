"""The WAMP codec: transport frames in, autobahn messages out, with no socket and no event loop.

The serializers (JSON, MessagePack, CBOR) are autobahn's wire formats with faster or stricter
readers; :func:`decode` turns one frame into messages and refuses, with a reason, what the
router must not pass on (malformed messages, unknown types, values not every serializer can
carry). The transports (gateway.shell.transport) call it; being pure, it is part of the core that
tests/pure/test_architecture.py keeps free of I/O.
"""

from __future__ import annotations

import base64
import json
import json.encoder
import json.scanner
import re
from typing import Any

import cbor2
import msgpack
import orjson
from autobahn.wamp import message as m
from autobahn.wamp.exception import ProtocolError
from autobahn.wamp.message import check_or_raise_uri
from autobahn.wamp.serializer import (
    CBORObjectSerializer,
    CBORSerializer,
    JsonObjectSerializer,
    JsonSerializer,
    MsgPackObjectSerializer,
    MsgPackSerializer,
    Serializer,
)

from cairn.gateway.core import messages
from cairn.gateway.core.patterns import CACHED_URIS
from cairn.gateway.core.session import brief

# Options autobahn's parser drops but WAMP clients still send (autobahn-js, wampy).
_PASS_THROUGH_OPTIONS = {m.Publish: ("disclose_me",), m.Call: ("disclose_me",)}


def _encode_binary(value: Any) -> str:
    if isinstance(value, bytes):  # WAMP's JSON form of binary: NUL + base64
        return "\x00" + base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} cannot be serialized to JSON")


def _binary_strings(message: Any) -> Any:
    """``message`` with every string that starts with NUL (WAMP's JSON form of binary: NUL
    + base64) turned into bytes; a walk without recursion, however deep the message."""
    root = [message]
    stack: list[list | dict] = [root]
    while stack:
        node = stack.pop()
        for key, value in (node.items() if type(node) is dict else enumerate(node)):
            if type(value) is str:
                if value.startswith("\x00"):
                    node[key] = base64.b64decode(value[1:], validate=True)
            elif type(value) is list or type(value) is dict:
                stack.append(value)
    return root[0]


class JsonObjects(JsonObjectSerializer):
    """autobahn's JSON object serializer, the same wire format, with C code on the common
    path: autobahn's decoder runs the pure-Python scanner on every message (to turn
    "\\u0000"-prefixed strings into bytes) and its encoder is rebuilt for every message.

    Written by orjson (a seventh of the standard library's time for an EVENT), except what
    it refuses: integers beyond 64 bits and non-string keys get the standard library's form
    as before. It writes NaN, which only the router could make (clients' values are checked
    finite), as null where the standard library wrote invalid JSON. Read by the standard
    library's C scanner, made once (json.loads makes it on every call); json.loads reads
    only what it refuses (leading or trailing whitespace, invalid JSON: the same values, the
    same errors). orjson is no reader here: it reads an integer beyond 64 bits as a float,
    and looking for one costs more than it saves."""

    _encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                default=_encode_binary)
    # without json.dumps' check for circular references: what the router sends is what it
    # read or made, which cannot hold itself
    _chunks = (json.encoder.c_make_encoder(None, _encode_binary, json.encoder.encode_basestring,
                                           None, ":", ",", False, False, True)
               if json.encoder.c_make_encoder is not None else None)
    _scan = json.scanner.make_scanner(json.JSONDecoder())

    def serialize(self, obj: Any) -> bytes:
        try:
            return orjson.dumps(obj, default=_encode_binary)
        except orjson.JSONEncodeError:
            return self._standard(obj)  # its form, or its error

    def _standard(self, obj: Any) -> bytes:
        if self._chunks is None:
            return self._encoder.encode(obj).encode("utf-8")
        return "".join(self._chunks(obj, 0)).encode("utf-8")

    def unserialize(self, payload: bytes) -> list[Any]:
        text = payload.decode("utf-8")
        try:
            value, end = self._scan(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):
            value = json.loads(text)
        messages = [value]
        if b"\\u" not in payload:  # (one scan for the two checks below, which most skip)
            return messages
        if b"\\u0000" in payload:  # may hold binary values (autobahn's decoder for them
            messages = [_binary_strings(messages[0])]  # is pure Python: 0.4 s per MB)
        if b"\\ud" in payload or b"\\uD" in payload:
            # "\\ud800" alone is valid JSON but no Unicode text: no other serializer, and
            # not the store, could carry it. Encoding it again finds it.
            self.serialize(messages)
        return messages


# RFC 8746 typed arrays of bytes (uint8, uint8 clamped): how autobahn-js's CBOR encoder sends
# a Uint8Array or Buffer. They are byte strings to every other serializer.
_BYTE_ARRAY_TAGS = (64, 68)


def _byte_arrays(tag: cbor2.CBORTag, immutable: bool) -> Any:
    if tag.tag in _BYTE_ARRAY_TAGS and type(tag.value) is bytes:
        return tag.value
    return tag  # any other tag stays what it is, and is refused by _unportable


class CborObjects(CBORObjectSerializer):
    """autobahn's CBOR object serializer, reading byte typed arrays as bytes."""

    def unserialize(self, payload: bytes) -> list[Any]:
        return [cbor2.loads(payload, tag_hook=_byte_arrays)]


class JsonWire(JsonSerializer):
    """WAMP's JSON serializer (autobahn's ids and MIME type) over :class:`JsonObjects`."""

    def __init__(self) -> None:
        self.objects = JsonObjects()
        Serializer.__init__(self, self.objects)


class MsgPackObjects(MsgPackObjectSerializer):
    """autobahn's MessagePack object serializer (unbatched), without the two calls it wraps
    around msgpack's and with one Packer for all it writes: ``msgpack.packb`` makes a Packer
    for every message, two thirds of its time for an EVENT."""

    def __init__(self) -> None:
        super().__init__()
        self.serialize = msgpack.Packer(use_bin_type=True).pack  # (it resets after an error)

    def unserialize(self, payload: bytes) -> list[Any]:
        return [msgpack.unpackb(payload, raw=False)]


class MsgPackWire(MsgPackSerializer):
    def __init__(self) -> None:
        self.objects = MsgPackObjects()
        Serializer.__init__(self, self.objects)


class CborWire(CBORSerializer):
    """WAMP's CBOR serializer over :class:`CborObjects`."""

    def __init__(self) -> None:
        self.objects = CborObjects()
        Serializer.__init__(self, self.objects)


def decode(serializer: Any, payload: bytes) -> list[tuple[m.Message, dict[str, Any]]]:
    """Parse one transport frame into WAMP messages, each with the options autobahn's parser
    drops (``disclose_me``), raising ProtocolError with a reason."""
    try:
        raw_messages = serializer.objects.unserialize(payload)
    except Exception as e:
        raise ProtocolError(f"cannot decode {serializer.SERIALIZER_ID}: {e}") from e
    decoded = []
    for raw in raw_messages:
        if not isinstance(raw, list) or not raw:
            raise ProtocolError(f"a WAMP message must be a non-empty array, got {brief(raw)}")
        kind = raw[0]
        cls = serializer.MESSAGE_TYPE_MAP.get(kind) if isinstance(kind, int) else None
        if cls is None:
            raise ProtocolError(f"unknown WAMP message type {brief(kind, 20)}")
        if cls is m.Publish and (msg := _plain_publish(raw)) is not None:
            decoded.append((msg, {}))
            continue
        msg, extra = _parse(cls, raw)
        if cls in _WITH_PAYLOAD:
            _check_portable(cls, msg.args, msg.kwargs)
        decoded.append((msg, extra))
    return decoded


def _check_portable(cls: type, args: Any, kwargs: Any) -> None:
    for name, value in (("args", args), ("kwargs", kwargs)):
        problem = _unportable(value)
        if problem is not None:
            raise ProtocolError(f"{cls.__name__.upper()} {name}{problem}")


def _parse(cls: type, raw: list[Any]) -> tuple[m.Message, dict[str, Any]]:
    """autobahn's parser, with the checks it leaves out and the options it drops."""
    try:
        msg = cls.parse(raw)
        if cls is m.Subscribe:  # autobahn allows empty components whatever the policy
            _check_pattern(msg.topic, msg.match, "'topic' in SUBSCRIBE")
    except ProtocolError:
        raise
    except Exception as e:  # autobahn's parsers assume well-formed input in places
        raise ProtocolError(f"malformed {cls.__name__.upper()}: {e}") from e
    extra = {}
    for name in _PASS_THROUGH_OPTIONS.get(cls, ()):
        value = _options(cls, raw).get(name)
        if value is not None and not isinstance(value, bool):
            raise ProtocolError(f"option {name!r} in {cls.__name__.upper()} must be a bool")
        if value:
            extra[name] = value
    return msg, extra


_MAX_ID = 2**53  # WAMP ids are 0..2**53, as autobahn's check_or_raise_id has it
# autobahn's loose URI rule (check_or_raise_uri, not strict): non-empty components without
# whitespace, "." or "#"
_URI = re.compile(r"^([^\s\.#]+\.)*([^\s\.#]+)$")
_valid_topics: set[str] = set()  # that matched it: a sensor publishes to the same ones


def _flat(values: list[Any]) -> bool:
    """Whether ``values`` holds only strings, bytes, bools, nulls, 64-bit integers and
    finite floats (a reading, a counter, a status): portable, checked without a call."""
    low, high = _INT_RANGE
    for item in values:
        kind = type(item)
        if kind not in _PORTABLE_SCALARS and not (
                kind is int and low <= item < high or kind is float and item - item == 0):
            return False
    return True


def _plain_publish(raw: list[Any]) -> m.Message | None:
    """What ``Publish.parse(raw)`` returns, for the PUBLISHes clients send all the time:
    ``[16, Request, Options, Topic(, Arguments(, ArgumentsKw))]`` with a list and a dict,
    and no option but acknowledge, exclude_me and retain; None for anything else, which
    autobahn's parser then reads or refuses with its reason. Raises ProtocolError for a
    payload not every serializer can carry."""
    n = len(raw)
    if n < 4 or n > 6:
        return None
    request, options, topic = raw[1], raw[2], raw[3]
    if (type(request) is not int or not 0 <= request <= _MAX_ID or type(options) is not dict
            or type(topic) is not str):
        return None
    acknowledge = exclude_me = retain = None
    for key, value in options.items():
        if type(value) is not bool:
            return None
        if key == "acknowledge":
            acknowledge = value
        elif key == "retain":
            retain = value
        elif key == "exclude_me":
            exclude_me = value
        else:
            return None
    args = kwargs = None
    if n > 4:
        args = raw[4]
        if type(args) is not list:
            return None
        if n > 5:
            kwargs = raw[5]
            if type(kwargs) is not dict:
                return None
    if topic not in _valid_topics:
        if _URI.match(topic) is None:
            return None
        if len(_valid_topics) >= CACHED_URIS:
            _valid_topics.clear()
        _valid_topics.add(topic)
    if kwargs is not None or not (args is None or _flat(args)):  # (each walked once)
        _check_portable(m.Publish, args, kwargs)
    return messages.publish(request, topic, args, kwargs, acknowledge, exclude_me, retain)


def _check_pattern(uri: str, match: str | None, what: str) -> None:
    # as autobahn checks REGISTER: empty components only in wildcard patterns, and an empty
    # last component only in prefixes
    check_or_raise_uri(uri, what, allow_empty_components=match == "wildcard",
                       allow_last_empty=match == "prefix")


_WITH_PAYLOAD = (m.Publish, m.Call, m.Yield, m.Error)


_MAX_DEPTH = 100  # deeper payloads cannot be read back by every client (cbor2 stops at 400)


_PORTABLE_SCALARS = frozenset((str, bytes, bool, type(None)))
_INT_RANGE = (-(2**63), 2**64)  # what MessagePack and CBOR carry


def _unportable(value: Any, depth: int = 0) -> str | None:
    """Where and why ``value`` cannot be carried by every serializer, or None if it can: what
    a CBOR peer sends must reach JSON and MessagePack peers too, not be dropped on the way."""
    kind = type(value)
    if kind in _PORTABLE_SCALARS:
        return None
    if kind is float:  # NaN and the infinities: JSON has no word for them
        return None if value - value == 0 else f": {value} is not a number JSON can carry"
    if kind is int:
        low, high = _INT_RANGE
        return None if low <= value < high else ": integer out of the 64-bit range"
    if depth == _MAX_DEPTH and (kind is list or kind is dict):
        return f": nested deeper than {_MAX_DEPTH} levels"
    if kind is list:
        if _flat(value):
            return None
        for i, item in enumerate(value):
            problem = _unportable(item, depth + 1)
            if problem is not None:
                return f"[{i}]{problem}"
        return None
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f": map key {brief(key, 40)} is not a string"
            problem = _unportable(item, depth + 1)
            if problem is not None:
                return f"[{brief(key, 40)}]{problem}"
        return None
    return f": {kind.__name__} is not a value every WAMP serializer can carry"


def _options(cls: type, raw: list[Any]) -> dict[str, Any]:
    # PUBLISH and CALL are [TYPE, Request|id, Options|dict, ...]
    return raw[2] if len(raw) > 2 and isinstance(raw[2], dict) else {}
