"""Commit windows (``commit_window`` on a history rule): publications on the rule wait up to
that long for a group commit, so a busy sensor topic costs the card a commit per window
instead of one per reading; a rule without one commits an acknowledged publish at once, and
a batch that is full (rows or bytes) commits at once too.
Real router, real sockets, and the SQLite file read from outside the router."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core.config import HEALTH_TOPIC
from cairn.gateway.store.commit import CommitLoop
from harness.config import history_rule, permission, realm, role, router_table
from harness.wamp_client import Client
from tests.system.test_retention import Cairn


def config(data_dir: Path) -> str:
    """sensor* waits up to 30 s for a group commit, slow* up to 1 s, ctl* commits at once."""
    return router_table(data_dir, rawsocket=["127.0.0.1:0"]) + realm(
        "realm1", role("user", permission("", ["publish", "subscribe", "call"])),
        history_rule("sensor", commit_window="30s"), history_rule("ctl"),
        history_rule("slow", commit_window="1s"), anonymous_role="user")

ACKED = PublishOptions(acknowledge=True)


@pytest.fixture
async def cairn(tmp_path):
    router = await Cairn(config(tmp_path / "data")).start()
    yield router
    await router.close()


def stored_topics(data_dir: Path) -> list[str]:
    """What is on disk, read by another connection (committed rows only)."""
    with contextlib.closing(sqlite3.connect(f"file:{data_dir / 'cairn.db'}?mode=ro",
                                            uri=True)) as db:
        return [t for (t,) in db.execute("SELECT topic FROM publications ORDER BY seq")
                if t != HEALTH_TOPIC]  # the router's own record, made at start


def publish(session: Client, topic: str) -> asyncio.Future:
    return asyncio.ensure_future(session.publish(topic, 1, options=ACKED))


async def test_an_acknowledged_publish_waits_for_its_rules_commit_window(cairn, tmp_path):
    session = await cairn.connect()
    published = publish(session, "sensor.a")
    await asyncio.sleep(1)
    assert not published.done()
    assert stored_topics(tmp_path / "data") == []


async def test_a_rule_without_a_window_commits_at_once_and_takes_pending_ones_along(
        cairn, tmp_path):
    session = await cairn.connect()
    waiting = publish(session, "sensor.a")
    await asyncio.sleep(0.2)
    await asyncio.wait_for(publish(session, "ctl.valve"), 5)
    await asyncio.wait_for(waiting, 5)  # committed with it, long before its window ends
    assert stored_topics(tmp_path / "data") == ["sensor.a", "ctl.valve"]


async def test_a_publication_is_committed_when_its_window_ends(cairn, tmp_path):
    session = await cairn.connect()
    started = time.monotonic()
    await asyncio.wait_for(publish(session, "slow.a"), 10)
    assert time.monotonic() - started >= 0.9
    assert stored_topics(tmp_path / "data") == ["slow.a"]


async def test_an_unacknowledged_publication_waits_for_the_window_too(cairn, tmp_path):
    session = await cairn.connect()
    session.publish("slow.a", 1)
    await asyncio.sleep(0.5)
    assert stored_topics(tmp_path / "data") == []
    deadline = time.monotonic() + 10
    while not stored_topics(tmp_path / "data") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert stored_topics(tmp_path / "data") == ["slow.a"]


async def test_stopping_the_router_commits_what_waits_in_a_window(cairn, tmp_path):
    session = await cairn.connect()
    session.publish("sensor.a", 1)
    waiting = publish(session, "sensor.b")
    await asyncio.sleep(0.2)
    await cairn.stop()
    assert stored_topics(tmp_path / "data") == ["sensor.a", "sensor.b"]
    with contextlib.suppress(Exception):  # acknowledged or told the router went away
        await asyncio.wait_for(waiting, 5)


# -- a window is a bound on delay, not a wait (gateway.store.commit) ----------------------


async def test_a_full_batch_is_committed_before_its_window_ends(cairn, tmp_path):
    session = await cairn.connect()
    published = [publish(session, f"sensor.s{n % 10}") for n in range(CommitLoop.full_rows)]
    await asyncio.wait_for(asyncio.gather(*published), 20)  # the window is 30 s
    assert len(stored_topics(tmp_path / "data")) == CommitLoop.full_rows


async def test_a_batch_of_many_bytes_is_committed_before_its_window_ends(cairn, tmp_path):
    session = await cairn.connect()
    big = "x" * 4096
    count = -(-CommitLoop.full_bytes // len(big))  # the last one fills the batch
    published = [asyncio.ensure_future(session.publish("sensor.camera", big, options=ACKED))
                 for _ in range(count)]
    await asyncio.wait_for(asyncio.gather(*published), 20)  # the window is 30 s
    assert stored_topics(tmp_path / "data") == ["sensor.camera"] * count


async def test_a_batch_short_of_full_waits_for_its_window(cairn, tmp_path):
    session = await cairn.connect()
    published = [publish(session, "sensor.a") for _ in range(CommitLoop.full_rows // 2)]
    await asyncio.sleep(1)
    assert not any(p.done() for p in published)
    assert stored_topics(tmp_path / "data") == []
