"""``cairn update pull`` against a real HTTP server on loopback: latest.json, a bundle that
arrives whole, in pieces after a dropped link, or not at all; what it refuses. RAUC's install
is the recorder here (on a device it checks the signature; tests/appliance/test_device.py installs
real bundles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.app import update_pull
from cairn.base.config_tools import ConfigError
from cairn.gateway.ops import update_state
from cairn.sync.sinks import HttpSource
from harness.central import Central

BUNDLE = bytes(range(256)) * 4096          # 1 MiB standing in for a .raucb


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
