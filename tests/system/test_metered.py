"""A metered link known to Cairn: ``on_metered = "wait"`` holds sync and update pulls back
while NetworkManager says the way out is metered; "unknown" (no NetworkManager) is not."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from cairn.app.update_pull import parse_update
from cairn.base.config_tools import ConfigError
from cairn.sync import metered
from cairn.sync.cli import parse_sync
from cairn.sync.sinks import DirectorySink
from tests.system.test_ops import cairn, doctor_lines, write_config
from tests.system.test_sync import fill_store, status_of, uploader_for

UNKNOWN, YES, NO, GUESS_YES, GUESS_NO = range(5)  # NMMetered


@pytest.mark.parametrize("value, waits", [
    (YES, True), (GUESS_YES, True), (NO, False), (GUESS_NO, False), (UNKNOWN, False),
    (None, False)], ids=["yes", "guess_yes", "no", "guess_no", "unknown", "no_networkmanager"])
def test_wait_holds_back_on_a_metered_link_only(value, waits):
    assert metered.holds_back("wait", value) is waits


@pytest.mark.parametrize("value", [YES, GUESS_YES, NO, None])
def test_send_never_holds_back(value):
    assert metered.holds_back("send", value) is False


@pytest.mark.parametrize("output, value", [("u 1\n", 1), ("u 4", 4), ("", None),
                                           ("s \"yes\"", None), ("u x", None)])
def test_busctl_answers_are_read_as_nm_metered(output, value):
    assert metered.parse_metered(output) == value


def test_a_machine_that_cannot_ask_networkmanager_is_not_metered():
    assert metered.read_metered(("/nonexistent/busctl",)) is None


@pytest.mark.skipif(shutil.which("busctl") is None, reason="needs busctl")
def test_busctl_without_networkmanager_answers_unknown():
    running = subprocess.run(["busctl", "status", "org.freedesktop.NetworkManager"],
                             capture_output=True).returncode == 0
    if running:
        pytest.skip("NetworkManager runs here")
    assert metered.read_metered() is None


def sync_document(policy: str | None) -> dict:
    sync = {"sink": "dir:/tmp/x"} | ({"on_metered": policy} if policy else {})
    return {"sync": sync, "update": {"source": "https://u.example/"} |
            ({"on_metered": policy} if policy else {})}


def test_sync_and_update_send_on_a_metered_link_unless_told_to_wait():
    assert parse_sync(sync_document(None), "c.toml").on_metered == "send"
    assert parse_update(sync_document(None), "c.toml").on_metered == "send"
    assert parse_sync(sync_document("wait"), "c.toml").on_metered == "wait"
    assert parse_update(sync_document("wait"), "c.toml").on_metered == "wait"


@pytest.mark.parametrize("parse, key", [(parse_sync, "sync.on_metered"),
                                        (parse_update, "update.on_metered")])
def test_an_unknown_on_metered_names_the_key(parse, key):
    with pytest.raises(ConfigError) as e:
        parse(sync_document("never"), "c.toml")
    assert e.value.key == key and "\"send\" or \"wait\"" in e.value.problem


class Link:
    """What NetworkManager would answer, changed by the test."""

    def __init__(self, value: int | None) -> None:
        self.value = value

    def __call__(self) -> int | None:
        return self.value


def test_the_uploader_waits_on_a_metered_link_and_says_so(tmp_path, caplog):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    fill_store(data_dir, 50)
    link = Link(YES)
    uploader = uploader_for(data_dir, DirectorySink(landing), on_metered="wait", metered=link)
    with caplog.at_level(logging.INFO, "cairn.sync"):
        assert uploader.once() == 0
    assert not landing.exists()
    status = status_of(data_dir)
    assert status["state"] == "waiting" and "unmetered" in status["waiting_for"]
    assert status["backlog"] == 50 and status["waiting_since"].endswith("Z")
    assert "the link is metered (NetworkManager: yes)" in caplog.text
    link.value = NO
    assert uploader.once() == 50
    assert (status_of(data_dir)["waiting_for"], status_of(data_dir)["waiting_since"]) == \
        (None, None)


def test_doctor_warns_while_sync_waits_for_an_unmetered_link(tmp_path):
    data_dir, sink = tmp_path / "data", tmp_path / "sink"
    fill_store(data_dir, 1234)
    sink.mkdir()
    uploader = uploader_for(data_dir, DirectorySink(sink), on_metered="wait", metered=Link(YES))
    assert uploader.once() == 0
    since = status_of(data_dir)["waiting_since"]
    config = write_config(tmp_path / "cairn.toml", data_dir,
                          f'[sync]\nsink = "dir:{sink}"\non_metered = "wait"\n')
    result = cairn("doctor", "--config", str(config))
    assert result.returncode == 0, result.stdout  # a warning: nothing is broken
    assert ("warn", f"waiting for an unmetered link (on_metered = \"wait\") since {since}; "
                    f"1,234 events not yet shipped") in doctor_lines(result.stdout)["sync"]


def test_the_running_uploader_sends_once_the_link_is_unmetered(tmp_path):
    data_dir, landing = tmp_path / "data", tmp_path / "landing"
    fill_store(data_dir, 20)
    link, stop = Link(GUESS_YES), threading.Event()

    def upload() -> None:  # in its thread: the uploader's SQLite connection stays there
        uploader = uploader_for(data_dir, DirectorySink(landing), on_metered="wait",
                                metered=link)
        try:
            uploader.run(interval=0.05, max_backoff=0.05, stop=stop)
        finally:
            uploader.reader.close()

    worker = threading.Thread(target=upload, daemon=True)
    worker.start()
    try:
        waited_on(lambda: status_of(data_dir)["state"] == "waiting", worker)
        assert not landing.exists()
        link.value = GUESS_NO
        waited_on(lambda: status_of(data_dir)["backlog"] == 0, worker)
        assert status_of(data_dir)["state"] == "ok"
    finally:
        stop.set()
        worker.join(10)


def waited_on(condition: Callable[[], bool], worker: threading.Thread,
              timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not (status_file_ready(condition)):
        assert worker.is_alive(), "the uploader died"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def status_file_ready(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except FileNotFoundError:  # not written yet
        return False
