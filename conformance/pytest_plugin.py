"""pytest11 plugin: `pytest --pyargs conformance --kvparity-engine NAME` runs the suite as pytest tests.

Only options and fixtures live here, and nothing heavy is imported until a fixture is used, so the plugin
is inert in every other pytest run (the project's own `pytest tests/` included).

Fail closed, as `kvparity run` does: an inconclusive check (a claimed capability never exercised, an
oracle that could not decide) fails its test unless `--kvparity-allow-inconclusive` is given — a CI job
must not go green on a run that proved nothing. Bad option values are a usage error before anything runs.

Under pytest-xdist the work is split, not repeated: the Hypothesis stream runs once per pytest session
(the first worker that needs it takes a lock under the session's shared temporary directory, runs it and
leaves the path of its run directory; the others wait on the lock and read that run's `results.json`),
while the state-machine test runs on another worker in parallel. Only a worker that runs the stream or
the state machine builds an engine. Without xdist the stream runs in-process, as before.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any, Iterator

import pytest

DEFAULT_REPORT_DIR = ".kvparity/runs"
DEFAULT_TIMEOUT_S = 300.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvparity", "kvparity conformance suite")
    group.addoption("--kvparity-engine", default=None, metavar="NAME",
                    help="engine adapter to test (entry-point name or module:Class); without it the suite skips")
    group.addoption("--kvparity-engine-arg", action="append", default=[], metavar="K=V",
                    help="adapter argument (repeatable)")
    group.addoption("--kvparity-profile", default="dev", choices=["dev", "ci", "nightly"])
    group.addoption("--kvparity-report-dir", default=DEFAULT_REPORT_DIR,
                    help=f"where run directories go (default: {DEFAULT_REPORT_DIR})")
    group.addoption("--kvparity-seed", type=int, default=None)
    group.addoption("--kvparity-checks", default="", help="comma-separated check names (default: all)")
    group.addoption("--kvparity-timeout", default=str(DEFAULT_TIMEOUT_S), metavar="SECONDS",
                    help=f"limit on each engine call; a call past it is an engine error (default: {DEFAULT_TIMEOUT_S:g})")
    group.addoption("--kvparity-max-examples", default=None, metavar="N",
                    help="Hypothesis examples for the stream (default: the profile's); the state machine runs "
                         "about a quarter as many")
    group.addoption("--kvparity-allow-inconclusive", action="store_true", default=False,
                    help="report an inconclusive check as skipped instead of failed")


def pytest_configure(config: pytest.Config) -> None:
    """Reject bad option values at once, with the option's name, before any engine is built."""
    timeout_value(config)
    max_examples_value(config)


def timeout_value(config: pytest.Config) -> float:
    """`--kvparity-timeout` as seconds: a finite number > 0 (0 or inf would mean "never time out")."""
    raw = config.getoption("--kvparity-timeout", default=str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise pytest.UsageError(f"--kvparity-timeout must be a finite number of seconds > 0, got {raw!r}")
    return value


def max_examples_value(config: pytest.Config) -> int | None:
    """`--kvparity-max-examples` as an int >= 1, or None for the profile's own count."""
    raw = config.getoption("--kvparity-max-examples", default=None)
    if raw is None:
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise pytest.UsageError(f"--kvparity-max-examples must be an integer >= 1, got {raw!r}")
    return value


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
            "checks": [c for c in (cfg.getoption("--kvparity-checks") or "").split(",") if c.strip()] or None,
            "timeout_s": timeout_value(cfg), "max_examples": max_examples_value(cfg),
            "allow_inconclusive": bool(cfg.getoption("--kvparity-allow-inconclusive"))}


@pytest.fixture(scope="session")
def kvparity_engine(kvparity_options: dict[str, Any]) -> Iterator[Any]:
    from conformance.registry import load_engine

    engine = load_engine(kvparity_options["name"], kvparity_options["args"])
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="session")
def kvparity_outcome(request: pytest.FixtureRequest, kvparity_options: dict[str, Any],
                     tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One Hypothesis-driven run of the whole suite, shared by the per-check tests (and, under xdist,
    by every worker of the session: see the module docstring)."""
    # An xdist worker is known by its `workerinput`, not by PYTEST_XDIST_WORKER: that variable is
    # inherited by any pytest a worker starts, which is not a worker of this session.
    if not hasattr(request.config, "workerinput"):
        return run_stream(request, kvparity_options)
    shared = shared_outcome_file(request.config, tmp_path_factory)
    with exclusive_lock(shared.with_name(shared.name + ".lock")):
        if shared.is_file():
            return read_shared_outcome(shared)
        try:
            outcome = run_stream(request, kvparity_options)
        except BaseException as exc:
            # The others must not run the stream again (it would fail the same way, once per worker).
            shared.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            raise
        shared.write_text(json.dumps({"run_dir": str(Path(outcome.run_dir).resolve())}))
        return outcome


def run_stream(request: pytest.FixtureRequest, o: dict[str, Any]) -> Any:
    """Build the engine (only now: a worker that reads another's outcome never does) and run the suite
    from the engine's default configuration, as `kvparity run` does on a fresh engine — the state
    machine may have left a shared engine anywhere in its config space."""
    from conformance.runner import run_suite
    from conformance.stateful import default_capabilities

    engine = request.getfixturevalue("kvparity_engine")
    default_capabilities(engine, o["timeout_s"])
    outcome = run_suite(engine, engine_name=o["name"], engine_args=o["args"], profile=o["profile"],
                        checks=o["checks"], report_dir=o["report_dir"], seed=o["seed"],
                        max_examples=o["max_examples"], timeout_s=o["timeout_s"])
    if outcome.interrupted:  # run_suite kept the history and wrote the report; the session ends here
        pytest.exit(f"kvparity run interrupted; report {outcome.run_dir}", returncode=130)
    return outcome


def shared_outcome_file(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A path every xdist worker of this session agrees on and no other session uses: the session's
    base temporary directory (each worker's is a child of it), named by the test run's id."""
    uid = config.workerinput["testrunuid"]  # type: ignore[attr-defined]
    return tmp_path_factory.getbasetemp().parent / f"kvparity-outcome-{uid}.json"


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if absent) for the block; waits for it."""
    import fcntl

    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class SharedOutcome:
    """The stream run another worker made, as the per-check tests read it: its run directory and its
    analysis, rebuilt from that run's `results.json`."""

    def __init__(self, run_dir: Path, analysis: Any) -> None:
        self.run_dir, self.analysis = run_dir, analysis

    @property
    def verdict(self) -> str:
        return self.analysis.verdict

    @property
    def exit_code(self) -> int:
        return self.analysis.exit_code


def read_shared_outcome(shared: Path) -> SharedOutcome:
    """The outcome the first worker left, or that worker's error (raised here too, once per test)."""
    note = json.loads(shared.read_text())
    if "error" in note:
        pytest.fail(f"the stream run on another xdist worker failed: {note['error']}", pytrace=False)
    run_dir = Path(note["run_dir"])
    try:
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError) as exc:
        pytest.fail(f"cannot read the stream run's results in {run_dir}: {exc}", pytrace=False)
    return SharedOutcome(run_dir, analysis_from_results(results))


def analysis_from_results(results: dict[str, Any]) -> Any:
    """An `Analysis` equal (for what the tests read: statuses, failures, notes, errors) to the one the
    run computed, from the `results.json` it wrote."""
    from conformance.analysis import Analysis
    from conformance.verdicts import CheckResult, Failure

    checks = {name: CheckResult(name, c["status"], [Failure.from_json(f) for f in c.get("failures", [])],
                                c.get("notes", []), c.get("stats", {}))
              for name, c in results.get("checks", {}).items()}
    return Analysis(checks=checks, errors=list(results.get("errors", [])))
