"""Writing a file all or nothing: to a temporary name beside it, then renamed over it, so that
a reader (and, when it is durable, a power cut) finds the old file or the new one, never a
part of either. The one way Cairn's modules replace a file in place."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path


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
