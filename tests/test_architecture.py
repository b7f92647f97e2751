"""The protocol core does no I/O: it takes messages and returns messages and effects
(gateway.core.session). Checked here on the source, so a shortcut from the core to the event loop or
the database fails the suite, naming the import chain that brought it in."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = tuple(f"cairn.gateway.{name}" for name in (
    "core", "router", "broker", "dealer", "meta", "retention", "history", "auth", "wire"))
# installed as cairn.gateway, cairn.drivers, cairn.sync, cairn.app
FOLDERS = ("gateway", "drivers", "sync", "app")
PACKAGES = tuple(f"cairn.{folder}" for folder in FOLDERS)
# the event loop, the database, the shell, and the clocks: the shell reads those
# (base.clock) and hands the core the time of each call (Outbox.now)
FORBIDDEN = ("asyncio", "sqlite3", "aiosqlite", "time", *(f"cairn.gateway.{name}" for name in (
    "store", "server", "transport", "flow_control", "admission", "clock")))
CLOCK_READS = ("now", "utcnow", "today")  # datetime/date methods that read the clock


def source(module: str) -> Path:
    """cairn.gateway.core.session -> gateway/core.py; a package: cairn.gateway.store ->
    gateway/store/__init__.py"""
    path = ROOT / module.removeprefix("cairn.").replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports_of(module: str, typing_too: bool = False) -> set[str]:
    """The modules ``module`` imports at run time (and, ``typing_too``, for type hints under
    ``if TYPE_CHECKING``)."""
    tree = ast.parse(source(module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        typing_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if typing_only and not typing_too:
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module in PACKAGES or source(node.module).name == "__init__.py":
                # from cairn.gateway import clock; from cairn.central.spark import table
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def forbidden_chains(start: str) -> list[list[str]]:
    """Every import chain from ``start`` through Cairn's modules to a forbidden one."""
    chains, seen, todo = [], {start}, [[start]]
    while todo:
        chain = todo.pop()
        for name in sorted(imports_of(chain[-1])):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                chains.append([*chain, name])
            elif name.startswith("cairn.gateway.") and name not in seen and \
                    source(name).exists():
                seen.add(name)
                todo.append([*chain, name])
    return chains


def test_the_protocol_core_imports_neither_the_event_loop_nor_the_store():
    chains = [" -> ".join(chain) for module in CORE for chain in forbidden_chains(module)]
    assert not chains, "the core reaches I/O:\n" + "\n".join(sorted(set(chains)))


def reachable(start: str) -> set[str]:
    """``start`` and every Cairn module it imports, directly or not."""
    seen, todo = {start}, [start]
    while todo:
        for name in imports_of(todo.pop()):
            if name.startswith("cairn.gateway.") and name not in seen and \
                    source(name).exists():
                seen.add(name)
                todo.append(name)
    return seen


def test_the_protocol_core_reads_no_clock():
    """``time`` is a forbidden import (above); ``datetime`` converts times (RFC 3339) but
    is never asked for the time."""
    modules = set().union(*(reachable(module) for module in CORE))
    reads = sorted(f"{module}: .{node.func.attr}()" for module in modules
                   for node in ast.walk(ast.parse(source(module).read_text()))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr in CLOCK_READS)
    assert not reads, "the core reads the clock:\n" + "\n".join(reads)


def test_the_import_check_finds_what_the_shell_imports():
    """The check itself: the shell's modules do reach the event loop and the store."""
    reached = {chain[-1] for chain in forbidden_chains("cairn.gateway.shell.server")}
    assert {"asyncio", "sqlite3", "time", "cairn.gateway.store", "cairn.gateway.shell.transport",
            "cairn.base.clock"} <= reached


def modules_of(folder: str) -> list[str]:
    """The modules of one folder, its own __init__ included: cairn.sync, cairn.sync.cli, ..."""
    return sorted("cairn." + ".".join(path.relative_to(ROOT).with_suffix("").parts
                                      ).removesuffix(".__init__")
                  for path in (ROOT / folder).rglob("*.py"))


def import_graph() -> dict[str, set[str]]:
    """Each of Cairn's modules and the ones of Cairn it imports, type hints included (a
    package inside a folder, such as gateway/store/, is a module and so is each of its own)."""
    modules = {m for folder in FOLDERS for m in modules_of(folder) if m != f"cairn.{folder}"}
    return {m: {d for d in imports_of(m, typing_too=True) if d in modules and d != m}
            for m in modules}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                found.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_cairns_modules_import_each_other_in_no_circle():
    """Type hints included: a TYPE_CHECKING import that closes a circle mirrors a real
    dependency both ways (the core's eight modules and server <-> transport were two), and so
    does an import in a function (gateway.cli <-> drivers.cli was one, hidden by importlib
    on one side; the command is app.cli now)."""
    assert circles(import_graph()) == []


def test_the_circle_check_finds_circles_and_sees_imports_of_other_packages():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert {"cairn.drivers.cli", "cairn.sync.cli"} <= graph["cairn.app.cli"]
    assert {"cairn.central.spark.table", "cairn.central.spark.files"} <= \
        graph["cairn.central.spark.ingest"]  # modules of subpackages too


# The folders a folder must not import: gateway is the base the others build on, app (the
# ``cairn`` command) the top that gathers them, so no import runs back down the stack.
NOT_IMPORTED_BY = {
    "gateway": ("drivers", "sync", "app"),
    "drivers": ("app",),
    "sync": ("app",),
}


def imports_against_the_layers() -> list[str]:
    """Each import, type hints and imports in functions included, of a folder that
    NOT_IMPORTED_BY forbids to the importing one: "cairn.gateway.ops.maintenance -> cairn.sync.sinks"."""
    found = []
    for folder, forbidden in NOT_IMPORTED_BY.items():
        for module in modules_of(folder):
            found += [f"{module} -> {name}" for name in sorted(imports_of(module, True))
                      if any(name == f"cairn.{other}" or name.startswith(f"cairn.{other}.")
                             for other in forbidden)]
    return found


def test_the_base_imports_neither_drivers_nor_sync_nor_the_command():
    """gateway/ imports nothing of drivers/, sync/ or app/; drivers/ and sync/ nothing of
    app/. A helper both need belongs in gateway/ (as urls.redact_url does)."""
    wrong = imports_against_the_layers()
    assert not wrong, "an import runs against the layers:\n" + "\n".join(wrong)


def private_names_used_across_folders() -> list[str]:
    """Each ``_name`` a module takes from a module of another folder, imported (``from
    cairn.gateway.core.config import _secret``) or as an attribute (``gateway_config._router``)."""
    found = []
    for folder in FOLDERS:
        for module in modules_of(folder):
            tree = ast.parse(source(module).read_text())
            others: set[str] = set()  # local names bound to another folder's modules
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and \
                        node.module.startswith("cairn.") and \
                        not node.module.startswith(f"cairn.{folder}"):
                    for alias in node.names:
                        if alias.name.startswith("_"):
                            found.append(f"{module}: {alias.name} from {node.module}")
                        elif source(f"{node.module}.{alias.name}").exists():
                            others.add(alias.asname or alias.name)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                        node.value.id in others and node.attr.startswith("_"):
                    found.append(f"{module}: {node.value.id}.{node.attr}")
    return found


def test_no_folder_uses_another_ones_private_names():
    """drivers/ and sync/ check their config sections with base.config_tools' public
    names, not gateway.core.config's private ones, which it may change freely."""
    wrong = private_names_used_across_folders()
    assert not wrong, "private names used across folders:\n" + "\n".join(wrong)
