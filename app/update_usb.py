"""``cairn update usb DEVICE``: a system update from a USB stick (cairn-update-usb@.service,
started by udev for each file system on a USB disk).

The stick is mounted read-only; a bundle named ``cairn-*.raucb`` at its top (one, any case) is
installed like ``cairn update install`` (RAUC checks its signature; a refusal is the last
update's result, with RAUC's reason) and the device reboots into it on trial. A stick left in
must not install again at every boot: a bundle of the version this slot runs, or of the
version whose update last failed, is left alone. A stick without a bundle is not an update
and leaves no record."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

BUNDLE_NAME = re.compile(r"cairn-.*\.raucb", re.IGNORECASE)


def find_bundles(top: Path) -> list[Path]:
    """The bundles at the top of a stick, by name (FAT names have no case)."""
    return sorted(p for p in top.iterdir() if BUNDLE_NAME.fullmatch(p.name) and p.is_file())


def reason_to_skip(version: str, running: str, last: dict[str, Any] | None) -> str | None:
    """Why a bundle of ``version`` is not installed (None: install it)."""
    if version == running:
        return f"version {version} is the one running"
    if last and last.get("result") == "failed" and last.get("version") == version:
        return f"version {version} was tried and not kept ({last.get('reason')})"
    return None


def bundle_version(bundle: Path, rauc_info: Any) -> str | None:
    """The version in the bundle's manifest as RAUC reads it (signature checked), or None
    when RAUC refuses it (the install then records RAUC's reason)."""
    try:
        return json.loads(rauc_info(bundle)).get("version") or None
    except Exception:   # RAUC refused it: a garbled or foreign bundle
        return None


def install_from(device: str, update: Any) -> tuple[bool, str]:
    """(installed, what was done) with the stick ``device``; ``update`` is the app.update
    module (its rauc, install and records)."""
    with tempfile.TemporaryDirectory(prefix="cairn-usb-") as top:
        mounted = subprocess.run(["mount", "-o", "ro,nosuid,nodev,noexec", device, top],
                                 capture_output=True, text=True)
        if mounted.returncode != 0:
            return False, f"{device}: not mounted ({mounted.stderr.strip()}): nothing to install"
        try:
            return _install_one(device, Path(top), update)
        finally:
            subprocess.run(["umount", top], capture_output=True)


def _install_one(device: str, top: Path, update: Any) -> tuple[bool, str]:
    bundles = find_bundles(top)
    if not bundles:
        return False, f"{device}: no cairn-*.raucb at the top of the stick: nothing to install"
    if len(bundles) > 1:
        return False, (f"{device}: {len(bundles)} bundles on the stick "
                f"({', '.join(b.name for b in bundles)}): leave one; nothing installed")
    bundle = bundles[0]
    version = bundle_version(bundle, lambda b: update.run("rauc", "info",
                                                          "--output-format=json", str(b)))
    if version is not None:
        skip = reason_to_skip(version, update.running_version(),
                              update.last_result(update.UPDATE_DIR))
        if skip:
            return False, f"{device}: {bundle.name}: {skip}: not installed again"
    update.install(bundle, version or bundle.name)   # refused: recorded, raises UpdateError
    return True, f"{device}: {bundle.name} ({version}) installed: rebooting into it on trial"
