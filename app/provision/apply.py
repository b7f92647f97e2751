"""Carrying out a plan all or nothing: each file written whole, the replaced ones put back
if a write fails midway, then the inputs removed from the FAT partition."""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cairn.app.provision.folder import Change, Plan, label_of
from cairn.base.config_tools import ConfigError
from cairn.base.files import fsync_dir, write_atomically
from cairn.gateway.core.config import load as cfg_load
from cairn.gateway.ops.config_history import History

log = logging.getLogger("cairn.provision")

@dataclass(frozen=True)
class Snapshot:
    """A destination as it was before provisioning replaced it (``data`` None: absent)."""

    data: bytes | None
    mode: int = 0o644
    uid: int = -1
    gid: int = -1


def snapshot(path: Path) -> Snapshot:
    try:
        st = path.stat()
        return Snapshot(path.read_bytes(), st.st_mode & 0o7777, st.st_uid, st.st_gid)
    except FileNotFoundError:
        return Snapshot(None)


def install_config(etc: Path, text: str, by: str) -> None:
    """The one place provisioning writes cairn.toml, recorded in the config history. With no
    last good configuration yet (a first boot), the one it replaces becomes it: should the
    router not start on the new one, it has the image's own to fall back to."""
    file = etc / "cairn.toml"
    history = History(file)
    with history.locked():
        if history.last_good_text() is None and file.is_file():
            with contextlib.suppress(ConfigError, OSError, UnicodeDecodeError):
                cfg_load(file)
                history.mark_good(file.read_text(encoding="utf-8"))
        write_atomically(file, text, mode=0o644)
        history.record(text, by, "the boot partition's cairn/cairn.toml", "restart")
    log.info("installed %s (%s)", file, by)


def put_back_config(etc: Path, text: str) -> None:
    """The config as it was before a run that failed midway; its change is rolled back."""
    file = etc / "cairn.toml"
    history = History(file)
    with history.locked():
        write_atomically(file, text, mode=0o644)
        latest = history.changes()
        if latest and latest[0].state == "pending":
            history.set_state(latest[0], "rolled_back",
                              "another file of the boot partition's folder could not be "
                              "written: the folder was not applied")


def apply(plan: Plan, etc: Path) -> None:
    """Write every change; if one fails, put back what the earlier ones replaced."""
    done: list[tuple[Change, Snapshot]] = []
    try:
        for change in plan.changes:
            before = snapshot(change.dest)
            write_change(change, etc)
            done.append((change, before))
    except OSError:
        for change, before in reversed(done):
            restore(change, before, etc)
        raise


def write_change(change: Change, etc: Path) -> None:
    if change.config:
        install_config(etc, change.data.decode(), "cairn provision from the boot partition")
        return
    if change.remove:
        with contextlib.suppress(FileNotFoundError):  # nothing to remove: nothing to sync
            change.dest.unlink()
            fsync_dir(change.dest.parent)
        return
    # the folders that hold secrets are no more readable than the secrets
    folder_mode = 0o750 if change.group else 0o755 if change.mode & 0o004 else 0o700
    make_parent(change.dest.parent, folder_mode, change.group)
    write_atomically(change.dest, change.data, mode=change.mode, gid=group_id(change.group))


def restore(change: Change, before: Snapshot, etc: Path) -> None:
    try:
        if before.data is None:
            change.dest.unlink(missing_ok=True)
        elif change.config:
            put_back_config(etc, before.data.decode())
        else:
            write_atomically(change.dest, before.data, mode=before.mode, uid=before.uid,
                             gid=before.gid)
    except OSError as e:  # keep putting back the others
        log.error("cannot put back %s: %s", change.dest, e)


def make_parent(folder: Path, mode: int, group: str | None) -> None:
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir()
    os.chmod(folder, mode)  # not the umask's
    gid = group_id(group)
    if gid != -1:
        os.chown(folder, -1, gid)


def group_id(name: str | None) -> int:
    if name is None:
        return -1
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:  # a development machine without the cairn group: root's
        return -1


def sync_folder(folder: Path) -> None:
    """The boot partition's folder on disk, as far as it goes (a card pulled, a file system
    that does not sync a directory)."""
    with contextlib.suppress(OSError):
        fsync_dir(folder)


def consume(plan: Plan, folder: Path) -> list[str]:
    """Remove the applied inputs from the FAT partition, overwriting them first: they may
    hold secrets, and FAT leaves a removed file's clusters as they were. Problems as text."""
    problems = []
    for source in sorted({c.source for c in plan.changes if c.source is not None}):
        try:
            _scrub(source)
            source.unlink()
        except OSError as e:
            problems.append(f"{label_of(source, folder)}: cannot remove it: {e.strerror}")
    for sub in sorted({c.source.parent for c in plan.changes if c.source is not None}):
        if sub != folder and not any(sub.iterdir()):
            with contextlib.suppress(OSError):
                sub.rmdir()
        sync_folder(sub)
    sync_folder(folder)
    return problems


def _scrub(path: Path) -> None:
    """Zeros over a regular file of the folder, never over a link's target."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "wb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        f.write(b"\0" * st.st_size)
        f.flush()
        os.fsync(f.fileno())


def set_hostname(name: str) -> None:
    """The running system's name, now (the boot's own unit applies /data/etc/hostname)."""
    import socket

    try:
        socket.sethostname(name)
    except OSError as e:
        log.warning("cannot set the host name now (%s); it applies at the next boot", e)
