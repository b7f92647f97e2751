"""MQTT presets benchmark: the bridge's CPU per message with a preset against a plain field
map (drivers.mqtt_presets).

Run from the repository root::

    .venv/bin/python -m bench.mqtt_presets [--messages 20000] [--bridged 5000] [--no-bridged]

Two parts, the same cases in each (a device's documented payload, with the entry that maps
it): ``plain`` (a Zigbee2MQTT state through a map without fields: the whole JSON object as
kwargs), ``fields`` (a Tasmota report through ``fields = {temperature =
"AM2301.Temperature", ...}``), and the presets ``zigbee2mqtt``, ``tasmota``, ``shelly`` (a Gen2
NotifyStatus overlaid on a full status), ``esphome`` (one number) and ``homeassistant`` (a
Zigbee2MQTT state followed through five announced entities).

- ``hook``: in this process, the bridge's own work on a message (``MqttBridge.bridge_in`` on
  real ``aiomqtt.Message`` objects, from the loop guard to the publication queued on its
  RouterLink, which is not connected): CPU microseconds per message, the best of
  ``--repeat`` runs of ``--messages`` messages.
- ``bridged``: the whole bridge as a process (``cairn bridge mqtt``) between a Mosquitto and
  a router (``cairn router``, history on ``sensor``), fed ``--bridged`` messages at QoS 1 at
  ``--rate`` a second (a burst outruns the bridge on a busy machine, and Mosquitto then drops
  what exceeds its ``max_queued_messages`` for it) by a client in this process, until the
  router has stored them all (``cairn_history_events`` in its ``/metrics``) or no more for
  10 s: the bridge process's CPU (utime + stime) per stored reading, MQTT receive and WAMP
  publish (retained, acknowledged) included, and any loss.

The table goes to stdout, the details to ``bench/results/mqtt_presets.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

from bench.mqtt import Process, start_servers, stopped_counts, warm_up
from bench.pubsub import machine, source_version
from harness.process import wait_for_ports

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "mqtt_presets.json"

Z2M_STATE = {"temperature": 22.75, "linkquality": 97, "humidity": 55.43, "pressure": 1000.6,
             "battery": 86, "voltage": 3005}
TASMOTA = {"Time": "2019-01-01T00:00:00", "AM2301": {"Temperature": 24.6, "Humidity": 58.2},
           "TempUnit": "C"}
SHELLY_FULL = {"src": "shellyplusht-b8d6", "method": "NotifyFullStatus", "params": {
    "ts": 1680962879.62, "temperature:0": {"id": 0, "tC": 19.8, "tF": 67.6},
    "humidity:0": {"id": 0, "rh": 42.2},
    "devicepower:0": {"id": 0, "battery": {"V": 5.2, "percent": 71},
                      "external": {"present": False}}}}
SHELLY_CHANGE = {"src": "shellyplusht-b8d6", "method": "NotifyStatus", "params": {
    "ts": 1680963479.61, "temperature:0": {"id": 0, "tC": 20.4, "tF": 68.7}}}


def _discovery() -> list[tuple[str, dict[str, Any]]]:
    """What Zigbee2MQTT announces for bench-z2m: five entities on one state topic."""
    entities = {"temperature": ("temperature", "°C"), "humidity": ("humidity", "%"),
                "pressure": ("atmospheric_pressure", "hPa"), "battery": ("battery", "%"),
                "linkquality": (None, "lqi")}
    return [(f"homeassistant/sensor/0x00158d0001/{key}/config",
             {"state_topic": "bench-z2m/bench-1", "unit_of_measurement": unit,
              "value_template": f"{{{{ value_json.{key} }}}}",
              "device": {"identifiers": ["zigbee2mqtt_0x00158d0001"]},
              **({"device_class": device_class} if device_class else {})})
            for key, (device_class, unit) in entities.items()]


# name: ([[mqtt.map]] entry, messages sent first (retained), the message measured)
CASES: dict[str, tuple[str, list[tuple[str, Any]], tuple[str, Any]]] = {
    "plain": ('filter = "bench-z2m/+"\ntopic = "sensor.{1}"', [],
              ("bench-z2m/bench-1", Z2M_STATE)),
    "fields": ('filter = "tele/+/SENSOR"\ntopic = "sensor.{1}"\nfields = { temperature = '
               '"AM2301.Temperature", humidity = "AM2301.Humidity" }', [],
               ("tele/bench-1/SENSOR", TASMOTA)),
    "zigbee2mqtt": ('preset = "zigbee2mqtt"\nbase = "bench-z2m"', [],
                    ("bench-z2m/bench-1", Z2M_STATE)),
    "tasmota": ('preset = "tasmota"', [], ("tele/bench-1/SENSOR", TASMOTA)),
    "shelly": ('preset = "shelly"', [("shellyplusht-b8d6/events/rpc", SHELLY_FULL)],
               ("shellyplusht-b8d6/events/rpc", SHELLY_CHANGE)),
    "esphome": ('preset = "esphome"', [], ("bench-1/sensor/living_room_temperature/state",
                                          21.5)),
    "homeassistant": ('preset = "homeassistant"\nfollow = ["bench-z2m/#"]', _discovery(),
                      ("bench-z2m/bench-1", Z2M_STATE)),
}


def _payload(value: Any) -> bytes:
    return json.dumps(value).encode()


def bridge_toml(router: str, broker: int, entry: str, backlog: int) -> str:
    return (f'[driver]\nrouter = "{router}"\nbacklog = {backlog}\n[mqtt]\n'
            f'broker = "127.0.0.1:{broker}"\nclient_id = "bench-presets"\n'
            f"[[mqtt.map]]\n{entry}\n")


# -- hook: the bridge's own work, in this process ----------------------------------------

async def hook_case(name: str, n: int, repeat: int) -> dict[str, Any]:
    import aiomqtt

    from cairn.drivers.mqtt_bridge import MqttBridge, load

    entry, first, (topic, value) = CASES[name]
    bridge = MqttBridge(*load(tomllib.loads(bridge_toml("ws://127.0.0.1:1/ws", 1, entry,
                                                        n + 100)), "bench.toml"))
    for setup_topic, setup in first:
        bridge.bridge_in(aiomqtt.Message(setup_topic, _payload(setup), 1, True, 1, None))
    messages = [aiomqtt.Message(topic, _payload(value), 1, False, i, None) for i in range(n)]
    best = None
    for _ in range(repeat):
        bridge.link.backlog.clear()
        started = time.process_time_ns()
        for message in messages:
            bridge.bridge_in(message)
        spent = time.process_time_ns() - started
        best = spent if best is None else min(best, spent)
    queued = [p for p in bridge.link.backlog if not p.status]
    return {"case": name, "messages": n, "us_per_message": round(best / n / 1000, 2),
            "published": len(queued), "kwargs": queued[-1].kwargs if queued else None}


# -- bridged: the bridge as a process between Mosquitto and the router -------------------

async def bridged_case(name: str, n: int, rate: float) -> dict[str, Any]:
    import aiomqtt
    from autobahn.wamp.types import SubscribeOptions

    from cairn.drivers.runtime import open_session

    entry, first, (topic, value) = CASES[name]
    workdir = Path(tempfile.mkdtemp(prefix="cairn-bench-presets-"))
    mosquitto, mqtt_port, router, ws_port, rs_port = start_servers(workdir)
    (workdir / "bridge.toml").write_text(bridge_toml(f"rawsocket+unix:{workdir}/wamp.sock",
                                                     mqtt_port, entry, n + 100))
    processes = [mosquitto, router]
    try:
        wait_for_ports([mqtt_port, ws_port, rs_port],
                       lambda: all(p.proc.poll() is None for p in processes))
        async with aiomqtt.Client("127.0.0.1", mqtt_port, max_inflight_messages=256) as mqtt:
            mqtt.pending_calls_threshold = n + 1  # 256 in flight is the point, not a leak
            for setup_topic, setup in first:  # announcements and full statuses, retained
                await mqtt.publish(setup_topic, _payload(setup), qos=1, retain=True)
            bridge = Process("bridge", [sys.executable, "-m", "cairn.drivers.mqtt_cli",
                                        "bridge", "mqtt", "--config",
                                        str(workdir / "bridge.toml")],
                             workdir / "bridge.log", workdir)
            processes.append(bridge)
            # A subscriber only to see the bridge come up: under load a slow reader of a
            # burst loses events (the router bounds what a client makes it hold).
            session = await open_session(f"rawsocket+tcp://127.0.0.1:{rs_port}", "realm1")
            arrivals: list[float] = []
            await session.subscribe(lambda *a, **kw: arrivals.append(time.monotonic()),
                                    "sensor.", options=SubscribeOptions(match="prefix"))
            await warm_up(mqtt_port, arrivals, processes, topic, _payload(value))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.leave(), 2)
            await asyncio.sleep(1.0)  # connected and idle
            stored = await asyncio.to_thread(_stored, ws_port)
            cpu_before, started = bridge.cpu_seconds(), time.monotonic()
            for i in range(n):  # paced: a burst outruns the bridge, and then Mosquitto
                # drops what exceeds its max_queued_messages (1000) for it
                await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
                await mqtt.publish(topic, _payload(value), qos=1)
            cpu, done, got = await _until_stored(bridge, ws_port, stored + n)
            cpu -= cpu_before
    finally:
        logs = {p.name: p.stop() for p in reversed(processes)}
    counts = stopped_counts(logs.get("bridge", ""))
    shutil.rmtree(workdir, ignore_errors=True)
    bridged = got - stored
    return {"case": name, "messages": n, "rate_per_s": rate, "stored": bridged,
            "loss": n - bridged, "received": counts.get("received"),
            "published": counts.get("published"), "bridge_cpu_s": round(cpu, 2),
            "bridge_us_per_message": round(cpu / max(bridged, 1) * 1e6),
            "bridged_per_s": round(bridged / (done - started))}


def _stored(ws_port: int) -> int:
    """The router's ``cairn_history_events``: readings stored (history on ``sensor``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ws_port}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("cairn_history_events "):
                return int(float(line.split()[1]))
    raise RuntimeError("no cairn_history_events in /metrics")


async def _until_stored(bridge: Process, ws_port: int,
                        wanted: int) -> tuple[float, float, int]:
    """The bridge's CPU seconds, the time, and the readings stored once the router stored
    ``wanted`` readings, or no more for 10 s."""
    got, since = _stored(ws_port), time.monotonic()
    while got < wanted and time.monotonic() - since < 10 and bridge.proc.poll() is None:
        await asyncio.sleep(0.2)
        now = _stored(ws_port)
        if now > got:
            got, since = now, time.monotonic()
    return bridge.cpu_seconds(), time.monotonic(), got


# -- report ------------------------------------------------------------------------------

def table(hook: list[dict[str, Any]], bridged: list[dict[str, Any]]) -> str:
    by_case = {r["case"]: r for r in bridged}
    plain = next((r["us_per_message"] for r in hook if r["case"] == "fields"), None)
    head = ("case", "hook µs/msg", "vs fields map", "bridge process µs/msg", "stored",
            "stored/s")
    rows = [head]
    for r in hook:
        b = by_case.get(r["case"], {})
        rows.append((r["case"], f"{r['us_per_message']:.2f}",
                     f"{r['us_per_message'] / plain:.2f}x" if plain else "",
                     f"{b['bridge_us_per_message']:,}" if b else "–",
                     f"{b['stored']:,}/{b['messages']:,}" if b else "–",
                     f"{b['bridged_per_s']:,}" if b else "–"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True))
                     for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per hook case")
    parser.add_argument("--repeat", type=int, default=3, help="hook runs; the best counts")
    parser.add_argument("--bridged", type=int, default=5_000, help="per bridged case")
    parser.add_argument("--no-bridged", action="store_true", help="the hook part only")
    parser.add_argument("--rate", type=float, default=200,
                        help="bridged: messages per second sent")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    hook = [asyncio.run(hook_case(name, args.messages, args.repeat)) for name in args.cases]
    bridged = []
    if not args.no_bridged:
        for name in args.cases:
            bridged.append(asyncio.run(bridged_case(name, args.bridged, args.rate)))
            print(f"{name}: {bridged[-1]}", file=sys.stderr)
    print(table(hook, bridged))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "mqtt_presets", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(), "source": source_version(), "settings": vars(args),
        "hook": hook, "bridged": bridged}, indent=2) + "\n")
    print(f"details: {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
