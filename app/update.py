"""``cairn update``: the device's A/B system updates (RAUC) and the health gate that keeps a
new slot only once it has proven itself.

RAUC does the updating: it checks a bundle's signature, writes its root file system into the
slot that is not running and, through its U-Boot backend, makes that slot the next to boot,
on trial (images/boot/boot.cmd takes one of its tries at each boot). What RAUC leaves to the
system is what a healthy boot is, and the record of how an update went:

- RAUC's pre-install handler (images/update/cairn-update-installing) writes ``installing``:
  the slot and version being written; its post-install handler (cairn-update-installed)
  renames it ``trial`` once RAUC has made that slot the next to boot.
- At every boot ``cairn update health`` (cairn-health.service) settles it. A boot of the
  trial slot is kept (``rauc status mark-good``) once the router is ready, its store open and
  no driver failed, within a bounded time; otherwise the slot is marked bad and the device
  reboots into the slot it came from. A boot of another slot while a trial is pending means
  the trial slot never reached user space and boot counting gave up on it. Any other boot is
  marked good at once: a bad config must not send the device back to an older system.
- An ``installing`` found at boot is an install the power cut off: recorded as interrupted
  (not as the version's failure: a pull tries it again), unless RAUC had already switched to
  its slot, which this boot runs; then it is on trial like any other.
- ``last.json`` keeps the last update's result and reason for ``cairn update status``.

Both files live in UPDATE_DIR on the data partition, outside either slot."""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairn.gateway.core import config as cfg
from cairn.gateway.ops.update_state import (
    INSTALLING,
    TRIAL,
    UPDATE_DIR,
    Trial,
    booted_slot,
    last_pull,
    last_result,
    record,
    running_slot,
)

DEFAULT_CONFIG = "/etc/cairn/cairn.toml"
HEALTH_TIMEOUT_S = float(os.environ.get("CAIRN_HEALTH_TIMEOUT", "300"))
DRIVER_UNITS = ("cairn-sensor@*.service", "cairn-bridge-mqtt@*.service")


class UpdateError(Exception):
    pass


def run(*cmd: str, timeout: float = 60) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UpdateError(f"{cmd[0]} is not installed: not an A/B Cairn image") from None
    except subprocess.TimeoutExpired:
        raise UpdateError(f"{' '.join(cmd)}: no answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        # rauc says why on stdout (LastError, its last progress step), that it failed on stderr
        said = [line.strip() for line in done.stdout.splitlines()[-3:] + done.stderr.splitlines()
                if line.strip()]
        raise UpdateError(f"{' '.join(cmd)}: {'; '.join(said) or done.returncode}")
    return done.stdout


# -- what a healthy boot is ------------------------------------------------------------------


def _metrics_url(config_path: str) -> str:
    listen = cfg.load(config_path).router.listen
    host = "127.0.0.1" if listen.host in ("0.0.0.0", "", "::") else listen.host
    scheme = "https" if listen.tls else "http"
    return f"{scheme}://{host}:{listen.port}/metrics"


def _metrics(config_path: str) -> str:
    # the device's own router: a tls: listener's certificate is for the LAN's name
    context = ssl._create_unverified_context()
    with urllib.request.urlopen(_metrics_url(config_path), timeout=10,
                                context=context) as reply:
        return reply.read().decode()


def history_last_seq(config_path: str) -> str:
    """The newest seq the store holds (committed, as its reader sees it), for the ready line:
    what a power cut from then on leaves on the card."""
    try:
        m = re.search(r"^cairn_history_last_seq (\S+)", _metrics(config_path), re.M)
    except Exception as e:  # the line says so; readiness was decided already
        return f"unknown ({e})"
    return m.group(1) if m else "none"


def health_problems(config_path: str) -> list[str]:
    """What keeps this boot from being healthy; empty when it is."""
    state = subprocess.run(["systemctl", "is-active", "cairn-router.service"],
                           capture_output=True, text=True).stdout.strip()
    if state != "active":
        return [f"cairn-router is {state or 'unknown'}, not ready"]
    try:
        metrics = _metrics(config_path)
    except Exception as e:  # the router answers or it is not healthy, whatever the reason
        return [f"the router's /metrics did not answer: {e}"]
    if not re.search(r"^cairn_store_available 1\b", metrics, re.M):
        return ["the router runs without its store (cairn_store_available is not 1)"]
    failed = subprocess.run(["systemctl", "list-units", "--state=failed", "--plain",
                             "--no-legend", *DRIVER_UNITS], capture_output=True, text=True)
    return [f"driver {line.split()[0]} failed" for line in failed.stdout.splitlines()
            if line.strip()]


def wait_healthy(check: Callable[[], list[str]], timeout: float,
                 interval: float = 2.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        problems = check()
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(interval)


def health_gate(directory: Path, slot: str | None, check: Callable[[], list[str]],
                timeout: float, rauc: Callable[..., str],
                kept: Callable[[], None] = lambda: None) -> tuple[str, str]:
    """Settles this boot; returns (what was done, why). ``rauc(*args)`` runs RAUC;
    ``kept()`` is called once an update is kept (the store's copy for a rollback goes)."""
    if slot is None:
        return "none", "not an A/B boot (no rauc.slot= on the kernel command line)"
    cut_off = _settle_cut_off_install(directory, slot)
    trial = Trial.read(directory)
    if trial is None:
        rauc("status", "mark-good", "booted")
        return "good", cut_off or f"slot {slot} marked good (no update on trial)"
    if trial.slot != slot:
        rauc("status", "mark-good", "booted")
        reason = (f"slot {trial.slot} ({trial.version}) never reached user space: "
                  f"boot counting went back to slot {slot}")
        record(directory, "failed", reason, trial)
        return "failed", reason
    problems = wait_healthy(check, timeout)
    if not problems:
        rauc("status", "mark-good", "booted")
        record(directory, "ok", f"slot {slot} proved healthy and is kept", trial)
        kept()
        return "good", f"update to {trial.version} in slot {slot} kept"
    reason = f"not healthy within {timeout:.0f} s: " + "; ".join(problems)
    record(directory, "failed", reason, trial)
    rauc("status", "mark-bad", "booted")
    return "bad", reason


def _settle_cut_off_install(directory: Path, slot: str) -> str | None:
    """An install this boot found under way was cut off by a power cut or a crash. Its slot
    is on trial if RAUC had switched to it (the power went before the post-install
    handler); otherwise this slot runs on (RAUC marked the one it was writing bad before
    writing it), and the reason is returned."""
    installing = Trial.read(directory, INSTALLING)
    if installing is None:
        (directory / INSTALLING).unlink(missing_ok=True)   # nothing, or a damaged record
        return None
    if installing.slot == slot:
        os.replace(directory / INSTALLING, directory / TRIAL)
        return None
    reason = (f"the install of {installing.version} into slot {installing.slot} was cut off "
              f"(power cut or crash); slot {slot} runs on: install it again")
    record(directory, "interrupted", reason, installing)
    return reason


# -- the command -------------------------------------------------------------------------------


def add_commands(commands: Any) -> None:
    u = commands.add_parser(
        "update", help="A/B system updates: status, install, mark-good",
        description="The device's system updates (RAUC bundles into the slot that is not "
                    "running, kept only once the new system proves healthy).")
    actions = u.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = actions.add_parser("status", help="slots, versions and the last update's result")
    s.add_argument("--json", action="store_true", help="print JSON")
    i = actions.add_parser("install", help="install a bundle into the other slot")
    i.add_argument("bundle", metavar="FILE", help="a signed cairn-*.raucb")
    i.add_argument("--reboot", action="store_true", help="reboot into it when installed")
    actions.add_parser("mark-good", help="keep the running slot (what the health gate does)")
    usb = actions.add_parser("usb", help="install the cairn-*.raucb of a USB stick and reboot "
                                         "into it (cairn-update-usb@.service)")
    usb.add_argument("device", metavar="DEVICE", help="the stick's file system, e.g. /dev/sda1")
    p = actions.add_parser("pull", help="fetch and install updates from [update] source",
                           description="Check the central side's latest.json every "
                                       "[update] interval; download, check and install a "
                                       "bundle of another version (cairn-update-pull.service).")
    p.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG)
    p.add_argument("--once", action="store_true", help="check once (exit 1 if it failed)")
    r = actions.add_parser("ready", help="wait until the router is ready, its store open and "
                                         "no driver failed, and say so (cairn-ready.service)",
                           description="Waits for what the health gate checks and prints one "
                                       "line when it holds (or why not, after --timeout): on "
                                       "the device it goes to the serial console, the way in "
                                       "when there is no network. Exit 1 if not ready.")
    r.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG)
    r.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S, metavar="S")
    h = actions.add_parser("health", help="the boot's health gate (cairn-health.service)")
    h.add_argument("--config", metavar="FILE", default=DEFAULT_CONFIG)
    h.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S, metavar="S",
                   help=f"how long a trial boot has to prove itself (default "
                        f"{HEALTH_TIMEOUT_S:.0f} s; CAIRN_HEALTH_TIMEOUT)")


def _pull(config_path: str, once: bool) -> int:
    from cairn.app import update_pull

    try:
        source = update_pull.load(config_path)
    except cfg.ConfigError as e:
        print(f"cairn update pull: bad config: {e}", file=sys.stderr)
        return 2
    if source is None:
        print("cairn update pull: no [update] source in the config: nothing to pull from")
        return 0

    def install_pulled(bundle: Path, version: str) -> None:
        try:
            install(bundle, version)
        except UpdateError as e:
            raise update_pull.PullError(str(e)) from None
        if source.reboot:
            run("systemctl", "--no-block", "reboot")

    return update_pull.run(source, running_version(), install_pulled, once)


def running_version() -> str:
    """The system this boot runs: the version of the bundle its slot was installed from, or,
    on a slot as flashed, the Cairn it carries."""
    from importlib import metadata

    try:
        s = status()
        return s["slots"][s["booted"]]["version"] or metadata.version("cairn")
    except (UpdateError, KeyError, ValueError):   # RAUC cannot tell (or is busy): this Cairn's
        return metadata.version("cairn")


def install(bundle: Path, version: str) -> str:
    """``rauc install``; a bundle RAUC refuses is recorded as the last update, with RAUC's
    reason, for status, doctor and the router to show."""
    before = _stat(UPDATE_DIR / INSTALLING)
    try:
        return run_rauc("install", str(bundle))
    except UpdateError as e:
        slot = booted_slot(Path("/proc/cmdline").read_text()) or "?"
        # the install record ends only if this install wrote it (RAUC may be busy with
        # another one); an update on trial waits for its boot all the same
        ours = _stat(UPDATE_DIR / INSTALLING) not in (None, before)
        record(UPDATE_DIR, "failed", f"not installed: {e}", Trial("-", version, slot),
               ends=(INSTALLING,) if ours else ())
        raise


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _commit_store(config_path: str) -> None:
    """The store's pre-migration copies are only for going back to the older release."""
    from cairn.base.data_dir import db_path
    from cairn.gateway.store import discard_pre_migration_copies

    try:
        for copy in discard_pre_migration_copies(db_path(cfg.load(config_path).router.data_dir)):
            print(f"cairn update health: the update is kept: removed {copy}")
    except (cfg.ConfigError, OSError) as e:   # the slot is kept all the same
        print(f"cairn update health: the store's copies for a rollback stay: {e}",
              file=sys.stderr)


def run_rauc(*args: str) -> str:
    return run("rauc", *args, timeout=600)


RAUC_BUSY = "already processing a different method"   # rauc's answer while it installs


def status() -> dict[str, Any]:
    """The slots as RAUC sees them and Cairn's records of the updates. While RAUC installs it
    answers no status: the slot booted is then the kernel command line's, the slots unknown."""
    try:
        rauc = json.loads(run_rauc("status", "--detailed", "--output-format=json"))
    except UpdateError as e:
        if RAUC_BUSY not in str(e).lower():
            raise
        return {"rauc": "busy: installing", "booted": running_slot(), "primary": None,
                "compatible": None, "slots": {}, **records()}
    slots = {}
    for entry in rauc.get("slots", []):
        for name, slot in entry.items():
            info = slot.get("slot_status", {}).get("bundle", {})
            slots[slot.get("bootname") or name] = {
                "state": slot.get("state"), "boot_status": slot.get("boot_status"),
                "version": info.get("version"), "device": slot.get("device")}
    booted = slots.get(rauc.get("booted"))
    if booted is not None and booted["version"] is None:
        # a slot as flashed has no bundle record: its version is the Cairn it runs
        from importlib import metadata
        booted["version"] = metadata.version("cairn")
    return {"rauc": "ok", "booted": rauc.get("booted"), "primary": rauc.get("boot_primary"),
            "compatible": rauc.get("compatible"), "slots": slots, **records()}


def records() -> dict[str, Any]:
    """The install under way, the update on trial, the last update's result and the last
    pull's."""
    return {"installing": vars(i) if (i := Trial.read(UPDATE_DIR, INSTALLING)) else None,
            "trial": vars(t) if (t := Trial.read(UPDATE_DIR)) else None,
            "last": last_result(UPDATE_DIR), "pull": last_pull(UPDATE_DIR)}


def render_status(s: dict[str, Any]) -> str:
    busy = s.get("rauc", "ok") != "ok"
    lines = [f"booted slot {s['booted']}" + ("" if busy else f" (next boot: {s['primary']})")]
    for name, slot in sorted(s["slots"].items()):
        lines.append(f"  slot {name}: {slot['state']}, {slot['boot_status']}, "
                     f"version {slot['version'] or '-'} ({slot['device']})")
    after = " (RAUC is busy; slot details after the install)" if busy else ""
    if s.get("installing"):
        lines.append(f"installing {s['installing']['version']} into slot "
                     f"{s['installing']['slot']}{after}")
    elif busy:
        lines.append(f"an install is under way{after}")
    if s["trial"]:
        lines.append(f"on trial: {s['trial']['version']} in slot {s['trial']['slot']}")
    last = s["last"]
    lines.append("last update: " + (f"{last['result']} at {last['at']}: {last['reason']}"
                                    if last else "none"))
    if pull := s.get("pull"):
        lines.append(f"last pull: {pull['result']} since {pull['since']}: {pull['reason']}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "status":
            s = status()
            print(json.dumps(s, indent=1) if args.json else render_status(s))
        elif args.action == "install":
            print(install(Path(args.bundle), Path(args.bundle).name), end="")
            print("cairn update: installed; the new slot boots on trial at the next boot")
            if args.reboot:
                run("systemctl", "--no-block", "reboot")
        elif args.action == "mark-good":
            print(run_rauc("status", "mark-good", "booted"), end="")
        elif args.action == "pull":
            return _pull(args.config, args.once)
        elif args.action == "usb":
            from cairn.app import update_usb

            installed, what = update_usb.install_from(args.device, sys.modules[__name__])
            print(f"cairn update usb: {what}")
            if installed:
                run("systemctl", "--no-block", "reboot")
        elif args.action == "ready":
            problems = wait_healthy(lambda: health_problems(args.config), args.timeout)
            if problems:
                print(f"cairn: not ready after {args.timeout:.0f} s: " + "; ".join(problems))
                return 1
            slot = booted_slot(Path("/proc/cmdline").read_text()) or "-"
            uptime = float(Path("/proc/uptime").read_text().split()[0])
            print(f"cairn: ready: router ready, store open, no driver failed (slot {slot}, "
                  f"history to seq {history_last_seq(args.config)}, {uptime:.0f} s since the "
                  "kernel started)")
        elif args.action == "health":
            slot = booted_slot(Path("/proc/cmdline").read_text())
            done, why = health_gate(UPDATE_DIR, slot, lambda: health_problems(args.config),
                                    args.timeout, run_rauc, lambda: _commit_store(args.config))
            print(f"cairn update health: {why}")
            if done == "bad":
                run("systemctl", "--no-block", "reboot")
    except UpdateError as e:
        print(f"cairn update: {e}", file=sys.stderr)
        return 1
    return 0
