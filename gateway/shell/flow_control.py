"""Write flow control: what the router sends and how fast it reads.

- :class:`WriteBatcher` and :class:`CorkedTransport` join the writes of one read (or one
  timer, one finished task) into one socket write per connection and notice a peer that
  stopped reading;
- :class:`Pacer` sends a session's retained events as the peer reads them, and what the
  session is sent after them behind them;
- :class:`StoreBackpressure` stops reading the connections that fill the store's queue
  while it is over its bound (TCP backpressure instead of unbounded memory);
- :class:`FairShare` reads the connections in turn, a quantum each, so that a connection is
  held back only while others wait for the router and a flood cannot starve anyone;
- :class:`ReadBudget`, an optional hard cap, stops reading a connection that sends more
  messages or bytes a second than configured, whether or not anyone else is waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from cairn.gateway.core.limits import LimitHits
from cairn.gateway.store.port import StorePort


class WriteBatcher:
    """Joins what the router writes to each connection while it handles one read (or one
    timer, one finished task) into one socket write per connection: a batch of 50 PUBLISHes
    read at once becomes one write per subscriber instead of 50, and a burst of retained
    events one write in all. Input handlers flush at their end (no extra loop pass on the
    latency path); writes made anywhere else are flushed at the end of the loop pass."""

    def __init__(self) -> None:
        self._dirty: list[CorkedTransport] = []
        self._reading = 0

    def cork(self, transport: asyncio.Transport, limit: int,
             overflowed: Callable[[int], None],
             flushed: Callable[[], None] | None = None) -> CorkedTransport:
        return CorkedTransport(transport, self, limit, overflowed, flushed)

    def mark(self, corked: CorkedTransport) -> None:
        if not self._dirty and not self._reading:
            asyncio.get_running_loop().call_soon(self.flush)
        self._dirty.append(corked)

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for corked in dirty:
            corked.flush()

    def read(self, receive: Callable[[bytes], None], data: bytes) -> None:
        """``receive(data)``, then flush what it wrote."""
        self._reading += 1
        try:
            receive(data)
        finally:
            self._reading -= 1
            if not self._reading:
                self.flush()


class CorkedTransport:
    """Stands in for a connection's asyncio transport: write() collects, the batcher
    flushes at the end of the loop pass; closing flushes first. Everything else is the real
    transport's. When what the kernel has not taken exceeds ``limit`` bytes after a flush,
    ``overflowed(buffered)`` is called: the peer stopped reading; otherwise ``flushed()``."""

    def __init__(self, transport: asyncio.Transport, batcher: WriteBatcher, limit: int,
                 overflowed: Callable[[int], None],
                 flushed: Callable[[], None] | None = None) -> None:
        self._transport = transport
        self._batcher = batcher
        self._limit = limit
        self._overflowed = overflowed
        self._flushed = flushed
        self._chunks: list[bytes] = []
        self.corked = 0  # bytes written and not flushed yet

    def write(self, data: bytes) -> None:
        if not self._chunks:
            self._batcher.mark(self)
        self._chunks.append(data)
        self.corked += len(data)

    def flush(self) -> None:
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self.corked = 0
            transport = self._transport
            if not transport.is_closing():
                transport.write(data)
                buffered = transport.get_write_buffer_size()
                if buffered > self._limit:
                    self._overflowed(buffered)
                elif self._flushed is not None:
                    self._flushed()

    def unsent(self) -> int:
        """What was written and neither flushed nor taken by the kernel yet."""
        return self.corked + self._transport.get_write_buffer_size()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:  # what the kernel has not taken yet
        return self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._chunks.clear()
        self.corked = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Paced(Protocol):
    """What a :class:`Pacer` sends piece by piece: a stream of messages (a retained
    stream, gateway.core.retention.RetainedStream) whose ``next()`` is None once it is done."""

    def next(self) -> Any: ...


class Pacer:
    """Paces what one connection is sent. The messages of a :class:`Paced` stream are
    written one after the other while at most ``window`` bytes wait to be taken by the peer
    (corked or in the transport's buffer), never so many that they and those would pass
    ``limit`` (unless nothing else waits), and again when the peer has read (``pump()``,
    which the connection calls once its writes are flushed or its transport's buffer is
    empty again). While a stream is not done, whatever else the connection is sent (live
    events, answers) waits behind it, encoded, in order; those bytes and the unsent ones
    together over ``limit`` make the peer a slow consumer (``overflowed(bytes)``), as they
    would without a stream. A stream thus costs its cursor, and at most ``window`` bytes
    plus one message in the send buffer, however much it holds."""

    window = 64 * 1024  # bytes

    def __init__(self, unsent: Callable[[], int], encode: Callable[[Any], bytes | None],
                 write_payload: Callable[[bytes], None], limit: int,
                 overflowed: Callable[[int], None]) -> None:
        self._unsent, self._encode, self._write_payload = unsent, encode, write_payload
        self._limit = limit
        self._overflowed = overflowed
        # streams, and encoded messages (bytes); empty: nothing is paced (always this deque,
        # so that a connection can test it as cheaply as a deque can be)
        self.waiting: deque[Any] = deque()
        self.waiting_bytes = 0  # of the encoded messages
        self._next: bytes | None = None  # the first stream's next message, encoded

    def stream(self, stream: Paced) -> None:
        self.waiting.append(stream)
        self.pump()

    def queue(self, payload: bytes) -> None:
        """An encoded message, written once the streams before it are done."""
        self.waiting.append(payload)
        self.waiting_bytes += len(payload)
        total = self.waiting_bytes + self._unsent()
        if total > self._limit:
            self._overflowed(total)

    def pump(self) -> None:
        waiting = self.waiting
        while waiting and (unsent := self._unsent()) <= self.window:
            head = waiting[0]
            if type(head) is bytes:
                payload = head
            elif (payload := self._next) is None:
                msg = head.next()
                if msg is None:
                    waiting.popleft()
                    continue
                if (payload := self._encode(msg)) is None:
                    continue
            if unsent and unsent + len(payload) > self._limit:
                if payload is not head:
                    self._next = payload  # written once the peer has read
                return
            if payload is head:
                waiting.popleft()
                self.waiting_bytes -= len(payload)
            else:
                self._next = None
            self._write_payload(payload)

    def finish(self) -> None:
        """The connection closes: the streams are dropped, and what waits behind them is
        written (an ABORT or GOODBYE among it)."""
        payloads = [item for item in self.waiting if type(item) is bytes]
        self.clear()
        for payload in payloads:
            self._write_payload(payload)

    def clear(self) -> None:
        """The connection is gone: nothing more is written."""
        self.waiting.clear()
        self.waiting_bytes = 0
        self._next = None


class FairShare:
    """One connection's share of the router: deficit round robin over the event loop's
    turns. Each turn a connection is read (one ``data_received``, or one resumption the
    connection scheduled with ``loop.call_soon``) it gets a quantum of :attr:`messages` and
    :attr:`size` bytes; once either is spent, the rest of what it sent waits, the socket not
    read, for its next turn (gateway.shell.transport.Connection). asyncio runs, each turn, the
    callbacks scheduled in the last one and then every socket that became readable, so every
    other connection with something to say is read before the waiting one goes on: a lone
    client goes on at once (a turn costs one ``epoll_wait`` with no timeout), a flood gets
    a quantum a turn beside everyone else's. A message is handled whole even when it is more
    than what is left; the debt is paid off, a quantum a turn, before the connection is read
    again, so large messages buy no more than small ones. Unused credit is not saved up.

    Why per turn of the loop, not a scheduler of our own: the loop already is the queue of
    ready connections, in the order they became ready, and leaves no work behind for a
    connection that is gone. Why these quanta: at 64 messages a turn a lone publisher pays
    one extra loop turn per 64 messages, under 1 % of handling them (bench.pubsub, 1->1
    ws/json, default config against the cap lifted); a neighbour waits at most 64 of a
    flooder's messages (about 3 ms on a 2-core x86, 10-15 ms on a Pi 4) per flooder before
    its own is read. 64 KiB keeps a flood of large messages to about as much work a turn."""

    messages = 64  # quantum per turn
    size = 64 * 1024  # bytes per turn

    def __init__(self) -> None:
        self.messages_left, self.bytes_left = self.messages, self.size
        self.left = True  # whether the connection may be read on in this turn

    def turn(self) -> None:
        """A new turn: a quantum more, never more than a quantum in all."""
        self.messages_left = min(self.messages_left + self.messages, self.messages)
        self.bytes_left = min(self.bytes_left + self.size, self.size)
        self.left = self.messages_left > 0 and self.bytes_left > 0

    def spend(self, messages: int, size: int) -> None:
        self.messages_left -= messages
        self.bytes_left -= size
        self.left = self.messages_left > 0 and self.bytes_left > 0


class ReadBudget:
    """A hard cap on what one connection may send the router: ``messages`` and ``size``
    bytes a second (either None: no cap on it), up to one second's worth at once (a token
    bucket). Past it, the connection is not read until the budget is back: TCP
    backpressure, as for the store's queue; nothing is refused, the sender waits. Off by
    default: :class:`FairShare` already keeps a flood from taking the router's time from
    others; this is for an operator who wants a connection slower whether or not others
    wait (a metered uplink behind it, a battery)."""

    def __init__(self, messages: float | None, size: float | None, now: float) -> None:
        self._messages = _Bucket("max_messages_per_second", messages)
        self._bytes = _Bucket("max_bytes_per_second", size)
        self._at = now

    def spend(self, messages: int, size: int, now: float) -> tuple[str, float] | None:
        """Spends what one read brought; None while within budget, else the budget that
        ran out (its limit's name) and the seconds until it is back."""
        elapsed, self._at = now - self._at, now
        waits = (self._messages.spend(messages, elapsed), self._bytes.spend(size, elapsed))
        wait = max(waits)
        if wait <= 0:
            return None
        return (self._messages if waits[0] >= waits[1] else self._bytes).name, wait


class _Bucket:
    """One token bucket of a :class:`ReadBudget`: ``rate`` a second, a second's worth at
    once; a rate of None never runs out."""

    def __init__(self, name: str, rate: float | None) -> None:
        self.name, self.rate = name, rate
        self.left = rate or 0.0  # negative when in debt

    def spend(self, amount: int, elapsed: float) -> float:
        """Seconds until the bucket is out of debt (0 or less: it is not in debt)."""
        if self.rate is None:
            return 0.0
        self.left = min(self.rate, self.left + elapsed * self.rate) - amount
        return -self.left / self.rate


class Readable(Protocol):
    """A connection as backpressure needs it: its reading is paused for one or more reasons
    (``"store"``, ``"rate"``) and goes on once none is left (and it is its turn)."""

    session: Any

    def pause_reading(self, reason: str) -> None: ...

    def resume_reading(self, reason: str) -> None: ...


class StoreBackpressure:
    """While the store's queue is over its bound, the connections that put more than an
    eighth of it there since it last drained are paused; a sensor's few readings never are.
    All resume when the store drains."""

    def __init__(self, hits: LimitHits, store: StorePort) -> None:
        self.hits = hits
        self.store = store
        self.paused: set[Readable] = set()
        self.shares: dict[Readable, int] = {}  # bytes each connection queued since it drained

    def attach(self, store: StorePort) -> None:
        self.store = store
        store.on_drained = self.resume_all

    def added(self, connection: Readable, size: int) -> None:
        """``connection``'s messages put ``size`` more bytes in the store's queue."""
        share = self.shares.get(connection, 0) + size
        self.shares[connection] = share
        if self.store.congested and share > self.store.max_queue_bytes // 8:
            self._pause(connection)

    def _pause(self, connection: Readable) -> None:
        if connection not in self.paused:
            self.paused.add(connection)
            connection.pause_reading("store")
            self.hits.hit("max_store_queue_bytes",
                          f"paused session {connection.session.id}: "
                          f"{self.store.queued_bytes} bytes wait for a commit")

    def resume_all(self) -> None:
        self.shares.clear()
        paused, self.paused = self.paused, set()
        for connection in paused:
            connection.resume_reading("store")
