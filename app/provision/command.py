"""The report file and the ``cairn provision`` command."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from cairn.app import network_profiles
from cairn.app.provision.apply import apply, consume, set_hostname, sync_folder
from cairn.app.provision.checks import Context, ProvisionError, make_plan
from cairn.app.provision.folder import (
    BOOT_FOLDER,
    DATA,
    ETC,
    EXIT_APPLIED,
    EXIT_FAILED,
    EXIT_REFUSED,
    GROUPS,
    Change,
    Inputs,
    Plan,
    scan,
)
from cairn.base.config_tools import ConfigError
from cairn.base.files import write_atomically
from cairn.gateway.ops.config_history import PROVISIONING as OUTCOME_FILE
from cairn.gateway.ops.config_history import provisioning_outcome

log = logging.getLogger("cairn.provision")

def report(outcome: str, plan: Plan, lines: list[str] | None = None) -> str:
    """report.txt: what a person at a laptop needs, no secret values (names only)."""
    out = ["Cairn provisioning report", f"When: {utc_now()} (boot {_boot_id()})", "",
           outcome, *(lines or [])]
    if plan.problems:
        out += ["", "Problems (file: key: problem):", *(f"  {p}" for p in plan.problems)]
    if plan.changes and not plan.problems:
        out += ["", "Applied:" if not outcome.startswith(("FAILED", "CHECKED")) else
                "Would apply:"]
        out += [f"  {_source(c)}: {c.note} ({c.dest})" if c.remove else
                f"  {_source(c)} -> {c.dest} ({c.note})" for c in plan.changes]
    if plan.not_understood:
        out += ["", "Not understood, left alone:", *(f"  {n}" for n in plan.not_understood)]
    return "\n".join(out) + "\n"


def _source(change: Change) -> str:
    if change.source is None:
        return "network (country)"
    return f"{change.source.parent.name}/{change.source.name}" \
        if change.source.parent.name.lower() in GROUPS else change.source.name


def utc_now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def write_report(folder: Path, text: str) -> None:
    """report.txt on the FAT partition, CRLF for Notepad; no chmod (FAT has none)."""
    tmp = folder / "report.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(text.replace("\n", "\r\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / "report.txt")
        sync_folder(folder)
    except OSError as e:  # a read-only or vanished card: the journal still has it
        log.error("cannot write %s: %s", folder / "report.txt", e)


def provision(folder: Path, etc: Path, data: Path, dry_run: bool = False,
              live: bool = False) -> int:
    inputs = scan(folder)
    if inputs.empty():
        return nothing_to_do(folder, etc, inputs, dry_run)
    try:
        with tempfile.TemporaryDirectory(prefix="cairn-provision-") as staging:
            plan = make_plan(inputs, Context(folder, etc, data, Path(staging)))
    except ProvisionError as e:
        record_outcome(etc, "failed", [str(e)], dry_run)
        return finish(folder, EXIT_FAILED, dry_run, report(
            f"FAILED: the files could not be checked ({e}); nothing was applied.",
            Plan(not_understood=inputs.not_understood)))
    if plan.problems:
        record_outcome(etc, "refused", plan.problems, dry_run)
        return finish(folder, EXIT_REFUSED, dry_run, report(
            "REFUSED: nothing was applied; the device runs as before. Fix the files named "
            "below on this card and boot again.", plan))
    if dry_run:
        return finish(folder, EXIT_APPLIED, dry_run, report("CHECKED (--dry-run): all good, "
                                                            "nothing written.", plan))
    try:
        apply(plan, etc)
    except OSError as e:
        record_outcome(etc, "failed", [f"writing {e.filename or 'a file'}: {e.strerror or e}"],
                       dry_run)
        return finish(folder, EXIT_FAILED, dry_run, report(
            f"FAILED: writing {e.filename or 'a file'} failed ({e.strerror or e}); what was "
            f"already written was put back and the files stay on this card.", plan))
    record_outcome(etc, "applied", [], dry_run)
    leftovers = consume(plan, folder)
    if plan.hostname and live:
        set_hostname(plan.hostname)
    return finish(folder, EXIT_APPLIED, dry_run, report(
        "APPLIED: the files below were moved into the device's settings and removed from "
        "this card.", plan, leftovers))


def record_outcome(etc: Path, outcome: str, problems: list[str], dry_run: bool) -> None:
    """The last run's outcome for the router's status and the dashboard (OUTCOME_FILE in the
    settings, readable by the router): applied, refused, failed, or cleared (a refused folder
    taken away). Names and problems only, never a secret."""
    if dry_run:
        return
    record = {"at": utc_now(), "boot_id": _boot_id(), "outcome": outcome,
              "problems": [str(p) for p in problems]}
    try:
        write_atomically(etc / OUTCOME_FILE, json.dumps(record, indent=1) + "\n", mode=0o644)
    except OSError as e:   # the report on the FAT still says it
        log.error("cannot record the outcome in %s: %s", etc / OUTCOME_FILE, e)


def read_outcome(etc: Path) -> dict[str, Any] | None:
    return provisioning_outcome(etc / "cairn.toml")


def nothing_to_do(folder: Path, etc: Path, inputs: Inputs, dry_run: bool) -> int:
    """Nothing to apply. Files it does not understand get a report once (e.g. a
    cairn.toml.txt): a later boot does not overwrite the report of the run that applied."""
    log.info("provision: nothing to apply in %s", folder)
    if not dry_run and (read_outcome(etc) or {}).get("outcome") in ("refused", "failed"):
        record_outcome(etc, "cleared", [], dry_run)   # the files it refused were taken away
    if inputs.not_understood and not (folder / "report.txt").exists():
        finish(folder, EXIT_APPLIED, dry_run, report(
            "NOTHING APPLIED: no file here is one Cairn reads (see README.txt).",
            Plan(not_understood=inputs.not_understood)))
    return EXIT_APPLIED


def finish(folder: Path, code: int, dry_run: bool, text: str) -> int:
    for line in text.splitlines():
        if line:
            log.log(logging.ERROR if code else logging.INFO, "%s", line)
    if not dry_run:
        write_report(folder, text)
    return code


def add_commands(commands: Any) -> None:
    parser = commands.add_parser(
        "provision", help="apply the cairn/ folder of the boot partition (at boot, as root)",
        description="Check the files of the cairn/ folder on the boot partition with Cairn's "
                    "own config checks and, if all are good, move them into the device's "
                    "settings; write report.txt there either way. Exit 0 applied or nothing "
                    "to do, 2 refused (nothing applied), 1 a write failed (put back).")
    parser.add_argument("--from", dest="folder", type=Path, default=BOOT_FOLDER,
                        metavar="DIR", help=f"the folder (default {BOOT_FOLDER})")
    parser.add_argument("--etc", type=Path, default=ETC, metavar="DIR",
                        help=f"Cairn's settings (default {ETC})")
    parser.add_argument("--data", type=Path, default=DATA, metavar="DIR",
                        help=f"the data partition (default {DATA}); the running host name "
                             f"is set only with the default")
    parser.add_argument("--dry-run", action="store_true",
                        help="check and print the report; write nothing, not even the report")
    parser.add_argument("--render-network", type=Path, metavar="FILE",
                        help="print the NetworkManager keyfile of one network/NAME.toml")


def main(args: argparse.Namespace) -> int:
    if args.render_network:
        return render_network(args.render_network)
    inputs = scan(args.folder)
    writes = not args.dry_run and not (inputs.empty() and not inputs.not_understood)
    with writable(args.folder) if writes else contextlib.nullcontext():
        return provision(args.folder, args.etc, args.data, args.dry_run,
                         live=not args.dry_run and args.data == DATA)


@contextlib.contextmanager
def writable(folder: Path):
    """The device mounts its boot partition read-only (nothing writes the FAT on a normal
    boot, so a power cut cannot tear it): it is made writable only while provisioning takes
    files off it and writes its report, then read-only again. A folder on a writable file
    system (a test, a laptop) is left as it is."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if not read_only:
        yield
        return
    mount = subprocess.run(["findmnt", "-n", "-o", "TARGET", "--target", str(folder)],
                           capture_output=True, text=True).stdout.strip()
    done = subprocess.run(["mount", "-o", "remount,rw", mount], capture_output=True, text=True)
    if done.returncode != 0:
        log.error("cannot make %s writable: %s", mount, done.stderr.strip())
    try:
        yield
    finally:
        if done.returncode == 0:
            subprocess.run(["mount", "-o", "remount,ro", mount], check=False)


def render_network(path: Path) -> int:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        stem = path.name[:-5] if path.name.lower().endswith(".toml") else path.stem
        profile = network_profiles.parse_profile(data, str(path), stem)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        print(f"cairn: cannot read {path}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ConfigError as e:
        print(f"cairn: bad network file: {e}", file=sys.stderr)
        return EXIT_REFUSED
    sys.stdout.write(profile.keyfile)
    return EXIT_APPLIED
