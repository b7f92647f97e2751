"""Memory of 1,000 concurrent idle sessions, Cairn vs Crossbar.io. A part of
``python -m bench`` (``--only sessions``).

Per server and transport (WebSocket/JSON like the dashboards, RawSocket/MsgPack like the
sensor drivers), on a freshly started server: RSS summed over the server's process tree
(:func:`bench.crossbar.tree_rss`) after ``--settle`` s idle; then ``n`` lean sessions
(:class:`bench.pubsub.SubscriberGroup`, spread over several processes with their fd limit
raised), each joined and subscribed to a topic of its own (``bench.idle.<i>``: a
subscription per session, the costlier case); RSS again ``--settle`` s after the last
SUBSCRIBED. Reported: MiB per 1,000 sessions = (after - before) / n * 1,000.

Checked: every session got WELCOME and SUBSCRIBED, none was closed by the server while
idle, and the server's process tree holds at least ``n`` open sockets. The server's open
files limit is reported (it inherits this process's; ``n`` must fit under it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from bench.compare import running_server
from bench.crossbar import process_tree, tree_rss
from bench.pubsub import SubscriberGroup, raise_fd_limit

CASES = [("websocket", "json"), ("rawsocket", "msgpack")]


def open_sockets(pid: int) -> int:
    """Sockets held open by ``pid`` and its descendants (/proc/*/fd)."""
    count = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    count += os.readlink(fd.path).startswith("socket:")
    return count


def fd_limit(pid: int) -> int | None:
    """The soft "Max open files" of a process."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return None


def sessions_case(kind: str, transport: str, serializer: str, n: int,
                  opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"server": kind, "transport": transport, "serializer": serializer,
                           "sessions": n, "problems": []}
    with running_server(kind, opts) as server:
        out["startup_s"] = round(server.startup_s, 3)
        limits = [fd_limit(p) for p in process_tree(server.pid)]
        out["server_fd_limit"] = min((x for x in limits if x), default=None)
        if out["server_fd_limit"] and out["server_fd_limit"] < n + 100:
            out["problems"].append(f"server open files limit {out['server_fd_limit']} < n")
        time.sleep(opts.settle)
        before = tree_rss(server.pid)
        port = server.ws_port if transport == "websocket" else server.rs_port
        t0 = time.monotonic()
        group = SubscriberGroup(transport, serializer, port, n, opts.session_procs,
                                topic="bench.idle.{i}")
        try:
            group.wait_ready(timeout=120)
            out["connect_s"] = round(time.monotonic() - t0, 2)
            time.sleep(opts.settle)
            after = tree_rss(server.pid)
            sockets = open_sockets(server.pid)
            stats = group.command("stop")
        except Exception as e:
            out["problems"].append(f"failed: {type(e).__name__}: {e}")
            return out
        finally:
            group.close()
        if stats.lost:
            out["problems"].append(f"{stats.lost} idle sessions closed by the server")
        if sockets < n:
            out["problems"].append(f"the server holds {sockets} sockets, expected >= {n}")
        grown = after["rss_bytes"] - before["rss_bytes"]
        out.update(rss_before=before, rss_after=after, server_sockets=sockets,
                   mib_per_1000=round(grown / n * 1000 / 2**20, 2))
    out["ok"] = not out["problems"]
    return out


def run(kind: str, opts: argparse.Namespace) -> dict[str, Any]:
    raise_fd_limit()  # the server inherits it
    out: dict[str, Any] = {"server": kind, "cases": []}
    for transport, serializer in CASES:
        print(f"  {kind} {opts.sessions:,} idle sessions {transport}/{serializer} ...", end=" ",
              flush=True)
        r = sessions_case(kind, transport, serializer, opts.sessions, opts)
        r.setdefault("ok", False)
        out["cases"].append(r)
        print(f"{r.get('mib_per_1000')} MiB per 1,000 (connected in {r.get('connect_s')} s)"
              + ("" if r["ok"] else f"  PROBLEMS: {r['problems']}"), flush=True)
    return out
