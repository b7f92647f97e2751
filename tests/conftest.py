"""Fixtures: a real router on real sockets (ephemeral ports, a Unix socket in tmp_path)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cairn.gateway import config as cfg
from cairn.gateway.server import Node
from harness.config import open_realm, router_table
from harness.wamp_client import Client, connect

# The longest modules, started first: `make test` runs the suite on three workers a module at
# a time (pytest-xdist, --dist loadfile --no-loadscope-reorder: xdist would otherwise deal the
# modules out by their number of tests; most tests wait on sockets and processes, so a third
# worker fills the two cores), and a long module dealt out last would run alone while the
# other workers idle. Ordered by their time in a whole run (129 s for the first, 9 for the
# last); the rest follow in name order.
LONGEST_FIRST = ("test_spark.py", "test_spark_cluster.py", "test_hostile_clients.py",
                 "test_spark_bad_input.py", "test_spark_clock_and_reports.py",
                 "test_spark_concurrency.py", "test_sync_links.py", "test_appliance.py",
                 "test_config_apply.py", "test_ops.py", "test_spark_lean.py", "test_history.py",
                 "test_serial_driver.py", "test_dashboard.py", "test_sync.py",
                 "test_bad_input.py", "test_boot_chooser.py", "test_auth.py", "test_cli.py",
                 "test_spark_fleet.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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
    of 2.5, and the suite 537 CPU-s instead of 584). Interpreted and generated code give
    the same results (Spark tests both); the cluster test runs the job as shipped and
    compares its tables with this session's, row for row, and the benchmarks run it as
    shipped."""
    from cairn.sync import spark as jobs
    from harness.spark_cluster import QUICK_JVM

    session = jobs.session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                        "spark.default.parallelism": "2",
                                        "spark.ui.enabled": "false",
                                        "spark.sql.codegen.wholeStage": "false",
                                        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
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
