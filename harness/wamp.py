"""WAMP message codes for tests and benchmarks that speak the wire protocol by hand, taken
from autobahn's message classes rather than typed in again."""

from __future__ import annotations

from autobahn.wamp import message as m

HELLO = m.Hello.MESSAGE_TYPE
WELCOME = m.Welcome.MESSAGE_TYPE
ABORT = m.Abort.MESSAGE_TYPE
CHALLENGE = m.Challenge.MESSAGE_TYPE
AUTHENTICATE = m.Authenticate.MESSAGE_TYPE
GOODBYE = m.Goodbye.MESSAGE_TYPE
ERROR = m.Error.MESSAGE_TYPE
PUBLISH = m.Publish.MESSAGE_TYPE
PUBLISHED = m.Published.MESSAGE_TYPE
SUBSCRIBE = m.Subscribe.MESSAGE_TYPE
SUBSCRIBED = m.Subscribed.MESSAGE_TYPE
UNSUBSCRIBE = m.Unsubscribe.MESSAGE_TYPE
UNSUBSCRIBED = m.Unsubscribed.MESSAGE_TYPE
EVENT = m.Event.MESSAGE_TYPE
CALL = m.Call.MESSAGE_TYPE
RESULT = m.Result.MESSAGE_TYPE

# every message type of WAMP's basic and advanced profiles (autobahn also defines
# EVENT_RECEIVED, 337, which is outside them)
MESSAGE_TYPES = sorted(kind.MESSAGE_TYPE for kind in vars(m).values()
                       if isinstance(kind, type) and issubclass(kind, m.Message)
                       and isinstance(getattr(kind, "MESSAGE_TYPE", None), int)
                       and kind.MESSAGE_TYPE < 256)
