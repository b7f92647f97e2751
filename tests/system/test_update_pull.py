"""``cairn update pull`` against a real HTTP server on loopback: latest.json, a bundle that
arrives whole, in pieces after a dropped link, or not at all; what it refuses. RAUC's install
is the recorder here (on a device it checks the signature; tests/appliance/test_device.py installs
real bundles)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from cairn.app import update, update_pull
from cairn.base.config_tools import ConfigError
from cairn.gateway.ops import maintenance as ops
from cairn.gateway.ops import update_state
from cairn.sync.sinks import HttpSource
from harness.central import Central
from harness.tmpfs import tmpfs

BUNDLE = bytes(range(256)) * 4096          # 1 MiB standing in for a .raucb
MiB = 2**20


class Offering(Central):
    def offer(self, version: str, body: bytes = BUNDLE, **index) -> str:
        return super().offer(version, body, **index)


@pytest.fixture
def central():
    c = Offering()
    yield c
    c.close()


class Installer:
    def __init__(self) -> None:
        self.installed: list[bytes] = []

    def __call__(self, bundle: Path, version: str) -> None:
        self.installed.append(bundle.read_bytes())


def test_a_newer_version_is_downloaded_checked_and_installed(central, tmp_path):
    central.offer("0.3.0")
    install = Installer()
    done = update_pull.check(HttpSource(central.url, token="t0ken"), "0.2.0", install, tmp_path)
    assert done.startswith("installed 0.3.0") and install.installed == [BUNDLE]
    assert not (tmp_path / "download.raucb").exists()   # the space is given back
    assert {auth for _, _, auth in central.requests} == {"Bearer t0ken"}


def test_the_running_version_is_not_installed_again(central, tmp_path):
    central.offer("0.3.0")
    install = Installer()
    assert update_pull.check(HttpSource(central.url), "0.3.0", install, tmp_path) == \
        "up to date (0.3.0)"
    assert install.installed == [] and [r[0] for r in central.requests] == ["latest.json"]


def test_a_download_cut_off_resumes_where_it_stopped(central, tmp_path):
    central.offer("0.3.0")
    central.drop_after = 300_000
    install = Installer()
    with pytest.raises(update_pull.PullError, match="300000 of 1048576 bytes here"):
        update_pull.check(HttpSource(central.url, timeout=5), "0.2.0", install, tmp_path)
    assert install.installed == []
    update_pull.check(HttpSource(central.url, timeout=5), "0.2.0", install, tmp_path)
    assert install.installed == [BUNDLE]
    ranges = [r for name, r, _ in central.requests if name.endswith(".raucb")]
    assert ranges == [None, "bytes=300000-"]


def test_a_bundle_that_is_not_what_the_index_says_is_discarded(central, tmp_path):
    central.offer("0.3.0")
    name = json.loads(central.files["latest.json"])["bundle"]
    central.files[name] = BUNDLE[:-1] + b"X"   # damaged on the way, same size
    install = Installer()
    with pytest.raises(update_pull.PullError, match="discarded"):
        update_pull.check(HttpSource(central.url), "0.2.0", install, tmp_path)
    assert install.installed == [] and not (tmp_path / "download.raucb").exists()


@pytest.mark.parametrize(("index", "message"), [
    (b"<html><body>Sign in to the captive portal</body></html>", "not JSON .*<html>"),
    (b'{"version": "0.3.0"}', "needs version, bundle, size and sha256"),
    (json.dumps({"version": "0.3.0", "bundle": "../../etc/passwd", "size": 1,
                 "sha256": "0" * 64}).encode(), "not a bundle file name"),
])
def test_an_index_that_is_not_one_is_refused_with_what_it_was(central, tmp_path, index,
                                                              message):
    central.files["latest.json"] = index
    with pytest.raises(update_pull.PullError, match=message):
        update_pull.check(HttpSource(central.url), "0.2.0", Installer(), tmp_path)


def test_a_source_without_an_index_says_so(central, tmp_path):
    with pytest.raises(update_pull.PullError, match="GET latest.json: HTTP 404"):
        update_pull.check(HttpSource(central.url), "0.2.0", Installer(), tmp_path)


def test_a_bundle_larger_than_the_free_space_is_not_started(central, tmp_path):
    central.offer("0.3.0")
    index = json.loads(central.files["latest.json"])
    index["size"] = 1 << 50
    central.files["latest.json"] = json.dumps(index).encode()
    with pytest.raises(update_pull.PullError, match="not enough space on the data partition"):
        update_pull.check(HttpSource(central.url), "0.2.0", Installer(), tmp_path)
    assert [r[0] for r in central.requests] == ["latest.json"]


def test_a_version_that_was_not_kept_here_is_not_tried_again(central, tmp_path):
    central.offer("0.3.0")
    update_state.record(tmp_path, "failed", "not healthy within 300 s",
                        update_state.Trial("B", "0.3.0", "A"))
    install = Installer()
    done = update_pull.check(HttpSource(central.url), "0.2.0", install, tmp_path)
    assert "was not kept here before" in done and install.installed == []


def test_a_version_whose_install_was_cut_off_is_tried_again(central, tmp_path):
    central.offer("0.3.0")
    update_state.record(tmp_path, "interrupted", "the install of 0.3.0 was cut off",
                        update_state.Trial("B", "0.3.0", "A"))
    install = Installer()
    done = update_pull.check(HttpSource(central.url), "0.2.0", install, tmp_path)
    assert done.startswith("installed 0.3.0") and install.installed == [BUNDLE]


def test_the_config_names_the_source_per_gateway(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    data = {"sync": {"gateway_id": "pump-7"},
            "update": {"source": "https://updates.example/cairn/{gateway_id}/",
                       "token_file": str(secret), "interval": 600, "reboot": False}}
    update = update_pull.parse_update(data, "cairn.toml")
    assert update.source.url == "https://updates.example/cairn/pump-7/"
    assert update.source.token == "s3cret" and update.interval == 600
    assert update.reboot is False
    assert update_pull.parse_update({}, "cairn.toml") is None


def test_a_source_that_is_not_http_is_a_config_error():
    with pytest.raises(ConfigError, match="update.source"):
        update_pull.parse_update({"update": {"source": "ftp://x/"}}, "cairn.toml")


# -- what comes in is bounded (issue 45, U1) -------------------------------------------------


@pytest.mark.parametrize("shape", ["endless", "content-length"])
def test_a_body_longer_than_the_offer_is_refused_and_the_part_deleted(central, tmp_path,
                                                                      shape):
    """The attack: latest.json offered 1000 bytes and the source sent without end; 200 MiB
    were written to download.raucb before the size check."""
    name = central.offer("0.3.0", BUNDLE[:1000])
    if shape == "endless":
        central.endless.add(name)
    else:
        central.files[name] = BUNDLE[:2000]    # its Content-Length says 2000
    install = Installer()
    with pytest.raises(update_pull.PullError,
                       match="more than the 1000 bytes latest.json offers: refused"):
        update_pull.check(HttpSource(central.url, timeout=5), "0.2.0", install, tmp_path)
    assert install.installed == [] and not (tmp_path / "download.raucb").exists()


def test_a_part_larger_than_the_offer_is_deleted_before_it_is_resumed(central, tmp_path):
    central.offer("0.3.0")
    index = json.loads(central.files["latest.json"])
    (tmp_path / "download.json").write_text(json.dumps(
        {k: index[k] for k in ("bundle", "sha256", "size")}) + "\n")
    (tmp_path / "download.raucb").write_bytes(BUNDLE + b"x" * 4096)   # kept from a bad source
    install = Installer()
    update_pull.check(HttpSource(central.url, timeout=5), "0.2.0", install, tmp_path)
    assert install.installed == [BUNDLE]
    assert [r for name, r, _ in central.requests if name.endswith(".raucb")] == [None]


@pytest.fixture
def partition(tmp_path):
    """A 64 MiB data partition of its own: the update directory, beside a growing store."""
    with tmpfs(tmp_path / "data", "64m") as mount:
        yield mount


def test_the_download_stops_where_the_stores_reserve_begins(central, partition):
    """There was room when the download began; then the store grew: the bundle may not take
    the space the store keeps for itself."""
    central.offer("0.3.0", BUNDLE * 16)

    def store_grows(sent: int) -> None:
        if sent >= 4 * MiB and not (partition / "cairn.db").exists():
            free = shutil.disk_usage(partition).free
            (partition / "cairn.db").write_bytes(
                bytes(free - update_pull.SPARE_BYTES - 6 * MiB))

    central.while_sending = store_grows
    install = Installer()
    with pytest.raises(update_pull.PullError, match="kept free for the store.*the next check "
                                                    "resumes"):
        update_pull.check(HttpSource(central.url, timeout=5), "0.2.0", install,
                          partition / "update")
    # the download ended before the reserve (the record of this check took a page since)
    assert shutil.disk_usage(partition).free >= update_pull.SPARE_BYTES - 4096
    assert install.installed == []
    assert 0 < (partition / "update" / "download.raucb").stat().st_size < 16 * MiB


def test_a_refused_download_says_why_in_the_journal_the_update_status_and_doctor(
        central, ab_device, caplog):
    central.endless.add(central.offer("0.3.0", BUNDLE[:1000]))
    source = update_pull.UpdateSource(HttpSource(central.url, timeout=5))
    with caplog.at_level(logging.WARNING, "cairn.update"):
        assert update_pull.run(source, "0.2.0", Installer(), once=True) == 1
    why = "more than the 1000 bytes latest.json offers"
    assert why in caplog.text
    shown = update.render_status({"booted": "A", "primary": "A", "slots": {},
                                  **update.records()})
    assert "last pull: failed since " in shown and why in shown
    report = ops.Report()
    ops.check_update(report)
    assert [(level, what) for level, what, detail in report.lines if why in detail] == \
        [("warn", "update pull")]
