"""`cairn demo`: router, simulated sensors and driver in one command."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest
from autobahn.wamp.types import SubscribeOptions

from harness.process import ROOT, RouterProcess
from harness.wamp_client import connect
from tests.system.test_durability import REALM

pytestmark = pytest.mark.slow


async def test_demo_serves_simulated_readings_retained_and_stops_on_sigint(tmp_path):
    ports = RouterProcess(tmp_path, REALM)  # writes a config on free ports; not started
    proc = subprocess.Popen(
        [sys.executable, "-m", "cairn.app.cli", "demo", "--config", str(ports.config),
         "--interval", "0.5", "--fault-rate", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**ports.env, "PYTHONPATH": str(ROOT)})
    try:
        banner = ""
        while "Stop with Ctrl-C" not in banner:
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line, f"demo exited: {proc.stderr.read()}"
            banner += line
        assert f"http://127.0.0.1:{ports.port}/" in banner
        session = await connect(ports)
        readings: dict[str, dict] = {}
        for _ in range(50):  # until every simulated device has a retained reading
            readings.clear()

            def on_event(*args, details=None, **kwargs):
                readings[details.topic] = kwargs

            sub = await session.subscribe(on_event, "sensor.", options=SubscribeOptions(
                match="prefix", get_retained=True, details_arg="details"))
            await session.call("wamp.session.count")
            await sub.unsubscribe()
            if len(readings) == 6:
                break
            await asyncio.sleep(0.2)
        assert len(readings) == 6, readings
        assert all({"temperature", "humidity"} <= set(r) for r in readings.values())
        await session.leave()
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(10)
    assert code == 0
