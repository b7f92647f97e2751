"""The health gate of A/B updates (``cairn update health``) and RAUC's post-install handler that
puts a slot on trial, run against real files; RAUC itself is the recorder of the calls the gate
makes (on a device they go to ``rauc status mark-good|mark-bad booted``). The booted image's
updates are tested in QEMU (tests/appliance/test_device_update.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cairn.app import update, update_usb
from cairn.gateway.ops import maintenance as ops
from cairn.gateway.ops import update_state
from cairn.gateway.shell.metrics import MessageCounters, render

HANDLERS = Path(__file__).resolve().parents[2] / "images/update"


class Rauc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> str:
        self.calls.append(args)
        return ""


def put_on_trial(directory: Path, slot: str = "B", version: str = "1.2.0") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trial").write_text(f"slot={slot}\nversion={version}\nfrom_slot=A\n")


def healthy() -> list[str]:
    return []


def never_ready() -> list[str]:
    return ["cairn-router is activating, not ready"]


def test_the_booted_slot_is_read_from_the_kernel_command_line():
    assert update_state.booted_slot("root=PARTUUID=ca11ab1e-03 ro rauc.slot=B quiet") == "B"
    assert update_state.booted_slot("root=/dev/vda2 ro") is None


def test_a_boot_without_a_slot_is_left_alone(tmp_path):
    rauc = Rauc()
    done, _ = update.health_gate(tmp_path, None, healthy, 1, rauc)
    assert done == "none" and rauc.calls == []


def test_a_boot_with_no_update_on_trial_is_marked_good_at_once(tmp_path):
    rauc = Rauc()
    done, _ = update.health_gate(tmp_path, "A", never_ready, 60, rauc)
    # a router that is not ready does not send a slot without a trial back (a bad config)
    assert done == "good" and rauc.calls == [("status", "mark-good", "booted")]
    assert update_state.last_result(tmp_path) is None


def test_a_healthy_trial_boot_is_kept_and_recorded(tmp_path):
    put_on_trial(tmp_path)
    rauc, kept = Rauc(), []
    done, _ = update.health_gate(tmp_path, "B", healthy, 60, rauc, lambda: kept.append(1))
    assert done == "good" and rauc.calls == [("status", "mark-good", "booted")]
    assert kept == [1]   # the store's copy for going back is not needed any more
    last = update_state.last_result(tmp_path)
    assert last["result"] == "ok" and last["version"] == "1.2.0" and last["slot"] == "B"
    assert not (tmp_path / "trial").exists()


def test_a_trial_boot_that_turns_healthy_in_time_is_kept(tmp_path):
    put_on_trial(tmp_path)
    answers = iter([["cairn-router is activating, not ready"], []])
    rauc = Rauc()
    done, _ = update.health_gate(tmp_path, "B", lambda: next(answers), 30, rauc)
    assert done == "good" and rauc.calls == [("status", "mark-good", "booted")]


def test_an_unhealthy_trial_boot_is_marked_bad_with_its_reason(tmp_path):
    put_on_trial(tmp_path)
    rauc = Rauc()
    kept: list[int] = []
    done, reason = update.health_gate(tmp_path, "B", never_ready, 0.1, rauc,
                                      lambda: kept.append(1))
    assert done == "bad" and rauc.calls == [("status", "mark-bad", "booted")]
    assert kept == []
    last = update_state.last_result(tmp_path)
    assert last["result"] == "failed" and "cairn-router is activating" in last["reason"]
    assert last["reason"] == reason
    assert not (tmp_path / "trial").exists()


def test_a_trial_slot_that_never_reached_user_space_is_recorded_from_the_old_slot(tmp_path):
    put_on_trial(tmp_path, slot="B")
    rauc = Rauc()
    done, _ = update.health_gate(tmp_path, "A", healthy, 60, rauc)
    assert done == "failed" and rauc.calls == [("status", "mark-good", "booted")]
    last = update_state.last_result(tmp_path)
    assert last["result"] == "failed" and "never reached user space" in last["reason"]


def test_a_damaged_trial_record_is_no_trial(tmp_path):
    (tmp_path / "trial").write_bytes(b"\x00\xff garbage")
    assert update_state.Trial.read(tmp_path) is None


def _run_handler(name: str, directory: Path, tmp_path: Path, version: str = "1.3.0") -> None:
    """One of RAUC's handlers as RAUC runs it: installing slot B of A and B, from A."""
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "manifest.raucm").write_text("[update]\ncompatible=cairn-debian-arm64\n"
                                           f"version={version}\n")
    env = {**os.environ, "CAIRN_UPDATE_DIR": str(directory),
           "RAUC_TARGET_SLOTS": "2", "RAUC_SLOT_BOOTNAME_1": "A", "RAUC_SLOT_BOOTNAME_2": "B",
           "RAUC_CURRENT_BOOTNAME": "A", "RAUC_BUNDLE_MOUNT_POINT": str(bundle)}
    subprocess.run([str(HANDLERS / name)], env=env, check=True, capture_output=True)


def test_raucs_pre_install_handler_records_the_install_under_way(tmp_path):
    _run_handler("cairn-update-installing", tmp_path / "update", tmp_path)
    installing = update_state.Trial.read(tmp_path / "update", update_state.INSTALLING)
    assert installing == update_state.Trial(slot="B", version="1.3.0", from_slot="A")
    assert update_state.Trial.read(tmp_path / "update") is None   # not on trial yet


def test_raucs_post_install_handler_puts_the_written_slot_on_trial(tmp_path):
    _run_handler("cairn-update-installing", tmp_path / "update", tmp_path)
    _run_handler("cairn-update-installed", tmp_path / "update", tmp_path)
    trial = update_state.Trial.read(tmp_path / "update")
    assert trial == update_state.Trial(slot="B", version="1.3.0", from_slot="A")
    assert not (tmp_path / "update" / update_state.INSTALLING).exists()


def test_an_install_cut_off_before_the_slot_switch_is_recorded_and_the_old_slot_kept(tmp_path):
    _run_handler("cairn-update-installing", tmp_path, tmp_path)   # then the power went
    rauc = Rauc()
    done, reason = update.health_gate(tmp_path, "A", never_ready, 60, rauc)
    assert done == "good" and rauc.calls == [("status", "mark-good", "booted")]
    last = update_state.last_result(tmp_path)
    assert last["result"] == "interrupted" and last["version"] == "1.3.0", last
    assert "was cut off" in last["reason"] and last["reason"] == reason
    assert not (tmp_path / update_state.INSTALLING).exists()


def test_an_install_cut_off_after_the_slot_switch_boots_its_slot_on_trial(tmp_path):
    """The power went after RAUC made slot B the next to boot, before its post-install
    handler ran: B's boot is a trial all the same, settled by its health."""
    _run_handler("cairn-update-installing", tmp_path, tmp_path)
    rauc = Rauc()
    done, _ = update.health_gate(tmp_path, "B", never_ready, 0.1, rauc)
    assert done == "bad" and rauc.calls == [("status", "mark-bad", "booted")]
    last = update_state.last_result(tmp_path)
    assert last["result"] == "failed" and last["version"] == "1.3.0", last


@pytest.mark.parametrize("result", ["ok", "failed"])
def test_the_last_result_is_written_whole(tmp_path, result):
    update_state.record(tmp_path, result, "why", None)
    assert json.loads((tmp_path / "last.json").read_text())["result"] == result
    assert os.listdir(tmp_path) == ["last.json"]   # no temporary file left


def _update_line(report: ops.Report) -> tuple[str, str]:
    (line,) = [(level, detail) for level, what, detail in report.lines
               if what == "system update"]
    return line


def test_doctor_warns_of_an_update_that_was_not_kept_and_says_why(ab_device):
    update_state.record(ab_device, "failed", "not healthy within 300 s: cairn-router is "
                                             "activating, not ready",
                        update_state.Trial("B", "1.3.0", "A"))
    report = ops.Report()
    ops.check_update(report)
    level, detail = _update_line(report)
    assert level == "warn" and "running slot A" in detail
    assert "1.3.0 was not kept" in detail and "cairn-router is activating" in detail


def test_doctor_says_nothing_of_updates_off_an_ab_image(ab_device):
    update_state.CMDLINE.write_text("root=/dev/mmcblk0p2 ro\n")
    report = ops.Report()
    ops.check_update(report)
    assert report.lines == []


def test_metrics_carry_the_slot_and_the_last_updates_result(ab_device):
    update_state.record(ab_device, "ok", "kept", update_state.Trial("B", "1.3.0", "A"))
    text = render({"update": update_state.summary()}, MessageCounters(), [])
    assert 'cairn_system_slot_info{slot="A"} 1' in text
    assert 'cairn_update_last_failed{version="1.3.0"} 0' in text


def test_a_bundle_rauc_refuses_is_recorded_with_raucs_reason(ab_device, monkeypatch):
    def refuse(*args: str) -> str:
        raise update.UpdateError("rauc install x.raucb: signature verification failed")

    monkeypatch.setattr(update, "run_rauc", refuse)
    monkeypatch.setattr(update, "UPDATE_DIR", ab_device)
    with pytest.raises(update.UpdateError):
        update.install(Path("x.raucb"), "0.3.0")
    last = update_state.last_result(ab_device)
    assert last["result"] == "failed" and last["version"] == "0.3.0"
    assert "signature verification failed" in last["reason"]


def _refusing(directory: Path, writes_installing: bool = False):
    def refuse(*args: str) -> str:
        if writes_installing:   # RAUC's pre-install handler ran, then the install failed
            (directory / update_state.INSTALLING).write_text("slot=B\nversion=0.3.0\n")
        raise update.UpdateError("rauc install x.raucb: Already processing a different method")
    return refuse


def test_a_refused_install_leaves_the_update_on_trial_and_the_install_under_way(ab_device,
                                                                               monkeypatch):
    put_on_trial(ab_device, version="0.2.0")
    (ab_device / update_state.INSTALLING).write_text("slot=B\nversion=0.2.1\nfrom_slot=A\n")
    monkeypatch.setattr(update, "run_rauc", _refusing(ab_device))
    monkeypatch.setattr(update, "UPDATE_DIR", ab_device)
    with pytest.raises(update.UpdateError):
        update.install(Path("x.raucb"), "0.3.0")
    assert update_state.Trial.read(ab_device).version == "0.2.0"
    assert update_state.Trial.read(ab_device, update_state.INSTALLING).version == "0.2.1"
    assert update_state.last_result(ab_device)["result"] == "failed"


def test_an_install_rauc_gave_up_on_ends_its_own_record(ab_device, monkeypatch):
    ab_device.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(update, "run_rauc", _refusing(ab_device, writes_installing=True))
    monkeypatch.setattr(update, "UPDATE_DIR", ab_device)
    with pytest.raises(update.UpdateError):
        update.install(Path("x.raucb"), "0.3.0")
    assert not (ab_device / update_state.INSTALLING).exists()



def _rauc_answering(error: str):
    def rauc(*args: str) -> str:
        raise update.UpdateError(f"rauc {' '.join(args)}: {error}")
    return rauc


@pytest.fixture
def rauc_installing(ab_device, monkeypatch) -> Path:
    """RAUC busy writing 1.2.3 into slot B, as its pre-install handler recorded it."""
    ab_device.mkdir(parents=True, exist_ok=True)
    (ab_device / update_state.INSTALLING).write_text("slot=B\nversion=1.2.3\nfrom_slot=A\n")
    monkeypatch.setattr(update, "run_rauc",
                        _rauc_answering("Already processing a different method"))
    monkeypatch.setattr(update, "UPDATE_DIR", ab_device)
    return ab_device


def test_the_status_while_rauc_installs_carries_the_install_and_the_booted_slot(
        rauc_installing):
    s = update.status()
    assert s["rauc"] == "busy: installing" and s["slots"] == {}
    assert s["booted"] == "A"
    assert s["installing"] == {"slot": "B", "version": "1.2.3", "from_slot": "A"}


def test_the_status_while_rauc_installs_says_so(rauc_installing):
    text = update.render_status(update.status())
    assert "booted slot A" in text
    assert ("installing 1.2.3 into slot B (RAUC is busy; slot details after the install)"
            in text), text


def test_the_status_fails_on_any_other_rauc_failure(ab_device, monkeypatch):
    monkeypatch.setattr(update, "run_rauc", _rauc_answering("rauc is not running"))
    monkeypatch.setattr(update, "UPDATE_DIR", ab_device)
    with pytest.raises(update.UpdateError, match="not running"):
        update.status()


# -- a USB stick (cairn update usb: the whole path runs in QEMU, test_device_update.py) ------


def test_a_stick_offers_the_bundles_at_its_top_named_cairn_whatever_their_case(tmp_path):
    for name in ("cairn-1.2.raucb", "CAIRN-1.3.RAUCB", "other.raucb", "cairn-1.4.raucb.txt"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "cairn-dir.raucb").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cairn-2.0.raucb").write_bytes(b"x")
    assert [p.name for p in update_usb.find_bundles(tmp_path)] == ["CAIRN-1.3.RAUCB",
                                                                   "cairn-1.2.raucb"]


def test_a_stick_left_in_does_not_install_the_running_version_again():
    assert "is the one running" in update_usb.reason_to_skip("1.2", "1.2", None)


def test_a_stick_left_in_does_not_install_again_a_version_that_was_not_kept():
    last = {"result": "failed", "version": "1.3", "reason": "cairn-router never ready"}
    assert "not kept (cairn-router never ready)" in update_usb.reason_to_skip("1.3", "1.2", last)


def test_a_stick_installs_another_version_even_after_a_different_one_failed():
    last = {"result": "failed", "version": "1.3", "reason": "x"}
    assert update_usb.reason_to_skip("1.4", "1.2", last) is None
    assert update_usb.reason_to_skip("1.3", "1.2", {"result": "kept", "version": "1.3"}) is None
