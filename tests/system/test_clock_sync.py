"""Whether the clock is synchronized: the kernel's state (adjtimex(2), which chrony, ntpd
and systemd-timesyncd all set) or timesyncd's flag file; and ages of retained events by
CLOCK_BOOTTIME, which no step of the wall clock moves."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions

from cairn.base import clock
from cairn.base.clock_readings import age_s, parse_rfc3339
from harness.config import (
    EVERYTHING,
    history_rule,
    named_users,
    open_realm,
    permission,
    realm,
    role,
    router_table,
    ticket_of,
)
from harness.process import ROOT, RouterProcess
from harness.wamp_client import connect
from tests.conftest import RunningRouter, start_router

REALM = open_realm(history=[history_rule("sensor")])
RETAINED = PublishOptions(retain=True, acknowledge=True)
# rita may call cairn.retained.received, and subscribe to sensor.yard only
READER_REALM = realm("realm1", role("anonymous", permission("", EVERYTHING)),
                     role("reader", permission("cairn.retained.received", ["call"], "exact"),
                          permission("sensor.yard", ["subscribe"], "exact")),
                     named_users("reader", "rita"), history_rule("sensor"),
                     anonymous_role="anonymous")

# adjtimex(2) through the raw system call, reading struct timex at the offsets of the
# kernel's LP64 ABI: a path that shares nothing with base.clock's ctypes.Structure
RAW_ADJTIMEX = """
import ctypes, json, platform, struct
number = {"x86_64": 159, "aarch64": 171}[platform.machine()]
timex = ctypes.create_string_buffer(208)  # modes 0: only reads
state = ctypes.CDLL(None).syscall(number, timex)
(status,) = struct.unpack_from("i", timex, 40)
sec, _, tick = struct.unpack_from("qqq", timex, 72)
print(json.dumps({"state": state, "status": status, "sec": sec, "tick": tick}))
"""

needs_lp64_linux = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="the raw adjtimex system call is checked on Linux x86_64 and aarch64")


def raw_adjtimex() -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", RAW_ADJTIMEX], capture_output=True,
                          text=True, check=True, timeout=30)
    return json.loads(done.stdout)


@needs_lp64_linux
def test_the_kernel_reader_reads_what_the_raw_system_call_returns():
    raw = raw_adjtimex()
    state, timex = clock.adjtimex()
    assert (state, timex.status, timex.tick) == (raw["state"], raw["status"], raw["tick"])
    assert abs(timex.time_sec - raw["sec"]) <= 2  # the kernel's time, so the layout holds
    assert abs(timex.time_sec - time.time()) <= 2


@needs_lp64_linux
def test_the_kernel_counts_as_synchronized_unless_sta_unsync_or_time_error():
    raw = raw_adjtimex()
    expected = raw["state"] != 5 and not raw["status"] & 0x0040  # TIME_ERROR, STA_UNSYNC
    assert clock.kernel_synchronized() is expected


def test_timesyncds_flag_file_counts_when_the_kernel_says_unsynchronized(tmp_path,
                                                                         monkeypatch):
    flag = tmp_path / "synchronized"
    monkeypatch.setattr(clock, "kernel_synchronized", lambda: False)
    monkeypatch.setattr(clock, "SYNCED_PATHS", (flag,))
    assert clock.clock_synchronized() is False
    flag.touch()
    assert clock.clock_synchronized() is True


def test_the_kernels_state_counts_without_the_flag_file(tmp_path, monkeypatch):
    monkeypatch.setattr(clock, "kernel_synchronized", lambda: True)
    monkeypatch.setattr(clock, "SYNCED_PATHS", (tmp_path / "absent",))
    assert clock.clock_synchronized() is True


def test_reading_the_clock_state_is_cheap():
    clock.clock_synchronized()
    n = 2000
    started = time.perf_counter()
    for _ in range(n):
        clock.clock_synchronized()
    assert (time.perf_counter() - started) / n < 100e-6  # measured: about 5 µs


def test_an_age_from_another_boot_is_unknown():
    now = clock.SystemClock().now()
    assert age_s("another-boot", now.boottime_ns, now) is None
    assert age_s(now.boot_id, now.boottime_ns - 3_000_000_000, now) == 3.0


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "synchronized"), [("1", True), ("0", False)])
async def test_the_router_reports_the_kernels_state_without_the_flag_file(
        tmp_path, kernel, synchronized):
    env = {"CAIRN_FAKE_CLOCK_SYNCED": kernel,  # the kernel reader's answer, no flag file
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    router = RouterProcess(tmp_path, REALM, env=env).start()
    try:
        session = await connect(router)
        status = await session.call("cairn.router.status")
        assert status["clock"]["synchronized"] is synchronized
        await session.leave()
    finally:
        router.stop()


@pytest.mark.slow
async def test_a_retained_events_age_is_by_boottime_while_the_wall_clock_steps(tmp_path):
    offset_file = tmp_path / "offset"
    offset_file.write_text("0")
    env = {"CAIRN_FAKE_CLOCK_FILE": str(offset_file), "CAIRN_FAKE_CLOCK_SYNCED": "0",
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    router = RouterProcess(tmp_path, REALM, env=env).start()
    try:
        session = await connect(router)
        published = await session.publish("sensor.shed", temperature=7.5, options=PublishOptions(
            retain=True, acknowledge=True))
        offset_file.write_text(str(3 * 3600))  # the wall clock is set 3 h ahead
        received = await session.call("cairn.retained.received", "sensor.shed")
        assert received["publication"] == published.id
        assert 0 <= received["age_s"] < 5
        assert received["synchronized"] is False
        assert parse_rfc3339(received["timestamp"]) <= time.time() * 1000
        assert await session.call("cairn.retained.received", "sensor.none") is None
        await session.leave()
    finally:
        router.stop()


@pytest.fixture
async def reader_router(tmp_path):
    node = await start_router(router_table(tmp_path / "data") + READER_REALM)
    yield RunningRouter(node, "")
    await node.stop()


async def test_received_refuses_a_caller_that_may_not_subscribe_to_the_topic(reader_router):
    publisher = await connect(reader_router)
    rita = await connect(reader_router, authmethods=["ticket"], authid="rita",
                         secret=ticket_of("rita"))
    try:
        await publisher.publish("sensor.shed", temperature=7.5, options=RETAINED)
        refusals = {}
        for topic in ("sensor.shed", "sensor.none"):  # one retained event, one without
            with pytest.raises(ApplicationError) as refused:
                await rita.call("cairn.retained.received", topic)
            refusals[topic] = (refused.value.error, refused.value.args)
        assert refusals["sensor.shed"][0] == "wamp.error.not_authorized"
        # the same answer whether there is a retained event or not: nothing about it leaks
        assert str(refusals["sensor.shed"]).replace("sensor.shed", "TOPIC") == \
            str(refusals["sensor.none"]).replace("sensor.none", "TOPIC")
        # where rita may subscribe, she is told
        published = await publisher.publish("sensor.yard", temperature=9.0, options=RETAINED)
        received = await rita.call("cairn.retained.received", "sensor.yard")
        assert received["publication"] == published.id
    finally:
        await rita.leave()
        await publisher.leave()


async def test_received_answers_none_for_a_retained_event_the_caller_is_not_eligible_for(
        reader_router):
    publisher = await connect(reader_router)
    rita = await connect(reader_router, authmethods=["ticket"], authid="rita",
                         secret=ticket_of("rita"))
    try:
        await publisher.publish("sensor.yard", temperature=9.0, options=PublishOptions(
            retain=True, acknowledge=True, eligible_authid=["someone-else"]))
        assert await rita.call("cairn.retained.received", "sensor.yard") is None
    finally:
        await rita.leave()
        await publisher.leave()


@pytest.mark.slow
async def test_a_retained_events_age_and_clock_state_survive_a_router_restart_in_one_boot(
        tmp_path):
    env = {"CAIRN_FAKE_CLOCK_SYNCED": "1", "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    router = RouterProcess(tmp_path, REALM, env=env).start()
    try:
        session = await connect(router)
        published = await session.publish("sensor.shed", temperature=7.5, options=RETAINED)
        await session.leave()
        router.stop()
        router.start()
        session = await connect(router)
        received = await session.call("cairn.retained.received", "sensor.shed")
        await session.leave()
        assert received["publication"] == published.id
        assert (received["synchronized"], received["age_s"] is not None) == (True, True)
    finally:
        router.stop()
