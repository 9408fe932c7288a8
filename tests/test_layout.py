"""The layout is one room per role: `adapters/` holds one module per engine plus the helpers they share,
every command lives in `kvparity/commands/`, the probes in `adapters/probes/`, and `reports/`
holds results only. These tests pin that, so a new command or probe does not land among the engines."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ADAPTERS = REPO / "adapters"

# Modules directly in adapters/ that are not an engine: helpers the engine modules share. Keep it short;
# a command goes to kvparity/commands/, a probe to adapters/probes/.
SHARED_HELPERS = {"engine_args", "reference_oracle", "checkpoint_info", "landmarks", "landmark_search", "gguf_export",
                  "timeline_driver"}
ROLE_PACKAGES = {"probes"}
SCRIPTS = {"thirdparty.sh"}  # runs the vLLM adapters' third-party suites in their own venv
COMMANDS = REPO / "kvparity" / "commands"


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the venv is 3.11
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _entry_points(group: str) -> dict[str, str]:
    return _pyproject()["project"]["entry-points"][group]


def _engine_modules() -> dict[str, str]:
    """engine name -> module name directly under adapters/, from the `kvparity.adapters` entry points."""
    out = {}
    for name, target in _entry_points("kvparity.adapters").items():
        module = target.split(":")[0]
        package, _, rest = module.partition(".")
        assert package == "adapters" and rest and "." not in rest, f"{name} = {target}: not a module in adapters/"
        out[name] = rest
    return out


def test_adapters_top_level_is_engines_and_their_shared_helpers():
    engines = set(_engine_modules().values())
    assert not engines & SHARED_HELPERS
    stray = []
    for path in sorted(ADAPTERS.iterdir()):
        if path.name in ("__init__.py", "__pycache__"):
            continue
        if path.is_dir():  # an engine may be a package of its own (adapters/openai_http/)
            if path.name not in ROLE_PACKAGES | engines:
                stray.append(f"{path.name}/ (a package that is neither an engine nor adapters/probes)")
            continue
        if path.name in SCRIPTS:
            continue
        if path.suffix != ".py":
            stray.append(f"{path.name} (not a Python module)")
        elif path.stem not in engines | SHARED_HELPERS | {f"{e}_{part}" for e in engines
                                                           for part in ("versions", "args", "timeline")}:
            # <engine>_versions.py: the one place an adapter keeps what differs between engine releases;
            # <engine>_args.py: its engine arguments as one typed, frozen class;
            # <engine>_timeline.py: how it drives a batch's arrivals and aborts step by step
            stray.append(f"{path.name} (neither a registered engine adapter, its _versions, _args or _timeline "
                         f"module nor a listed shared helper)")
    assert not stray, "adapters/ holds one module per engine plus shared helpers; move these: " + ", ".join(stray)
    for module in engines | SHARED_HELPERS:
        assert (ADAPTERS / f"{module}.py").is_file() or (ADAPTERS / module / "__init__.py").is_file(), module
    for package in ROLE_PACKAGES:
        assert (ADAPTERS / package / "__init__.py").is_file(), package


def test_no_code_under_reports():
    code = [str(p.relative_to(REPO)) for p in (REPO / "reports").rglob("*")
            if p.is_file() and p.suffix in (".py", ".sh")]
    assert not code, f"reports/ holds results only; code belongs in adapters/: {code}"


def test_every_command_is_a_module_under_kvparity_commands():
    commands = _entry_points("kvparity.commands")
    assert {"bench", "fault-zoo", "export-gguf"} <= set(commands)
    for name, target in commands.items():
        module_name, _, attr = target.partition(":")
        assert module_name.startswith("kvparity.commands."), f"{name} = {target}"
        module = importlib.import_module(module_name)
        assert Path(module.__file__).resolve().is_relative_to(COMMANDS), module.__file__
        assert callable(getattr(module, attr)), target


def test_probes_are_named_after_engines_and_edit_no_sys_path():
    engines = set(_engine_modules())
    probes = {p.stem for p in (ADAPTERS / "probes").glob("*.py") if p.name != "__init__.py"}
    assert probes and probes <= engines, f"a probe module is named after its engine: {sorted(probes - engines)}"
    for path in ADAPTERS.rglob("*.py"):
        assert "sys.path" not in path.read_text(), f"{path.relative_to(REPO)} edits sys.path"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_bench_renderer_imports_no_collector():
    """The report renderer takes plain data: it never calls back into a collector (no import cycle)."""
    bench = COMMANDS / "bench"
    for renderer in ("report.py", "plots.py"):
        bad = {n for n in _imports(bench / renderer)
               if n.startswith(("kvparity.commands.bench.collect", "kvparity.commands.bench.__init__"))
               or n == "kvparity.commands.bench"}
        assert not bad, f"{renderer} imports {sorted(bad)}"
