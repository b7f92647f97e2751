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
