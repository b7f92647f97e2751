"""autobahn's PUBLISH and EVENT objects, made and marshalled without its general code.

Every publication is one PUBLISH in and an EVENT per subscription out. autobahn's
constructors check two dozen optional fields one by one (assertions that run on every
message) and its properties wrap each field in a call; on the 1->1 path those were a third
of the router's CPU per event. The objects made here are autobahn's own classes with every
field set, so the rest of the router, and autobahn's serializers, see no difference:
tests/pure/test_messages.py compares every slot, and every encoding, with what autobahn
makes of the same message. (The slots named here are autobahn's; a release that adds or
renames one fails there.)
"""

from __future__ import annotations

from typing import Any

from autobahn.wamp import message as m

_new_publish = m.Publish.__new__
_new_event = m.Event.__new__
_EVENT = m.Event.MESSAGE_TYPE


def publish(request: int, topic: str, args: list | None, kwargs: dict | None,
            acknowledge: bool | None, exclude_me: bool | None,
            retain: bool | None) -> m.Publish:
    """A PUBLISH with no payload transparency, audience lists, forwarding or transaction
    hash: what ``m.Publish(request, topic, args=..., kwargs=..., acknowledge=...,
    exclude_me=..., retain=...)`` makes, without its checks (the caller made them)."""
    msg = _new_publish(m.Publish)
    # what autobahn's Message.__init__ sets (without FlatBuffers), then the message's own
    msg._serialized = {}  # per serializer, the message's bytes (an EVENT is encoded once)
    msg._from_fbs = msg._correlation_id = msg._correlation_uri = None
    msg._correlation_is_anchor = msg._correlation_is_last = msg._router_internal = None
    msg._request = request
    msg._topic = topic
    msg._args = args
    msg._kwargs = kwargs
    msg._acknowledge = acknowledge
    msg._exclude_me = exclude_me
    msg._retain = retain
    msg._exclude = msg._exclude_authid = msg._exclude_authrole = None
    msg._eligible = msg._eligible_authid = msg._eligible_authrole = None
    msg._transaction_hash = None
    msg._payload = msg._enc_algo = msg._enc_key = msg._enc_serializer = None
    msg._forward_for = None
    return msg


def event(subscription: int, publication: int, args: list | None, kwargs: dict | None,
          topic: str | None, publisher: int | None = None,
          publisher_authid: str | None = None,
          publisher_authrole: str | None = None) -> m.Event:
    """An EVENT with no payload transparency: what ``m.Event(subscription, publication,
    args=..., kwargs=..., topic=..., publisher=..., ...)`` makes, without its checks."""
    msg = _new_event(m.Event)
    # what autobahn's Message.__init__ sets (without FlatBuffers), then the message's own
    msg._serialized = {}  # per serializer, the message's bytes (an EVENT is encoded once)
    msg._from_fbs = msg._correlation_id = msg._correlation_uri = None
    msg._correlation_is_anchor = msg._correlation_is_last = msg._router_internal = None
    msg._subscription = subscription
    msg._publication = publication
    msg._args = args
    msg._kwargs = kwargs
    msg._topic = topic
    msg._publisher = publisher
    msg._publisher_authid = publisher_authid
    msg._publisher_authrole = publisher_authrole
    msg._retained = msg._transaction_hash = msg._x_acknowledged_delivery = None
    msg._payload = msg._enc_algo = msg._enc_key = msg._enc_serializer = None
    msg._forward_for = None
    return msg


def addressed(msg: m.Publish) -> bool:
    """Whether a PUBLISH names its audience: an exclude or eligible list of session ids,
    authids or authroles (what six of its properties tell, read from the slots)."""
    return not (msg._exclude is None and msg._eligible is None and msg._exclude_authid is None
                and msg._eligible_authid is None and msg._exclude_authrole is None
                and msg._eligible_authrole is None)


def encode(msg: Any, serializer: Any) -> bytes:
    """``msg.serialize(serializer)`` (``serializer``: an object serializer of
    gateway.core.wire), an EVENT marshalled here: its bytes are cached on it per serializer,
    so it is encoded once for all its subscribers, as autobahn caches them."""
    if type(msg) is not m.Event:
        return msg.serialize(serializer)
    serialized = msg._serialized
    payload = serialized.get(serializer)
    if payload is None:
        raw = _event_array(msg)
        if raw is None:
            return msg.serialize(serializer)
        payload = serialized[serializer] = serializer.serialize(raw)
    return payload


def _event_array(msg: m.Event) -> list[Any] | None:
    """What ``Event.marshal`` returns, for an EVENT without payload transparency,
    forwarding, retained flag, transaction hash or acknowledged delivery (None for one
    with any of them: autobahn's marshal then)."""
    if (msg._payload is not None or msg._forward_for is not None or msg._retained is not None
            or msg._transaction_hash is not None or msg._x_acknowledged_delivery is not None):
        return None
    details: dict[str, Any] = {}
    if msg._publisher is not None:
        details["publisher"] = msg._publisher
    if msg._publisher_authid is not None:
        details["publisher_authid"] = msg._publisher_authid
    if msg._publisher_authrole is not None:
        details["publisher_authrole"] = msg._publisher_authrole
    if msg._topic is not None:
        details["topic"] = msg._topic
    if msg._kwargs:
        return [_EVENT, msg._subscription, msg._publication, details, msg._args, msg._kwargs]
    if msg._args:
        return [_EVENT, msg._subscription, msg._publication, details, msg._args]
    return [_EVENT, msg._subscription, msg._publication, details]
