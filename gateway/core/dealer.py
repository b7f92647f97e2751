"""The dealer: REGISTER, UNREGISTER, CALL, YIELD, ERROR (from callees) and CANCEL.

CALL: authorize -> meta procedure or most specific registration -> pick a callee by the
registration's invocation policy -> INVOCATION, remembered as a pending call until the
callee answers, the caller cancels, the timeout fires or either side leaves.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autobahn.wamp import message as m

from cairn.base.clock_readings import Reading, rfc3339
from cairn.gateway.core.auth import Authorizer
from cairn.gateway.core.config import Limits
from cairn.gateway.core.limits import LimitHits
from cairn.gateway.core.patterns import PatternMap
from cairn.gateway.core.session import Outbox, Read, Session, WampError, global_id, limit_reached

log = logging.getLogger("cairn.dealer")

INVOKE_POLICIES = ("single", "roundrobin", "random", "first", "last")
CANCEL_MODES = ("skip", "kill", "killnowait")

# A meta procedure takes (caller, args, kwargs, now: the call's Reading) and returns a
# result, a Query whose result needs a read of the store, or (procedures of the shell) an
# awaitable of a result. A result is a value (sent as args=[value]) or a MetaResult for full
# control.
MetaProcedure = Callable[[Session, list[Any], dict[str, Any], Reading], Any]
MetaEvent = Callable[[str, list[Any], Outbox], None]


@dataclass
class MetaResult:
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None


@dataclass(eq=False)
class Query:
    """A meta procedure's answer that needs the store: ``result(rows or the exception the
    read raised)`` makes the result (or raises WampError)."""

    request: Any
    result: Callable[[Any], Any]


@dataclass(eq=False)
class Registration:
    id: int
    uri: str
    match: str
    invoke: str
    created: str  # RFC 3339
    callees: list[Session] = field(default_factory=list)
    next_index: int = 0

    def details(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, "uri": self.uri, "match": self.match,
                "invoke": self.invoke}

    def pick(self, eligible: Callable[[Session], bool] | None = None) -> Session | None:
        """The callee for the next call by the invocation policy, among ``eligible`` ones."""
        callees = self.callees if eligible is None else [c for c in self.callees if eligible(c)]
        if not callees:
            return None
        if self.invoke == "roundrobin":
            callee = callees[self.next_index % len(callees)]
            self.next_index += 1
            return callee
        if self.invoke == "random":
            return random.choice(callees)
        if self.invoke == "last":
            return callees[-1]
        return callees[0]


@dataclass(eq=False)
class PendingCall:
    caller: Session
    call_request: int
    callee: Session
    invocation: int
    procedure: str
    receive_progress: bool
    canceled: bool = False  # the caller has been answered; drop what the callee sends


class Dealer:
    def __init__(self, authorizer: Authorizer, limits: Limits, hits: LimitHits,
                 meta_event: MetaEvent) -> None:
        """``meta_event(topic, args, out)`` publishes a registration meta event."""
        self.authorizer, self.limits, self.hits = authorizer, limits, hits
        self.meta_event = meta_event
        self.registrations = PatternMap[Registration]()
        self.by_id: dict[int, Registration] = {}
        self.meta_procedures: dict[str, MetaProcedure] = {}
        self._invocation_ids = itertools.count(1)
        self._by_invocation: dict[tuple[Session, int], PendingCall] = {}
        self._by_call: dict[tuple[Session, int], PendingCall] = {}

    # -- REGISTER / UNREGISTER -----------------------------------------------------------

    def register(self, session: Session, msg: m.Register, out: Outbox) -> None:
        match = msg.match or "exact"
        invoke = msg.invoke or "single"
        if msg.procedure.startswith("wamp."):
            raise WampError("wamp.error.invalid_uri",
                            f"procedures under 'wamp.' are reserved for the router: "
                            f"{msg.procedure!r}")
        self.authorizer.require(session, msg.procedure, "register")
        if session.registrations >= self.limits.max_registrations_per_session:
            raise limit_reached(self.hits, "max_registrations_per_session",
                                f"session {session.id} holds {session.registrations} "
                                f"registrations")
        reg = self.registrations.get(msg.procedure, match)
        if reg is not None:
            if reg.invoke == "single" or invoke != reg.invoke:
                raise WampError("wamp.error.procedure_already_exists",
                                f"{msg.procedure!r} ({match}) is already registered "
                                f"with invoke={reg.invoke!r}")
            if session in reg.callees:
                raise WampError("wamp.error.procedure_already_exists",
                                f"this session already registered {msg.procedure!r}")
        created = reg is None
        if reg is None:
            reg = Registration(global_id(), msg.procedure, match, invoke, rfc3339(out.now.wall_ms))
            self.registrations.add(msg.procedure, match, reg)
            self.by_id[reg.id] = reg
        reg.callees.append(session)
        session.registrations += 1
        out.send(session, m.Registered(msg.request, reg.id))
        if created:
            self.meta_event("wamp.registration.on_create", [session.id, reg.details()], out)
        self.meta_event("wamp.registration.on_register", [session.id, reg.id], out)

    def unregister(self, session: Session, msg: m.Unregister, out: Outbox) -> None:
        reg = self.by_id.get(msg.registration)
        if reg is None or session not in reg.callees:
            raise WampError("wamp.error.no_such_registration",
                            f"session {session.id} has no registration {msg.registration}")
        self._remove_callee(session, reg, out)
        out.send(session, m.Unregistered(msg.request))

    def _remove_callee(self, session: Session, reg: Registration, out: Outbox) -> None:
        reg.callees.remove(session)
        session.registrations -= 1
        self.meta_event("wamp.registration.on_unregister", [session.id, reg.id], out)
        if not reg.callees:
            self.registrations.remove(reg.uri, reg.match)
            del self.by_id[reg.id]
            self.meta_event("wamp.registration.on_delete", [session.id, reg.id], out)

    # -- CALL ----------------------------------------------------------------------------

    def call(self, caller: Session, msg: m.Call, out: Outbox, disclose_me: bool = False) -> None:
        rule = self.authorizer.require(caller, msg.procedure, "call")
        meta = self.meta_procedures.get(msg.procedure)
        if meta is not None:
            self._call_meta(caller, msg, meta, out)
            return
        reg = self.registrations.best(msg.procedure)
        callee = reg.pick(self._may_serve(msg.procedure) if reg and reg.match != "exact"
                          else None) if reg else None
        if callee is None:
            raise WampError("wamp.error.no_such_procedure",
                            f"no callee registered for {msg.procedure!r}")
        invocation = next(self._invocation_ids)
        receive_progress = bool(msg.receive_progress)
        who = {}
        if rule.disclose or disclose_me:
            who = {"caller": caller.id, "caller_authid": caller.authid,
                   "caller_authrole": caller.authrole}
        pending = PendingCall(caller, msg.request, callee, invocation, msg.procedure,
                              receive_progress)
        self._by_invocation[(callee, invocation)] = pending
        self._by_call[(caller, msg.request)] = pending
        out.send(callee, m.Invocation(
            invocation, reg.id, args=msg.args, kwargs=msg.kwargs, payload=msg.payload,
            timeout=msg.timeout or None,
            receive_progress=receive_progress or None,
            procedure=msg.procedure if reg.match != "exact" else None,
            enc_algo=msg.enc_algo, enc_key=msg.enc_key, enc_serializer=msg.enc_serializer,
            **who,
        ))
        if msg.timeout:
            out.later(msg.timeout / 1000.0, lambda o: self._time_out(pending, o))

    def _may_serve(self, procedure: str) -> Callable[[Session], bool]:
        """A pattern registration was authorized on its pattern; the concrete procedure must
        be one the callee's role may register as well."""
        allowed = self.authorizer.allowed
        return lambda s: allowed(s.authrole, procedure, "register") is not None

    def revoke_unauthorized(self, out: Outbox) -> None:
        """After a reload: drop callees whose role may no longer register the procedure."""
        allowed = self.authorizer.allowed
        for reg in list(self.by_id.values()):
            for session in [s for s in reg.callees
                            if allowed(s.authrole, reg.uri, "register") is None]:
                self._remove_callee(session, reg, out)

    def _call_meta(self, caller: Session, msg: m.Call, meta: MetaProcedure, out: Outbox) -> None:
        try:
            result = meta(caller, list(msg.args or []), dict(msg.kwargs or {}), out.now)
        except WampError as e:
            out.send(caller, _call_error(msg.request, e))
            return
        if isinstance(result, Query):
            out.store(Read(result.request,
                           functools.partial(self._answer_query, caller, msg, result)))
            return
        if not inspect.isawaitable(result):
            out.send(caller, _meta_result(msg.request, result))
            return

        async def finish(o: Outbox) -> None:
            try:
                value = await result
            except WampError as e:
                o.send(caller, _call_error(msg.request, e))
            except Exception as e:  # e.g. the store failed: the caller still gets an answer
                log.exception("meta procedure %s failed", msg.procedure)
                o.send(caller, _call_error(msg.request, WampError(
                    "cairn.error.internal", f"{msg.procedure} failed: {type(e).__name__}: {e}")))
            else:
                o.send(caller, _meta_result(msg.request, value))

        out.spawn(finish)

    @staticmethod
    def _answer_query(caller: Session, msg: m.Call, query: Query, outcome: Any,
                      out: Outbox) -> None:
        try:
            value = query.result(outcome)
        except WampError as e:
            out.send(caller, _call_error(msg.request, e))
        except Exception as e:  # e.g. the store failed: the caller still gets an answer
            log.error("meta procedure %s failed: %s: %s", msg.procedure, type(e).__name__, e)
            out.send(caller, _call_error(msg.request, WampError(
                "cairn.error.internal", f"{msg.procedure} failed: {type(e).__name__}: {e}")))
        else:
            out.send(caller, _meta_result(msg.request, value))

    # -- answers from the callee ---------------------------------------------------------

    def yield_(self, callee: Session, msg: m.Yield, out: Outbox) -> None:
        pending = self._by_invocation.get((callee, msg.request))
        if pending is None:
            return  # canceled or timed out already: the callee answered too late
        if msg.progress:
            if pending.receive_progress and not pending.canceled:
                out.send(pending.caller, m.Result(pending.call_request, args=msg.args,
                                                  kwargs=msg.kwargs, payload=msg.payload,
                                                  progress=True, enc_algo=msg.enc_algo,
                                                  enc_key=msg.enc_key,
                                                  enc_serializer=msg.enc_serializer))
            return
        self._finish(pending)
        if not pending.canceled:
            out.send(pending.caller, m.Result(pending.call_request, args=msg.args,
                                              kwargs=msg.kwargs, payload=msg.payload,
                                              enc_algo=msg.enc_algo, enc_key=msg.enc_key,
                                              enc_serializer=msg.enc_serializer))

    def invocation_error(self, callee: Session, msg: m.Error, out: Outbox) -> None:
        pending = self._by_invocation.get((callee, msg.request))
        if pending is None:
            return
        self._finish(pending)
        if not pending.canceled:
            out.send(pending.caller, m.Error(m.Call.MESSAGE_TYPE, pending.call_request,
                                             msg.error, args=msg.args, kwargs=msg.kwargs,
                                             payload=msg.payload, enc_algo=msg.enc_algo,
                                             enc_key=msg.enc_key,
                                             enc_serializer=msg.enc_serializer))

    # -- cancel, timeout, sessions leaving -----------------------------------------------

    def cancel(self, caller: Session, msg: m.Cancel, out: Outbox) -> None:
        pending = self._by_call.get((caller, msg.request))
        if pending is None or pending.canceled:
            return  # already answered: nothing to cancel
        mode = msg.mode or "killnowait"
        if not pending.callee.supports("callee", "call_canceling"):
            mode = "skip"
        if mode != "skip":
            out.send(pending.callee, m.Interrupt(pending.invocation, mode=mode,
                                                 reason="wamp.error.canceled"))
        if mode == "kill":
            return  # the caller gets the callee's answer to the INTERRUPT
        self._abandon(pending, "wamp.error.canceled", "the caller canceled the call", out)

    def _time_out(self, pending: PendingCall, out: Outbox) -> None:
        if self._by_invocation.get((pending.callee, pending.invocation)) is not pending:
            return
        if pending.canceled:
            return
        if pending.callee.supports("callee", "call_canceling"):
            out.send(pending.callee, m.Interrupt(pending.invocation, mode="killnowait",
                                                 reason="wamp.error.timeout"))
        self._abandon(pending, "wamp.error.timeout",
                      f"no answer from the callee of {pending.procedure!r} within the timeout",
                      out)

    def _abandon(self, pending: PendingCall, error: str, text: str, out: Outbox) -> None:
        """Answer the caller with an error now; later answers from the callee are dropped."""
        pending.canceled = True
        self._by_call.pop((pending.caller, pending.call_request), None)
        out.send(pending.caller, m.Error(m.Call.MESSAGE_TYPE, pending.call_request, error,
                                         args=[text]))
        if not pending.callee.supports("callee", "call_canceling"):
            # an INTERRUPT could not be sent, so an answer may still come: keep the slot
            return
        self._by_invocation.pop((pending.callee, pending.invocation), None)

    def _finish(self, pending: PendingCall) -> None:
        self._by_invocation.pop((pending.callee, pending.invocation), None)
        if self._by_call.get((pending.caller, pending.call_request)) is pending:
            del self._by_call[(pending.caller, pending.call_request)]

    def session_left(self, session: Session, out: Outbox) -> None:
        for pending in [p for p in self._by_invocation.values() if p.callee is session]:
            self._finish(pending)
            if not pending.canceled:
                out.send(pending.caller, m.Error(m.Call.MESSAGE_TYPE, pending.call_request,
                                                 "wamp.error.canceled",
                                                 args=["the callee left before answering"]))
        for pending in [p for p in self._by_invocation.values() if p.caller is session]:
            self._finish(pending)
            if pending.callee.supports("callee", "call_canceling"):
                out.send(pending.callee, m.Interrupt(pending.invocation, mode="killnowait",
                                                     reason="wamp.error.canceled"))
        for reg in [r for r in self.by_id.values() if session in r.callees]:
            self._remove_callee(session, reg, out)


def _call_error(request: int, e: WampError) -> m.Error:
    return m.Error(m.Call.MESSAGE_TYPE, request, e.uri, args=e.args_list, kwargs=e.kwargs or None)


def _meta_result(request: int, value: Any) -> m.Result:
    if isinstance(value, MetaResult):
        return m.Result(request, args=value.args, kwargs=value.kwargs)
    return m.Result(request, args=[value])
