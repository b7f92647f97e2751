"""The MQTT bridge against a real Mosquitto and a real router process.

One broker and one router serve the whole module (the restart tests stop and start them on
the same ports); every test uses its own topics and MQTT client id, because both keep
retained values from test to test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from cairn.drivers import mqtt_cli
from cairn.drivers.mqtt_bridge import MapRule, MqttBridge, load
from cairn.drivers.runtime import open_session
from harness.config import history_rule, open_realm
from harness.process import ROOT, RouterProcess, free_port, wait_for_ports
from harness.waiting import until
from harness.wamp_client import all_history
from tests.system.test_durability import REALM


class Mosquitto:
    """A broker on a fixed loopback port, no persistence: a restart forgets everything."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
            f"log_dest file {workdir / 'mosquitto.log'}\n"
            + ("user root\n" if os.geteuid() == 0 else ""))
        self.proc: subprocess.Popen | None = None

    def start(self) -> Mosquitto:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not os.path.exists(binary):
            pytest.fail("mosquitto is not installed (scripts/setup.sh test installs it)")
        self.proc = subprocess.Popen([binary, "-c", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:  # until it listens, or exits (a generous deadline: a loaded CI machine)
            wait_for_ports([self.port], lambda: self.proc.poll() is None)
        except RuntimeError as e:
            raise TimeoutError(f"mosquitto did not listen: {e}") from None
        return self

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    mosquitto = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield mosquitto
    mosquitto.stop()


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    process = RouterProcess(tmp_path_factory.mktemp("router"), REALM).start()
    yield process
    process.stop()



@contextlib.asynccontextmanager
async def running_bridge(router: RouterProcess, broker: Mosquitto, client_id: str,
                         body: str, driver: str = "") -> AsyncIterator[MqttBridge]:
    """The bridge in this process, once connected to both sides; ``driver``: more keys of
    its [driver] table."""
    data = tomllib.loads(f'[driver]\nrouter = "{router.ws_url}"\n{driver}[mqtt]\n'
                         f'broker = "127.0.0.1:{broker.port}"\nclient_id = "{client_id}"\n{body}')
    bridge = MqttBridge(*load(data, "test.toml"))
    task = asyncio.create_task(bridge.run())
    try:
        await until(lambda: bridge.stats.mqtt_connects and bridge.link.stats.connected and
                    (bridge.stats.wamp_connects or not bridge.config.forwards))
        yield bridge
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Events:
    """A WAMP subscriber's events: (topic, args, kwargs, retained)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.session = None

    @classmethod
    async def subscribe(cls, router: RouterProcess, topic: str, match: str = "exact",
                        get_retained: bool = False) -> Events:
        events = cls()
        events.session = await open_session(router.ws_url, "realm1")

        def on_event(*args, details, **kwargs):
            events.queue.put_nowait((details.topic or topic, args, kwargs, details.retained))

        await events.session.subscribe(on_event, topic, options=SubscribeOptions(
            match=match, get_retained=get_retained, details_arg="details"))
        return events

    async def next(self, timeout: float = 5) -> tuple:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.session.leave(), 2)


@contextlib.asynccontextmanager
async def wamp_events(router, topic, match="exact", get_retained=False):
    events = await Events.subscribe(router, topic, match, get_retained)
    try:
        yield events
    finally:
        await events.close()


def mqtt_client(broker: Mosquitto) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V5)


async def mqtt_messages(client: aiomqtt.Client, seconds: float) -> list[aiomqtt.Message]:
    """Whatever arrives within ``seconds``."""
    got = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            async for message in client.messages:
                got.append(message)
    return got


# -- MQTT -> WAMP ------------------------------------------------------------------------

def test_wildcard_levels_fill_the_wamp_topic_template():
    plus = MapRule("tele/+/SENSOR", "sensor.{1}")
    assert plus.wamp_topic("tele/tasmota_1/SENSOR") == "sensor.tasmota_1"
    assert plus.wamp_topic("tele/tasmota_1/STATE") is None
    assert plus.wamp_topic("tele/a/b/SENSOR") is None
    assert MapRule("z2m/+", "sensor.{1}").wamp_topic("z2m/Living Room #2") == "sensor.Living_Room_2"
    hashed = MapRule("home/#", "home.{1}")
    assert hashed.wamp_topic("home/kitchen/temp") == "home.kitchen.temp"
    assert MapRule("a/+/+", "x.{2}.{1}.{0}").wamp_topic("a/b/c") == "x.c.b.a.b.c"


async def test_mqtt_filters_with_wildcards_map_to_wamp_topics(router, broker):
    body = """
[[mqtt.map]]
filter = "wild/zigbee2mqtt/+"
topic = "sensor.wild.{1}"
[[mqtt.map]]
filter = "wild/tele/+/SENSOR"
topic = "sensor.wild.{1}"
"""
    async with running_bridge(router, broker, "map", body), \
            wamp_events(router, "sensor.wild.", "prefix") as events, mqtt_client(broker) as mqtt:
        await mqtt.publish("wild/tele/plug_1/STATE", b'{"POWER": "ON"}')  # no entry takes it
        await mqtt.publish("wild/zigbee2mqtt/Living Room", b'{"t": 1}')
        await mqtt.publish("wild/tele/plug_1/SENSOR", b'{"t": 2}')
        assert (await events.next())[0] == "sensor.wild.Living_Room"
        assert (await events.next())[0] == "sensor.wild.plug_1"


async def test_json_object_becomes_kwargs(router, broker):
    body = '[[mqtt.map]]\nfilter = "kw/+"\ntopic = "sensor.kw.{1}"\n'
    async with running_bridge(router, broker, "kwargs", body), \
            wamp_events(router, "sensor.kw.a") as events, mqtt_client(broker) as mqtt:
        await mqtt.publish("kw/a", b'{"temperature": 21.5, "humidity": 48, "ok": true}')
        assert await events.next() == ("sensor.kw.a", (), {"temperature": 21.5, "humidity": 48,
                                                           "ok": True}, None)


async def test_keys_autobahn_cannot_carry_are_renamed(router, broker):
    body = '[[mqtt.map]]\nfilter = "rsv/+"\ntopic = "sensor.rsv.{1}"\n'
    async with running_bridge(router, broker, "reserved", body), \
            wamp_events(router, "sensor.rsv.a") as events, mqtt_client(broker) as mqtt:
        await mqtt.publish("rsv/a", b'{"topic": "x", "options": 1, "t": 2}')
        assert (await events.next())[2] == {"topic_": "x", "options_": 1, "t": 2}


async def test_other_json_values_travel_as_value(router, broker):
    body = '[[mqtt.map]]\nfilter = "val/+"\ntopic = "sensor.val.{1}"\n'
    async with running_bridge(router, broker, "value", body), \
            wamp_events(router, "sensor.val.a") as events, mqtt_client(broker) as mqtt:
        await mqtt.publish("val/a", b"21.5")
        await mqtt.publish("val/a", b"[1, 2]")
        assert (await events.next())[2] == {"value": 21.5}
        assert (await events.next())[2] == {"value": [1, 2]}


async def test_fields_select_and_rename_dotted_paths(router, broker):
    body = """
[[mqtt.map]]
filter = "fld/+/SENSOR"
topic = "sensor.fld.{1}"
fields = { temperature = "AM2301.Temperature", humidity = "AM2301.Humidity" }
"""
    tasmota = {"Time": "2026-01-01T00:00:00", "AM2301": {"Temperature": 19.2, "Humidity": 55.1},
               "TempUnit": "C"}
    async with running_bridge(router, broker, "fields", body) as bridge, \
            wamp_events(router, "sensor.fld.t1") as events, mqtt_client(broker) as mqtt:
        await mqtt.publish("fld/t1/SENSOR", b'{"Time": "x", "DS18B20": {}}')  # no such field
        await mqtt.publish("fld/t1/SENSOR", json.dumps(tasmota).encode())
        assert (await events.next())[2] == {"temperature": 19.2, "humidity": 55.1}
        assert bridge.stats.skipped == 1


async def test_invalid_json_is_counted_and_skipped(router, broker, caplog):
    body = '[[mqtt.map]]\nfilter = "inv/+"\ntopic = "sensor.inv.{1}"\n'
    async with running_bridge(router, broker, "invalid", body) as bridge, \
            wamp_events(router, "sensor.inv.a") as events, mqtt_client(broker) as mqtt:
        for bad in (b"{nope", b"ON", b"NaN", b"\xff\xfe", b""):
            await mqtt.publish("inv/a", bad)
        await mqtt.publish("inv/a", b'{"t": 1}')
        assert (await events.next())[2] == {"t": 1}
        assert bridge.stats.invalid == 5 and bridge.stats.bridged == 1
    assert "skipping inv/a: invalid JSON" in caplog.text


async def test_mqtt_retained_message_becomes_wamp_retained_event(router, broker):
    body = '[[mqtt.map]]\nfilter = "ret/+"\ntopic = "sensor.ret.{1}"\nretain = false\n'
    async with mqtt_client(broker) as mqtt:  # retained before the bridge starts
        await mqtt.publish("ret/a", b'{"t": 3}', qos=1, retain=True)
    async with running_bridge(router, broker, "retained", body) as bridge:
        await until(lambda: bridge.link.stats.published >= 2)  # its status, then ret/a
    async with wamp_events(router, "sensor.ret.a", get_retained=True) as late:
        assert await late.next() == ("sensor.ret.a", (), {"t": 3}, True)


async def test_map_retain_false_leaves_live_messages_unretained(router, broker):
    body = '[[mqtt.map]]\nfilter = "live/+"\ntopic = "sensor.live.{1}"\nretain = false\n'
    async with running_bridge(router, broker, "live", body), \
            wamp_events(router, "sensor.live.a") as events, mqtt_client(broker) as mqtt:
        await mqtt.publish("live/a", b'{"t": 4}')
        assert (await events.next())[2] == {"t": 4}
    async with wamp_events(router, "sensor.live.a", get_retained=True) as late:
        with pytest.raises(TimeoutError):
            await late.next(timeout=0.5)


# -- WAMP -> MQTT ------------------------------------------------------------------------

async def test_forward_sends_current_values_retained_to_mqtt(router, broker):
    publisher = await open_session(router.ws_url, "realm1")
    await publisher.publish("cmd.fwd.light1", on=True,
                            options=PublishOptions(retain=True, acknowledge=True))
    body = '[[mqtt.forward]]\ntopic = "cmd.fwd."\nmatch = "prefix"\nmqtt = "fwd/{1}/set"\n'
    async with running_bridge(router, broker, "forward", body) as bridge:
        await until(lambda: bridge.stats.forwarded == 1)  # the current value, at start
        publisher.publish("cmd.fwd.light2", level=[1, 2])
        await until(lambda: bridge.stats.forwarded == 2)
    await publisher.leave()
    async with mqtt_client(broker) as late:
        await late.subscribe("fwd/#")
        got = {m.topic.value: (json.loads(m.payload), m.retain)
               for m in await mqtt_messages(late, 0.5)}
    assert got == {"fwd/light1/set": ({"on": True}, True),
                   "fwd/light2/set": ({"level": [1, 2]}, True)}


LOOP = """
[[mqtt.map]]
filter = "loop/+"
topic = "loop.{1}"
[[mqtt.forward]]
topic = "loop."
match = "prefix"
mqtt = "loop/{1}"
"""


async def test_forwarded_messages_are_not_bridged_back_in(router, broker):
    body = LOOP.replace("loop", "out")
    async with wamp_events(router, "out.b") as events:
        async with running_bridge(router, broker, "loop-out", body) as bridge:
            events.session.publish("out.b", n=1, options=PublishOptions(exclude_me=False))
            assert (await events.next())[2] == {"n": 1}
            await until(lambda: bridge.stats.forwarded == 1)
        # a new bridge gets its own retained message from the broker and drops it
        async with running_bridge(router, broker, "loop-out", body) as again:
            await until(lambda: again.stats.echoes == 1)
            assert again.stats.bridged == 0
        with pytest.raises(TimeoutError):
            await events.next(timeout=0.5)


async def test_bridged_in_messages_are_not_forwarded_back_out(router, broker):
    body = LOOP.replace("loop", "in")
    async with running_bridge(router, broker, "loop-in", body) as bridge, \
            wamp_events(router, "in.a") as events, mqtt_client(broker) as mqtt:
        await mqtt.subscribe("in/a")
        await mqtt.publish("in/a", b'{"n": 2}')
        assert (await events.next())[2] == {"n": 2}
        await until(lambda: bridge.stats.echoes == 1)
        assert [m.payload for m in await mqtt_messages(mqtt, 0.5)] == [b'{"n": 2}']
        with pytest.raises(TimeoutError):
            await events.next(timeout=0.1)


# -- restarts ----------------------------------------------------------------------------

async def test_bridge_reconnects_after_the_broker_restarts(router, broker):
    body = LOOP.replace("loop", "brk")
    async with running_bridge(router, broker, "broker-restart", body) as bridge, \
            wamp_events(router, "brk.", "prefix") as events:
        events.session.publish("brk.out", n=1, options=PublishOptions(retain=True))
        await until(lambda: bridge.stats.forwarded == 1)
        broker.stop()
        broker.start()  # same port, nothing retained any more
        await until(lambda: bridge.stats.mqtt_connects == 2)
        async with mqtt_client(broker) as mqtt:
            await mqtt.publish("brk/in", b'{"n": 2}')
            assert (await events.next())[:3] == ("brk.in", (), {"n": 2})
            await mqtt.subscribe("brk/out")  # the bridge said its retained value again
            assert [m.payload for m in await mqtt_messages(mqtt, 0.5)] == [b'{"n":1}']


async def test_bridge_reconnects_after_the_router_restarts(router, broker):
    body = LOOP.replace("loop", "rtr")
    async with running_bridge(router, broker, "router-restart", body) as bridge, \
            mqtt_client(broker) as mqtt:
        router.stop()
        await mqtt.publish("rtr/in", b'{"n": 1}', qos=1)  # waits in the bridge's backlog
        await until(lambda: bridge.stats.bridged == 1)
        router.start()
        await until(lambda: bridge.link.stats.connected and not bridge.link.backlog and
                    bridge.stats.wamp_connects == 2)
        async with wamp_events(router, "rtr.in", get_retained=True) as late:
            assert await late.next() == ("rtr.in", (), {"n": 1}, True)
        await mqtt.subscribe("rtr/out")
        publisher = await open_session(router.ws_url, "realm1")
        publisher.publish("rtr.out", n=2)
        assert [m.payload for m in await mqtt_messages(mqtt, 1)] == [b'{"n":2}']
        await publisher.leave()


# -- a backlog no single source can take (drivers.backlog) --------------------------------

async def history(router: RouterProcess, topic: str) -> list[dict]:
    """The kwargs of ``topic``'s events in history, oldest first."""
    session = await open_session(router.ws_url, "realm1")
    sub = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
    events = await all_history(session, sub, topic=topic)
    await session.leave()
    return [e["kwargs"] for e in events]


async def publish_beside_a_flood(mqtt: aiomqtt.Client, prefix: str, flood: int,
                                 every: int) -> list[dict]:
    """``flood`` messages on ``prefix/noisy`` with one on ``prefix/sensor`` every ``every``
    of them; returns what the sensor sent."""
    sensor = []
    for n in range(flood):
        await mqtt.publish(f"{prefix}/noisy", b'{"n": %d}' % n, qos=1)
        if n % every == 0:
            sensor.append({"n": n})
            await mqtt.publish(f"{prefix}/sensor", b'{"n": %d}' % n, qos=1)
    return sensor


async def test_while_the_router_is_away_a_noisy_publisher_drops_only_its_own_oldest(
        router, broker, caplog):
    body = '[[mqtt.map]]\nfilter = "share/+"\ntopic = "sensor.share.{1}"\n'
    async with running_bridge(router, broker, "share", body, "backlog = 20\n") as bridge, \
            mqtt_client(broker) as mqtt:
        router.stop()
        sent = await publish_beside_a_flood(mqtt, "share", flood=500, every=25)
        await until(lambda: bridge.stats.bridged == 500 + len(sent))
        router.start()
        await until(lambda: bridge.link.stats.connected and not bridge.link.backlog)
    assert bridge.link.stats.dropped_by_device == {"share/noisy": 480}
    assert await history(router, "sensor.share.sensor") == sent
    assert await history(router, "sensor.share.noisy") == [{"n": n} for n in range(480, 500)]
    assert "backlog full for share/noisy" in caplog.text


@pytest.fixture
def windowed_router(tmp_path):
    """A router whose sensor history waits for 5 s commit windows, as on the image."""
    realm = open_realm(history=[history_rule("sensor", commit_window="5s")])
    process = RouterProcess(tmp_path, realm).start()
    yield process
    process.stop()


async def test_a_flood_beside_a_real_sensor_through_commit_windows_keeps_every_reading(
        windowed_router, broker):
    body = '[[mqtt.map]]\nfilter = "lan/+"\ntopic = "sensor.lan.{1}"\n'
    async with running_bridge(windowed_router, broker, "lan", body) as bridge, \
            mqtt_client(broker) as mqtt:
        sent = await publish_beside_a_flood(mqtt, "lan", flood=3000, every=100)
        await until(lambda: bridge.stats.bridged == 3000 + len(sent), timeout=60)
        await until(lambda: not bridge.link.backlog, timeout=60,
                    what="the bridge to deliver what it took in")
    assert "lan/sensor" not in bridge.link.stats.dropped_by_device
    assert await history(windowed_router, "sensor.lan.sensor") == sent


# -- configuration -----------------------------------------------------------------------

GOOD = '[driver]\nrouter = "ws://127.0.0.1:1/ws"\n[mqtt]\n'
MAP = '[[mqtt.map]]\nfilter = "a/+"\ntopic = "sensor.{1}"\n'


@pytest.mark.parametrize(("body", "key", "problem"), [
    ("", "mqtt", "nothing to bridge"),
    ('broker = "localhost"\n' + MAP, "mqtt.broker", "expected 'host:port'"),
    ('keepalive = 0\n' + MAP, "mqtt.keepalive", "positive"),
    ('bogus = 1\n' + MAP, "mqtt.bogus", "unknown key"),
    ('password = "a"\npassword_env = "B"\n' + MAP, "mqtt.password_env", "only one of"),
    ('password_env = "CAIRN_TEST_UNSET"\n' + MAP, "mqtt.password_env", "not set"),
    ('[[mqtt.map]]\nfilter = "a/#/b"\ntopic = "s.{1}"\n', "mqtt.map[0].filter", "# only last"),
    ('[[mqtt.map]]\nfilter = "a/b+"\ntopic = "s"\n', "mqtt.map[0].filter", "whole levels"),
    ('[[mqtt.map]]\nfilter = "a/+"\ntopic = "s.{2}"\n', "mqtt.map[0].topic", "1 wildcard"),
    ('[[mqtt.map]]\nfilter = "a/+"\ntopic = "s.{x}"\n', "mqtt.map[0].topic", "placeholder"),
    ('[[mqtt.map]]\nfilter = "a/+"\ntopic = "s..{1}"\n', "mqtt.map[0].topic", "invalid WAMP URI"),
    ('[[mqtt.map]]\nfilter = "a/+"\n', "mqtt.map[0].topic", "missing"),
    ('[[mqtt.map]]\nfilter = "a/+"\ntopic = "s"\nqos = 3\n', "mqtt.map[0].qos", "0, 1 or 2"),
    ('[[mqtt.map]]\nfilter = "a/+"\ntopic = "s"\nfields = { t = 1 }\n',
     "mqtt.map[0].fields.t", "dotted path"),
    ('[[mqtt.forward]]\ntopic = "s"\nmqtt = "x/{1}"\n', "mqtt.forward[0].mqtt", "exact match"),
    ('[[mqtt.forward]]\ntopic = "s"\nmqtt = "x/#"\n', "mqtt.forward[0].mqtt", "no wildcards"),
    ('[[mqtt.forward]]\ntopic = "s"\nmatch = "wildcard"\nmqtt = "x"\n',
     "mqtt.forward[0].match", "exact or prefix"),
])
def test_bad_config_exits_2_naming_file_and_key(tmp_path, capsys, body, key, problem):
    path = tmp_path / "bridge.toml"
    path.write_text(GOOD + body)
    assert mqtt_cli.main(argparse.Namespace(config=str(path), log_level="info")) == 2
    err = capsys.readouterr().err
    assert f"{path}: {key}: " in err and problem in err, err


def test_missing_mqtt_table_exits_2_from_the_command_line(tmp_path):
    path = tmp_path / "bridge.toml"
    path.write_text('[driver]\nrealm = "realm1"\n')
    result = subprocess.run(
        [sys.executable, "-m", "cairn.drivers.mqtt_cli", "bridge", "mqtt", "--config", str(path)],
        capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert result.returncode == 2
    assert f"cairn: bad config: {path}: mqtt: missing" in result.stderr


def test_password_comes_from_a_file(tmp_path):
    (tmp_path / "pw").write_text("s3cret\n")
    data = tomllib.loads(f'[mqtt]\nusername = "u"\npassword_file = "{tmp_path / "pw"}"\n{MAP}')
    _, config = load(data, "x.toml")
    assert (config.username, config.password, config.port) == ("u", "s3cret", 1883)
