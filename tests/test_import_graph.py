"""The project's modules form no import cycle (type-only imports and imports inside functions
included), and dependencies flow one way: kvparity (the command line) may import everything; adapters
import no command (nothing of kvparity); conformance imports no adapter, engine or command;
reference_engine imports nothing of ours. The graph is built from the source with `ast`, not by
importing anything."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvparity", "conformance", "reference_engine", "adapters")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports, anywhere in the file. `from pkg import mod` counts as importing
    `pkg.mod` when that is a module, else `pkg`; importing `a.b.c` also imports the packages `a.b`, `a`
    (their __init__ runs first), which is how a package facade takes part in a cycle."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    known = set(mods)
    return {name: imports_of(name, path, known) - {name} for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_sees_the_packages():
    g = graph()
    assert "conformance.runner" in g and "conformance.history" in g["conformance.runner"]
    assert "reference_engine.engine" in g


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_a_cycle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_dependencies_flow_one_way():
    g = graph()
    for name, deps in g.items():
        if name.startswith("conformance"):
            assert not {d for d in deps if d.startswith(("adapters", "reference_engine", "kvparity"))}, name
        if name.startswith("reference_engine"):
            assert not {d for d in deps if d.startswith(("adapters", "conformance", "kvparity"))}, name
        if name.startswith("adapters"):
            assert not {d for d in deps if d.startswith("kvparity")}, name
