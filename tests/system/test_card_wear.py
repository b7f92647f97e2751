"""The card's wear as the gateway shows it: bytes written per day and the projected years of
card life, in /metrics, ``cairn.router.status`` and ``cairn doctor``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core.config import load
from cairn.gateway.ops import wear
from cairn.gateway.ops.wear import WearMeter, disk_of
from cairn.gateway.shell.server import Node
from harness.config import router_table
from harness.process import ROOT, RouterProcess, free_port
from harness.wamp_client import connect
from tests.conftest import RunningRouter
from tests.system.test_ops import REALM, cairn, doctor_lines, parse_prometheus

GB = 10**9
MIB = 2**20
DAY = 86400


class FakeClock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(wear.time, "monotonic", lambda: self.now)


def disk_stat(directory: Path, written_bytes: int) -> Path:
    """A /sys/block/X-like directory whose stat says ``written_bytes`` were written."""
    directory.mkdir(exist_ok=True)
    sectors = written_bytes // wear.SECTOR
    (directory / "stat").write_text(f"100 0 800 10 7 0 {sectors} 30 0 40 40 0 0 0 0\n")
    return directory


def settled(meter: WearMeter, clock: FakeClock) -> None:
    """The meter's first sample, once the store's creation has reached the card."""
    clock.now += wear.SETTLE_S
    meter.sample()


def test_card_life_is_projected_from_the_disks_writes(tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    disk = disk_stat(tmp_path / "mmcblk0", 5 * GB)  # written before the router started
    meter = WearMeter(disk, endurance_tb=10)
    settled(meter, clock)
    clock.now += 3600
    disk_stat(disk, 7 * GB)
    meter.sample()
    report = meter.report()
    assert report["rate_from"] == "disk" and report["disk"] == "mmcblk0"
    assert report["bytes_per_day"] == 48 * GB  # 2 GB an hour
    assert report["life_years"] == round(10e12 / (48 * GB * 365), 1) == 0.6
    assert report["disk_written_bytes"] == 7 * GB
    assert (report["measuring"], report["measured_s"]) == (False, 3600)


def test_the_rate_is_taken_over_the_last_day(tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    disk = disk_stat(tmp_path / "sda", 0)
    meter = WearMeter(disk, endurance_tb=10)
    written = [0, 50 * GB] + [50 * GB + hour * GB for hour in range(1, 26)]  # a burst, then 1/h
    for total in written:
        clock.now += 3600
        disk_stat(disk, total)
        meter.sample()
    assert meter.report()["bytes_per_day"] == 24 * GB  # the burst is more than a day ago


def test_without_a_disk_the_rate_is_the_routers_own(tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    written = iter([10 * GB, 11 * GB, 11 * GB])
    monkeypatch.setattr(wear, "process_write_bytes", lambda: next(written))
    meter = WearMeter(None, endurance_tb=100)
    settled(meter, clock)
    clock.now += DAY
    meter.sample()
    report = meter.report()
    assert (report["rate_from"], report["bytes_per_day"], report["life_years"]) == \
        ("process", GB, 274.0)


def test_no_projection_before_an_hour_of_measurement(tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    disk = disk_stat(tmp_path / "sda", 0)
    meter = WearMeter(disk, endurance_tb=10)
    settled(meter, clock)
    clock.now += 3599
    disk_stat(disk, GB)
    report = meter.report()
    assert (report["measuring"], report["bytes_per_day"], report["life_years"]) == \
        (True, None, None)
    assert (report["measured_s"], report["needs_s"]) == (3599, 3600)
    clock.now += 1
    assert meter.report()["measuring"] is False and meter.report()["bytes_per_day"] == 24 * GB


def test_the_stores_creation_is_not_taken_for_wear(tmp_path, monkeypatch):
    """The demo's dashboard once showed 7.6 GB/day 44 s after start: the database being
    created (written back to the card half a minute later), extrapolated to a day."""
    clock = FakeClock(monkeypatch)
    disk = disk_stat(tmp_path / "sda", 0)
    meter = WearMeter(disk, endurance_tb=10)
    clock.now += 30
    disk_stat(disk, 100 * MIB)  # the new store reaches the card
    meter.sample()
    assert meter.report()["measuring"] is True
    clock.now += 30
    meter.sample()
    clock.now += 3600
    disk_stat(disk, 101 * MIB)  # then 1 MiB in an hour
    assert meter.report()["bytes_per_day"] == 24 * MIB


def fake_sysfs(root: Path, path: Path, partition: bool) -> None:
    """/sys/dev/block/M:m of the device holding ``path``, as the kernel lays it out for an
    SD card (mmcblk0, partition mmcblk0p2) or a whole disk."""
    dev = os.stat(path).st_dev
    disk = root / "devices/platform/mmc/mmcblk0"
    node = disk / "mmcblk0p2" if partition else disk
    node.mkdir(parents=True)
    disk_stat(disk, 0)
    if partition:
        (node / "partition").write_text("2\n")
        (node / "stat").write_text("1 0 8 0 0 0 0 0 0 0 0 0 0 0 0\n")
    (root / "dev/block").mkdir(parents=True)
    (root / f"dev/block/{os.major(dev)}:{os.minor(dev)}").symlink_to(node)


@pytest.mark.parametrize("partition", [True, False])
def test_a_data_directory_is_measured_on_the_whole_disk(tmp_path, monkeypatch, partition):
    fake_sysfs(tmp_path / "sys", tmp_path, partition)
    monkeypatch.setattr(wear, "SYS_DEV_BLOCK", tmp_path / "sys/dev/block")
    assert disk_of(tmp_path) == (tmp_path / "sys/devices/platform/mmc/mmcblk0").resolve()


def test_a_data_directory_without_a_block_device_has_no_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(wear, "SYS_DEV_BLOCK", tmp_path / "empty")
    assert disk_of(tmp_path) is None


# -- the router shows it ----------------------------------------------------------------------


def get_text(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.read().decode()


async def wear_figures(router: Any) -> tuple[dict, dict[str, float], tuple[str, str]]:
    """What the router shows of its card's wear: cairn.router.status, /metrics (unlabelled
    samples) and cairn doctor's line (run in a thread: the router may be in this process)."""
    session = await connect(router)
    try:
        status = await session.call("cairn.router.status")
    finally:
        await session.leave()
    families = parse_prometheus(await asyncio.to_thread(get_text, router.port, "/metrics"))
    metrics = {name: family["samples"][0][2] for name, family in families.items()
               if family["samples"]}
    doctor = await asyncio.to_thread(cairn, "doctor", "--config", str(router.config))
    (line,) = doctor_lines(doctor.stdout)["card wear"]
    assert doctor.returncode == 0, doctor.stdout  # a warning, not a failure
    return status, metrics, line


@pytest.mark.slow
async def test_a_router_just_started_says_measuring_instead_of_a_rate(tmp_path):
    router = RouterProcess(tmp_path, REALM).start()
    try:
        status, metrics, (level, detail) = await wear_figures(router)
    finally:
        router.stop()
    assert status["wear"]["measuring"] is True
    assert (status["wear"]["bytes_per_day"], status["wear"]["life_years"]) == (None, None)
    assert metrics["cairn_card_wear_measuring"] == 1
    assert "cairn_card_written_bytes_per_day" not in metrics
    assert "cairn_card_life_years" not in metrics
    assert level == "ok" and detail.startswith("measuring (0 of 60 min)"), detail


@dataclass
class InProcessRouter(RunningRouter):
    config: Path = Path()


@pytest.mark.slow
async def test_metrics_status_and_doctor_show_a_card_that_wears_out_too_fast(tmp_path,
                                                                            monkeypatch):
    """A card of 1 MB endurance: any write rate wears it out in minutes. (The meter's hour
    is shortened to a second here, in the router's own process.)"""
    monkeypatch.setattr(WearMeter, "settle_s", 0.0)
    monkeypatch.setattr(WearMeter, "min_span_s", 1.0)
    config = tmp_path / "cairn.toml"
    config.write_text(router_table(tmp_path / "data", f"127.0.0.1:{free_port()}",
                                   extra="card_endurance_tb = 0.000001") + REALM)
    node = Node(load(config))
    await node.start()
    try:
        node.stores.wear.sample()  # the first maintenance pass
        session = await connect(InProcessRouter(node, "", config))
        for i in range(20):
            await session.publish(f"sensor.s{i % 4}", i,
                                  options=PublishOptions(acknowledge=True, retain=True))
        await session.leave()
        await asyncio.sleep(1.1)
        status, metrics, (level, detail) = await wear_figures(InProcessRouter(node, "", config))
    finally:
        await node.stop()
    assert status["wear"]["endurance_tb"] == 0.000001
    assert status["wear"]["bytes_per_day"] > 0 and status["wear"]["life_years"] < 5
    assert metrics["cairn_process_written_bytes_total"] > 0
    assert metrics["cairn_card_written_bytes_per_day"] > 0
    assert metrics["cairn_card_life_years"] < 5
    assert metrics["cairn_card_wear_measuring"] == 0
    assert metrics["cairn_card_wear_window_seconds"] >= 1
    assert metrics["cairn_card_endurance_bytes"] == 10**6
    assert level == "warn" and "GB/day" in detail and "under 5" in detail, detail
    assert "over the last" in detail


def test_doctor_says_when_the_router_does_not_answer(tmp_path):
    config = tmp_path / "cairn.toml"
    RouterProcess(tmp_path, REALM)  # writes the config; never started
    doctor = cairn("doctor", "--config", str(config))
    (level, detail), = doctor_lines(doctor.stdout)["card wear"]
    assert level == "warn" and "does not answer" in detail


# -- the wear benchmark (bench/wear.py; the measurement itself needs root and ~1 hour) --------


def test_the_wear_benchmark_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "bench.wear", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--mounts" in done.stdout, done.stderr


def test_the_wear_section_of_the_docs_is_replaced_and_kept():
    from bench import wear as bench_wear

    docs = "# Benchmarks\n\ntable\n"
    once = bench_wear.replace_section(docs, "first run")
    twice = bench_wear.replace_section(once, "second run")
    assert twice.startswith(docs) and "second run" in twice and "first run" not in twice
    assert bench_wear.section_of(twice) in twice and "second run" in bench_wear.section_of(twice)


def test_a_full_bench_run_keeps_the_wear_and_driver_acks_sections():
    from bench import wear as bench_wear

    docs = bench_wear.replace_section("# Benchmarks\n", "wear figures")
    docs = bench_wear.replace_section(docs, "acks figures", "bench.driver_acks")
    kept = bench_wear.kept_sections(docs)
    assert "wear figures" in kept and "acks figures" in kept and "# Benchmarks" not in kept
