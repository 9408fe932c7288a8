"""Rooms and names in `conformance/` (issue 27 item 5): a newcomer finds a concept by its module's name,
and two different things never share one. Pinned here so that the next module does not grow past a
reader's sitting, the next helper does not land in another room's module, and the next name does not
collide: no module over 400 lines (an exception list that only shrinks), no two modules of
`conformance/` with the same name and one module named `registry` in the project, no two classes of `conformance/` with the same name or a name and its plural, the checks'
own helpers used only by checks, the report modules in one package, statuses as an enum that still
reads as the same strings in every file kvparity writes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from test_import_graph import graph

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "conformance"
MAX_LINES = 400

# Modules allowed over MAX_LINES for now, each being split by its own piece of work. The list only
# shrinks: an entry that is gone or back under the limit fails the test until it is removed here.
OVER_THE_LIMIT: set[str] = set()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_conformance_module_is_over_400_lines():
    over = {str(p.relative_to(CONFORMANCE)): _lines(p) for p in CONFORMANCE.rglob("*.py") if _lines(p) > MAX_LINES}
    assert set(over) - OVER_THE_LIMIT == set(), f"split these modules (lines): {over}"


def test_the_exception_list_only_shrinks():
    stale = {name for name in OVER_THE_LIMIT
             if not (CONFORMANCE / name).exists() or _lines(CONFORMANCE / name) <= MAX_LINES}
    assert stale == set(), f"remove from OVER_THE_LIMIT: {sorted(stale)}"


def test_no_two_modules_of_conformance_share_a_name():
    """`checks/coverage.py` (the vacuity check) beside a report module also named coverage read as one."""
    names: dict[str, list[str]] = {}
    for p in sorted(CONFORMANCE.rglob("*.py")):
        if p.name != "__init__.py":
            names.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}


def test_one_module_named_registry():
    found = sorted(str(p.relative_to(ROOT)) for pkg in ("conformance", "reference_engine", "adapters", "kvparity")
                   for p in (ROOT / pkg).rglob("registry.py"))
    assert found == ["conformance/checks/registry.py"]


def _type_names(path: Path) -> set[str]:
    """Classes and type aliases (`Name = Union[...]`) a module defines at its top level."""
    names = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript)
              and isinstance(node.value.value, ast.Name) and node.value.value.id in ("Union", "Optional")):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_no_two_types_of_conformance_share_a_name():
    where: dict[str, list[str]] = {}
    for p in sorted(CONFORMANCE.rglob("*.py")):
        for name in _type_names(p):
            where.setdefault(name, []).append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in where.items() if len(ps) > 1} == {}


def test_no_type_of_conformance_is_named_as_another_plus_s():
    """`Finding` (a grouped root cause) beside `Findings` (one check's accumulator) read as one thing."""
    names = {n for p in CONFORMANCE.rglob("*.py") for n in _type_names(p)}
    assert sorted(n for n in names if n.endswith("s") and n[:-1] in names) == []


def test_the_checks_own_helpers_are_imported_by_checks_only():
    """What grouping, situations, the report and the minimiser share with the checks is
    `conformance.history_facts`; `conformance.checks.common` is the checks' own."""
    users = sorted(name for name, deps in graph().items()
                   if "conformance.checks.common" in deps and not name.startswith("conformance.checks"))
    assert users == []


def test_the_report_modules_are_one_package():
    import conformance.report as report

    assert hasattr(report, "__path__")
    assert sorted(p.name for p in CONFORMANCE.glob("report*.py")) == []
    assert all(callable(getattr(report, name)) for name in report.__all__ if name != "CARRIED")


def test_a_status_is_an_enum_that_reads_as_its_string():
    from conformance.verdicts import ERROR, FAIL, PASS, STATUSES, CheckResult, Status

    assert [s.value for s in STATUSES] == ["pass", "fail", "inconclusive", "error", "skip"]
    assert json.dumps({PASS: FAIL}) == '{"pass": "fail"}'
    assert f"{ERROR} {FAIL!s}" == "error fail" and FAIL == "fail" and {"fail": 1}[FAIL] == 1
    assert CheckResult("c", "pass").status is Status.PASS  # read back from results.json: a member again
    with pytest.raises(ValueError, match="unknown status 'passed'"):
        CheckResult("c", "passed")
