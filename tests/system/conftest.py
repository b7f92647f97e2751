"""Fixtures the system tests of more than one module share."""

from __future__ import annotations

import pytest

from cairn.app import update
from cairn.gateway.ops import update_state


@pytest.fixture
def ab_device(tmp_path, monkeypatch):
    """This process seen as running slot A of an A/B image, with its update records (where
    cairn.app.update and gateway.ops.update_state keep them)."""
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("root=PARTUUID=ca11ab1e-02 ro rauc.slot=A\n")
    monkeypatch.setattr(update_state, "CMDLINE", cmdline)
    monkeypatch.setattr(update_state, "UPDATE_DIR", tmp_path / "update")
    monkeypatch.setattr(update, "UPDATE_DIR", tmp_path / "update")
    return tmp_path / "update"
