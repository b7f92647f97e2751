"""Issue 31's attacks, each replayed in a compact, measurable form against a router started
from a given source tree, and its outcome recorded as a figure: the table of the attacks
before and after the fixes.

    .venv/bin/python -m bench.attacks [--source PATH] [--only N1,N3,...]

``--source`` (default: this checkout) is the tree whose router, ``cairn sync`` and store are
measured: its own venv's Python runs ``-m cairn.app.cli`` (``PATH/.venv``, as
``scripts/setup.sh`` makes it); the bench itself, its clients and its checks run from here.
Each run's figures are kept in ``bench/results/attacks.json`` under the source's commit, and
the table printed has one column per commit kept there, oldest first: run it with the tree
before the fixes and with this one, and the table is before | after.

The attacks (issue 31's ids), each on a fresh router and data directory:

- N1: one byte of invalid UTF-8 in the topic of a retained row that is not a sensor's,
  restart: does the router start, how many of the sensors' retained values are served, is
  an acknowledged publish stored;
- N2: ``meta.state`` not JSON, restart: does the router start;
- N3: 20 retained payloads of 1 MB under ``sensor.`` (how many accepted), then 5 dashboards
  subscribe to ``sensor.`` with get_retained: how many are cut off;
- N4: ``max_retained_bytes`` lowered to 16 MiB and filled (250 x 64,000 B), then subscribers
  in JSON, MsgPack and CBOR, exact and prefix, each receiving every retained event (with a
  1 GiB ``send_buffer_limit``, so that N3's cut does not end them): the router's RSS (MiB)
  started, filled, after;
- N5: one anonymous session publishes retained to 10,000 junk topics (``max_retained``:
  10,000): how many are retained, and is a new real sensor's value retained after;
- N6: two hosts (this machine's two IPv6 addresses) hold 32 half-open RawSocket connections
  each, re-opened as they close; a client from the IPv4 LAN address opens a WebSocket 22
  times: how often it gets in;
- N7: 5 wrong tickets for ``bob`` from each of 127.0.0.2-5; is ``bob``, with the right ticket
  from 127.0.0.1, locked out, and for how long (polled every 2 s, up to 75 s);
- N8: invalid UTF-8 in ``publications.topic`` of one history row: ``cairn sync --once``'s
  exit code, and what ``get_events`` answers for the page holding it;
- N9: ``status_token_file`` rotated, SIGHUP: HTTP codes of ``/status`` from the LAN address
  with the old token and with the new one;
- N10: WAMP-CRA decoy salts of 6 unknown authids, across a restart: how many stay the same;
- N11: a sink answering ``HTTP/1.1 200 OK`` then a header byte every 0.2 s, never ending its
  head (``sync.timeout`` 2 s): ``cairn sync --once``'s exit code, and does the watermark move
  (the batch counted as delivered);
- L4: HELLO with authid ``anonymous-1234`` and no credentials: the authid the session gets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import signal
import socketserver
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions

from bench.pubsub import RESULTS_DIR
from bench.retained_memory import fetch, rss_mib
from harness.config import EVERYTHING, history_rule, open_realm, permission, role, user
from harness.process import RouterProcess
from harness.wamp_client import RawSocketPeer, connect, retained_values

REPO = Path(__file__).resolve().parent.parent
OUTPUT = RESULTS_DIR / "attacks.json"
ACKED = PublishOptions(acknowledge=True)
RETAINED = PublishOptions(acknowledge=True, retain=True)
SENSORS = ("sensor.a", "sensor.b", "sensor.c")
BAD_TEXT = "CAST(x'73746174659f2e78' AS TEXT)"  # "state\x9f.x": not UTF-8
USERS = (role("operator", permission("", EVERYTHING))
         + user("bob", "operator", secret="bob-ticket")
         + user("sam", "operator", secret="sam-derived-key", salt="sam-salt"))
REALM = open_realm(history=[history_rule("sensor")], extra=USERS)
# a router reachable from the LAN: anonymous sessions may only read (the fixed tree refuses
# to start with anonymous writes on a listener the network reaches)
LAN_REALM = open_realm(allow=("subscribe",), extra=USERS)


@dataclass(frozen=True)
class Tree:
    """A source tree whose router and CLI are measured."""

    path: Path

    @property
    def python(self) -> str:
        venv = self.path / ".venv" / "bin" / "python"
        return str(venv) if venv.exists() else sys.executable

    @property
    def command(self) -> list[str]:
        return [self.python, "-m", "cairn.app.cli"]

    def commit(self) -> str:
        return subprocess.run(["git", "-C", str(self.path), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()

    def router(self, workdir: Path, router_toml: str = "", realm: str = REALM,
               **kwargs: Any) -> RouterProcess:
        return RouterProcess(workdir, realm, router_toml=router_toml, command=self.command,
                             **kwargs)


def lan_addresses() -> tuple[str, list[str]]:
    """(this machine's IPv4 LAN address, two IPv6 ones): RuntimeError without them."""
    found: dict[str, list[str]] = {"inet": [], "inet6": []}
    out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    for fields in (line.split() for line in out.splitlines() if "tentative" not in line):
        family, address = fields[2], fields[3].split("/")[0]
        if family in found and not address.startswith(("127.", "::1")):
            scoped = address.startswith("fe80")  # link-local: named with its interface
            found[family].append(f"{address}%{fields[1]}" if scoped else address)
    if not found["inet"] or len(found["inet6"]) < 2:
        raise RuntimeError("needs an IPv4 LAN address and two IPv6 ones")
    return found["inet"][0], found["inet6"][:2]


# -- the store: damaged rows (N1, N2, N8) ---------------------------------------------------


async def write_store(tree: Tree, workdir: Path) -> RouterProcess:
    """A store with the sensors' retained values, a retained value that is not a sensor's
    (``state.x``) and history; the router stopped."""
    router = tree.router(workdir).start()
    try:
        session = await connect(router)
        for topic in (*SENSORS, "state.x"):
            await session.publish(topic, f"{topic} retained", options=RETAINED)
        for i in range(12):
            await session.publish(SENSORS[i % 3], i, options=ACKED)
        await session.leave()
    finally:
        router.stop()
    return router


def damage(db_path: Path, sql: str) -> None:
    with contextlib.closing(sqlite3.connect(db_path)) as db, db:
        db.execute(sql)


def restarted(router: RouterProcess) -> str | None:
    """None when the router started again, else how it failed."""
    try:
        router.start()
    except RuntimeError as e:  # "router exited with N:" and its log's tail
        lines = [line for line in str(e).splitlines() if line.strip()]
        return f"{lines[0].rstrip(':')}: {lines[-1].strip()[:80]}"
    return None


async def after_damage(tree: Tree, workdir: Path, sql: str,
                       check: Callable[[Any], Awaitable[str]]) -> str:
    """Write a store, damage it with ``sql``, restart: whether the router starts, and what
    ``check`` says a session sees then."""
    router = await write_store(tree, workdir)
    damage(router.db_path, sql)
    failed = restarted(router)
    if failed:
        return f"does not start ({failed})"
    try:
        return await check(await connect(router))
    finally:
        router.stop()


async def sensors_served(session: Any) -> str:
    served = await retained_values(session, "sensor")
    return f"starts; {len([t for t in SENSORS if t in served])}/{len(SENSORS)} sensor values"


async def n1(tree: Tree, workdir: Path) -> str:
    async def check(session: Any) -> str:
        served = await sensors_served(session)
        stored = await publish_error(session, "sensor.a", "after", RETAINED)
        return f"{served} served; an acked publish: {stored or 'stored'}"

    return await after_damage(
        tree, workdir, f"UPDATE retained SET topic = {BAD_TEXT} WHERE topic = 'state.x'", check)


async def n2(tree: Tree, workdir: Path) -> str:
    return await after_damage(
        tree, workdir, "UPDATE meta SET value = 'not json {' WHERE key = 'state'", sensors_served)


async def n8(tree: Tree, workdir: Path) -> str:
    router = await write_store(tree, workdir)
    damage(router.db_path, "UPDATE publications SET topic = CAST(x'73656e736f72ff2e61' AS TEXT)"
                           " WHERE seq = (SELECT min(seq) FROM publications"
                           " WHERE topic = 'sensor.b')")
    with contextlib.closing(sqlite3.connect(router.db_path)) as db:
        stored, = db.execute("SELECT count(*) FROM publications").fetchone()
    sync = await run_sync(tree, router.data_dir, workdir, "dir:" + str(workdir / "landing"))
    router.start()
    try:
        session = await connect(router)
        sub = await session.call("wamp.subscription.lookup", "sensor", {"match": "prefix"})
        try:
            page = await session.call("wamp.subscription.get_events", sub, limit=100)
            answer = f"{len(page.results[0])} events of {stored} rows stored"
        except ApplicationError as e:
            answer = e.error
    finally:
        router.stop()
    return f"sync exits {sync[0]}; get_events: {answer}"


async def publish_error(session: Any, topic: str, value: Any,
                        options: PublishOptions) -> str | None:
    """None when an acknowledged publish is accepted, else its error URI."""
    try:
        await asyncio.wait_for(session.publish(topic, value, options=options), 30)
    except ApplicationError as e:
        return e.error
    return None


# -- retained values (N3, N4, N5) -----------------------------------------------------------


async def n3(tree: Tree, workdir: Path, dashboards: int = 5) -> str:
    router = tree.router(workdir).start()
    try:
        session = await connect(router, "rawsocket-tcp", "msgpack")
        errors = [await publish_error(session, f"sensor.big{i}", "x" * 1_000_000, RETAINED)
                  for i in range(20)]
        await session.leave()
        cut = await asyncio.gather(*(cut_off_on_subscribe(router) for _ in range(dashboards)))
    finally:
        router.stop()
    refused = {e for e in errors if e}
    return (f"{errors.count(None)}/20 accepted{f' ({min(refused)})' if refused else ''}; "
            f"{sum(cut)}/{dashboards} dashboards cut off")


async def cut_off_on_subscribe(router: RouterProcess, seconds: float = 10) -> bool:
    """A dashboard subscribes to ``sensor.`` with get_retained: is it disconnected within
    ``seconds``?"""
    session = await connect(router, "websocket", "json")
    await session.subscribe(lambda *a, **k: None, "sensor.", options=SubscribeOptions(
        match="prefix", get_retained=True))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(session.disconnected), seconds)
    cut = session.disconnected.done()
    if not cut:
        await session.leave()
    return cut


async def n4(tree: Tree, workdir: Path, topics: int = 250, size: int = 64_000) -> str:
    # a send buffer that holds every retained event at once: the memory, not N3's cut
    router = tree.router(workdir, f"send_buffer_limit = {2**30}\n[router.limits]\n"
                                  f"max_retained_bytes = {16 * 2**20}\n")
    router.start()
    try:
        started = rss_mib(router.pid)
        blob, acked = "x" * size, PublishOptions(acknowledge=True, retain=True)
        for first in range(0, topics, 50):  # 50 a session: within a session's share
            session = await connect(router, "rawsocket-tcp", "msgpack")
            await asyncio.gather(*(session.publish(f"sensor.mem.t{k:05d}", k, blob, options=acked)
                                   for k in range(first, min(first + 50, topics))))
            await session.leave()
        await asyncio.sleep(0.5)
        filled = rss_mib(router.pid)
        for serializer in ("json", "msgpack", "cbor"):
            for kind in ("exact", "prefix"):
                await fetch(router, serializer, kind, topics)
        await asyncio.sleep(0.5)
        after = rss_mib(router.pid)
    finally:
        router.stop()
    return f"RSS {started:.0f} -> {filled:.0f} -> {after:.0f} MiB"


async def n5(tree: Tree, workdir: Path, junk: int = 10_000) -> str:
    router = tree.router(workdir).start()  # max_retained: 10,000 (the default)
    try:
        attacker = await connect(router, "rawsocket-tcp", "msgpack")
        errors: list[str | None] = []
        for first in range(0, junk, 500):
            errors += await asyncio.gather(*(publish_error(attacker, f"junk.t{i}", i, RETAINED)
                                             for i in range(first, first + 500)))
        await attacker.leave()
        sensor = await connect(router)
        error = await publish_error(sensor, "sensor.new", 21.5, RETAINED)
        kept = "sensor.new" in await retained_values(sensor, "sensor")
        await sensor.leave()
    finally:
        router.stop()
    return (f"junk retained {errors.count(None)}/{junk}; new sensor: {error or 'accepted'}, "
            f"{'retained' if kept else 'not retained'}")


# -- connections and logins (N6, N7, N10, L4) -----------------------------------------------


async def n6(tree: Tree, workdir: Path, held_each: int = 32, tries: int = 22) -> str:
    client, attackers = lan_addresses()
    router = tree.router(workdir, '[router.limits]\nhandshake_timeout = "2s"\n', LAN_REALM,
                         host="0.0.0.0", rawsocket_host="[::]").start()
    stop = asyncio.Event()
    try:
        attack = asyncio.gather(*(hold_half_open(a, router.rawsocket_port, held_each, stop)
                                  for a in attackers))
        await asyncio.sleep(2)  # they fill what they can
        admitted = 0
        for _ in range(tries):
            admitted += await websocket_upgrade(client, router.port)
            await asyncio.sleep(0.2)
        stop.set()
        await attack
    finally:
        router.stop()
    return f"{admitted}/{tries} client connections get in"


async def open_from(address: str, port: int) -> tuple[asyncio.StreamReader,
                                                       asyncio.StreamWriter]:
    """A connection from ``address`` to the router's port on that same address."""
    return await asyncio.open_connection(address, port, local_addr=(address, 0))


async def hold_half_open(address: str, port: int, count: int, stop: asyncio.Event) -> None:
    """``count`` connections from ``address`` that send half a RawSocket handshake, each
    opened again as soon as the router closes it."""
    async def one() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                reader, writer = await open_from(address, port)
                writer.write(b"\x7f")
                while not stop.is_set() and not reader.at_eof():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(reader.read(64), 0.2)
                writer.close()
            await asyncio.sleep(0.2)
    await asyncio.gather(*(one() for _ in range(count)))


async def websocket_upgrade(address: str, port: int) -> bool:
    """A WebSocket upgrade from ``address``: answered 101?"""
    try:
        reader, writer = await open_from(address, port)
    except OSError:
        return False
    writer.write(f"GET /ws HTTP/1.1\r\nHost: {address}:{port}\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n"
                 .encode())
    try:
        line = await asyncio.wait_for(reader.readline(), 5)
    except (OSError, TimeoutError):
        line = b""
    finally:
        writer.close()
    return line.startswith(b"HTTP/1.1 101")


async def n7(tree: Tree, workdir: Path, limit: float = 75) -> str:
    router = tree.router(workdir).start()
    try:
        for last in range(2, 6):
            for _ in range(5):
                with contextlib.suppress(ConnectionError, TimeoutError):
                    session = await connect(router, local_addr=(f"127.0.0.{last}", 0),
                                            authmethods=["ticket"], authid="bob", secret="no")
                    await session.leave()
        started = time.monotonic()
        while not await bob_logs_in(router):
            if time.monotonic() - started > limit:
                return f"owner locked out: yes, over {limit:g} s"
            await asyncio.sleep(2)
        waited = time.monotonic() - started
    finally:
        router.stop()
    return "owner locked out: no" if waited < 1 else f"owner locked out: yes, {waited:.0f} s"


async def bob_logs_in(router: RouterProcess) -> bool:
    try:
        session = await connect(router, authmethods=["ticket"], authid="bob",
                                secret="bob-ticket")
    except (ConnectionError, TimeoutError):
        return False
    await session.leave()
    return True


async def n10(tree: Tree, workdir: Path, unknown: int = 6) -> str:
    router = tree.router(workdir).start()
    salts = []
    try:
        for _ in range(2):
            salts.append([await cra_salt(router, f"ghost-{i}") for i in range(unknown)])
            router.stop()
            router.start()
        real = [await cra_salt(router, "sam")]
    finally:
        router.stop()
    same = sum(a == b for a, b in zip(*salts, strict=True))
    return f"{same}/{unknown} decoy salts the same after a restart (sam's: {real[0]})"


async def cra_salt(router: RouterProcess, authid: str) -> str | None:
    """The salt of the WAMP-CRA challenge a HELLO for ``authid`` gets."""
    peer = await RawSocketPeer.open(router.rawsocket_port)
    try:
        peer.send([1, "realm1", {"roles": {"subscriber": {}}, "authmethods": ["wampcra"],
                                 "authid": authid}])
        reply = await peer.receive()
    finally:
        peer.close()
    return reply[2].get("salt") if reply and reply[0] == 4 else None


async def l4(tree: Tree, workdir: Path) -> str:
    router = tree.router(workdir).start()
    try:
        session = await connect(router, authid="anonymous-1234")
        authid = session.welcome_details.authid
        await session.leave()
    finally:
        router.stop()
    return f"session's authid {authid}"


# -- status token (N9) ----------------------------------------------------------------------


async def n9(tree: Tree, workdir: Path) -> str:
    client, _ = lan_addresses()
    token = workdir / "status.token"
    token.write_text("old-token-0123456789abcdef\n")
    token.chmod(0o600)
    router = tree.router(workdir, f'status_token_file = "{token}"\n', LAN_REALM,
                         host="0.0.0.0").start()
    try:
        before = status_code(client, router.port, "old-token-0123456789abcdef")
        token.write_text("new-token-0123456789abcdef\n")
        router.proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(2)
        old = status_code(client, router.port, "old-token-0123456789abcdef")
        new = status_code(client, router.port, "new-token-0123456789abcdef")
    finally:
        router.stop()
    return f"old token {old}, new token {new} (old before the rotation: {before})"


def status_code(address: str, port: int, token: str) -> int:
    connection = http.client.HTTPConnection(address, port, timeout=5,
                                            source_address=(address, 0))
    try:
        connection.request("GET", "/status", headers={"Authorization": f"Bearer {token}"})
        return connection.getresponse().status
    finally:
        connection.close()


# -- sync (N8's run, N11) -------------------------------------------------------------------


async def run_sync(tree: Tree, data_dir: Path, workdir: Path, sink: str,
                   timeout: float = 30) -> tuple[int, str]:
    """``cairn sync --once`` of ``tree`` into ``sink``: (exit code, output)."""
    config = workdir / "sync.toml"
    config.write_text(f'[router]\ndata_dir = "{data_dir}"\n\n[sync]\nsink = "{sink}"\n'
                      f'gateway_id = "bench"\ntimeout = {timeout}\n')
    proc = await asyncio.create_subprocess_exec(
        *tree.command, "sync", "--config", str(config), "--once", cwd=workdir,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(errors="replace")


SINK_TIMEOUT = 2.0  # sync.timeout against the endless head: each byte comes well within it


class EndlessHead(socketserver.StreamRequestHandler):
    """Reads a request, answers ``HTTP/1.1 200 OK`` and then a header byte every tenth of
    ``SINK_TIMEOUT`` (the attack's byte a second at the default 30 s, scaled down), for five
    times as long."""

    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        self.rfile.read(length)
        with contextlib.suppress(OSError):
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(50):
                self.wfile.write(b"X")
                self.wfile.flush()
                time.sleep(SINK_TIMEOUT / 10)


async def n11(tree: Tree, workdir: Path) -> str:
    router = await write_store(tree, workdir)
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), EndlessHead)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/landing/{{name}}"
        code, _ = await run_sync(tree, router.data_dir, workdir, url, timeout=SINK_TIMEOUT)
    finally:
        server.shutdown()
        server.server_close()
    status = json.loads((router.data_dir / "sync-status.json").read_text())
    moved = status.get("synced_seq", 0) > 0
    return (f"sync exits {code}; counted as delivered: {'yes' if moved else 'no'} "
            f"(watermark {status.get('synced_seq')})")


# -- the run --------------------------------------------------------------------------------

ATTACKS: dict[str, Callable[[Tree, Path], Awaitable[str]]] = {
    "N1": n1, "N2": n2, "N3": n3, "N4": n4, "N5": n5, "N6": n6, "N7": n7, "N8": n8,
    "N9": n9, "N10": n10, "N11": n11, "L4": l4}


async def measure(tree: Tree, only: list[str]) -> dict[str, str]:
    figures = {}
    for name in only:
        with tempfile.TemporaryDirectory(prefix=f"cairn-attack-{name}-") as tmp:
            started = time.monotonic()
            try:
                figures[name] = await ATTACKS[name](tree, Path(tmp))
            except Exception as e:  # one attack's failure is its figure, not the run's end
                traceback.print_exc()
                figures[name] = f"error: {type(e).__name__}: {str(e)[:120]}".splitlines()[0]
        print(f"{name:<4} {figures[name]}  ({time.monotonic() - started:.0f} s)", flush=True)
    return figures


def table(runs: dict[str, dict[str, Any]]) -> str:
    """attack | one column per run, oldest commit first."""
    order = sorted(runs, key=lambda c: runs[c]["commit_time"])
    head = ["attack", *(f"{c} ({runs[c]['label']})" for c in order)]
    rows = [[name, *(runs[c]["figures"].get(name, "-") for c in order)] for name in ATTACKS]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True))
             for r in [head, *rows]]
    return "\n".join([lines[0], "-+-".join("-" * w for w in widths), *lines[1:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=REPO,
                        help="the source tree whose router is measured (default: this one)")
    parser.add_argument("--label", help="its column's name (default: its path)")
    parser.add_argument("--only", default=",".join(ATTACKS), help="comma-separated ids")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    tree = Tree(args.source.resolve())
    commit = tree.commit()
    when = int(subprocess.run(["git", "-C", str(tree.path), "log", "-1", "--format=%ct"],
                              capture_output=True, text=True, check=True).stdout)
    figures = asyncio.run(measure(tree, args.only.split(",")))
    runs = json.loads(args.output.read_text())["runs"] if args.output.exists() else {}
    kept = runs.get(commit, {}).get("figures", {})
    runs[commit] = {"label": args.label or str(tree.path), "source": str(tree.path),
                    "commit_time": when, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "figures": {**kept, **figures}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"benchmark": "attacks", "runs": runs}, indent=2) + "\n")
    print(f"\n{table(runs)}\n-> {args.output}")


if __name__ == "__main__":
    main()
