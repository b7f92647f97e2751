"""SUBSCRIBE with get_retained: Cairn vs Crossbar.io, and Cairn vs Mosquitto's retained
messages. A part of ``python -m bench`` (``--only retained``).

``N`` topics (``bench.retained.t00000`` .., MQTT ``bench/retained/t00000`` ..) get one
retained publication each (acknowledged, so all are in before measuring; payload
``{"k": k, "temperature": .., "humidity": ..}``, as kwargs in WAMP and as JSON in MQTT).
Then, timed from sending SUBSCRIBE, on lean clients (RawSocket/MsgPack WAMP sessions,
:class:`bench.lean_wamp.WampClient`; a raw MQTT 3.1.1 client written here), each repeat on a
new connection (connecting is not timed):

- **prefix**: SUBSCRIBE(``bench.retained``, match=prefix, get_retained) -> SUBSCRIBED and
  -> the N-th retained EVENT. Crossbar 26.10.1 keeps a retained event on the exact topic's
  subscription only and sends at most one per SUBSCRIBE (router/broker.py
  ``_get_retained_event``), so a prefix subscription gets none; the run checks that (it
  waits ``quiet`` seconds for anything) and records how many arrived.
- **exact**: SUBSCRIBE(one topic, get_retained) -> SUBSCRIBED and -> its EVENT, on one
  session (UNSUBSCRIBE in between), for both WAMP servers.
- **all exact**: what a Crossbar client must do to get all N values: N SUBSCRIBEs sent at
  once -> the last SUBSCRIBED and the N-th EVENT, for both WAMP servers.
- **Mosquitto** (persistence off, ``set_tcp_nodelay true`` like Cairn's and Crossbar's
  sockets): a new MQTT client SUBSCRIBEs ``bench/retained/#`` (QoS 0) -> SUBACK and -> the
  N-th retained PUBLISH. The same with aiomqtt (paho underneath) shows how much of that a
  full client library costs (most of it), and a few runs against Mosquitto's default
  config (Nagle on) show the ~40 ms the retained messages then wait for the client's
  delayed ACK of the SUBACK.

Every event is decoded after the timing and checked: retained flag, topic under the prefix,
payload ``k`` matching the topic, each of the N topics exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from bench.compare import LoadMeter, running_server
from bench.crossbar import tree_rss
from bench.lean_wamp import WampClient
from bench.measure import latency_summary
from bench.mqtt import start_mosquitto
from harness.process import wait_for_ports

PREFIX = "bench.retained"
MQTT_PREFIX = "bench/retained"


def topic(k: int) -> str:
    return f"{PREFIX}.t{k:05d}"


def mqtt_topic(k: int) -> str:
    return f"{MQTT_PREFIX}/t{k:05d}"


def payload(k: int) -> dict[str, Any]:
    return {"k": k, "temperature": 20.0 + (k % 50) / 10, "humidity": 48.5}


async def wait_count(events: list[Any], n: int, quiet: float) -> None:
    """Until ``events`` holds ``n`` items, or nothing came for ``quiet`` seconds."""
    seen = -1
    while len(events) < n and len(events) != seen:
        seen = len(events)
        deadline = time.monotonic() + quiet
        while len(events) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
    await asyncio.sleep(0.02)  # anything beyond n would show by now


def check_wamp_events(events: list[tuple[bytes, int]], want: set[int]) -> list[str]:
    """Decoded after timing: retained, topic under PREFIX (when given), kwargs k matching."""
    got: list[int] = []
    problems = []
    for raw, _ in events:
        msg = msgpack.unpackb(raw, raw=False)
        details, kwargs = msg[3], (msg[5] if len(msg) > 5 else {})
        k = kwargs.get("k")
        if not details.get("retained") or k is None or \
                details.get("topic", topic(k)) != topic(k):
            problems.append(f"not the retained event of a bench topic: {msg!r:.200}")
            break
        got.append(k)
    if sorted(got) != sorted(want):
        problems.append(f"{len(got)} retained events for {len(set(got))} topics, expected "
                        f"{len(want)} topics once each")
    return problems


# -- WAMP ------------------------------------------------------------------------------------


async def populate_wamp(port: int, n: int) -> float:
    client = await WampClient.connect(port)
    t0 = time.perf_counter()
    futures = [client.publish(topic(k), payload(k), acknowledge=True, retain=True)
               for k in range(n)]
    await asyncio.wait_for(asyncio.gather(*futures), 120)
    elapsed = time.perf_counter() - t0
    await client.close()
    return elapsed


def collector(client: WampClient) -> list[tuple[bytes, int]]:
    events: list[tuple[bytes, int]] = []
    client.raw_event = lambda raw, now: events.append((raw, now))
    return events


async def prefix_once(port: int, n: int, quiet: float) -> dict[str, Any]:
    client = await WampClient.connect(port)
    try:
        events = collector(client)
        t0 = time.perf_counter_ns()
        (_msg, subscribed), = await asyncio.wait_for(asyncio.gather(client.subscribe(
            PREFIX, {"match": "prefix", "get_retained": True})), 30)
        await wait_count(events, n, quiet)
    finally:
        await client.close()
    return {"subscribed_ns": subscribed - t0, "delivered": len(events),
            "last_ns": events[-1][1] - t0 if events else None,
            "problems": check_wamp_events(events, set(range(n)))}


async def exact_series(port: int, n: int, repeats: int) -> dict[str, Any]:
    client = await WampClient.connect(port)
    subscribed, delivered, problems = [], [], []
    try:
        for i in range(repeats):
            k = (i * 7919) % n  # spread over the topics
            events = collector(client)
            t0 = time.perf_counter_ns()
            msg, now = await asyncio.wait_for(client.subscribe(topic(k),
                                                               {"get_retained": True}), 30)
            await wait_count(events, 1, 2.0)
            problems += check_wamp_events(events, {k})
            if events:
                subscribed.append(now - t0)
                delivered.append(events[0][1] - t0)
            await client.unsubscribe(msg[2])
    finally:
        await client.close()
    return {"subscribed": latency_summary(subscribed), "event": latency_summary(delivered),
            "problems": problems[:5], "ok": not problems}


async def all_exact_once(port: int, n: int, quiet: float) -> dict[str, Any]:
    client = await WampClient.connect(port)
    try:
        events = collector(client)
        t0 = time.perf_counter_ns()
        replies = await asyncio.wait_for(asyncio.gather(*(
            client.subscribe(topic(k), {"get_retained": True}) for k in range(n))), 60)
        await wait_count(events, n, quiet)
    finally:
        await client.close()
    return {"subscribed_ns": max(now for _, now in replies) - t0, "delivered": len(events),
            "last_ns": max(now for _, now in events) - t0 if events else None,
            "problems": check_wamp_events(events, set(range(n)))}


async def series(once: Callable[[], Any], repeats: int, stop_short: bool) -> dict[str, Any]:
    """``repeats`` timed runs of ``once`` after one warm-up; with ``stop_short``, stops at
    the first run that delivered fewer than all (an unsupported feature, not noise)."""
    runs = []
    for i in range(1 + repeats):
        r = await once()
        if i or (stop_short and r["problems"]):
            runs.append(r)
        if stop_short and r["problems"]:
            break
    problems = [p for r in runs for p in r["problems"]]
    return {"repeats": len(runs),
            "subscribed": latency_summary([r["subscribed_ns"] for r in runs]),
            "last": latency_summary([r["last_ns"] for r in runs if r["last_ns"] is not None
                                     and not r["problems"]]),
            "delivered_min": min(r["delivered"] for r in runs),
            "problems": problems[:5], "ok": not problems}


async def wamp_side(server: Any, opts: argparse.Namespace) -> dict[str, Any]:
    n, port, quiet = opts.retained, server.rs_port, opts.retained_quiet
    out: dict[str, Any] = {"populate_s": round(await populate_wamp(port, n), 3)}
    meter = LoadMeter(server)
    # Crossbar has no prefix retention: one try shows it, repeating it shows nothing new
    out["prefix"] = await series(lambda: prefix_once(port, n, quiet), opts.retained_repeats,
                                 stop_short=server.name != "cairn")
    out["exact"] = await exact_series(port, n, opts.retained_exact_repeats)
    out["all_exact"] = await series(lambda: all_exact_once(port, n, quiet),
                                    max(2, opts.retained_repeats // 4), stop_short=False)
    out["load"] = meter.stop()
    return out


def run_wamp(kind: str, opts: argparse.Namespace) -> dict[str, Any]:
    with running_server(kind, opts) as server:
        print(f"  {kind} get_retained, {opts.retained:,} topics ...", end=" ", flush=True)
        out = {"server": kind, "startup_s": round(server.startup_s, 3), "retained": opts.retained}
        try:
            out.update(asyncio.run(wamp_side(server, opts)))
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        out["log_problems"] = [line for line in server.log_lines()
                               if "Traceback" in line or "ERROR" in line][:10]
    print(summary_line(out), flush=True)
    return out


# -- MQTT ------------------------------------------------------------------------------------


def mqtt_packet(first: int, body: bytes) -> bytes:
    head, n = bytearray([first]), len(body)
    while True:  # remaining length: 7 bits per byte, high bit = more
        n, digit = divmod(n, 128)
        head.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(head) + body


def mqtt_str(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def split_mqtt(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Complete MQTT packets at the start of ``buf`` as (first byte, body), and the rest."""
    out, pos, n = [], 0, len(buf)
    while n - pos >= 2:
        length, shift, i = 0, 0, pos + 1
        while i < n:
            length |= (buf[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not buf[i - 1] & 0x80:
                break
        else:
            break
        if i + length > n or buf[i - 1] & 0x80:
            break
        out.append((buf[pos], buf[i:i + length]))
        pos = i + length
    return out, buf[pos:]


class MqttClient(asyncio.Protocol):
    """A lean MQTT 3.1.1 client: CONNECT, SUBSCRIBE, QoS 1 PUBLISH, incoming PUBLISH kept
    raw with its receive time (``perf_counter_ns`` per socket read)."""

    def __init__(self, client_id: str) -> None:
        loop = asyncio.get_running_loop()
        self.client_id = client_id
        self.connack: asyncio.Future = loop.create_future()
        self.acks: dict[int, asyncio.Future] = {}
        self.publishes: list[tuple[int, bytes, int]] = []
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    @classmethod
    async def connect(cls, port: int, client_id: str) -> MqttClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(client_id), "127.0.0.1", port)
        await asyncio.wait_for(client.connack, 10)
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # protocol level 4, clean session, keep-alive 60 s
        self.transport.write(mqtt_packet(0x10, mqtt_str("MQTT") + b"\x04\x02\x00\x3c"
                                         + mqtt_str(self.client_id)))

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in [self.connack, *self.acks.values()]:
            if not fut.done():
                fut.set_exception(ConnectionError(f"broker closed the connection ({exc})"))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        packets, self.buf = split_mqtt(self.buf + data if self.buf else data)
        for first, body in packets:
            kind = first >> 4
            if kind == 3:
                self.publishes.append((first, body, now))
            elif kind == 2 and not self.connack.done():
                self.connack.set_result(body[1])
            elif kind in (4, 9):  # PUBACK, SUBACK: packet id first
                fut = self.acks.pop(struct.unpack("!H", body[:2])[0], None)
                if fut is not None and not fut.done():
                    fut.set_result((body, now))

    def _expect(self, packet_id: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.acks[packet_id] = fut
        return fut

    def publish_retained(self, packet_id: int, name: str, data: bytes) -> asyncio.Future:
        fut = self._expect(packet_id)
        self.transport.write(mqtt_packet(0x33, mqtt_str(name) + struct.pack("!H", packet_id)
                                         + data))  # PUBLISH, QoS 1, retain
        return fut

    def subscribe(self, packet_id: int, pattern: str) -> asyncio.Future:
        fut = self._expect(packet_id)
        self.transport.write(mqtt_packet(0x82, struct.pack("!H", packet_id) + mqtt_str(pattern)
                                         + b"\x00"))
        return fut

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"\xe0\x00")  # DISCONNECT
            self.transport.close()


def check_mqtt_publishes(publishes: list[tuple[int, bytes, int]], n: int) -> list[str]:
    got = []
    for first, body, _ in publishes:
        size = struct.unpack("!H", body[:2])[0]
        name = body[2:2 + size].decode()
        data = json.loads(body[2 + size + (2 if first & 0x06 else 0):])
        if not first & 0x01 or name != mqtt_topic(data.get("k", -1)):
            return [f"not a retained message of a bench topic: {name} {data}"]
        got.append(data["k"])
    if sorted(got) != list(range(n)):
        return [f"{len(got)} retained messages for {len(set(got))} topics, expected {n}"]
    return []


async def populate_mqtt(port: int, n: int) -> float:
    client = await MqttClient.connect(port, "bench-populate")
    t0 = time.perf_counter()
    futures = [client.publish_retained(k % 65535 + 1, mqtt_topic(k),
                                       json.dumps(payload(k)).encode()) for k in range(n)]
    await asyncio.wait_for(asyncio.gather(*futures), 120)
    elapsed = time.perf_counter() - t0
    client.close()
    return elapsed


async def mqtt_once(port: int, n: int, quiet: float, i: int) -> dict[str, Any]:
    client = await MqttClient.connect(port, f"bench-retained-{i}")
    try:
        t0 = time.perf_counter_ns()
        _, subscribed = await asyncio.wait_for(client.subscribe(1, f"{MQTT_PREFIX}/#"), 30)
        await wait_count(client.publishes, n, quiet)
    finally:
        client.close()
    pubs = client.publishes
    return {"subscribed_ns": subscribed - t0, "delivered": len(pubs),
            "last_ns": pubs[-1][2] - t0 if pubs else None,
            "problems": check_mqtt_publishes(pubs, n)}


async def aiomqtt_once(port: int, n: int, i: int) -> dict[str, Any]:
    """The same with aiomqtt: is a full client library the bottleneck?"""
    import aiomqtt

    async with aiomqtt.Client("127.0.0.1", port, identifier=f"bench-aiomqtt-{i}") as client:
        t0 = time.perf_counter_ns()
        await client.subscribe(f"{MQTT_PREFIX}/#")
        subscribed = time.perf_counter_ns()
        count, retained = 0, 0
        async with asyncio.timeout(60):
            async for message in client.messages:
                count += 1
                retained += bool(message.retain)
                if count == n:
                    break
        last = time.perf_counter_ns()
    problems = [] if retained == n else [f"{retained} of {n} messages retained"]
    return {"subscribed_ns": subscribed - t0, "delivered": count, "last_ns": last - t0,
            "problems": problems}


async def mosquitto_side(port: int, opts: argparse.Namespace, full: bool) -> dict[str, Any]:
    n, quiet = opts.retained, opts.retained_quiet
    out: dict[str, Any] = {"populate_s": round(await populate_mqtt(port, n), 3)}
    counter = iter(range(10**6))
    out["prefix"] = await series(lambda: mqtt_once(port, n, quiet, next(counter)),
                                 opts.retained_repeats if full else 3, stop_short=False)
    if full:
        out["aiomqtt"] = await series(lambda: aiomqtt_once(port, n, next(counter)),
                                      max(2, opts.retained_repeats // 4), stop_short=False)
    return out


def mosquitto_run(opts: argparse.Namespace, nodelay: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"server": "mosquitto", "retained": opts.retained,
                           "set_tcp_nodelay": nodelay}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-mosquitto-") as tmp:
        t0 = time.monotonic()
        mosquitto, port = start_mosquitto(Path(tmp), nodelay)
        try:
            wait_for_ports([port], lambda: mosquitto.proc.poll() is None)
            out["startup_s"] = round(time.monotonic() - t0, 3)
            time.sleep(opts.settle)
            out["idle_rss"] = tree_rss(mosquitto.proc.pid)
            out.update(asyncio.run(mosquitto_side(port, opts, full=nodelay)))
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            with contextlib.suppress(Exception):
                mosquitto.stop()
    return out


def run_mosquitto(opts: argparse.Namespace) -> dict[str, Any]:
    """Mosquitto's start-up, idle RSS and retained-message delivery with TCP_NODELAY (as
    Cairn's asyncio sockets and Crossbar's have), and the delivery with Mosquitto's default
    (Nagle on): after the small SUBACK the retained messages wait for the client's delayed
    ACK, ~40 ms on Linux, with a client that has nothing to send meanwhile."""
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()):
        print("  mosquitto is not installed: skipped", flush=True)
        return {"server": "mosquitto", "error": "mosquitto is not installed"}
    print(f"  mosquitto retained, {opts.retained:,} topics ...", end=" ", flush=True)
    out = mosquitto_run(opts, nodelay=True)
    out["default_config"] = mosquitto_run(opts, nodelay=False)
    print(summary_line(out), flush=True)
    return out


def summary_line(out: dict[str, Any]) -> str:
    if "error" in out:
        return f"FAILED: {out['error']}"
    p = out["prefix"]
    text = (f"prefix: SUBSCRIBED p50 {p['subscribed']['p50_ms']} ms, last of "
            f"{p['delivered_min']:,} p50 {p['last']['p50_ms']} ms p99 {p['last']['p99_ms']} ms")
    if "exact" in out:
        text += (f"; exact: EVENT p50 {out['exact']['event']['p50_ms']} ms; all exact: last "
                 f"p50 {out['all_exact']['last']['p50_ms']} ms")
    if "aiomqtt" in out:
        text += f"; with aiomqtt: last p50 {out['aiomqtt']['last']['p50_ms']} ms"
    default = out.get("default_config", {}).get("prefix")
    if default:
        text += f"; default config (Nagle): last p50 {default['last']['p50_ms']} ms"
    return text
