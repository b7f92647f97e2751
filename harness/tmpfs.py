"""A filesystem of a given size for the tests that need a disk to fill (as root): a tmpfs
mounted on a directory, unmounted on leaving; the test is skipped where it cannot mount."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """``mount`` (made here) as a tmpfs of ``size`` (``"2m"``, ``"64m"``)."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
