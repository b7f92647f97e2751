"""Operations on a device: ``cairn backup``, ``cairn restore``, ``cairn doctor`` and
``cairn repair``."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import os
import shutil
import sqlite3
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cairn.base import clock
from cairn.base.data_dir import DB_NAME, lock_path, read_sync_status
from cairn.base.urls import cut_connection, redact_url
from cairn.gateway.core.config import Config, ConfigError, Endpoint, load, read_document
from cairn.gateway.ops import update_state, wear
from cairn.gateway.ops.config_history import History, read_running
from cairn.gateway.store import SCHEMA_VERSION, Findings, inspect
from cairn.gateway.store import repair as repair_store

MIN_FREE_BYTES = 64 * 1024 * 1024


class DataDirBusy(Exception):
    """Another router process holds the data directory."""


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Held by the router for as long as it runs: a second router (or a restore) on the
    same data directory is refused instead of corrupting it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(data_dir), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataDirBusy(f"{data_dir} is in use by a running router") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


# -- backup and restore --------------------------------------------------------------------


def backup(data_dir: Path, target: Path) -> dict[str, Any]:
    """A consistent copy of the store taken with SQLite's online backup while the router
    runs, checked with ``integrity_check`` before it is renamed into place."""
    source_path = data_dir / DB_NAME
    if not source_path.exists():
        raise FileNotFoundError(f"no store at {source_path}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.part")
    started = time.monotonic()
    with contextlib.closing(sqlite3.connect(f"file:{source_path}?mode=ro", uri=True,
                                            timeout=30)) as source, \
            contextlib.closing(sqlite3.connect(partial)) as copy:
        # One step, in one read transaction: the router keeps writing meanwhile (WAL), and a
        # stepped backup would start over at every commit of the router and never finish.
        source.backup(copy, pages=-1)
        copy.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
        check = copy.execute("PRAGMA integrity_check").fetchone()[0]
        events = copy.execute("SELECT COUNT(*), MAX(seq) FROM publications").fetchone()
    if check != "ok":
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"the backup failed its integrity check: {check}")
    findings = inspect(partial)  # rows damaged in the store are copied as they are
    os.replace(partial, target)
    return {"file": str(target), "bytes": target.stat().st_size, "events": events[0],
            "last_seq": events[1], "seconds": round(time.monotonic() - started, 2),
            "damage": None if findings.clean else findings.summary()}


def restore(data_dir: Path, source: Path, say: Callable[[str], None] = print) -> None:
    """Put a backup in place of the store; refused while a router uses the directory. A
    backup holding damaged rows is restored, after ``say`` has said so."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as db:
            check = db.execute("PRAGMA integrity_check").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as e:
        raise RuntimeError(f"{source} is not a usable backup: {e}") from e
    if check != "ok":
        raise RuntimeError(f"{source} is damaged: {check}")
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"{source} has schema {version}, newer than this Cairn "
                           f"({SCHEMA_VERSION})")
    findings = inspect(source)
    if not findings.clean:
        say(f"{source} holds {findings.summary()}: the router will leave them out; "
            f"`cairn repair` (router stopped) writes a clean store from the rest")
    with data_dir_lock(data_dir):
        for suffix in ("-wal", "-shm"):
            (data_dir / f"{DB_NAME}{suffix}").unlink(missing_ok=True)
        partial = data_dir / f".{DB_NAME}.restore"
        shutil.copyfile(source, partial)
        os.replace(partial, data_dir / DB_NAME)


def repair(data_dir: Path) -> dict[str, Any]:
    """``cairn repair``, the router stopped: a clean store written from every row of the
    store that can be read (seqs, publication and subscription ids kept; the history rows
    left out recorded as gaps), the damaged file kept beside it. Nothing is written when
    nothing is damaged."""
    path = data_dir / DB_NAME
    if not path.exists():
        raise FileNotFoundError(f"no store at {path}")
    try:
        with data_dir_lock(data_dir):
            findings = inspect(path)
            if findings.clean and _integrity(path) == "ok":
                return {"file": str(path), "findings": findings, "aside": None}
            done, aside = repair_store(path)
    except DataDirBusy as e:
        raise DataDirBusy(f"{e}: stop it first (systemctl stop cairn-router), repair, start "
                          f"it again") from None
    return {"file": str(path), "findings": done.findings, "aside": str(aside),
            "kept": done.kept, "gaps": done.gaps}


def _integrity(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


# -- doctor --------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str]] = []

    def add(self, level: str, what: str, detail: str) -> None:
        self.lines.append((level, what, detail))

    @property
    def problems(self) -> int:
        return sum(1 for level, _, _ in self.lines if level == "FAIL")

    def render(self) -> str:
        width = max((len(w) for _, w, _ in self.lines), default=10)
        body = "\n".join(f"{level:<4}  {what:<{width}}  {detail}"
                         for level, what, detail in self.lines)
        verdict = "healthy" if not self.problems else f"{self.problems} problem(s)"
        return f"{body}\n\ncairn doctor: {verdict}"


def doctor(config_path: str | None) -> Report:
    report = Report()
    try:
        config = load(config_path)
        data, _ = read_document(config_path)
    except ConfigError as e:
        report.add("FAIL", "config", str(e))
        last_good = History(config_path).last_good() if config_path else None
        if last_good is None:
            return report
        report.add("warn", "config", f"the router runs on the last good configuration "
                                     f"{last_good.source} instead")
        config, data = last_good, read_document(last_good.source)[0]
    else:
        report.add("ok", "config", f"{config.source}: {len(config.realms)} realm(s)")
        _check_running_config(report, config)
    _check_data_dir(report, config)
    _check_store(report, config.router.data_dir / DB_NAME)
    _check_serial(report, data.get("sensors", []))
    _check_clock(report)
    _check_sink(report, data.get("sync"))
    sync = data.get("sync")
    status = read_sync_status(config.router.data_dir) if isinstance(sync, dict) and sync else None
    _check_sync_wait(report, status)
    _check_sync_budget(report, status)
    _check_wear(report, config)
    check_update(report)
    return report


def _check_running_config(report: Report, config: Config) -> None:
    """A router that could not start on the file, or refused its last reload, says so in
    its config state (gateway.ops.config_history)."""
    state = read_running(config.router.data_dir)
    if state is None or not pid_alive(state.pid) or state.problem is None:
        return
    where = "runs on the last good configuration" if state.running == "last-good" else \
        "keeps its running configuration"
    report.add("FAIL", "config", f"the router {where}: {state.problem}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the router's user is not ours
        return True
    return True


def _check_data_dir(report: Report, config: Config) -> None:
    data_dir = config.router.data_dir
    if not data_dir.exists():
        report.add("warn", "data directory", f"{data_dir} does not exist yet (the router "
                                             f"creates it)")
        return
    if not os.access(data_dir, os.W_OK):
        report.add("FAIL", "data directory", f"{data_dir} is not writable")
        return
    free = shutil.disk_usage(data_dir).free
    level = "ok" if free >= MIN_FREE_BYTES else "FAIL"
    report.add(level, "free space", f"{free / 2**20:.0f} MiB free on {data_dir}")


def check_update(report: Report) -> None:
    """The A/B system (nothing off an A/B image): the slot running, an update on trial, the
    last update's result and the last pull's. A failed update is a warning: the device runs
    the slot it came from, as it should; so is a pull that failed (a source that sent more
    than it offered, a partition too full to take the bundle)."""
    state = update_state.summary()
    if state["slot"] is None:
        return
    pull = state["pull"]
    if pull and pull.get("result") == "failed":
        report.add("warn", "update pull", f"failing since {pull['since']}: {pull['reason']}")
    detail = f"running slot {state['slot']}"
    if state["trial"]:
        detail += f"; {state['trial']['version']} in slot {state['trial']['slot']} on trial"
    last = state["last"]
    if last is None:
        report.add("ok", "system update", f"{detail}; no update yet")
    elif last["result"] == "ok":
        report.add("ok", "system update", f"{detail}; last update {last['version']} kept "
                                          f"({last['at']})")
    else:
        report.add("warn", "system update", f"{detail}; last update {last['version']} was "
                                            f"not kept ({last['at']}): {last['reason']}")


def _check_store(report: Report, path: Path) -> None:
    if not path.exists():
        report.add("warn", "store", f"{path} does not exist yet")
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                                timeout=10)) as db:
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            events = db.execute("SELECT COUNT(*) FROM publications").fetchone()[0]
    except sqlite3.DatabaseError as e:
        report.add("FAIL", "store", f"{path}: {e}")
        return
    if check != "ok":
        report.add("FAIL", "store", f"{path}: integrity: {check}")
    elif version > SCHEMA_VERSION:
        report.add("FAIL", "store", f"{path}: schema {version} is newer than this Cairn")
        return  # its rows are not this Cairn's to read
    else:
        report.add("ok", "store", f"{path}: integrity ok, schema {version}, {events} events")
    try:
        findings = inspect(path)
    except sqlite3.DatabaseError as e:
        report.add("FAIL", "store rows", f"{path}: {e}")
        return
    _check_rows(report, findings)


def _check_rows(report: Report, findings: Findings) -> None:
    """Every row read as the router reads it: the damaged ones, by table, a few named."""
    if findings.clean:
        report.add("ok", "store rows", f"{sum(findings.rows.values())} rows, all readable")
        return
    for table, n in findings.damaged.items():
        report.add("FAIL", "store rows",
                   f"{table}: {n} of {findings.rows[table]} damaged, left out by the router "
                   f"({'; '.join(findings.examples[table])})")
    for table, why in findings.stopped.items():
        report.add("FAIL", "store rows", f"{table}: could be read only in part ({why})")
    report.add("warn", "store rows", "`cairn repair` (router stopped) writes a clean store "
                                     "from every readable row and keeps the damaged file")


def _check_serial(report: Report, sensors: list[dict[str, Any]]) -> None:
    ports = sorted({s.get("port") for s in sensors if isinstance(s, dict) and s.get("port")})
    for port in ports:
        if not Path(port).exists():
            report.add("FAIL", "serial device", f"{port} is missing (unplugged?)")
        elif not os.access(port, os.R_OK | os.W_OK):
            report.add("FAIL", "serial device", f"{port} is not readable and writable "
                                                f"(serial group?)")
        else:
            report.add("ok", "serial device", port)


def _check_clock(report: Report) -> None:
    if clock.clock_synchronized():
        report.add("ok", "clock", "synchronized")
    else:
        report.add("warn", "clock", "not synchronized: timestamps are stamped with boottime "
                                    "and re-based centrally")


def _check_sink(report: Report, sync: dict[str, Any] | None) -> None:
    if not sync or not isinstance(sync, dict) or not sync.get("sink"):
        report.add("ok", "sync", "not configured")
        return
    sink = str(sync["sink"])
    if sink.startswith("dir:"):
        path = Path(sink.removeprefix("dir:"))
        ok = path.is_dir() and os.access(path, os.W_OK)
        report.add("ok" if ok else "FAIL", "sync sink",
                   f"{path} {'is writable' if ok else 'is missing or not writable'}")
        return
    base = sink.split("{name}")[0]
    level, what = _probe_sink(base)
    report.add(level, "sync sink", f"{redact_url(base)} {what}")


SINK_PROBE_S = 5.0  # the whole HEAD of a sink's URL, connect to the end of its head
NO_ANSWER = f"gave no whole answer within {SINK_PROBE_S:g} s; batches wait until it answers"


def _probe_sink(url: str) -> tuple[str, str]:
    """(level, what) of one HEAD of ``url`` within :data:`SINK_PROBE_S` in all: a sink that
    sent its head a byte a second held the doctor forever, and one that sent endless
    headers crashed it. Redirects are named, not followed (the uploader follows only a
    307/308 to the sink's own host or ``redirect_hosts``)."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=SINK_PROBE_S)
    expired = threading.Event()
    deadline = threading.Timer(SINK_PROBE_S, cut_connection, [connection, expired])
    deadline.start()
    try:
        connection.request("HEAD", (parts.path or "/") + (f"?{parts.query}" if parts.query
                                                          else ""))
        reply = connection.getresponse()
    except (OSError, http.client.HTTPException) as e:
        if expired.is_set() or isinstance(e, TimeoutError):
            return "warn", NO_ANSWER
        if isinstance(e, http.client.HTTPException):
            return "warn", f"answers, but not as an HTTP server ({type(e).__name__}: {e})"
        return "warn", f"unreachable now ({e}); batches wait until it is back"
    finally:
        deadline.cancel()
        connection.close()
    if expired.is_set():  # the head was cut: what it said is not an answer
        return "warn", NO_ANSWER
    if 300 <= reply.status < 400:
        location = redact_url(urllib.parse.urljoin(url, reply.getheader("Location") or ""))
        return "warn", f"answers with a redirect (HTTP {reply.status} to {location})"
    if "html" in (reply.getheader("Content-Type") or "").lower():
        return "warn", (f"answers with a web page (HTTP {reply.status}, text/html): a login "
                        f"page of the network in between?")
    return "ok", f"answers (HTTP {reply.status})"


def _check_sync_wait(report: Report, status: dict[str, Any] | None) -> None:
    """An uploader told to wait for an unmetered link (``on_metered = "wait"``) that waits:
    nothing is broken, but nothing leaves the device either (a warning)."""
    if status is None or status.get("state") != "waiting":
        return
    since = f" since {status['waiting_since']}" if status.get("waiting_since") else ""
    backlog = status.get("backlog")
    left = f"; {backlog:,} events not yet shipped" if isinstance(backlog, int) else ""
    report.add("warn", "sync", f"waiting for {status.get('waiting_for') or 'an unmetered link'}"
                               f"{since}{left}")


def _check_sync_budget(report: Report, status: dict[str, Any] | None) -> None:
    """History rows larger than a whole day's ``[sync] daily_bytes``, shipped as gaps: the
    rest ships, but these never reach the central side (a warning)."""
    rows = (status or {}).get("over_budget_rows")
    if not isinstance(rows, int) or rows <= 0:
        return
    last = status.get("last_over_budget") if isinstance(status.get("last_over_budget"),
                                                        dict) else {}
    report.add("warn", "sync budget", f"{rows:,} history row(s) shipped as gaps, the last "
                                      f"seq {last.get('first_seq')}: {last.get('reason')}")


def _check_wear(report: Report, config: Config) -> None:
    """The running router's figures (its /metrics): the card's writes per day and the years
    a fresh card of ``router.card_endurance_tb`` lasts at that rate."""
    url = metrics_url(config.router.listen)
    try:
        metrics = read_metrics(config.router.listen)
    except (urllib.error.URLError, OSError, ValueError) as e:
        report.add("warn", "card wear", f"no figures: the router does not answer at {url} "
                                        f"({getattr(e, 'reason', e)})")
        return
    per_day = metrics.get("cairn_card_written_bytes_per_day")
    years = metrics.get("cairn_card_life_years")
    window = metrics.get("cairn_card_wear_window_seconds", 0)
    endurance = config.router.card_endurance_tb
    if per_day is None:
        report.add("ok", "card wear", f"measuring ({window / 60:.0f} of "
                                      f"{wear.MIN_SPAN_S / 60:.0f} min): a rate is projected "
                                      f"after an hour of the router running")
        return
    detail = (f"{per_day / 1e9:.2f} GB/day written to the card (over the last "
              f"{window / 3600:.1f} h)")
    if years is None:
        report.add("ok", "card wear", detail)
    elif years < wear.WARN_YEARS:
        report.add("warn", "card wear",
                   f"{detail}: a {endurance:g} TB card lasts {years:.1f} years at this rate "
                   f"(under {wear.WARN_YEARS:g}); a commit_window on busy history rules "
                   f"writes less (see README, Durability and the SD card)")
    else:
        report.add("ok", "card wear", f"{detail}: a {endurance:g} TB card lasts "
                                      f"{years:.0f} years at this rate")


def local_authority(listen: Endpoint) -> str:
    """``host:port`` of the router's HTTP listener as this machine reaches it."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen.host or "", listen.host)
    return f"{_url_host(host)}:{listen.port}"


def local_tls_context() -> ssl.SSLContext:
    """For the router's own certificate, on this machine: no name or chain to check."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def metrics_url(listen: Endpoint) -> str:
    """The router's /metrics as this machine reaches it."""
    return f"{'https' if listen.tls else 'http'}://{local_authority(listen)}/metrics"


def read_metrics(listen: Endpoint, timeout: float = 5) -> dict[str, float]:
    """The unlabelled samples of the router's /metrics on ``listen`` (URLError, OSError or
    ValueError when it does not answer)."""
    context = local_tls_context() if listen.tls else None
    with urllib.request.urlopen(metrics_url(listen), timeout=timeout,
                                context=context) as response:
        return _parse_metrics(response.read().decode())


def _url_host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host else host or "127.0.0.1"


def _parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format, unlabelled samples only (what doctor reads)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            values[name] = float(value)
    return values


# -- commands ------------------------------------------------------------------------------


def add_commands(commands: Any) -> None:
    b = commands.add_parser("backup", help="copy the store while the router runs",
                            description="Take a consistent copy of the store with SQLite's "
                                        "online backup, while the router keeps running.")
    b.add_argument("--config", metavar="FILE", help="TOML config (for router.data_dir)")
    b.add_argument("out", metavar="FILE", help="where to write the copy")
    r = commands.add_parser("restore", help="put a backup in place (router stopped)",
                            description="Replace the store with a backup. Refused while a "
                                        "router uses the data directory.")
    r.add_argument("--config", metavar="FILE", help="TOML config (for router.data_dir)")
    r.add_argument("backup", metavar="FILE", help="a file made by cairn backup")
    f = commands.add_parser("repair", help="rewrite a damaged store (router stopped)",
                            description="Write a clean store from every row of the store "
                                        "that can be read, keeping seqs and subscription ids "
                                        "(history rows left out become gap records); the "
                                        "damaged file is kept beside it. Refused while a "
                                        "router uses the data directory.")
    f.add_argument("--config", metavar="FILE", help="TOML config (for router.data_dir)")
    d = commands.add_parser("doctor", help="check the installation and report",
                            description="Check config, data directory, free space, store "
                                        "integrity, every row of the store as the router "
                                        "reads it, serial devices, clock and sync sink; "
                                        "exit 1 when something is wrong.")
    d.add_argument("--config", metavar="FILE", help="TOML config file")


def main(args: argparse.Namespace) -> int:
    if args.command == "doctor":
        report = doctor(args.config)
        print(report.render())
        return 1 if report.problems else 0
    try:
        config = load(args.config)
    except ConfigError as e:
        print(f"cairn: bad config: {e}", file=sys.stderr)
        return 2
    try:
        if args.command == "backup":
            result = backup(config.router.data_dir, Path(args.out))
            print(f"backup: {result['file']}: {result['events']} events up to seq "
                  f"{result['last_seq']}, {result['bytes']} bytes in {result['seconds']} s")
            if result["damage"]:
                print(f"cairn backup: the copy holds {result['damage']}, as the store does: "
                      f"`cairn doctor` names them, `cairn repair` mends the store",
                      file=sys.stderr)
        elif args.command == "repair":
            _print_repair(repair(config.router.data_dir))
        else:
            restore(config.router.data_dir, Path(args.backup),
                    lambda line: print(f"cairn restore: {line}", file=sys.stderr))
            print(f"restored {args.backup} into {config.router.data_dir}")
    except (OSError, RuntimeError, ValueError, sqlite3.DatabaseError, DataDirBusy) as e:
        print(f"cairn {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


def _print_repair(result: dict[str, Any]) -> None:
    findings = result["findings"]
    if result["aside"] is None:
        print(f"repair: {result['file']}: {findings.summary()}, integrity ok: nothing to do")
        return
    kept = result["kept"]
    print(f"repair: {result['file']} held {findings.summary()}; wrote a clean store with "
          f"{kept['publications']} history rows, {kept['retained']} retained events and "
          f"{kept['subscriptions']} subscriptions ({result['gaps']} gap records for the "
          f"history rows left out); the damaged file is kept as {result['aside']}")
    for table, examples in findings.examples.items():
        for example in examples:
            print(f"  left out of {table}: {example}")
