"""Writing a file all or nothing: to a temporary name beside it, then renamed over it, so that
a reader (and, when it is durable, a power cut) finds the old file or the new one, never a
part of either. The one way Cairn's modules replace a file in place.

And reading a file a less privileged process wrote, as root (:func:`read_untrusted`): the one
way Cairn's root helpers take what the router, a driver or a card left for them."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple


def write_atomically(path: Path, data: bytes | str | Iterable[bytes], *,
                     mode: int | None = 0o600, uid: int = -1, gid: int = -1,
                     like: Path | None = None, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8; chunks are written as they come).

    ``mode`` None leaves a new file's default (the umask's); ``uid``/``gid`` other than -1
    give the file away (root only). ``like``, when that file exists, sets the mode and group
    instead: those of ``like`` (a group only root may give is left as it is). ``durable``:
    the file and its name are on disk when this returns; without it a file rewritten often
    spares the SD card the syncs, and a power cut may leave the old file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o666 if mode is None and like is None else 0o600)
        with open(fd, "wb") as f:
            _set_owner(f.fileno(), mode, uid, gid, like)
            for chunk in [data] if isinstance(data, bytes | str) else data:
                f.write(chunk.encode() if isinstance(chunk, str) else chunk)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def _set_owner(fd: int, mode: int | None, uid: int, gid: int, like: Path | None) -> None:
    if like is not None and like.exists():
        st = like.stat()
        os.fchmod(fd, st.st_mode & 0o7777)
        with contextlib.suppress(PermissionError):  # only root may give a file away
            os.fchown(fd, -1, st.st_gid)
        return
    if mode is not None:
        os.fchmod(fd, mode)
    if uid != -1 or gid != -1:
        os.fchown(fd, uid, gid)


def fsync_dir(directory: Path) -> None:
    """Puts the names in ``directory`` (a file renamed into it) on disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading what a less privileged process wrote --------------------------------------------


class RefusedFile(Exception):
    """A file a root helper will not read, and why (one line, for a reason file or a report)."""


class Untrusted(NamedTuple):
    data: bytes
    uid: int  # the file's owner: who wrote it, whatever the file says


def read_untrusted(path: Path | str, owner_uids: Iterable[int] | None, max_bytes: int, *,
                   dir_fd: int | None = None) -> Untrusted:
    """The bytes of ``path`` and its owner, read the way a root helper reads what a less
    privileged process left for it (OpenSSH's privilege separation, polkit): the name itself
    is not followed (``O_NOFOLLOW``: a symbolic link to ``/etc/shadow`` or ``/dev/zero`` is
    refused), only a regular file is opened for reading (a FIFO cannot hang the reader, a
    device is never opened), its owner must be one of ``owner_uids`` (None: any), and no more
    than ``max_bytes`` are read. RefusedFile says why not; FileNotFoundError when there is
    no such name."""
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise RefusedFile(f"cannot look at it: {e.strerror}") from None
    _check_untrusted(st, owner_uids, max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:   # ELOOP: it became a link since
        raise RefusedFile(f"cannot open it without following a link: {e.strerror}") from None
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise RefusedFile("it was replaced while being opened")
        _check_untrusted(opened, owner_uids, max_bytes)
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise RefusedFile(f"larger than {max_bytes} bytes (it grew while being read)")
    return Untrusted(b"".join(chunks), opened.st_uid)


def _check_untrusted(st: os.stat_result, owner_uids: Iterable[int] | None,
                     max_bytes: int) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise RefusedFile("a symbolic link, not a regular file: never followed")
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(f"not a regular file (a {_kind(st.st_mode)})")
    owners = None if owner_uids is None else set(owner_uids)
    if owners is not None and st.st_uid not in owners:
        raise RefusedFile(f"owned by {user_name(st.st_uid)}, not by "
                          f"{' or '.join(sorted(user_name(u) for u in owners))}")
    if st.st_size > max_bytes:
        raise RefusedFile(f"{st.st_size} bytes, larger than the {max_bytes} allowed")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def user_name(uid: int) -> str:
    """``cairn (uid 998)``; ``uid 987`` for a uid no user has."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
