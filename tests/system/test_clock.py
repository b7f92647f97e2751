"""A wall clock that jumps: history stays in receive order, time filters follow the stored
timestamps, and every step is recorded as an anchor (with CLOCK_BOOTTIME beside it)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.base.clock_readings import parse_rfc3339
from harness.process import ROOT, RouterProcess
from harness.wamp_client import connect
from tests.system.test_durability import REALM

pytestmark = pytest.mark.slow

HOURS = 3600


async def test_history_keeps_receive_order_while_the_clock_steps_back_and_forth(tmp_path):
    offset_file = tmp_path / "offset"
    offset_file.write_text("0")
    env = {"CAIRN_FAKE_CLOCK_FILE": str(offset_file),
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    router = RouterProcess(tmp_path, REALM, env=env).start()
    phases = {"before": 0, "back": -2 * HOURS, "ahead": 3 * HOURS}
    published: dict[str, list[int]] = {}
    try:
        session = await connect(router)
        for phase, offset in phases.items():
            offset_file.write_text(str(offset))
            published[phase] = [
                (await session.publish("sensor.clock", phase, i,
                                       options=PublishOptions(acknowledge=True))).id
                for i in range(3)]
        sub_id = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        result = await session.call("wamp.subscription.get_events", sub_id)
        events = result.results[0]
        # receive order, not timestamp order
        assert [e["publication"] for e in events] == sum(published.values(), [])
        stamp = {e["publication"]: parse_rfc3339(e["timestamp"]) for e in events}
        first_before = stamp[published["before"][0]]
        assert all(stamp[p] < first_before - HOURS * 1000 for p in published["back"])
        assert all(stamp[p] > first_before + 2 * HOURS * 1000 for p in published["ahead"])

        # a time filter selects by stored timestamp and still returns receive order
        before = await session.call("wamp.subscription.get_events", sub_id,
                                    before_time=events[0]["timestamp"])
        assert [e["publication"] for e in before.results[0]] == published["back"]
        after = await session.call("wamp.subscription.get_events", sub_id,
                                   from_time=events[0]["timestamp"])
        assert [e["publication"] for e in after.results[0]] == \
            published["before"] + published["ahead"]
        await session.leave()
    finally:
        router.stop()

    with contextlib.closing(sqlite3.connect(Path(router.db_path))) as db:
        anchors = db.execute("SELECT reason, offset_before_ns, wall_ns - boottime_ns "
                             "FROM anchors ORDER BY id").fetchall()
    assert [a[0] for a in anchors] == ["start", "step", "step"]
    steps = [(after - before) / 1e9 for _, before, after in anchors[1:]]
    assert steps[0] == pytest.approx(-2 * HOURS, abs=5)
    assert steps[1] == pytest.approx(5 * HOURS, abs=5)
