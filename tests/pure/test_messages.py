"""The PUBLISHes and EVENTs the router reads and writes without autobahn's general code
(gateway.core.messages, gateway.core.wire) are autobahn's own: every slot, every encoding,
every refusal the same as autobahn's parser and constructors make of the same message."""

from __future__ import annotations

import json
import math

import autobahn.asyncio  # noqa: F401  (autobahn's serializers need txaio's framework chosen)
import pytest
from autobahn.wamp import message as m
from autobahn.wamp.exception import ProtocolError
from autobahn.wamp.serializer import JsonObjectSerializer, MsgPackObjectSerializer

from cairn.gateway.core import messages
from cairn.gateway.core.wire import CborWire, JsonWire, MsgPackWire, decode

WIRES = {"json": JsonWire(), "msgpack": MsgPackWire(), "cbor": CborWire()}


def slots(msg: m.Message) -> dict[str, object]:
    names = [name for cls in type(msg).__mro__ for name in getattr(cls, "__slots__", ())]
    return {name: getattr(msg, name) for name in names}


def encoded(wire: str, raw: list) -> bytes:
    return WIRES[wire].objects.serialize(raw)


def read(wire: str, raw: list) -> m.Message:
    [(msg, extra)] = decode(WIRES[wire], encoded(wire, raw))
    assert extra == {}
    return msg


PLAIN_PUBLISHES = [
    [16, 1, {}, "com.t"],
    [16, 2**53, {}, "com.t", []],
    [16, 0, {}, "sensor.greenhouse.t", [20.5]],
    [16, 7, {"acknowledge": True}, "a", [1, "x", None, True, -(2**63)], {"unit": "C"}],
    [16, 8, {"retain": True, "exclude_me": False}, "s.t", [{"nested": [1.5]}], {}],
    [16, 9, {"acknowledge": False, "retain": False, "exclude_me": True}, "s.t", [], {"k": 1}],
]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("raw", PLAIN_PUBLISHES, ids=range(len(PLAIN_PUBLISHES)))
def test_a_plain_publish_is_the_message_autobahns_parser_makes(wire, raw):
    msg = read(wire, raw)
    assert type(msg) is m.Publish
    expected = m.Publish.parse(WIRES[wire].objects.unserialize(encoded(wire, raw))[0])
    assert slots(msg) == slots(expected)


OTHER_PUBLISHES = [  # read or refused by autobahn's parser, each as it reads or refuses it
    [16, 1, {"exclude": [5]}, "com.t", [1]],
    [16, 1, {"eligible_authrole": ["admin"]}, "com.t"],
    [16, 1, {"disclose_me": True}, "com.t"],
    [16, 1, {"acknowledge": 1}, "com.t"],
    [16, 1, {"retain": "yes"}, "com.t"],
    [16, 1, {}, "com.t", "opaque"],
    [16, 1, {}, "com.t", None],
    [16, 1, {}, "com.t", [], None],
    [16, 1, {}, "com.t", {"a": 1}],
    [16, 2**53 + 1, {}, "com.t"],
    [16, -1, {}, "com.t"],
    [16, True, {}, "com.t"],
    [16, 1, {}, "a..b"],
    [16, 1, {}, "com.my topic"],
    [16, 1, {}, ""],
    [16, 1, {}, "com.t", [], {}, "more"],
]


@pytest.mark.parametrize("raw", OTHER_PUBLISHES, ids=range(len(OTHER_PUBLISHES)))
def test_any_other_publish_is_read_or_refused_as_autobahns_parser_does(raw):
    try:
        expected = m.Publish.parse(json.loads(json.dumps(raw)))
    except Exception as e:  # (decode wraps what is not a ProtocolError, keeping its reason)
        with pytest.raises(ProtocolError) as refused:
            decode(WIRES["json"], encoded("json", raw))
        assert str(e) in str(refused.value)
        return
    [(msg, _)] = decode(WIRES["json"], encoded("json", raw))
    assert slots(msg) == slots(expected)


def test_a_topic_once_valid_does_not_make_an_invalid_one_pass():
    read("json", [16, 1, {}, "com.t"])
    for _ in range(2):
        with pytest.raises(ProtocolError, match="topic"):
            decode(WIRES["json"], b'[16, 1, {}, "com.t."]')


@pytest.mark.parametrize(("wire", "raw", "where"), [
    ("cbor", [16, 1, {}, "com.t", [2**64]], r"PUBLISH args\[0\]: integer out of the 64-bit"),
    ("msgpack", [16, 1, {}, "com.t", [1.0, math.inf]], r"PUBLISH args\[1\]: inf is not a"),
    ("msgpack", [16, 1, {}, "com.t", [[math.nan]]], r"PUBLISH args\[0\]\[0\]: nan is not"),
    ("cbor", [16, 1, {}, "com.t", [], {"t": -math.inf}], r"PUBLISH kwargs\['t'\]: -inf is"),
])
def test_a_plain_publish_with_a_value_json_cannot_carry_is_refused_naming_where(wire, raw,
                                                                                 where):
    with pytest.raises(ProtocolError, match=where):
        decode(WIRES[wire], encoded(wire, raw))


EVENTS = [
    dict(subscription=1, publication=2, args=None, kwargs=None, topic=None),
    dict(subscription=1, publication=2, args=[20.5, "C"], kwargs=None, topic=None),
    dict(subscription=3, publication=2**53, args=None, kwargs={"t": 1}, topic="s.t"),
    dict(subscription=3, publication=4, args=[1], kwargs={"t": 1}, topic="s.t", publisher=77,
         publisher_authid="pump", publisher_authrole="sensor"),
    dict(subscription=3, publication=4, args=[], kwargs={}, topic=None, publisher=77),
]


@pytest.mark.parametrize("fields", EVENTS, ids=range(len(EVENTS)))
def test_an_event_is_the_message_autobahns_constructor_makes(fields):
    assert slots(messages.event(**fields)) == slots(m.Event(**fields))


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("fields", EVENTS, ids=range(len(EVENTS)))
def test_an_event_is_encoded_as_autobahn_encodes_it(wire, fields):
    objects = WIRES[wire].objects
    assert messages.encode(messages.event(**fields), objects) == \
        m.Event(**fields).serialize(objects)


def test_an_event_is_encoded_once_per_serializer_for_all_its_subscribers():
    event = messages.event(1, 2, [1], None, None)
    first = messages.encode(event, WIRES["json"].objects)
    assert messages.encode(event, WIRES["json"].objects) is first
    assert messages.encode(event, WIRES["msgpack"].objects) is not first


def test_an_event_with_a_field_marshalled_only_by_autobahn_is_encoded_by_autobahn():
    event = m.Event(1, 2, args=[1], retained=True, transaction_hash="h")
    assert messages.encode(event, WIRES["json"].objects) == \
        b'[36,1,2,{"retained":true,"transaction_hash":"h"},[1]]'


@pytest.mark.parametrize("text", [b'[1, "a"]', b' [1]', b'[1]  \n', b'{"a": [1.5e3, null]}'])
def test_the_json_reader_reads_what_json_loads_reads(text):
    assert WIRES["json"].objects.unserialize(text) == [json.loads(text)]


@pytest.mark.parametrize("text", [b"[1,", b"[1] x", b"", b" ", b"[1]]"])
def test_the_json_reader_refuses_what_json_loads_refuses_with_its_reason(text):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as refused:
        WIRES["json"].objects.unserialize(text)
    assert str(refused.value) == str(expected.value)


def test_the_json_writer_writes_what_autobahns_writes():
    value = [36, 1, 2, {"topic": "s.ü"}, [1.5, None, True, "x", b"\x01\x02"], {"k": [{}]}]
    assert WIRES["json"].objects.serialize(value) == JsonObjectSerializer().serialize(value)


def test_the_json_writer_writes_long_integers_and_integer_keys_as_the_standard_library():
    # orjson refuses both; the router's own records may hold them (clients' values are
    # checked portable first)
    assert WIRES["json"].objects.serialize([{1: 2}, 2**70]) == \
        json.dumps([{1: 2}, 2**70], separators=(",", ":")).encode()


@pytest.mark.parametrize("value, error", [([object()], TypeError),
                                          (["\ud800"], UnicodeEncodeError)])
def test_the_json_writer_refuses_what_the_standard_library_refuses(value, error):
    with pytest.raises(error):
        WIRES["json"].objects.serialize(value)


@pytest.mark.parametrize("number", [0.1, 1e-7, 1e16, 5e-324, 1.7976931348623157e308, -0.0,
                                    21.5, 2**53 + 1.0])
def test_the_json_writer_writes_each_float_as_the_same_float(number):
    # (the digits may differ from the standard library's: 1e-7 where it writes 1e-07)
    [read] = json.loads(WIRES["json"].objects.serialize([number]))
    assert read == number and math.copysign(1, read) == math.copysign(1, number)


MSGPACK_VALUES = [[36, 1, 2, {"topic": "s.ü"}, [1.5, None, True, "x", b"\x01\x02"], {"k": [{}]}],
                  [16, 2**53, {}, "t", [2**64 - 1, -2**63]]]


@pytest.mark.parametrize("value", MSGPACK_VALUES)
def test_the_msgpack_writer_writes_what_autobahns_writes(value):
    assert WIRES["msgpack"].objects.serialize(value) == MsgPackObjectSerializer().serialize(value)


@pytest.mark.parametrize("value", MSGPACK_VALUES)
def test_the_msgpack_reader_reads_what_autobahns_reads(value):
    payload = MsgPackObjectSerializer().serialize(value)
    assert WIRES["msgpack"].objects.unserialize(payload) == \
        MsgPackObjectSerializer().unserialize(payload)


def test_the_msgpack_writer_after_a_value_it_cannot_write_writes_the_next_one_whole():
    wire = MsgPackWire().objects
    with pytest.raises(TypeError):
        wire.serialize([1, object()])
    assert wire.serialize([2]) == MsgPackObjectSerializer().serialize([2])
