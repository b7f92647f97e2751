"""The table lock: one writer (an ingest) or any number of readers (reports) at a time.

Why a lock and not a commit protocol: the table is plain Parquet partitioned by date, read
by users with ``spark.read.parquet(TABLE)``; versioned directories behind a pointer would
make every such reader see every version. Appends never touch existing files, but a
re-base rewrites whole partitions (rows move between dates), and two ingests that
anti-join against the same table before either appends would both add the same rows. So
writers exclude each other and Cairn's readers, and a second run waits (``wait`` seconds)
or gives up with a message naming the holder.

How, per file system (the lock must work where the table is):

- local paths (``file:``; also NFS, whose Linux client maps ``flock`` to NFS locks):
  ``flock`` on ``TABLE/_lock``: exclusive for an ingest, shared for a report. The kernel
  drops it when the process dies, so a crash leaves no stale lock.
- any other Hadoop file system (``hdfs://``...): ``create(TABLE/_lock, overwrite=false)``,
  atomic on HDFS, for writers only, removed on release. A writer killed with the lock held
  leaves the file: the message names its owner so an operator can delete it. Readers take
  no lock there. S3A's create is not atomic: schedule one ingest at a time on S3.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("cairn.spark")

LOCK_NAME = "_lock"   # Spark skips names starting with _ when it reads the table
POLL_S = 0.2          # how often a waiting run tries again


class TableBusy(OSError):
    """The table lock was not free within the wait."""


def _owner(what: str) -> str:
    return json.dumps({"what": what, "pid": os.getpid(), "host": socket.gethostname(),
                       "since": datetime.now(UTC).isoformat(timespec="seconds")})


def _describe(text: str) -> str:
    try:
        o = json.loads(text)
        return f"{o['what']} (pid {o['pid']} on {o['host']}, since {o['since']})"
    except (ValueError, KeyError, TypeError):
        return "another run"


def _local_path(table: str) -> str | None:
    """``file:/x/t`` -> ``/x/t``; None for other file systems."""
    if table.startswith("file:"):
        return "/" + table.removeprefix("file:").lstrip("/")
    return None if "://" in table else table


@contextlib.contextmanager
def locked(table: str, files: Any, *, exclusive: bool, wait: float,
           what: str) -> Iterator[None]:
    """Hold the lock of ``table`` (a qualified path) for the block. ``files`` is a
    :class:`central.spark.Files` (Hadoop file systems); ``what`` names the holder in messages."""
    path = _local_path(table)
    if path is not None:
        with _flocked(path, exclusive, wait, what):
            yield
    elif exclusive:
        with _created(files, f"{table}/{LOCK_NAME}", wait, what):
            yield
    else:
        yield


def _give_up(table: str, holder: str, wait: float) -> TableBusy:
    return TableBusy(f"table {table} is locked by {holder}; gave up after {wait:g} s "
                     "(one ingest at a time per table; --wait SECONDS to wait longer)")


@contextlib.contextmanager
def _flocked(table: str, exclusive: bool, wait: float, what: str) -> Iterator[None]:
    os.makedirs(table, exist_ok=True)
    lock_path = os.path.join(table, LOCK_NAME)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + wait
        said = False
        while True:
            try:
                fcntl.flock(fd, mode)
                break
            except BlockingIOError:
                holder = _describe(os.pread(fd, 4096, 0).decode(errors="replace"))
                if time.monotonic() >= deadline:
                    raise _give_up(table, holder, wait) from None
                if not said:
                    log.warning("waiting for the lock of %s, held by %s", table, holder)
                    said = True
                time.sleep(POLL_S)
        if exclusive:  # who holds it, for the messages of those who wait
            os.ftruncate(fd, 0)
            os.pwrite(fd, _owner(what).encode(), 0)
        log.info("%s lock of %s taken", "exclusive" if exclusive else "shared", table)
        try:
            yield
        finally:
            if exclusive:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _created(files: Any, lock_path: str, wait: float, what: str) -> Iterator[None]:
    deadline = time.monotonic() + wait
    said = False
    while not files.create_new(lock_path, _owner(what)):
        holder = "another run"
        with contextlib.suppress(Exception):  # it may be gone between the two calls
            holder = _describe(files.read_text(lock_path))
        if time.monotonic() >= deadline:
            raise _give_up(lock_path.rsplit("/", 1)[0], holder, wait)
        if not said:
            log.warning("waiting for %s, held by %s (if that run is gone, delete the file)",
                        lock_path, holder)
            said = True
        time.sleep(POLL_S)
    try:
        yield
    finally:
        files.delete(lock_path)
