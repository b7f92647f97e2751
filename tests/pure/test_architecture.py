"""The folders are the architecture, and this module checks it on the source, by folder: each
folder's package docstring says what it is for, and :data:`MAY_IMPORT` what it may import. The
protocol core does no I/O (it takes messages and returns messages and effects), the central
jobs stand on nothing of the edge, no module uses another's ``_private`` names, and nothing
imports in a circle. A shortcut fails the suite, naming the import that made it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# installed as cairn.<folder> (pyproject.toml's package-dir)
FOLDERS = ("base", "formats", "gateway", "drivers", "sync", "central", "app")
PACKAGES = tuple(f"cairn.{folder}" for folder in FOLDERS)
# Each folder (a package, or a package's subpackage) and the folders its modules may import,
# their own always included. Read top down: base is the floor, app (the ``cairn`` command)
# the roof that gathers the rest. A folder not named here takes its parent's rule.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "base": (),
    "formats": ("base",),
    "gateway/core": ("base", "formats"),
    "gateway/store": ("gateway/core", "base", "formats"),
    "gateway/ops": ("gateway/store", "gateway/core", "base", "formats"),
    "gateway/shell": ("gateway/ops", "gateway/store", "gateway/core", "base", "formats"),
    "gateway": ("gateway/shell",),  # the package itself: its docstring and old-path shims
    "drivers": ("gateway", "base", "formats"),
    "sync": ("gateway/store", "gateway/core", "base", "formats"),
    "central": ("base", "formats"),
    "app": FOLDERS,
}
CORE = "gateway/core"
# what the core never imports, directly or through another module: the event loop, the
# database and the clocks (the shell reads those, base.clock, and hands the core the time of
# each call, Outbox.now)
FORBIDDEN = ("asyncio", "sqlite3", "aiosqlite", "time")
CLOCK_READS = ("now", "utcnow", "today")  # datetime/date methods that read the clock
# Old import paths kept for one release (a module that re-exports the new one and warns):
# {old: new}. They are exempt from MAY_IMPORT.
SHIMS = {"cairn.gateway.server": "cairn.gateway.shell.server",
         "cairn.sync.table_lock": "cairn.central.table_lock"}


def source(module: str) -> Path:
    """cairn.gateway.core.router -> gateway/core/router.py; a package: cairn.gateway.store ->
    gateway/store/__init__.py"""
    path = ROOT / module.removeprefix("cairn.").replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@functools.cache
def is_cairn(name: str) -> bool:
    return name.startswith("cairn.") and source(name).exists()


@functools.cache  # each file is parsed once per check: the tier runs in seconds
def imports_of(module: str, typing_too: bool = False) -> frozenset[str]:
    """The modules ``module`` imports at run time, in functions too (and, ``typing_too``, for
    type hints under ``if TYPE_CHECKING``)."""
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
            if is_cairn(node.module) and source(node.module).name == "__init__.py":
                # from cairn.base import clock; from cairn.central.spark import table
                found.update(f"{node.module}.{alias.name}" for alias in node.names
                             if is_cairn(f"{node.module}.{alias.name}"))
    return frozenset(found)


def folder_of(module: str) -> str:
    """The folder a module is in: cairn.gateway.core.router -> gateway/core; a package's own
    __init__ is in its folder (cairn.gateway.store -> gateway/store)."""
    path = source(module).relative_to(ROOT)
    return "/".join(path.parts[:-1])


def rule_of(folder: str) -> str:
    """The folder of :data:`MAY_IMPORT` that rules ``folder``: itself, or its parent's."""
    while folder not in MAY_IMPORT:
        folder = folder.rpartition("/")[0]
    return folder


def allowed(importer: str, imported: str) -> bool:
    """May a module of folder ``importer`` import one of folder ``imported``? Its own rule's
    folders and their subfolders that have no rule of their own (drivers may import
    gateway/shell through "gateway"; sync may not import gateway/shell)."""
    mine = rule_of(importer)
    theirs = rule_of(imported)
    return theirs == mine or theirs in MAY_IMPORT[mine] or \
        any(theirs.startswith(f"{name}/") for name in MAY_IMPORT[mine]
            if name in FOLDERS)


def modules_of(folder: str) -> list[str]:
    """The modules of one folder and its subfolders, their __init__ included: cairn.sync,
    cairn.sync.cli, cairn.sync.sinks, ..."""
    return sorted("cairn." + ".".join(path.relative_to(ROOT).with_suffix("").parts
                                      ).removesuffix(".__init__")
                  for path in (ROOT / folder).rglob("*.py"))


ALL = [module for folder in FOLDERS for module in modules_of(folder)]


def test_every_folder_says_what_it_is_for():
    """A one-line purpose at the top of each package (its docstring), for the tree to read."""
    packages = sorted({folder_of(module) for module in ALL})
    missing = [folder for folder in packages
               if not ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))]
    assert not missing, f"packages without a docstring: {missing}"
    assert set(packages) - {"gateway/dashboard"} <= {rule_of(f) for f in packages} | \
        {f for f in packages if rule_of(f) in FOLDERS}


def imports_against_the_folders() -> list[str]:
    """Each import (type hints and imports in functions included) that :data:`MAY_IMPORT`
    does not allow: "cairn.central.spark.reports -> cairn.gateway.core.config"."""
    wrong = []
    for module in ALL:
        if module in SHIMS:
            continue
        wrong += [f"{module} -> {name}" for name in sorted(imports_of(module, True))
                  if is_cairn(name) and not allowed(folder_of(module), folder_of(name))]
    return wrong


def test_each_folder_imports_only_what_its_rule_allows():
    wrong = imports_against_the_folders()
    assert not wrong, "imports against the folders' rules:\n" + "\n".join(wrong)


def test_the_folder_check_finds_an_import_against_the_rules():
    assert allowed("gateway/shell", "gateway/core") and allowed("drivers", "gateway/shell")
    assert not allowed("gateway/core", "gateway/shell") and not allowed("central", "sync")
    assert not allowed("sync", "gateway/shell") and not allowed("base", "formats")
    assert allowed("central/spark", "central") and allowed("central", "central/spark")


def core_modules() -> list[str]:
    return [module for module in ALL if folder_of(module) == CORE]


def forbidden_chains(start: str) -> list[list[str]]:
    """Every import chain from ``start`` through Cairn's modules to a forbidden one."""
    chains, seen, todo = [], {start}, [[start]]
    while todo:
        chain = todo.pop()
        for name in sorted(imports_of(chain[-1])):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                chains.append([*chain, name])
            elif is_cairn(name) and name not in seen:
                seen.add(name)
                todo.append([*chain, name])
    return chains


def test_the_protocol_core_imports_neither_the_event_loop_nor_the_store():
    chains = [" -> ".join(chain) for module in core_modules()
              for chain in forbidden_chains(module)]
    assert not chains, "the core reaches I/O:\n" + "\n".join(sorted(set(chains)))


def reachable(start: str) -> set[str]:
    """``start`` and every Cairn module it imports, directly or not."""
    seen, todo = {start}, [start]
    while todo:
        for name in imports_of(todo.pop()):
            if is_cairn(name) and name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_the_protocol_core_reads_no_clock():
    """``time`` is a forbidden import (above); ``datetime`` converts times (RFC 3339) but
    is never asked for the time."""
    modules = set().union(*(reachable(module) for module in core_modules()))
    reads = sorted(f"{module}: .{node.func.attr}()" for module in modules
                   for node in ast.walk(ast.parse(source(module).read_text()))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr in CLOCK_READS)
    assert not reads, "the core reads the clock:\n" + "\n".join(reads)


def test_the_import_check_finds_what_the_shell_imports():
    """The check itself: the shell's modules do reach the event loop and the store."""
    reached = {chain[-1] for chain in forbidden_chains("cairn.gateway.shell.server")}
    assert {"asyncio", "sqlite3", "time"} <= reached
    assert {"cairn.gateway.store", "cairn.base.clock"} <= reachable("cairn.gateway.shell.server")


def test_only_the_spark_jobs_import_pyspark():
    """central/ outside central/spark/ (the plan, the fleet report, the HTML report, the
    table lock) is plain Python: its tests run where PySpark is not installed."""
    wrong = [f"{module} -> {name}" for module in ALL if folder_of(module) != "central/spark"
             for name in sorted(imports_of(module, True))
             if name.startswith(("pyspark", "py4j", "cairn.central.spark"))
             and not (module == "cairn.central.cli" and name.startswith("cairn.central.spark"))]
    assert not wrong, "\n".join(wrong)


def import_graph() -> dict[str, set[str]]:
    """Each of Cairn's modules and the ones of Cairn it imports, type hints included (a
    package inside a folder, such as gateway/store/, is a module and so is each of its own)."""
    modules = {m for m in ALL if m not in PACKAGES}
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


def test_the_harness_imports_itself_in_no_circle():
    """The tests' harness too (harness.spark_cds <-> harness.spark_cluster was one, hidden
    in a function)."""
    names = {f"harness.{path.stem}" for path in (ROOT / "harness").glob("*.py")
             if path.stem != "__init__"}
    graph = {}
    for name in names:
        tree = ast.parse((ROOT / "harness" / f"{name.split('.')[1]}.py").read_text())
        found = {node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
        found |= {f"harness.{alias.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module == "harness"
                  for alias in node.names}
        graph[name] = found & names - {name}
    assert circles(graph) == []


def test_the_folders_import_each_other_in_no_circle():
    """Folder by folder too (a folder without a rule of its own, app/provision, is its
    parent's): gateway/shell imports gateway/ops, never the other way."""
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        mine = rule_of(folder_of(module))
        if module not in SHIMS:
            graph.setdefault(mine, set()).update(
                rule_of(folder_of(name)) for name in imported
                if rule_of(folder_of(name)) != mine)
    for folder in {f for names in graph.values() for f in names}:
        graph.setdefault(folder, set())
    assert circles(graph) == []


def test_the_circle_check_finds_circles_and_sees_imports_of_other_packages():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert {"cairn.drivers.cli", "cairn.sync.cli"} <= graph["cairn.app.cli"]
    assert {"cairn.central.spark.table", "cairn.central.spark.files"} <= \
        graph["cairn.central.spark.ingest"]  # modules of subpackages too


# -- no _private name crosses modules ------------------------------------------------------

# Every module of the repository's Python that may import Cairn's (tests, their harness, the
# benchmarks and soak runs too: a test that reaches for a _name pins what its module may change)
CHECKED = (*FOLDERS, "harness", "tests", "bench", "soak")
OURS = ("cairn.", "harness", "tests", "bench", "soak")


def private_names_crossing_modules() -> list[str]:
    """Each ``_name`` (not a ``__dunder__``) a module takes from another of ours, imported
    (``from cairn.gateway.store.schema import _meta``), as an attribute of a module it
    imported (``schema._meta``) or a test's ``monkeypatch.setattr(schema, "_meta", ...)``. A
    name another module uses is part of its package's internal surface: it goes without the
    underscore."""
    found = []
    for path in sorted(p for top in CHECKED for p in (ROOT / top).rglob("*.py")):
        tree = ast.parse(path.read_text())
        modules: set[str] = set()  # local names bound to modules of ours
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith(OURS):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}: {alias.name} from "
                                     f"{node.module}")
                    else:
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                modules.update(alias.asname or alias.name.split(".")[0]
                               for alias in node.names if alias.name.startswith(OURS))
        found += [f"{path.relative_to(ROOT)}: {node.value.id}.{node.attr}"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in modules and node.attr.startswith("_")
                  and not node.attr.startswith("__")]
        # and a test's monkeypatch.setattr(module, "_name", ...)
        found += [f"{path.relative_to(ROOT)}: setattr({node.args[0].id}, {node.args[1].value!r})"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "setattr" and len(node.args) >= 2
                  and isinstance(node.args[0], ast.Name) and node.args[0].id in modules
                  and isinstance(node.args[1], ast.Constant)
                  and str(node.args[1].value).startswith("_")
                  and not str(node.args[1].value).startswith("__")]
    return found


def test_no_module_uses_another_ones_private_names():
    wrong = private_names_crossing_modules()
    assert not wrong, f"{len(wrong)} private names used across modules:\n" + "\n".join(wrong)


def test_the_old_import_paths_still_work_and_say_where_to_go(recwarn):
    import importlib
    import sys

    for old, new in SHIMS.items():
        sys.modules.pop(old, None)
        module = importlib.import_module(old)
        target = importlib.import_module(new)
        assert any(str(w.message) == f"{old} moved to {new}" for w in recwarn.list), old
        public = [name for name in vars(module) if not name.startswith("_")
                  and name not in ("warnings",)]
        assert public and all(getattr(module, name) is getattr(target, name)
                              for name in public), old
