"""The history of a configuration file, and what the router says it runs.

Beside the config file (on a device ``/etc/cairn/cairn.toml``, on the data partition):

- ``config-history/NNNN.toml`` and ``NNNN.json``: each change, its text and who made it,
  when, in which boot, from where, how it was applied (``reload`` | ``restart``) and how it
  ended (``pending`` | ``good`` | ``rolled_back`` | ``refused``, with the reason); the last
  :data:`KEEP` are kept;
- ``config-history/last-good.toml`` (and ``last-good.json``, the change it came from): the
  last configuration the router became ready on. ``cairn router`` runs on it when the file
  fails validation or cannot be started on, and ``cairn config`` restores it on a failed
  change.

In the router's data directory (the router cannot write ``/etc/cairn``):

- ``config-state.json`` (:class:`RunningConfig`): the file the router was told to run,
  whether it runs it or the last good one, why, and the digest of the text it runs, so
  ``cairn config apply`` knows when the router is ready on a change;
- ``config-requests/queue/NNNN.json``: changes asked for over WAMP
  (``cairn.admin.config.apply``), carried out by ``cairn config apply --pending`` as root,
  which reads them as a root helper must (see :class:`Queue`); what it did not carry out is
  in ``config-requests/refused/`` with a ``.reason`` beside each.

Plain file operations: every write is a temporary file, fsync'd and renamed over the old one,
so a power cut leaves the old file or the new one, never half of either.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cairn.base.clock_readings import rfc3339
from cairn.base.files import RefusedFile, fsync_dir, read_untrusted, user_name, write_atomically
from cairn.gateway.core.config import Config, ConfigError, load

HISTORY_DIR = "config-history"
LAST_GOOD = "last-good.toml"
LAST_GOOD_INFO = "last-good.json"
STATE_NAME = "config-state.json"
REQUESTS_DIR = "config-requests"
QUEUE, REFUSED = "queue", "refused"   # inside REQUESTS_DIR
MAX_REQUEST_BYTES = 1 << 20           # a config file is a few KB; past this it is not one
MAX_BY = 200
REQUEST_KEYS = {"id", "by", "at", "action", "boot_id", "text"}
KEEP = 10  # changes kept in the history
# beside the config: the last outcome of `cairn provision` (the boot partition's cairn/ folder)
PROVISIONING = "provisioning.json"
STATES = ("pending", "good", "rolled_back", "refused")
_ENTRY = re.compile(r"^(\d{4,})\.json$")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def now_iso() -> str:
    return rfc3339(time.time_ns() // 1_000_000)


def boot_id() -> str | None:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return None


def atomic_write(path: Path, data: str, like: Path | None = None) -> None:
    """Write ``data`` to ``path`` all or nothing; with the mode and group of ``like`` (a
    config file readable by the router's group stays so in its history), else a new file's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data, mode=None, like=like)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Change:
    id: int
    by: str
    at: str
    source: str
    action: str | None  # "reload" | "restart"; None when refused before it was applied
    state: str
    reason: str | None = None
    boot_id: str | None = None
    sha256: str | None = None
    request: int | None = None  # the WAMP request it carried out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class History:
    """The history beside ``config_file``."""

    def __init__(self, config_file: Path | str) -> None:
        self.file = Path(config_file)
        self.dir = self.file.parent / HISTORY_DIR

    @property
    def last_good_path(self) -> Path:
        return self.dir / LAST_GOOD

    @contextlib.contextmanager
    def locked(self, wait: bool = True) -> Iterator[None]:
        """One change at a time (two ``cairn config apply`` would undo each other). Without
        ``wait``, BlockingIOError when another holds it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            yield

    def changes(self) -> list[Change]:
        """Newest first."""
        found = []
        for path in self.dir.glob("*.json"):
            data = _read_json(path) if _ENTRY.match(path.name) else None
            if data is not None:
                with contextlib.suppress(TypeError):
                    found.append(Change(**data))
        return sorted(found, key=lambda c: c.id, reverse=True)

    def text(self, change_id: int) -> str:
        return (self.dir / f"{change_id:04d}.toml").read_text(encoding="utf-8")

    def record(self, text: str, by: str, source: str, action: str | None,
               state: str = "pending", reason: str | None = None,
               request: int | None = None) -> Change:
        latest = self.changes()
        change = Change(id=(latest[0].id + 1) if latest else 1, by=by, at=now_iso(),
                        source=source, action=action, state=state, reason=reason,
                        boot_id=boot_id(), sha256=digest(text), request=request)
        atomic_write(self.dir / f"{change.id:04d}.toml", text, like=self.file)
        self._save(change)
        for old in latest[KEEP - 1:]:
            for suffix in (".json", ".toml"):
                with contextlib.suppress(FileNotFoundError):
                    (self.dir / f"{old.id:04d}{suffix}").unlink()
        return change

    def set_state(self, change: Change, state: str, reason: str | None = None) -> Change:
        assert state in STATES, state
        change = replace(change, state=state, reason=reason)
        self._save(change)
        return change

    def _save(self, change: Change) -> None:
        atomic_write(self.dir / f"{change.id:04d}.json",
                     json.dumps(change.as_dict(), indent=1) + "\n", like=self.file)

    def mark_good(self, text: str, change_id: int | None = None) -> None:
        """``text`` is what the router became ready on: the one to come back to."""
        atomic_write(self.last_good_path, text, like=self.file)
        atomic_write(self.dir / LAST_GOOD_INFO, json.dumps(
            {"change": change_id, "sha256": digest(text), "at": now_iso()}) + "\n",
            like=self.file)

    def last_good_text(self) -> str | None:
        try:
            return self.last_good_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def last_good_info(self) -> dict[str, Any] | None:
        return _read_json(self.dir / LAST_GOOD_INFO)

    def last_good(self) -> Config | None:
        """The last good configuration, if there is one and it still loads."""
        if not self.last_good_path.exists():
            return None
        try:
            return load(self.last_good_path)
        except ConfigError:
            return None


# -- what the router runs (written by it into its data directory) ---------------------------


@dataclass
class RunningConfig:
    """``file``: what the router was told to run (None: the embedded default); ``running``:
    "file" or "last-good"; ``problem``: why not the file, or why the last SIGHUP kept the
    running configuration; ``sha256``: of the text running."""

    file: str | None
    running: str = "file"
    problem: str | None = None
    sha256: str | None = None
    pid: int = field(default_factory=os.getpid)
    started: str = field(default_factory=now_iso)
    seq: int = 0  # one more at each write: a reader sees that the router has answered

    def status(self) -> dict[str, Any]:
        """The ``config`` entry of the router's status."""
        return {"file": self.file, "running": self.running, "problem": self.problem,
                "sha256": self.sha256}

    def save(self, data_dir: Path) -> None:
        self.seq += 1
        atomic_write(Path(data_dir) / STATE_NAME, json.dumps(asdict(self)) + "\n")


def provisioning_outcome(config_file: Path | str) -> dict[str, Any] | None:
    """What provisioning last did with the boot partition's folder (applied, refused,
    failed, cleared, with the problems), written by `cairn provision` beside the config."""
    return _read_json(Path(config_file).parent / PROVISIONING)


def read_running(data_dir: Path) -> RunningConfig | None:
    """What the router wrote; root reads it too (``cairn config``), so by the one rule: a
    regular file of the data directory's owner or root, not a link, at most 64 KiB."""
    try:
        owners = {0, os.stat(data_dir).st_uid}
        data = json.loads(read_untrusted(Path(data_dir) / STATE_NAME, owners, 1 << 16).data)
        return RunningConfig(**data)
    except (OSError, ValueError, RefusedFile, TypeError):
        return None


def file_digest(path: Path | str) -> str | None:
    try:
        return digest(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def startup_config(path: str | None) -> tuple[Config, RunningConfig]:
    """What ``cairn router --config path`` runs: the file, or when it fails validation the
    last good configuration beside it. ConfigError when there is none to fall back on."""
    if path is None:
        return load(None), RunningConfig(None)
    try:
        return load(path), RunningConfig(path, sha256=file_digest(path))
    except ConfigError as e:
        history = History(path)
        fallback = history.last_good()
        if fallback is None:
            raise
        return fallback, RunningConfig(path, "last-good", str(e),
                                       digest(history.last_good_text() or ""))


# -- requests from the network (cairn.admin.config.apply) -----------------------------------
#
# The router (user cairn) writes a request; root carries it out. So root reads what a less
# privileged process wrote, by the one rule (cairn.base.files.read_untrusted), and every entry
# of the queue leaves it at once: carried out, or moved into refused/ with a reason. Nothing
# stays behind to start cairn-config-apply.service again (DirectoryNotEmpty= on the queue).
#
#   config-requests/queue/NNNN.json     one request, whole: written beside the queue, renamed in
#   config-requests/refused/NAME        an entry root did not carry out, and NAME.reason: why
#   config-requests/last.json           the last number given (numbers are never reused)


@dataclass(frozen=True)
class Request:
    id: int
    by: str      # what the router says (who asked over WAMP): a claim, not the author
    at: str
    action: str
    boot_id: str | None = None
    text: str = ""


@dataclass(frozen=True)
class Taken:
    """A request root took out of the queue: ``by`` is its author, the file's owner, for the
    one the router names."""

    request: Request
    name: str
    data: bytes
    owner: int

    @property
    def by(self) -> str:
        return f"{_owner_name(self.owner)} for {self.request.by}"


def _owner_name(uid: int) -> str:
    return user_name(uid).split(" (uid")[0]


def _queue(data_dir: Path) -> Path:
    return Path(data_dir) / REQUESTS_DIR / QUEUE


def write_request(data_dir: Path, text: str, by: str, action: str) -> Request:
    directory = Path(data_dir) / REQUESTS_DIR
    _queue(data_dir).mkdir(parents=True, exist_ok=True)
    done = [int(m.group(1)) for p in _queue(data_dir).iterdir() if (m := _ENTRY.match(p.name))]
    counter = _read_json(directory / "last.json") or {}
    number = max([counter.get("id", 0), *done]) + 1
    request = Request(number, by, now_iso(), action, boot_id(), text)
    # whole or not at all in the queue: written beside it, then renamed into it
    staged = directory / f"{number:04d}.json"
    atomic_write(staged, json.dumps(asdict(request)) + "\n")
    os.replace(staged, _queue(data_dir) / staged.name)
    fsync_dir(_queue(data_dir))
    # the numbers go on after the requests are carried out and removed
    atomic_write(directory / "last.json", json.dumps({"id": number}) + "\n")
    return request


def parse_request(name: str, data: bytes) -> Request:
    """The request in the queue's entry ``name``; ValueError says why it is not one."""
    m = _ENTRY.match(name)
    if m is None:
        raise ValueError("not a request's name (NNNN.json, four digits or more)")
    try:
        fields = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(fields, dict) or set(fields) != REQUEST_KEYS:
        keys = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise ValueError(f"keys {keys}, expected {sorted(REQUEST_KEYS)}")
    number = fields["id"]
    if type(number) is not int or number != int(m.group(1)):
        raise ValueError(f"id {number!r} is not the number of its name, {name}")
    for key in ("by", "at", "text"):
        if not isinstance(fields[key], str):
            raise ValueError(f"{key} is not text")
    if not fields["by"].isprintable() or not 0 < len(fields["by"]) <= MAX_BY:
        raise ValueError(f"by: one line of at most {MAX_BY} printable characters")
    if fields["action"] not in ("reload", "restart"):
        raise ValueError(f"action {fields['action']!r}, expected reload or restart")
    if fields["boot_id"] is not None and not isinstance(fields["boot_id"], str):
        raise ValueError("boot_id is not text")
    return Request(**fields)


def pending_requests(data_dir: Path) -> list[Request]:
    """The requests waiting in the queue (as the router sees them, for its status)."""
    found = []
    with contextlib.suppress(OSError):
        for path in _queue(data_dir).iterdir():
            with contextlib.suppress(OSError, ValueError, RefusedFile):
                found.append(parse_request(path.name, read_untrusted(
                    path, None, MAX_REQUEST_BYTES).data))
    return sorted(found, key=lambda r: r.id)


def refused_requests(data_dir: Path) -> list[dict[str, str]]:
    """What root did not carry out, newest last: ``{name, reason}``."""
    directory = Path(data_dir) / REQUESTS_DIR / REFUSED
    found = []
    with contextlib.suppress(OSError):
        for path in sorted(directory.glob("*.reason"), key=lambda p: p.stat().st_mtime_ns):
            with contextlib.suppress(OSError, RefusedFile):
                reason = read_untrusted(path, None, MAX_BY * 20).data.decode(errors="replace")
                found.append({"name": path.name.removesuffix(".reason"),
                              "reason": reason.strip()})
    return found


class Queue:
    """The queue of a data directory as root drains it: opened without following a link,
    every entry out of it before any is carried out."""

    def __init__(self, data_dir: Path, say: Callable[[str], None]) -> None:
        self.data_dir, self.say = Path(data_dir), say
        # the writer: the owner of the data directory (the router's user); and root
        self.owners = {0, os.stat(self.data_dir).st_uid}
        self.refusals = 0

    def drain(self) -> list[Taken]:
        """Every entry leaves the queue: the requests to carry out, oldest first, are
        returned (and removed); the others are moved into refused/ with their reason."""
        try:
            queue = os.open(_queue(self.data_dir), _DIRECTORY)
        except FileNotFoundError:
            return []
        except OSError as e:
            self.say(f"cairn config: {_queue(self.data_dir)}: not a directory of its own "
                     f"({e.strerror}): no request taken")
            return []
        taken = []
        try:
            for name in sorted(os.listdir(queue)):
                try:
                    got = read_untrusted(name, self.owners, MAX_REQUEST_BYTES, dir_fd=queue)
                    taken.append(Taken(parse_request(name, got.data), name, got.data,
                                       got.uid))
                except FileNotFoundError:
                    continue
                except (RefusedFile, ValueError) as e:
                    self.refuse(name, str(e), queue=queue)
                    continue
                os.unlink(name, dir_fd=queue)
            os.fsync(queue)
        finally:
            os.close(queue)
        return sorted(taken, key=lambda t: t.request.id)

    def refuse(self, name: str, reason: str, *, queue: int | None = None,
               data: bytes | None = None) -> None:
        """``name`` into refused/ (moved from the queue, or written from ``data``) with
        ``name.reason``; names are never followed there either."""
        self.say(f"cairn config: request {name} refused: {reason}")
        self.refusals += 1
        directory = Path(self.data_dir) / REQUESTS_DIR / REFUSED
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o755)
        refused = os.open(directory, _DIRECTORY)
        try:
            kept = name
            while _exists(kept, refused) or _exists(f"{kept}.reason", refused):
                kept = f"{name}.{time.time_ns()}"
            if queue is not None:
                os.rename(name, kept, src_dir_fd=queue, dst_dir_fd=refused)
            else:
                _create(kept, refused, data or b"")
            _create(f"{kept}.reason", refused, f"{now_iso()} {reason}\n".encode())
            os.fsync(refused)
        finally:
            os.close(refused)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _create(name: str, dir_fd: int, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=dir_fd)
    with open(fd, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
