"""pytest11 plugin: `pytest --pyargs conformance --kvparity-engine NAME` runs the suite as pytest tests.

Only options and fixtures live here, and nothing heavy is imported until a fixture is used, so the plugin
is inert in every other pytest run (the project's own `pytest tests/` included). Under pytest-xdist each
worker builds its own engine and writes its own run directory (suffixed with the worker id); the
Hypothesis example database is a directory database, safe to share between workers.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvparity", "kvparity conformance suite")
    group.addoption("--kvparity-engine", default=None, metavar="NAME",
                    help="engine adapter to test (entry-point name or module:Class); without it the suite skips")
    group.addoption("--kvparity-engine-arg", action="append", default=[], metavar="K=V",
                    help="adapter argument (repeatable)")
    group.addoption("--kvparity-profile", default="dev", choices=["dev", "ci", "nightly"])
    group.addoption("--kvparity-report-dir", default="reports")
    group.addoption("--kvparity-seed", type=int, default=None)
    group.addoption("--kvparity-checks", default="", help="comma-separated check names (default: all)")


@pytest.fixture(scope="session")
def kvparity_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    cfg = request.config
    name = cfg.getoption("--kvparity-engine", default=None)
    if not name:
        pytest.skip("no --kvparity-engine given")
    from conformance.registry import parse_engine_args

    return {"name": name, "args": parse_engine_args(cfg.getoption("--kvparity-engine-arg") or []),
            "profile": cfg.getoption("--kvparity-profile"), "report_dir": cfg.getoption("--kvparity-report-dir"),
            "seed": cfg.getoption("--kvparity-seed"),
            "checks": [c for c in (cfg.getoption("--kvparity-checks") or "").split(",") if c.strip()] or None}


@pytest.fixture(scope="session")
def kvparity_engine(kvparity_options: dict[str, Any]) -> Iterator[Any]:
    from conformance.registry import load_engine

    engine = load_engine(kvparity_options["name"], kvparity_options["args"])
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="session")
def kvparity_outcome(kvparity_engine: Any, kvparity_options: dict[str, Any]) -> Any:
    """One Hypothesis-driven run of the whole suite, shared by the per-check tests."""
    from conformance.runner import run_suite

    o = kvparity_options
    return run_suite(kvparity_engine, engine_name=o["name"], engine_args=o["args"], profile=o["profile"],
                     checks=o["checks"], report_dir=o["report_dir"], seed=o["seed"])
