"""The documentation keeps up with the code: every config key the code accepts is in the
reference (docs/configuration.md), under the kinds that take it, and every key there is one the
code accepts; every TOML example is accepted by the code; every ``cairn`` command is in the
commands table; every relative link and anchor in README.md and docs/*.md resolves; the README
stays a five-minute read; and the MkDocs site builds in strict mode with nothing fetched from
another host.

Where the accepted keys come from: every component checks its tables with
``Validator.keys(table, at, allowed)``, which refuses any other key. This test finds every such
call in the installed packages' source (by AST), runs each component's parser on a sample that
reaches all of them, and records each call's ``allowed`` set with its dotted place ``at``. A
call the samples do not reach fails the test by file and line (a new section needs a sample
here), so a key added to the code cannot escape the check. The one key accepted without
``Validator.keys`` (``remove`` of a network profile, read by ``network_profiles.removal``) is
checked by calling that function.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import subprocess
import sys
import tomllib
import unicodedata
from pathlib import Path

import pytest

from cairn.app import network_profiles, update_pull
from cairn.base.config_tools import ConfigError, Validator
from cairn.drivers import config as driver_config
from cairn.drivers import mqtt_bridge, mqtt_presets, serial_config
from cairn.formats import health
from cairn.gateway.core import config as gateway_config
from cairn.sync import cli as sync_cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
REFERENCE = DOCS / "configuration.md"
README_MAX_LINES = 150
PAGES = [README, *sorted(DOCS.glob("*.md"))]
NETWORK = "network/NAME.toml"  # the reference's name for a network profile's keys
TOP_LEVEL = "cairn.toml"       # ... and for the top level of a config file

# A config file that reaches every table the router, the drivers, sync and update check.
SAMPLE = """
[router]
listen = "127.0.0.1:8080"
rawsocket = ["unix:/tmp/cairn-docs-test.sock"]
tls = { cert = "CERT", key = "KEY" }
limits = { max_connections = 10 }

[[realms]]
name = "realm1"
anonymous_role = "anonymous"

  [[realms.roles]]
  name = "anonymous"
  permissions = [{ uri = "", match = "prefix", allow = ["subscribe"] }]

  [[realms.users]]
  authid = "alice"
  role = "anonymous"
  secret = "secret-a"

  [[realms.history]]
  uri = "sensor"
  match = "prefix"

  [[realms.retention]]
  uri = "sensor"
  match = "prefix"

[driver]
router = "ws://127.0.0.1:8080/ws"

[[sensors]]
id = "modbus-1"
kind = "modbus"
port = "/dev/ttyUSB0"
registers = { temperature = { register = 1 } }

[[sensors]]
id = "line-1"
kind = "line"
port = "/dev/ttyUSB1"

[[sensors]]
id = "hwmon-1"
kind = "hwmon"
device = "1-0044"

[[sensors]]
id = "iio-1"
kind = "iio"
device = "1-0076"

[[sensors]]
id = "w1-1"
kind = "w1"
device = "28-0316a2790b6f"

[mqtt]
broker = "127.0.0.1:1883"

  [[mqtt.map]]
  filter = "tele/+/SENSOR"
  topic = "sensor.{1}"

  [[mqtt.forward]]
  topic = "sensor."
  match = "prefix"
  mqtt = "cairn/{1}"

[sync]
sink = "dir:/tmp/cairn-docs-test-sink"
gateway_id = "gw-1"

[update]
source = "https://updates.invalid/cairn/{gateway_id}/"
"""
# ... and a [[mqtt.map]] entry of each preset: each takes keys of its own
SAMPLE += "".join(f'\n[[mqtt.map]]\npreset = "{name}"\n' for name in mqtt_presets.PRESETS)
NETWORK_SAMPLES = [
    {"type": "ethernet"},
    {"type": "wifi", "ssid": "Greenhouse"},
    {"type": "cellular", "apn": "internet"},
]


def _source_dirs() -> list[Path]:
    """The folders the cairn packages are installed from (pyproject's package-dir)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = pyproject["tool"]["setuptools"]["package-dir"].values()
    return sorted({ROOT / d for d in dirs})


def key_check_sites() -> set[tuple[str, int, int]]:
    """Every ``X.keys(table, at, allowed)`` call in the packages' source: (file, first line,
    last line). ``dict.keys()`` takes no arguments, so a call with any is Validator.keys."""
    sites = set()
    for folder in _source_dirs():
        for path in folder.rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "keys" and (node.args or node.keywords)):
                    sites.add((str(path.resolve()), node.lineno, node.end_lineno))
    return sites


def _section(at: str, caller: str) -> str:
    """A dotted place as the reference names its table: ``realms[0].roles[1].permissions[0]``
    -> ``realms.roles.permissions``; ``sensors[0].registers.temperature`` ->
    ``sensors.registers``; the top level of a config file or of a network profile."""
    if not at:
        return NETWORK if Path(caller).name == "network_profiles.py" else TOP_LEVEL
    name = re.sub(r"\[\d+\]", "", at)
    if name.startswith("sensors.registers."):
        return "sensors.registers"
    return name


# Sections whose tables come in kinds, each with keys of its own: the reference says in a
# column which kinds take a key. Section -> the key naming the kind, and the kind of a table
# without that key ([[mqtt.map]]: an entry with a filter, not a preset).
KINDED = {"sensors": ("kind", None), NETWORK: ("type", None), "mqtt.map": ("preset", "filter")}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[dict[str, set[str]], dict[str, dict[str, set[str]]]]:
    """What every parser accepts, as recorded from its Validator.keys calls: section -> keys,
    and for the sections of KINDED, section -> kind -> keys."""
    tmp = tmp_path_factory.mktemp("docs-config")
    (tmp / "cert.pem").write_text("cert\n")
    (tmp / "key.pem").write_text("key\n")
    text = SAMPLE.replace("CERT", str(tmp / "cert.pem")).replace("KEY", str(tmp / "key.pem"))
    data = tomllib.loads(text)
    found: dict[str, set[str]] = {}
    kinds: dict[str, dict[str, set[str]]] = {}
    reached: list[tuple[str, int]] = []
    original = Validator.keys

    def recording(self, table, at, allowed):
        caller = sys._getframe(1)
        reached.append((str(Path(caller.f_code.co_filename).resolve()), caller.f_lineno))
        section = _section(at, caller.f_code.co_filename)
        found.setdefault(section, set()).update(allowed)
        if section in KINDED and re.fullmatch(r"((sensors|mqtt\.map)\[\d+\])?", at):
            kind = table.get(*KINDED[section])
            kinds.setdefault(section, {}).setdefault(kind, set()).update(allowed)
        return original(self, table, at, allowed)

    Validator.keys = recording
    try:
        gateway_config.parse(data, "sample.toml")
        driver_config.parse_driver(data, "sample.toml")
        # cairn sensor run refuses [update] (its top level lacks it: see the reference)
        serial_config.parse({k: v for k, v in data.items() if k != "update"}, "sample.toml")
        mqtt_bridge.parse_mqtt(data, "sample.toml")
        sync_cli.parse_sync(data, "sample.toml")
        update_pull.parse_update(data, "sample.toml")
        for profile in NETWORK_SAMPLES:
            network_profiles.parse_profile(profile, "wifi.toml", "wifi")
    finally:
        Validator.keys = original
    assert network_profiles.removal({"remove": True}, "old.toml", "old") == "cairn-old"
    found[NETWORK].add("remove")

    missed = [f"{Path(file).relative_to(ROOT)}:{first}"
              for file, first, last in sorted(key_check_sites())
              if not any(f == file and first <= line <= last for f, line in reached)]
    assert not missed, (f"config keys are checked at {', '.join(missed)}, which the samples of "
                        f"tests/system/test_docs.py do not reach: add that section to SAMPLE (or "
                        f"call its parser in recorded())")
    return found, kinds


@pytest.fixture(scope="module")
def accepted(recorded) -> dict[str, set[str]]:
    """Section -> the keys the code accepts there."""
    return recorded[0]


# -- the reference ---------------------------------------------------------------------------

def reference_sections(text: str) -> dict[str, list[str]]:
    """Headings of the reference that name a table in a code span (`[router.limits]`,
    `[[realms.history]]`, `network/NAME.toml`) -> the keys listed in the first column of the
    tables under that heading, up to the next heading."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            spans = re.findall(r"`([^`]+)`", heading.group(1))
            current = spans[0].strip("[]") if spans else None
            if current is not None:
                sections.setdefault(current, [])
            continue
        if current is not None and line.startswith("|"):
            first = line.split("|")[1]
            if set(first.strip()) <= set("-: "):
                continue
            sections[current] += re.findall(r"`([^`]+)`", first)
    return sections


def reference_kinds(text: str, section: str, column: str) -> dict[str, str]:
    """Key -> the cell of ``column`` (``kind``, ``types``) in the table under the heading
    naming ``section``."""
    cells: dict[str, str] = {}
    current, header, in_code = None, None, False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code:
            continue
        elif heading := re.match(r"#{1,6}\s+(.*)", line):
            spans = re.findall(r"`([^`]+)`", heading.group(1))
            current, header = (spans[0].strip("[]") if spans else None), None
        elif current == section and line.startswith("|"):
            row = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if header is None:
                header = row
            elif not set("".join(row)) <= set("-: ") and column in header:
                for key in re.findall(r"`([^`]+)`", row[0]):
                    cells[key] = row[header.index(column)]
    return cells


@pytest.fixture(scope="module")
def documented() -> dict[str, list[str]]:
    return reference_sections(REFERENCE.read_text())


@pytest.mark.parametrize(("section", "column", "every"), [("sensors", "kind", "all"),
                                                        (NETWORK, "types", "all"),
                                                        ("mqtt.map", "entry", "all")])
def test_the_reference_says_which_kinds_take_each_key(recorded, section, column, every):
    """The kind column of [[sensors]] (``all``, ``modbus, line``, ``iio``...), the types
    column of a network profile (``all``, ``ethernet, wifi``...) and the entry column of
    [[mqtt.map]] (``all``, ``filter``, ``tasmota, homeassistant``...) say exactly which kinds
    accept a key."""
    kinds = recorded[1][section]
    cells = reference_kinds(REFERENCE.read_text(), section, column)
    assert cells, f"no {column!r} column under the heading of {section} in {REFERENCE.name}"
    wrong = []
    for key, cell in sorted(cells.items()):
        if key == "remove" and section == NETWORK:  # a file of its own (network_profiles)
            continue
        said = set(kinds) if cell == every else {k.strip() for k in cell.split(",")}
        takes = {kind for kind, keys in kinds.items() if key in keys}
        if said != takes:
            wrong.append(f"{key}: the reference says {cell!r}, the code takes it for "
                         f"{', '.join(sorted(takes)) or 'none'}")
    assert not wrong, (f"docs/configuration.md, {section}, column {column!r}:\n  "
                       + "\n  ".join(wrong))


def test_every_key_the_code_accepts_is_in_the_reference(accepted, documented):
    missing = [f"{section}: no heading names this section" for section in sorted(accepted)
               if section not in documented]
    missing += [f"{section}: {key}" for section, keys in sorted(accepted.items())
                if section in documented for key in sorted(keys)
                if key not in documented[section]]
    assert not missing, ("docs/configuration.md does not document these config keys (a key "
                         "belongs in the first column of a table under a heading naming its "
                         "section, such as ### `[router.limits]`):\n  " + "\n  ".join(missing))


def test_every_key_in_the_reference_is_one_the_code_accepts(accepted, documented):
    unknown = [f"{section}: {key}" for section, keys in sorted(documented.items())
               for key in keys if key not in accepted.get(section, ())]
    unknown += [f"{section} (no such section in the code)" for section in documented
                if section not in accepted]
    assert not unknown, ("docs/configuration.md documents keys the code does not accept:\n  "
                         + "\n  ".join(unknown))


def test_the_key_counts_are_what_the_reference_covers(accepted):
    # not a fixed number (the code may grow), but a floor that catches a check gathering
    # nothing: the router alone has 15 keys and its limits 21
    assert len(accepted["router"]) >= 15 and len(accepted["router.limits"]) >= 21
    assert sum(len(keys) for keys in accepted.values()) >= 150


# -- the examples ----------------------------------------------------------------------------

TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.S | re.M)
SECRET = "an-example-secret-of-some-length"


def toml_examples() -> list[tuple[Path, int, str]]:
    """(page, line, text) of every TOML example in the README and the pages."""
    return [(page, page.read_text().count("\n", 0, m.start()) + 1, m.group(1))
            for page in PAGES for m in TOML_BLOCK.finditer(page.read_text())]


def _provide(value, tmp: Path, monkeypatch, key: str = ""):
    """The example with what it names from outside made to exist: each ``*_file`` (and
    ``[router.tls]``'s PEM files) a file holding a secret, each ``*_env`` variable set."""
    if isinstance(value, dict):
        return {k: _provide(v, tmp, monkeypatch, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_provide(v, tmp, monkeypatch, key) for v in value]
    if isinstance(value, str) and (key.endswith("_file") or key in ("cert", "key")):
        path = tmp / f"{key}-{len(list(tmp.iterdir()))}"
        path.write_text(SECRET + "\n")
        return str(path)
    if isinstance(value, str) and key.endswith("_env"):
        monkeypatch.setenv(value, SECRET)
    return value


EXAMPLE_REALM = {"name": "realm1", "roles": [{"name": "user"}],
                 "users": [{"authid": "someone", "role": "user", "secret": SECRET}]}


@pytest.mark.parametrize(("page", "line", "text"), toml_examples(),
                         ids=[f"{p.relative_to(ROOT).as_posix()}:{n}"
                              for p, n, _ in toml_examples()])
def test_every_toml_example_is_accepted_by_the_code(page, line, text, tmp_path, monkeypatch):
    """What a reader copies works: each example passes the checks of every component that
    reads its sections (a fragment such as a role's ``permissions`` inside a realm, a section
    without ``[[realms]]`` beside a realm with a user, so that a LAN listener is allowed)."""
    where = f"{page.relative_to(ROOT)}:{line}"
    try:
        data = _provide(tomllib.loads(text), tmp_path, monkeypatch)
    except tomllib.TOMLDecodeError as e:
        pytest.fail(f"{where}: not TOML: {e}")
    source = f"{page.name}:{line}"
    try:
        if "type" in data:  # a network profile, network/NAME.toml
            network_profiles.parse_profile(data, source, "example")
            return
        if set(data) == {"permissions"}:
            data = {"realms": [{"name": "realm1",
                                "roles": [{"name": "example", **data}]}]}
        data.setdefault("realms", [EXAMPLE_REALM])
        gateway_config.parse(data, source)
        if {"driver", "sensors", "mqtt"} & set(data):
            driver_config.parse_driver(data, source)
        if "sensors" in data:
            serial_config.parse(data, source)
        if "mqtt" in data:
            mqtt_bridge.parse_mqtt(data, source)
        if "sync" in data:
            sync_cli.parse_sync(data, source)
        if "update" in data:
            update_pull.parse_update(data, source)
    except ConfigError as e:
        pytest.fail(f"{where}: the code refuses this example: {e}")


def test_the_embedded_default_in_the_reference_is_the_code_s():
    text = REFERENCE.read_text()
    section = text[text.index("## The embedded default"):]
    shown = TOML_BLOCK.search(section)
    assert shown, "no TOML block under 'The embedded default' in docs/configuration.md"
    assert tomllib.loads(shown.group(1)) == tomllib.loads(gateway_config.EMBEDDED_TOML), (
        "docs/configuration.md shows another embedded default than gateway/core/config.py's "
        "EMBEDDED_TOML")


def test_the_health_record_table_is_the_one_formats_health_prints():
    text = (DOCS / "fleet-report.md").read_text()
    shown = re.search(r"<!-- health-record-fields: begin -->\n(.*?)<!-- health-record-fields: end",
                      text, re.S)
    assert shown, "no health-record-fields block in docs/fleet-report.md"
    assert shown.group(1) == health.markdown(), (
        "docs/fleet-report.md's table of health record fields is not formats/health.py's: "
        "paste the output of python -m cairn.formats.health between its markers")


# -- the commands ----------------------------------------------------------------------------

def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((dict(action.choices) for action in parser._actions
                 if isinstance(action, argparse._SubParsersAction)), {})


def test_every_command_is_in_the_operations_table():
    """Each ``cairn`` command has a row of the commands table in docs/operations.md that
    names it (`` `cairn update ...` ``), and the row names each of its subcommands in code."""
    from cairn.app.cli import build_parser

    rows = [line for line in (DOCS / "operations.md").read_text().splitlines()
            if line.startswith("| `cairn ")]
    missing = []
    for name, parser in sorted(_commands(build_parser()).items()):
        mine = [row for row in rows if f"`cairn {name}" in row]
        if not mine:
            missing.append(f"cairn {name}")
            continue
        spans = " ".join(span for row in mine for span in re.findall(r"`([^`]+)`", row))
        missing += [f"cairn {name} {sub}" for sub in sorted(_commands(parser))
                    if not re.search(rf"(?<![\w-]){re.escape(sub)}(?![\w-])", spans)]
    assert not missing, ("docs/operations.md's commands table does not name: "
                         + ", ".join(missing))


# -- links -----------------------------------------------------------------------------------

def slugify(text: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) makes it: the heading's text
    without markup, ASCII only, no punctuation but '-' and '_', lower case, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    parts = re.split(r"(`[^`]*`)", re.sub(r"<[^>]+>", "", text))  # tags dropped
    text = "".join(part[1:-1] if part.startswith("`") else  # code as it is, emphasis marks out
                   re.sub(r"(\*\*|\*|\b__|\b_)(.+?)\1", r"\2", part) for part in parts)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            slug, n = slugify(m.group(1)), 1
            unique = slug
            while unique in found:  # as toc does for a repeated heading
                unique, n = f"{slug}_{n}", n + 1
            found.add(unique)
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image outside code."""
    found = []
    in_code = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        found += [(number, target) for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)",
                                                             line)]
    return found



@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for number, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif page.parent == DOCS and DOCS not in dest.parents:
            broken.append(f"{where}: outside docs/, so not in the site (name the path in "
                          f"code instead)")
        elif page == README and dest != README and DOCS not in dest.parents:
            broken.append(f"{where}: outside docs/, which is all a device has beside its "
                          f"README (images/build_payload.py): name the path in code instead")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading with that anchor in {dest.name}")
    assert not broken, "broken links:\n  " + "\n  ".join(broken)


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in DOCS.glob("*.md") if f": {p.name}" not in nav]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"


# -- the README ------------------------------------------------------------------------------

def test_the_readme_is_a_five_minute_read():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move the detail to "
        f"a page under docs/")
    # the two commands first: the page's first code block, in its first lines
    fence = next(i for i, line in enumerate(lines) if line.startswith("```"))
    commands = lines[fence + 1:fence + 3]
    assert fence < 5 and [c.split("#")[0].strip() for c in commands] == ["make run", "make test"], (
        "README.md must open with a code block of the two commands, make run then make test")


# -- the site --------------------------------------------------------------------------------

OUTSIDE_ASSET = re.compile(
    r"<(?:script|img|iframe|source|link)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//"
    r"|url\(\s*[\"']?(?:https?:)?//|@import\s+[\"']?(?:url\()?[\"']?(?:https?:)?//", re.I)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="MkDocs is not installed (pip install -e '.[docs]')")
def test_the_site_builds_strictly_and_opens_offline(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file() and (site / "configuration.html").is_file()
    outside = [f"{path.relative_to(site)}: {m.group(0)}"
               for path in site.rglob("*") if path.suffix in (".html", ".css", ".js")
               for m in OUTSIDE_ASSET.finditer(path.read_text(errors="replace"))]
    assert not outside, "the site loads assets from other hosts:\n  " + "\n  ".join(outside)
