"""Packaging without the Makefile: what ``pip`` alone builds from a checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = "gateway/dashboard/autobahn.min.js"  # in the source tree; in the wheel: cairn/...
# the folders pyproject.toml installs as cairn.<folder>: base, formats, gateway, ...
PACKAGE_FOLDERS = sorted({folder.split("/")[0] for folder in tomllib.loads(
    (ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()})


def fresh_checkout(into: Path) -> Path:
    """The files git tracks plus this change's, without anything a setup fetched."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, text=True,
                            check=True).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    assert not (into / BUNDLE).exists()
    return into


def pip_wheel(source: Path, out: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": path} if path is not None else None
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> dict[str, bytes]:
    """The files of a wheel that pip alone built from a fresh checkout."""
    if shutil.which("npm") is None:
        pytest.skip("npm fetches the dashboard's client")
    tmp_path = tmp_path_factory.mktemp("wheel")
    done = pip_wheel(fresh_checkout(tmp_path / "src"), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    [wheel] = (tmp_path / "out").glob("cairn-*.whl")
    with zipfile.ZipFile(wheel) as files:
        return {name: files.read(name) for name in files.namelist()}


@pytest.mark.slow
def test_a_wheel_built_by_pip_alone_carries_the_dashboards_client(wheel_files):
    bundle = wheel_files[f"cairn/{BUNDLE}"]
    assert b"autobahn" in bundle and len(bundle) > 100_000
    assert "cairn/gateway/dashboard/autobahn.LICENSE.txt" in wheel_files
    assert not [n for n in wheel_files if "node_modules" in n or n.endswith("package-lock.json")]


@pytest.mark.slow
def test_the_wheel_puts_nothing_but_cairn_at_the_top_of_site_packages(wheel_files):
    """Each package folder (base/, gateway/, sync/, central/...) installs as cairn.<folder>:
    generic names of their own would collide in an analyst's Spark environment."""
    tops = {name.split("/")[0] for name in wheel_files}
    assert tops == {"cairn", "cairn-0.1.0.dist-info"}, tops
    assert {"cairn/app/cli.py", "cairn/gateway/store/__init__.py",
            "cairn/gateway/store/writer.py", "cairn/drivers/cli.py",
            "cairn/central/spark/__init__.py", "cairn/central/spark/table.py"} <= set(wheel_files)
    entry_points = wheel_files["cairn-0.1.0.dist-info/entry_points.txt"].decode()
    assert "cairn = cairn.app.cli:main" in entry_points


@pytest.mark.slow
def test_every_module_of_the_source_tree_is_in_the_wheel(wheel_files):
    """A package folder left out of pyproject's list installs a cairn that cannot import
    itself (it happened: app/provision/ became a package and the installed `cairn` failed)."""
    root = Path(__file__).resolve().parents[2]
    sources = {f"cairn/{path.relative_to(root)}" for top in PACKAGE_FOLDERS
               for path in (root / top).rglob("*.py")}
    assert sources - set(wheel_files) == set()


@pytest.mark.slow
def test_a_wheel_build_without_npm_stops_naming_what_is_missing(tmp_path):
    source = fresh_checkout(tmp_path / "src")
    done = pip_wheel(source, tmp_path / "out", path=str(Path(sys.executable).parent))
    assert done.returncode != 0
    assert "needs npm to fetch the dashboard's WAMP client" in done.stderr + done.stdout
    assert not list((tmp_path / "out").glob("*.whl"))
