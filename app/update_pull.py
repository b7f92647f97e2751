"""``cairn update pull``: a device that is online fetches its system updates from the central
side, on an interval, and installs them (``cairn update``: into the other slot, on trial).

```toml
[update]
# a directory on the central side ({gateway_id} is [sync].gateway_id, or the host name): it
# holds latest.json and the bundles it names
source = "https://updates.example/cairn/{gateway_id}/"
token_env = "CAIRN_UPDATE_TOKEN"  # bearer token (or token / token_file); or username + password
interval = 3600                   # seconds between checks
timeout = 30                      # seconds any one network wait may take
redirect_hosts = []               # hosts a redirect may hand a download to
verify_tls = true
reboot = true                     # reboot into an installed update at once (else: next boot)
on_metered = "send"               # or "wait": no download on a metered link (cellular)
```

``latest.json`` names the bundle the device should run: ``{"version": "0.3.0", "bundle":
"cairn-0.3.0-debian-trixie-arm64.raucb", "size": 268435456, "sha256": "..."}``. A device
already on that version, or whose last try of it was not kept, leaves it; otherwise it
downloads the bundle to the data partition (a download cut off resumes where it stopped),
checks its size and sha256, and installs it with RAUC, which checks its signature. The
download holds at most the size offered (a source that sends more is refused and its bytes
deleted) and stops before it would take the SPARE_BYTES the store keeps free on the
partition; why a check did not install is the last pull of ``cairn update status``. HTTP
follows ``[sync]``'s rules: TLS verified, credentials for the source's own host only,
redirects within it or to ``redirect_hosts``, never from https to http."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.base.config_tools import ConfigError, Validator, optional_secret
from cairn.gateway.core.config import read_document
from cairn.gateway.ops import update_state
from cairn.gateway.ops.update_state import Trial, last_result
from cairn.sync import metered
from cairn.sync.cli import GATEWAY_ID
from cairn.sync.sinks import HttpSource, NoRoom, SinkError, TooLong

log = logging.getLogger("cairn.update")
INDEX = "latest.json"
SPARE_BYTES = 32 * 2**20   # left free on the data partition beside a download (the store)


class PullError(Exception):
    """This check did not get the update; the next one tries again."""


@dataclass(frozen=True)
class UpdateSource:
    source: HttpSource
    interval: float = 3600.0
    reboot: bool = True
    on_metered: str = "send"  # "wait": no check while the link is metered (sync.metered)


def parse_update(data: dict[str, Any], path: str) -> UpdateSource | None:
    """The [update] section; None when it names no source."""
    v = Validator(path)
    t = v.table(data, "update")
    at = "update"
    v.keys(t, at, {"source", "token", "token_file", "token_env", "username", "password",
                   "password_file", "password_env", "interval", "timeout", "redirect_hosts",
                   "verify_tls", "reboot", "on_metered"})
    url = v.get(t, at, "source", str, None)
    if url is None:
        return None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(path, f"{at}.source", f"must be an http(s):// URL, not {url!r}")
    sync = data.get("sync") if isinstance(data.get("sync"), dict) else {}
    gateway_id = sync.get("gateway_id") or socket.gethostname()
    if not isinstance(gateway_id, str) or not GATEWAY_ID.fullmatch(gateway_id):
        raise ConfigError(path, "sync.gateway_id", f"{gateway_id!r} is not a usable name")
    redirect_hosts = v.strings(t, at, "redirect_hosts")
    source = HttpSource(
        url.replace("{gateway_id}", gateway_id),
        token=optional_secret(v, t, at, "token"),
        username=v.get(t, at, "username", str, None),
        password=optional_secret(v, t, at, "password"),
        timeout=float(v.positive_number(t, at, "timeout", 30.0)),
        verify_tls=v.get(t, at, "verify_tls", bool, True),
        redirect_hosts=tuple(h.lower() for h in redirect_hosts))
    return UpdateSource(source, float(v.positive_number(t, at, "interval", 3600.0)),
                        v.get(t, at, "reboot", bool, True), metered.parse_policy(v, t, at))




def load(config_path: str) -> UpdateSource | None:
    data, source = read_document(config_path)
    return parse_update(data, source)


# -- one check -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    version: str
    bundle: str
    size: int
    sha256: str

    @classmethod
    def parse(cls, raw: bytes) -> Offer:
        try:
            index = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            start = raw[:60].decode("utf-8", "replace").strip()
            raise PullError(f"{INDEX} is not JSON (it starts {start!r}: an error page?)") from None
        if not isinstance(index, dict):
            raise PullError(f"{INDEX} is not a JSON object")
        try:
            offer = cls(str(index["version"]), str(index["bundle"]), int(index["size"]),
                        str(index["sha256"]).lower())
        except (KeyError, TypeError, ValueError) as e:
            raise PullError(f"{INDEX} needs version, bundle, size and sha256: {e}") from None
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.raucb", offer.bundle):
            raise PullError(f"{INDEX} names {offer.bundle!r}: not a bundle file name")
        if not re.fullmatch(r"[0-9a-f]{64}", offer.sha256) or offer.size <= 0:
            raise PullError(f"{INDEX}: a sha256 of 64 hex digits and a positive size, please")
        return offer


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check(source: HttpSource, running: str, install: Callable[[Path, str], None],
          directory: Path | None = None) -> str:
    """One check: what it did, as a sentence; PullError when it could not. Either is kept
    as the last pull (update_state.record_pull) for ``cairn update status`` and doctor."""
    directory = directory or update_state.UPDATE_DIR
    try:
        done = _check(source, running, install, directory)
    except PullError as e:
        update_state.record_pull(directory, "failed", str(e))
        raise
    update_state.record_pull(directory, "ok", done)
    return done


def _check(source: HttpSource, running: str, install: Callable[[Path, str], None],
           directory: Path) -> str:
    try:
        offer = Offer.parse(source.fetch(INDEX))
    except SinkError as e:
        raise PullError(str(e)) from None
    if offer.version == running:
        return f"up to date ({running})"
    last = last_result(directory)
    if last and last.get("result") == "failed" and last.get("version") == offer.version:
        return f"{offer.version} was not kept here before ({last['reason']}): waiting for another"
    if Trial.read(directory):
        return "an update is on trial: waiting for its boot"
    bundle = _download(source, offer, directory)
    try:
        install(bundle, offer.version)   # a bundle RAUC refuses is recorded as not kept
    finally:
        bundle.unlink(missing_ok=True)
    return f"installed {offer.version} from {source.describe()}"


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _part(offer: Offer, directory: Path) -> Path:
    """download.raucb as far as an earlier try of this offer got: another bundle's bytes, or
    more bytes than offered (a source that sent too much), are no start for this one."""
    directory.mkdir(parents=True, exist_ok=True)
    part, about = directory / "download.raucb", directory / "download.json"
    wanted = {"bundle": offer.bundle, "sha256": offer.sha256, "size": offer.size}
    try:
        same = json.loads(about.read_text()) == wanted
    except (OSError, ValueError):
        same = False
    if not same or _size(part) > offer.size:
        part.unlink(missing_ok=True)
    if not same:
        about.write_text(json.dumps(wanted) + "\n")
    return part


def _download(source: HttpSource, offer: Offer, directory: Path) -> Path:
    """The bundle, checked; never more than the offer's size on the data partition, and
    never into the SPARE_BYTES the store keeps there (it shares the partition)."""
    part = _part(offer, directory)
    have, free = _size(part), shutil.disk_usage(directory).free
    if offer.size - have + SPARE_BYTES > free:
        raise PullError(f"not enough space on the data partition for {offer.bundle}: "
                        f"{(offer.size - have) / 2**20:.0f} MiB to go, "
                        f"{free / 2**20:.0f} MiB free")
    try:
        source.download(offer.bundle, part, offer.size, SPARE_BYTES)
    except TooLong:
        part.unlink(missing_ok=True)
        raise PullError(f"{offer.bundle}: the source sent more than the {offer.size} bytes "
                        f"{INDEX} offers: refused, the part deleted") from None
    except NoRoom:
        raise PullError(f"{offer.bundle}: stopped at {_size(part)} of {offer.size} bytes: the "
                        f"data partition is down to the {SPARE_BYTES / 2**20:.0f} MiB kept "
                        f"free for the store (the next check resumes)") from None
    except SinkError as e:
        raise PullError(f"{e} ({_size(part)} of {offer.size} bytes here: the next check "
                        f"resumes)") from None
    got = _size(part)
    if got != offer.size or _sha256(part) != offer.sha256:
        part.unlink()
        raise PullError(f"{offer.bundle}: {got} bytes, not the {offer.size} with the sha256 "
                        f"{INDEX} names: discarded")
    return part


def read_metered(update: UpdateSource) -> int | None:
    """NetworkManager's Metered, asked only when the answer matters."""
    return metered.read_metered() if update.on_metered == "wait" else None


def run(update: UpdateSource, running: str, install: Callable[[Path, str], None],
        once: bool = False) -> int:
    """Check every interval (a failed check is retried sooner, backing off)."""
    backoff = 60.0
    while True:
        if metered.holds_back(update.on_metered, read_metered(update)):
            log.info("update pull: the link is metered and [update] on_metered = \"wait\": "
                     "no check until an unmetered one")
            if once:
                return 0
            time.sleep(update.interval)
            continue
        try:
            log.info("update pull: %s", check(update.source, running, install))
            if once:
                return 0
            time.sleep(update.interval)
            backoff = 60.0
        except PullError as e:
            log.warning("update pull from %s: %s", update.source.describe(), e)
            if once:
                return 1
            time.sleep(min(backoff, update.interval))
            backoff *= 2
