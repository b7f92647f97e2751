"""What ``cairn provision`` reads: the folder's files, the plan made of them (problems and
changes) and the names it keeps to."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cairn.base.files import RefusedFile, read_untrusted

BOOT_FOLDER = Path("/boot/firmware/cairn")
ETC = Path("/etc/cairn")
DATA = Path("/data")
DEVICE_SECRETS = "/etc/cairn/secrets"  # what a cairn.toml on the device names
# U-Boot's state (build-image.sh) and provisioning's own files: never read, moved or removed
RESERVED = {"boot.env", "bootargs.env", "report.txt", "report.tmp", "readme.txt"}
# what laptops leave on any FAT stick: not worth a line in the report
JUNK = {".ds_store", "system volume information", ".spotlight-v100", ".trashes",
        ".fseventsd", "thumbs.db", "desktop.ini", ".metadata_never_index"}
MAX_BYTES = 1 << 20  # no input is larger; a bigger "cairn.toml" is garbage, not config
SAFE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
EXIT_APPLIED, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


@dataclass(frozen=True)
class Problem:
    file: str
    key: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.problem}"


@dataclass
class Change:
    """One file to write into the device's settings, from one input (``source``)."""

    source: Path | None  # in the boot folder, removed once everything is applied
    dest: Path
    data: bytes
    mode: int = 0o644
    group: str | None = None  # chgrp to it when the group exists
    note: str = ""            # for the report: never a secret value
    config: bool = False      # cairn.toml: written by install_config only
    remove: bool = False      # dest is removed (data unused)


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    not_understood: list[str] = field(default_factory=list)
    hostname: str | None = None

    def refuse(self, file: str, key: str, problem: str) -> None:
        self.problems.append(Problem(file, key, problem))


@dataclass
class Inputs:
    """The folder's entries by role: the top-level files by their lower-case name, the
    groups' files by group (secrets, sensors, mqtt, network)."""

    files: dict[str, Path] = field(default_factory=dict)    # cairn.toml, hostname, ...
    groups: dict[str, list[Path]] = field(default_factory=dict)  # sensors, mqtt, ...
    not_understood: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # refused: never followed

    def empty(self) -> bool:
        return not self.files and not any(self.groups.values()) and not self.links


TOP_FILES = ("cairn.toml", "authorized_keys", "hostname", "update-keyring.pem")
GROUPS = {"secrets": None, "sensors": ".toml", "mqtt": ".toml", "network": ".toml"}


# -- reading the folder ----------------------------------------------------------------------

def scan(folder: Path) -> Inputs:
    """Sort the folder's entries. Names match case-insensitively, as FAT does."""
    inputs = Inputs()
    for entry in _entries(folder):
        name = entry.name.lower()
        if name in TOP_FILES:
            inputs.files[name] = entry   # read_input refuses anything but a regular file
        elif entry.is_symlink():
            inputs.links.append(entry.name)
        elif name in GROUPS and entry.is_dir():
            inputs.groups[name] = _group(entry, GROUPS[name], inputs)
        else:
            inputs.not_understood.append(_describe(entry.name))
    return inputs


def _entries(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(e for e in folder.iterdir()
                  if not _ignored(e.name) and e.name.lower() not in RESERVED)


def _ignored(name: str) -> bool:
    return name.startswith("._") or name.lower() in JUNK


def _group(folder: Path, suffix: str | None, inputs: Inputs) -> list[Path]:
    found = []
    for entry in _entries(folder):
        if entry.is_symlink():
            inputs.links.append(f"{folder.name}/{entry.name}")
        elif entry.is_file() and (suffix is None or entry.name.lower().endswith(suffix)):
            found.append(entry)
        else:
            inputs.not_understood.append(_describe(f"{folder.name}/{entry.name}"))
    return found


def _describe(name: str) -> str:
    if name.lower().endswith(".sample"):
        return f"{name} (an example: remove .sample from its name to use it)"
    # Windows hides extensions, so "cairn.toml" saved from Notepad is "cairn.toml.txt"
    for known in (*TOP_FILES, ".toml"):
        if name.lower().endswith(known + ".txt"):
            return f"{name} (did the editor add .txt? rename it to end in {known})"
    return name


def read_input(path: Path, label: str, plan: Plan) -> bytes | None:
    """The bytes of a regular file of the folder, read by the root helpers' rule (never a
    link's target: ``--from`` may name a folder that is not FAT). Any owner: on FAT every
    file has the mount's, and the folder is root's own choice."""
    try:
        return read_untrusted(path, None, MAX_BYTES).data
    except RefusedFile as e:
        plan.refuse(label, "-", f"{e}: provisioning reads regular files only, at most "
                                f"{MAX_BYTES} bytes")
    except OSError as e:
        plan.refuse(label, "-", f"cannot read it: {e.strerror}")
    return None


def read_text(path: Path, label: str, plan: Plan) -> str | None:
    data = read_input(path, label, plan)
    if data is None:
        return None
    try:
        text = data.decode("utf-8-sig")  # Notepad's byte order mark
    except UnicodeDecodeError as e:
        plan.refuse(label, "-", f"not UTF-8 text (byte {e.start}): garbage, or a binary file")
        return None
    return text.replace("\r\n", "\n")


def label_of(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()
