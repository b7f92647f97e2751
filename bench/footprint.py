"""Installed footprint: a runtime-only virtualenv of Cairn vs Crossbar.io's, and Mosquitto's
package. A part of ``python -m bench`` (``--only footprint``).

- Cairn: a fresh venv under the bench cache directory (``$CAIRN_BENCH_CACHE``, default
  ``~/.cache/cairn-bench/cairn-runtime-venv``) with ``pip install .`` of this checkout,
  without the test extras; rebuilt when pyproject.toml changes (its hash is kept in the
  venv). Both venvs are made by the system ``python3 -m venv`` with its pip, so pip and
  setuptools count on both sides and the interpreter on neither.
- Crossbar: :data:`bench.crossbar.CROSSBAR_VENV` as ``python -m bench.crossbar --install``
  made it.
- Mosquitto: ``dpkg-query``'s Installed-Size of the ``mosquitto`` package (KiB), without the
  shared libraries it links (libmosquitto1, libcjson1, libssl3, ...).

Sizes are the sum of the files' apparent sizes (``lstat``), as :func:`bench.crossbar.
venv_size_bytes` counts them.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.crossbar import CACHE_DIR, venv_size_bytes
from bench.pubsub import REPO

CAIRN_VENV = CACHE_DIR / "cairn-runtime-venv"


def cairn_runtime_venv(venv: Path = CAIRN_VENV) -> Path:
    """The venv, (re)built when missing or when pyproject.toml changed."""
    stamp = venv / ".pyproject-sha256"
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    with tempfile.TemporaryDirectory(prefix="cairn-bench-src-") as tmp:
        # pip builds in the source tree (build/, *.egg-info): build from a copy instead
        src = Path(tmp) / "cairn"
        skip = shutil.ignore_patterns("__pycache__", "node_modules", "*.egg-info", "build")
        for name in ("base", "formats", "gateway", "drivers", "sync", "central", "app"):
            shutil.copytree(REPO / name, src / name, ignore=skip)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q",
                        "--disable-pip-version-check", str(src)], check=True)
    stamp.write_text(digest)
    return venv


def installed_packages(venv: Path) -> int:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze",
                          "--disable-pip-version-check"], capture_output=True, text=True,
                         timeout=120, check=True)
    return len(out.stdout.split())


def dpkg_installed_kib(package: str) -> int | None:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Installed-Size}", package],
                             capture_output=True, text=True, timeout=30, check=True)
        return int(out.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def run(opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"problems": []}
    print("  footprint: cairn runtime venv ...", end=" ", flush=True)
    try:
        venv = cairn_runtime_venv()
        out["cairn"] = {"venv": str(venv), "mib": round(venv_size_bytes(venv) / 2**20, 1),
                        "packages": installed_packages(venv)}
    except (OSError, subprocess.SubprocessError) as e:
        out["problems"].append(f"cairn runtime venv: {type(e).__name__}: {e}")
    if opts.crossbar_venv.exists():
        out["crossbar"] = {"venv": str(opts.crossbar_venv),
                           "mib": round(venv_size_bytes(opts.crossbar_venv) / 2**20, 1),
                           "packages": installed_packages(opts.crossbar_venv)}
    kib = dpkg_installed_kib("mosquitto")
    if kib is not None:
        out["mosquitto"] = {"package": "mosquitto", "mib": round(kib / 1024, 1)}
    print(", ".join(f"{k} {v['mib']} MiB" for k, v in out.items() if k != "problems"),
          flush=True)
    return out
