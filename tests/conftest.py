"""Fixtures: a real router on real sockets (ephemeral ports, a Unix socket in tmp_path)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cairn.gateway import config as cfg
from cairn.gateway.server import Node
from harness.config import open_realm, router_table
from harness.wamp_client import Client, connect

# `make test` runs the suite on three workers, a module at a time (pytest-xdist, --dist loadfile
# --no-loadscope-reorder): most tests wait on sockets and processes, so a third worker fills
# the two cores. The modules are dealt out longest first (a long module dealt out last would
# run alone while the other workers idle), by their time in a whole run in seconds (the rest
# take under 9 and follow in name order):
MODULE_SECONDS = {"test_spark.py": 124, "test_hostile_clients.py": 94,
                  "test_spark_bad_input.py": 94, "test_spark_cluster.py": 81,
                  "test_spark_clock_and_reports.py": 68, "test_spark_concurrency.py": 50,
                  "test_sync_links.py": 36, "test_appliance.py": 35, "test_ops.py": 31,
                  "test_config_apply.py": 28, "test_spark_lean.py": 22, "test_history.py": 21,
                  "test_serial_driver.py": 18, "test_dashboard.py": 18, "test_sync.py": 16,
                  "test_spark_fleet.py": 15, "test_auth.py": 15, "test_bad_input.py": 12,
                  "test_cli.py": 12, "test_boot_chooser.py": 9}
# The modules that use the Spark session go out as two units, not one each: two workers, not
# three, then pay for a session and for the JIT's warm-up in its first ingest (~15 CPU-s
# each), and the third takes the modules that mostly wait.
SPARK_MODULES = ("test_spark.py", "test_spark_bad_input.py", "test_spark_cluster.py",
                 "test_spark_clock_and_reports.py", "test_spark_concurrency.py",
                 "test_sync_links.py", "test_spark_lean.py", "test_spark_fleet.py",
                 "test_device_clock.py", "test_spark_s3.py")


def spark_units() -> dict[str, str]:
    """{module: its unit}: each module, longest first, to the unit with less time so far."""
    load = {"spark-1": 0, "spark-2": 0}
    units = {}
    for name in sorted(SPARK_MODULES, key=lambda name: -MODULE_SECONDS.get(name, 0)):
        units[name] = min(load, key=load.__getitem__)
        load[units[name]] += MODULE_SECONDS.get(name, 1)
    return units


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with the Spark modules in two units (:data:`SPARK_MODULES`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    units = spark_units()

    class SparkInTwoUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return units.get(Path(module).name, module)

    return SparkInTwoUnits(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unlisted = {item.path.name for item in items if "spark" in item.fixturenames
                } - set(SPARK_MODULES)
    if unlisted:
        raise pytest.UsageError(f"{', '.join(sorted(unlisted))} use the Spark session: "
                                "list them in SPARK_MODULES (tests/conftest.py)")
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))


def router_config(unix_path: Path | str, data_dir: Path | str) -> str:
    """Two open realms on ephemeral ports and a Unix socket, with small transport limits."""
    return (router_table(data_dir, rawsocket=["127.0.0.1:0", f"unix:{unix_path}"],
                         extra="max_message_size = 65536\nsend_buffer_limit = 1048576\n")
            + open_realm("realm1") + open_realm("realm2"))


@dataclass
class RunningRouter:
    node: Node
    unix_path: str

    @property
    def port(self) -> int:
        return self.node.port

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def rawsocket_port(self) -> int:
        return self.node.rawsocket_ports[0]


async def start_router(toml_text: str, source: str = "test.toml") -> Node:
    import tomllib

    node = Node(cfg.parse(tomllib.loads(toml_text), source))
    await node.start()
    return node


@pytest.fixture
async def router(tmp_path: Path):
    text = router_config(tmp_path / "wamp.sock", tmp_path / "data")
    node = await start_router(text)
    yield RunningRouter(node, str(tmp_path / "wamp.sock"))
    await node.stop()


@contextlib.asynccontextmanager
async def sessions_on(router: RunningRouter):
    """A factory of autobahn sessions joined to ``router``; every one leaves at the end."""
    opened: list[Client] = []

    async def make(transport: str = "websocket", serializer: str = "json", **kwargs) -> Client:
        session = await connect(router, transport, serializer, **kwargs)
        opened.append(session)
        return session

    try:
        yield make
    finally:
        for session in opened:
            with contextlib.suppress(Exception):
                if session.is_attached():
                    await asyncio.wait_for(session.leave(), 2)


@pytest.fixture
async def client(router):
    """A factory of joined autobahn sessions; every one is closed at teardown."""
    async with sessions_on(router) as make:
        yield make


@contextlib.contextmanager
def restored_logging() -> Iterator[None]:
    """The CLI configures logging for the whole process: put the root logger back after."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)


@pytest.fixture
def cairn_cli() -> Iterator[Callable[[list[str]], int]]:
    """``app.cli.main`` (``cairn ...`` in this process), logging restored afterwards."""
    from cairn.app import cli

    with restored_logging():
        yield cli.main


@pytest.fixture(scope="session")
def spark():
    """One local[2] Spark session for every Spark test (starting one costs ~15 s): two
    shuffle partitions, no UI, the JVM options of short jobs (each test's jobs are small:
    five of tests/test_spark.py's heaviest took 98-117 s of CPU with them, 152-156 s
    without), and expressions interpreted rather than compiled to Java for each query
    (a run's queries are new and their data tiny: an ingest of 20 rows took 2.25 s instead
    of 2.5, and the suite 537 CPU-s instead of 584), and no adaptive query execution (its
    re-planning between stages pays off on large shuffles, not on the tests' few rows: a
    report ran 45 jobs instead of 84, the Spark tests 326 CPU-s instead of 358). Neither
    changes a result (Spark tests its engine both ways); the cluster test runs the job as
    shipped and compares its tables with this session's, row for row, and the benchmarks
    run it as shipped."""
    from cairn.sync import spark as jobs
    from harness import s3a_jars
    from harness.spark_cluster import QUICK_JVM

    # s3a:// for tests/test_spark_s3.py: hadoop-aws and its SDK, fetched once (181 MB) into
    # ~/.cache/cairn; loaded by Spark's class loader, so the class path (and the JVMs'
    # class-data archive, harness.spark_cds) stays as it is
    s3a = s3a_jars.fetch()
    extra = {"spark.jars": ",".join(map(str, s3a))} if s3a else {}
    session = jobs.session("local[2]", {**extra, "spark.sql.shuffle.partitions": "2",
                                        "spark.default.parallelism": "2",
                                        "spark.ui.enabled": "false",
                                        "spark.sql.codegen.wholeStage": "false",
                                        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                                        "spark.sql.adaptive.enabled": "false",
                                        "spark.driver.extraJavaOptions": QUICK_JVM},
                           app="cairn-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def image():
    """The Debian test image and its boot files (tests/qemu_device.py), built once per run
    for every appliance test module, rebuilt only when its sources changed."""
    import time

    from tests import qemu_device

    log = qemu_device.WORK.parent / "debian-test-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    built = qemu_device.build_test_image(log)
    print(f"\n[appliance] image ready in {time.monotonic() - started:.0f} s: {built[0]} "
          f"({built[0].stat().st_size / 2**20:.0f} MiB)")
    return built


@pytest.fixture(scope="session")
def appliance_device(image, tmp_path_factory):
    """One booted device for the appliance and system update modules (a first boot costs
    two minutes of emulated CPU), personalised from its boot partition
    (``qemu_device.PROVISIONED``): it can reach a service on this host's loopback port
    ``appliance_device.host_services[qemu_device.CENTRAL]`` as the central side."""
    from tests import qemu_device

    yield from qemu_device.booted(image, tmp_path_factory.mktemp("device"),
                                  {qemu_device.CENTRAL: qemu_device.free_port()},
                                  provision=qemu_device.PROVISIONED)
