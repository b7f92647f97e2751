"""SIGKILL under acknowledged load, CAIRN_SOAK_KILL_CYCLES times on one data directory.

Publishers stream ``acknowledge=true`` publications (half of them also ``retain=true``) to
history topics; the router is killed at a random moment and restarted. After every cycle
nothing acknowledged is missing, retained values are at least as new as the last
acknowledged ones, seq only ever grows and the database is intact. (SIGKILL leaves the page
cache alone, so this shows nothing acknowledged lived only in the router's memory, not that
fsync happened: see tests/system/test_durability.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
from autobahn.wamp.types import PublishOptions

from harness.config import history_rule, open_realm
from harness.process import RouterProcess
from harness.wamp_client import Client, connect, retained_values
from soak.knobs import KILL_CYCLES

REALM = open_realm(history=[history_rule("sensor")])

HISTORY_PUBLISHERS = 6  # publisher k retains when k is even
STATUS = HISTORY_PUBLISHERS  # one more: retained, no history (its seqs count all the same)
PUBLISHERS = HISTORY_PUBLISHERS + 1
TRANSPORTS = [("rawsocket-tcp", "msgpack"), ("websocket", "json"), ("rawsocket-tcp", "cbor")]


@dataclass
class Ledger:
    """What the publishers were told, and what the store held, across all cycles."""

    counters: list[int] = field(default_factory=lambda: [0] * PUBLISHERS)  # next per publisher
    last_acked: dict[int, int] = field(default_factory=dict)  # publisher -> counter
    stored: dict[int, int] = field(default_factory=dict)      # seq -> publication, verified
    max_seen: int = 0  # the highest seq in either table at the last check
    acked_per_cycle: list[int] = field(default_factory=list)

    @property
    def max_seq(self) -> int:
        return max(self.stored, default=0)


def topic(k: int) -> str:
    return "gateway.kill.status" if k == STATUS else f"sensor.kill.p{k}"


async def _stream(session: Client, k: int, ledger: Ledger, acked: dict[int, int]) -> None:
    """Publish acknowledged until the router goes away; ``acked``: publication -> publisher."""
    options = PublishOptions(acknowledge=True, retain=k % 2 == 0)
    while True:
        counter = ledger.counters[k]
        ledger.counters[k] += 1  # never reused, acknowledged or not
        try:
            pub = await asyncio.wait_for(session.publish(topic(k), counter, options=options), 5)
        except Exception:
            return
        acked[pub.id] = k
        ledger.last_acked[k] = counter


async def _load_until_killed(router: RouterProcess, ledger: Ledger,
                             rng: random.Random) -> dict[int, int]:
    sessions = [await connect(router, *TRANSPORTS[k % len(TRANSPORTS)])
                for k in range(PUBLISHERS)]
    acked: dict[int, int] = {}
    tasks = [asyncio.create_task(_stream(s, k, ledger, acked)) for k, s in enumerate(sessions)]
    await asyncio.sleep(rng.uniform(0.1, 2.0))
    router.kill()
    await asyncio.wait_for(asyncio.gather(*tasks), 15)
    return acked


def _rows_after(db_path: Path, seq: int) -> list[tuple[int, int, str, int]]:
    """(seq, publication, topic, counter) of the rows after ``seq``, read beside the router."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        rows = db.execute("SELECT seq, publication, topic, payload FROM publications "
                          "WHERE seq > ? ORDER BY seq", (seq,)).fetchall()
    return [(s, p, t, msgpack.unpackb(payload)[0][0]) for s, p, t, payload in rows]


def _retained_rows(db_path: Path) -> dict[str, tuple[int, int, int]]:
    """topic -> (seq, publication, counter) of the retained table."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        rows = db.execute("SELECT topic, seq, publication, payload FROM retained").fetchall()
    return {t: (s, p, msgpack.unpackb(payload)[0][0]) for t, s, p, payload in rows}


def _check_store(router: RouterProcess, ledger: Ledger, acked: dict[int, int]) -> list[int]:
    """The store after a kill and restart; returns the publications it gained, in seq order."""
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        old = dict(db.execute("SELECT seq, publication FROM publications WHERE seq <= ?",
                              (ledger.max_seq,)))
    assert old == ledger.stored, "rows of earlier cycles changed or vanished"
    new = _rows_after(router.db_path, ledger.max_seq)
    assert all(s > ledger.max_seen for s, _, _, _ in new), "a seq of an earlier cycle reused"
    missing = {p for p, k in acked.items() if k != STATUS} - {p for _, p, _, _ in new}
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged publications lost"
    for k in range(HISTORY_PUBLISHERS):  # receive order = publish order, per publisher
        counters = [c for _, _, t, c in new if t == topic(k)]
        assert counters == sorted(set(counters)), f"{topic(k)}: counters out of order"
    ledger.stored.update((s, p) for s, p, _, _ in new)
    _check_retained_only(router, ledger)
    return [p for _, p, _, _ in new]


def _check_retained_only(router: RouterProcess, ledger: Ledger) -> None:
    """The status topic's retained value is at least the last acknowledged one, and its seq
    is no one else's."""
    retained = _retained_rows(router.db_path)
    seq, publication, counter = retained.get(topic(STATUS), (0, 0, -1))
    assert counter >= ledger.last_acked.get(STATUS, -1), "retained status older than acked"
    assert ledger.stored.get(seq, publication) == publication, f"seq {seq} used twice"
    ledger.max_seen = max([ledger.max_seq] + [s for s, _, _ in retained.values()])


async def _history_after(session: Client, sub_id: int, after: int | None) -> list[int]:
    """Publication ids the router serves after ``after`` (all of them if None)."""
    got: list[int] = []
    kwargs: dict = {"limit": 1000}
    if after is not None:
        kwargs["after_publication"] = after
    while True:
        result = await session.call("wamp.subscription.get_events", sub_id, **kwargs)
        page = result.results[0]
        got += [e["publication"] for e in page]
        if not result.kwresults["is_limit_reached"]:
            return got
        kwargs["after_publication"] = page[-1]["publication"]


async def _check_router_view(router: RouterProcess, ledger: Ledger, new: list[int],
                             before: int | None) -> None:
    """get_events serves exactly the stored rows in seq order; retained values are at least
    the last acknowledged ones."""
    session = await connect(router)
    try:
        sub_id = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        assert await _history_after(session, sub_id, before) == new
        retained = await retained_values(session)
        for k in range(0, HISTORY_PUBLISHERS, 2):
            assert retained.get(topic(k), -1) >= ledger.last_acked.get(k, -1), (
                f"{topic(k)}: retained {retained.get(topic(k))} is older than the last "
                f"acknowledged {ledger.last_acked.get(k)}")
    finally:
        await session.leave()


async def test_twenty_sigkills_under_acknowledged_load_lose_nothing_acknowledged(tmp_path):
    seed = random.randrange(2**32)
    rng, ledger = random.Random(seed), Ledger()
    print(f"\nseed {seed}")
    router = RouterProcess(tmp_path, REALM).start()
    last_publication: int | None = None
    try:
        for cycle in range(1, KILL_CYCLES + 1):
            acked = await _load_until_killed(router, ledger, rng)
            router.start()
            new = _check_store(router, ledger, acked)
            await _check_router_view(router, ledger, new, last_publication)
            last_publication = new[-1] if new else last_publication
            ledger.acked_per_cycle.append(len(acked))
            print(f"cycle {cycle:2d}: {len(acked):5d} acknowledged, all stored; "
                  f"{len(new):5d} new history rows; highest seq {ledger.max_seen}")
            assert len(acked) > 50, "too few acknowledged publications to mean anything"
    finally:
        exit_code = router.stop()
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    counts = ledger.acked_per_cycle
    print(f"{len(counts)} cycles, acknowledged per cycle: min {min(counts)}, "
          f"mean {sum(counts) / len(counts):.0f}, max {max(counts)}; total {sum(counts)}")
    assert exit_code == 0, f"the router exited {exit_code} on SIGTERM"
