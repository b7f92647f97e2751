#!/usr/bin/env python3
"""Assemble the Cairn image payload: everything the SD-card image (or ``install.sh`` on a
running Raspberry Pi OS) puts on a device, in one directory and one reproducible tarball.

    python images/build_payload.py [--out DIR] [--wheel FILE] [--no-tar]

Layout of ``DIR/cairn-payload-<version>/``::

    install.sh                      installs all of it (into the image chroot, or on a Pi)
    wheels/cairn-<version>-py3-none-any.whl
    wheels/deps/*.whl               every pinned dependency, built for the device (linux
                                    aarch64, CPython 3.13): install.sh needs no network there
    constraints.txt                 the dependency versions this wheel was tested with
    rootfs/                         files copied to / as they are
        usr/lib/systemd/system/     cairn-router.service, cairn-sensor@.service, ...
        usr/lib/sysusers.d/cairn.conf
        usr/lib/tmpfiles.d/cairn.conf
        etc/udev/rules.d/99-cairn-serial.rules
        etc/cairn/cairn.toml        the device config (loopback + Unix socket)
        etc/cairn/sensors/example.toml.sample, etc/cairn/mqtt/example.toml.sample
        usr/share/doc/cairn/README.md, docs/*.md (the topic pages), IMAGE.md
    manifest.json                   version, source commit, file list with sha256 and mode
    SHA256SUMS                      the same hashes, for `sha256sum -c`

plus ``DIR/cairn-payload-<version>.tar.gz``. With the same sources and
``SOURCE_DATE_EPOCH`` (default: the last commit's time) the wheel and the tarball come out
byte for byte the same. Runs anywhere Python 3.11 and pip do: CI builds and checks it even
where the image itself cannot be built.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYSTEMD = ROOT / "systemd"

UNITS = ["cairn-router.service", "cairn-sensor@.service", "cairn-bridge-mqtt@.service",
         "cairn-sync.service", "cairn-config-apply.path", "cairn-config-apply.service"]
# source (relative to the repository) -> target path on the device, and mode
FILES: list[tuple[str, str, int]] = [
    *[(f"systemd/{unit}", f"usr/lib/systemd/system/{unit}", 0o644) for unit in UNITS],
    ("systemd/cairn.sysusers.conf", "usr/lib/sysusers.d/cairn.conf", 0o644),
    ("systemd/cairn.tmpfiles.conf", "usr/lib/tmpfiles.d/cairn.conf", 0o644),
    ("systemd/99-cairn-serial.rules", "etc/udev/rules.d/99-cairn-serial.rules", 0o644),
    ("images/config/cairn.toml", "etc/cairn/cairn.toml", 0o644),
    ("images/config/sensors/example.toml.sample", "etc/cairn/sensors/example.toml.sample",
     0o644),
    ("images/config/mqtt/example.toml.sample", "etc/cairn/mqtt/example.toml.sample", 0o644),
    ("README.md", "usr/share/doc/cairn/README.md", 0o644),
    # the topic pages the README links to, beside it as in the repository
    *[(f"docs/{page.name}", f"usr/share/doc/cairn/docs/{page.name}", 0o644)
      for page in sorted((ROOT / "docs").iterdir()) if page.suffix in (".md", ".png")],
    ("images/README.md", "usr/share/doc/cairn/IMAGE.md", 0o644),
]
# What goes into the wheel's build: the packages, their metadata and the build step that
# fetches the dashboard's client (setup.py: npm ci of the lock file), nothing else.
# The package folders, each installed as cairn.<folder> (pyproject.toml's package-dir).
PACKAGE_FOLDERS = ["base", "formats", "gateway", "drivers", "sync", "central", "app"]
SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", *PACKAGE_FOLDERS]
SKIP = re.compile(r"(^|/)(__pycache__|node_modules|\.pytest_cache)(/|$)|\.py[co]$")
# The dashboard's client bundle is fetched at build time (not committed): without it
# the dashboard of the image would be broken, so its absence is an error.
REQUIRED_IN_WHEEL = ["cairn/app/cli.py", "cairn/gateway/shell/server.py",
                     "cairn/drivers/__init__.py", "cairn/sync/cli.py",
                     "cairn/gateway/dashboard/index.html",
                     "cairn/gateway/dashboard/autobahn.min.js"]
# The platform the image runs: Debian 13 (trixie) and Raspberry Pi OS trixie, arm64, CPython
# 3.13 (Debian's python3 there). The payload's wheels follow the image's Python.
TARGET = {"python_version": "3.13", "python_full_version": "3.13.5", "os_name": "posix",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64",
          "platform_python_implementation": "CPython", "implementation_name": "cpython",
          "extra": ""}


# Wheel tags pip may take for the device: glibc 2.41 (trixie) runs every manylinux wheel up
# to 2.41; pip does not widen a --platform it is given, so each one is listed.
DEVICE_PLATFORMS = ["manylinux2014_aarch64",
                    *[f"manylinux_2_{v}_aarch64" for v in (17, *range(24, 42))]]


class PayloadError(Exception):
    pass


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return int(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 315532800  # 1980-01-01, the earliest time a zip file can hold


def git_describe() -> dict[str, object]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def build_wheel(workdir: Path, epoch: int) -> Path:
    """``pip wheel --no-deps`` of a clean copy of the sources (so nothing from the working
    tree's build/ or egg-info leaks in, and the tree itself is left alone)."""
    src = workdir / "src"
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, src / name,
                            ignore=lambda d, names: [n for n in names
                                                     if SKIP.search(f"{d}/{n}")])
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, src / name)
    out = workdir / "wheel"
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch),
           "PIP_CONSTRAINT": str(HERE / "build-constraints.txt"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "--wheel-dir", str(out), str(src)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise PayloadError(f"building the wheel failed:\n{done.stdout}{done.stderr}")
    wheels = list(out.glob("cairn-*.whl"))
    if len(wheels) != 1:
        raise PayloadError(f"expected one cairn wheel, got {wheels}")
    return wheels[0]


def wheel_requirements(wheel: Path) -> tuple[str, list[str]]:
    """The version and Requires-Dist of a wheel, read from the wheel itself."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        missing = [n for n in REQUIRED_IN_WHEEL if n not in names]
        if missing:
            hint = " (run scripts/setup.sh to fetch the dashboard's client)" \
                if any("dashboard" in n for n in missing) else ""
            raise PayloadError(f"{wheel.name} lacks {', '.join(missing)}{hint}")
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    version = re.search(r"^Version: (.+)$", meta, re.M).group(1).strip()
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    return version, requires


def _requirement(text: str):
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip always carries a copy
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(text)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_pins(requires: list[str]) -> list[str]:
    """``name==version`` for the whole runtime dependency closure, as installed in the
    environment that built and tested this wheel, with markers evaluated for the device
    (CPython 3.13 on Linux aarch64). The image installs with these as pip constraints."""
    pins: dict[str, str] = {}
    todo = list(requires)
    while todo:
        req = _requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate(TARGET):
            continue
        name = _canonical(req.name)
        if name in pins:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise PayloadError(f"dependency {req.name} is not installed here, so its tested "
                               f"version is unknown (pip install the project first)") from None
        if dist.version not in req.specifier and req.specifier:
            raise PayloadError(f"installed {req.name} {dist.version} does not satisfy {req}")
        pins[name] = dist.version
        todo.extend(dist.requires or [])
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def download_dependencies(pins: list[str], into: Path) -> list[str]:
    """The pinned dependencies as wheels for the device (binary only: a device cannot build
    an sdist offline). Returns their file names; PayloadError names what has no such wheel."""
    into.mkdir(parents=True)
    constraints = into / "pins.txt"
    constraints.write_text("\n".join(pins) + "\n")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--python-version", TARGET["python_version"],
           "--implementation", "cp", "--dest", str(into), "--requirement", str(constraints)]
    for platform in DEVICE_PLATFORMS:
        cmd += ["--platform", platform]
    done = subprocess.run(cmd, capture_output=True, text=True)
    constraints.unlink()
    if done.returncode != 0:
        raise PayloadError("could not fetch the dependencies as wheels for linux aarch64, "
                           f"CPython {TARGET['python_version']} (pip download):\n"
                           + done.stderr.strip()[-2000:])
    return sorted(p.name for p in into.glob("*.whl"))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def assemble(out: Path, wheel: Path | None = None, tar: bool = True,
             dependencies: bool = True) -> Path:
    """``dependencies``: carry the dependencies' wheels for the device (wheels/deps/);
    without them install.sh fetches the dependencies from the package index."""
    epoch = source_date_epoch()
    with tempfile.TemporaryDirectory(prefix="cairn-payload-") as tmp:
        if wheel is None:
            wheel = build_wheel(Path(tmp), epoch)
        version, requires = wheel_requirements(wheel)
        pins = dependency_pins(requires)
        name = f"cairn-payload-{version}"
        payload = out / name
        if payload.exists():
            shutil.rmtree(payload)
        (payload / "wheels").mkdir(parents=True)
        shutil.copy2(wheel, payload / "wheels" / wheel.name)
    deps = download_dependencies(pins, payload / "wheels" / "deps") if dependencies else []

    (payload / "constraints.txt").write_text(
        "# Versions of Cairn's dependencies this payload was built and tested with;\n"
        "# install.sh installs the wheel with them as pip constraints.\n" + "\n".join(pins)
        + "\n")
    shutil.copy2(HERE / "install.sh", payload / "install.sh")
    (payload / "install.sh").chmod(0o755)
    for source, target, mode in FILES:
        destination = payload / "rootfs" / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / source, destination)
        destination.chmod(mode)

    files = sorted(p for p in payload.rglob("*") if p.is_file())
    entries = [{"path": p.relative_to(payload).as_posix(), "sha256": sha256(p),
                "size": p.stat().st_size, "mode": f"{p.stat().st_mode & 0o777:04o}"}
               for p in files]
    manifest = {
        "name": "cairn", "version": version, "wheel": f"wheels/{wheel.name}",
        "source": git_describe(), "source_date_epoch": epoch,
        "target": f"Debian / Raspberry Pi OS trixie arm64, Python {TARGET['python_version']}",
        "units": UNITS, "enable": ["cairn-router.service"],
        "dependencies": pins, "dependency_wheels": {"platform": "linux_aarch64",
                                                    "files": [f"wheels/deps/{d}" for d in deps]},
        "files": entries,
    }
    (payload / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    sums = "".join(f"{e['sha256']}  {e['path']}\n" for e in entries)
    sums += f"{sha256(payload / 'manifest.json')}  manifest.json\n"
    (payload / "SHA256SUMS").write_text(sums)
    for p in payload.rglob("*"):
        os.utime(p, (epoch, epoch), follow_symlinks=False)
    os.utime(payload, (epoch, epoch))
    if tar:
        write_tarball(payload, out / f"{name}.tar.gz", epoch)
    return payload


def write_tarball(payload: Path, target: Path, epoch: int) -> None:
    """A tarball that depends only on the files: sorted, owned by root, fixed times, and a
    gzip header without name or time."""
    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = epoch
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [payload, *sorted(payload.rglob("*"))]:
            tar.add(path, arcname=path.relative_to(payload.parent).as_posix(),
                    recursive=False, filter=normalize)
    with target.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist",
                        help="where the payload directory and tarball go (default ./dist)")
    parser.add_argument("--wheel", type=Path,
                        help="use this wheel instead of building one from the sources")
    parser.add_argument("--no-tar", action="store_true", help="only the directory")
    parser.add_argument("--no-dependencies", action="store_true",
                        help="leave out the dependencies' wheels (install.sh then fetches "
                             "them from the package index)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        payload = assemble(args.out.resolve(), args.wheel, tar=not args.no_tar,
                           dependencies=not args.no_dependencies)
    except PayloadError as e:
        print(f"build_payload: {e}", file=sys.stderr)
        return 1
    print(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
