"""Fixtures: a real router on real sockets (ephemeral ports, a Unix socket in tmp_path)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cairn.gateway.core import config as cfg
from cairn.gateway.shell.server import Node
from harness.config import open_realm, router_table
from harness.wamp_client import Client, connect

TESTS = Path(__file__).resolve().parent
# `make test` runs the suite on three workers (pytest-xdist, --dist loadfile): most tests wait
# on sockets and processes, so a third worker fills the two cores. Each folder is a tier and
# goes out as one unit (a worker runs a unit whole), except tests/system, whose modules go out
# one by one, and tests/spark, split in two units: two workers, not three, then pay for a
# Spark session and for the JIT's warm-up in its first ingest (~15 CPU-s each). Units go out
# longest first (a long unit dealt out last would run alone while the other workers idle),
# with a module's size as the measure of its time: no table of seconds to keep.
SPLIT = {"system": 0, "spark": 2}  # a tier's number of units; 0: a unit per module
SPARK_TIERS = ("spark", "appliance")  # where a test may use the Spark session


def tier_of(path: Path) -> str:
    return path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""


def units_of(modules: set[Path]) -> dict[Path, str]:
    """{module: its unit}: a tier's modules, largest first, each to the unit of its tier
    with the least so far."""
    units: dict[Path, str] = {}
    load: dict[str, int] = {}
    for module in sorted(modules, key=lambda m: -m.stat().st_size):
        tier = tier_of(module)
        count = SPLIT.get(tier, 1)
        if count == 0:
            units[module] = str(module)
            continue
        names = [f"{tier}-{i}" for i in range(1, count + 1)]
        units[module] = min(names, key=lambda name: load.get(name, 0))
        load[units[module]] = load.get(units[module], 0) + module.stat().st_size
    return units


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with each tier's modules in its units (:data:`SPLIT`)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByTier(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            path = Path(config.rootpath, module)
            return UNITS.get(path, module)

    return ByTier(config, log)


# every module's unit, worked out the same in the controller (which schedules, collecting
# nothing) and in each worker (which orders what it collected)
UNITS = units_of(set(TESTS.rglob("test_*.py")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = {str(item.path.relative_to(TESTS)) for item in items
                 if "spark" in item.fixturenames and tier_of(item.path) not in SPARK_TIERS}
    if misplaced:
        raise pytest.UsageError(f"{', '.join(sorted(misplaced))} use the Spark session: "
                                "move them to tests/spark/")
    size: dict[str, int] = {}
    for path, unit in UNITS.items():
        size[unit] = size.get(unit, 0) + path.stat().st_size
    items.sort(key=lambda item: -size.get(UNITS.get(item.path, ""), 0))


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
    five of tests/spark/test_spark.py's heaviest took 98-117 s of CPU with them, 152-156 s
    without), and expressions interpreted rather than compiled to Java for each query
    (a run's queries are new and their data tiny: an ingest of 20 rows took 2.25 s instead
    of 2.5, and the suite 537 CPU-s instead of 584), and no adaptive query execution (its
    re-planning between stages pays off on large shuffles, not on the tests' few rows: a
    report ran 45 jobs instead of 84, the Spark tests 326 CPU-s instead of 358). Neither
    changes a result (Spark tests its engine both ways); the cluster test runs the job as
    shipped and compares its tables with this session's, row for row, and the benchmarks
    run it as shipped."""
    from cairn.central import spark as jobs
    from harness import s3a_jars
    from harness.spark_cluster import QUICK_JVM

    # s3a:// for tests/spark/test_spark_s3.py: hadoop-aws and its SDK, fetched once (181 MB)
    # into ~/.cache/cairn; loaded by Spark's class loader, so the class path (and the JVMs'
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
