"""The protocol core does no I/O: it takes messages and returns messages and effects
(gateway.core). Checked here on the source, so a shortcut from the core to the event loop or
the database fails the suite, naming the import chain that brought it in."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("gateway.core", "gateway.router", "gateway.broker", "gateway.dealer", "gateway.meta",
        "gateway.retention", "gateway.history", "gateway.auth")
FORBIDDEN = ("asyncio", "sqlite3", "aiosqlite", "gateway.store", "gateway.server",
             "gateway.transport", "gateway.flow_control", "gateway.admission")


def imports_of(module: str) -> set[str]:
    """The modules ``module`` imports at run time (not those under ``if TYPE_CHECKING``)."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "gateway":  # from gateway import clock
                found.update(f"gateway.{alias.name}" for alias in node.names)
    return found


def forbidden_chains(start: str) -> list[list[str]]:
    """Every import chain from ``start`` through Cairn's modules to a forbidden one."""
    chains, seen, todo = [], {start}, [[start]]
    while todo:
        chain = todo.pop()
        for name in sorted(imports_of(chain[-1])):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                chains.append([*chain, name])
            elif name.startswith("gateway.") and name not in seen and \
                    (ROOT / (name.replace(".", "/") + ".py")).exists():
                seen.add(name)
                todo.append([*chain, name])
    return chains


def test_the_protocol_core_imports_neither_the_event_loop_nor_the_store():
    chains = [" -> ".join(chain) for module in CORE for chain in forbidden_chains(module)]
    assert not chains, "the core reaches I/O:\n" + "\n".join(sorted(set(chains)))


def test_the_import_check_finds_what_the_shell_imports():
    """The check itself: the shell's modules do reach the event loop and the store."""
    reached = {chain[-1] for chain in forbidden_chains("gateway.server")}
    assert {"asyncio", "sqlite3", "gateway.store", "gateway.transport"} <= reached
