"""Build step that pyproject.toml cannot declare: the dashboard's WAMP client.

autobahn-js (npm package autobahn-browser, pinned with its checksum in
gateway/dashboard/package-lock.json) is fetched with ``npm ci`` whenever a wheel, an sdist
or an editable install is built and the bundle is missing or older than the lock file, and
copied next to the page as package data. Without npm the build stops and says so: a wheel
without it would install a dashboard that can only report its client missing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

DASHBOARD = Path(__file__).resolve().parent / "gateway" / "dashboard"
BUNDLE = DASHBOARD / "autobahn.min.js"
LICENSE = DASHBOARD / "autobahn.LICENSE.txt"
LOCK = DASHBOARD / "package-lock.json"


class MissingBuildTool(SystemExit):
    pass


def bundle_dashboard_client() -> None:
    if BUNDLE.is_file() and BUNDLE.stat().st_size and BUNDLE.stat().st_mtime >= \
            LOCK.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise MissingBuildTool(
            f"building cairn needs npm to fetch the dashboard's WAMP client (autobahn-browser, "
            f"pinned in {LOCK.relative_to(DASHBOARD.parent.parent)}): install Node.js and npm "
            f"(Debian: apt-get install nodejs npm), or run scripts/setup.sh, which does")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=DASHBOARD,
                   check=True)
    package = DASHBOARD / "node_modules" / "autobahn-browser"
    shutil.copyfile(package / "LICENSE", LICENSE)
    partial = BUNDLE.with_suffix(".tmp")
    shutil.copyfile(package / "autobahn.min.js", partial)
    partial.replace(BUNDLE)  # last, so a half-copied bundle never looks up to date


class BuildPy(build_py):
    def run(self) -> None:
        bundle_dashboard_client()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        bundle_dashboard_client()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
