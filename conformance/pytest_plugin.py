"""pytest11 plugin: `pytest --pyargs conformance --kvparity-engine NAME` runs the suite as pytest tests.

Only options and fixtures live here, and nothing heavy is imported until a fixture is used, so the plugin
is inert in every other pytest run (the project's own `pytest tests/` included).

Fail closed, as `kvparity run` does: an inconclusive check (a claimed capability never exercised, an
oracle that could not decide) fails its test unless `--kvparity-allow-inconclusive` is given — a CI job
must not go green on a run that proved nothing. Bad option values are a usage error before anything runs.
No engine runs in the pytest process: the stream is `python -m kvparity run` in a child and the state
machine a child of its own (`conformance.plugin_runs`), so an engine that calls `os._exit(0)` or hangs
fails the session instead of ending it green; a child that dies, or whose exit code disagrees with its
`results.json`, is an error. The session's last lines say where the run's report is.

Under pytest-xdist the work is split, not repeated: the Hypothesis stream runs once per pytest session
(the first worker that needs it takes a lock under the session's shared temporary directory, runs it and
leaves the path of its run directory; the others wait on the lock and read that run's `results.json`),
while the state-machine test runs on another worker in parallel.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any, Iterator

import pytest

from conformance.arguments import DEFAULT_REPORT_DIR, DEFAULT_TIMEOUT_S
from conformance.exit_codes import ExitCode



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
    group.addoption("--kvparity-shard", default=None, metavar="I/N",
                    help="run the stream as shard I of N of a campaign (`kvparity run --shard`): one CI-matrix job "
                         "each, then `kvparity merge` over their run folders")
    group.addoption("--kvparity-database", default=None, metavar="DIR|redis://HOST:PORT/N",
                    help="Hypothesis' example database for the stream (`kvparity run --database`): shared by a "
                         "campaign's shards, a failure one found is replayed first by the others")


def pytest_configure(config: pytest.Config) -> None:
    """Reject bad option values at once, with the option's name, before any engine is built."""
    timeout_value(config)
    max_examples_value(config)
    shard_value(config)
    database_value(config)


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


def shard_value(config: pytest.Config) -> str | None:
    """`--kvparity-shard` as given (I/N, 1 <= I <= N), or None: not a shard."""
    from conformance.contract import UsageError
    from conformance.shards import parse_shard

    raw = config.getoption("--kvparity-shard", default=None)
    if raw is None:
        return None
    try:
        return str(parse_shard(raw))
    except UsageError as exc:
        raise pytest.UsageError(f"--kvparity-shard must be I/N with 1 <= I <= N, got {raw!r}: {exc}") from None


def database_value(config: pytest.Config) -> str | None:
    """`--kvparity-database`: a folder, or a redis URL naming this machine (its reachability is checked by
    the run, before the engine is built); None for the default folder. Empty is refused: an unset CI
    variable would otherwise give each shard a database of its own."""
    from conformance.contract import UsageError
    from conformance.example_database import check_url, is_url

    raw = config.getoption("--kvparity-database", default=None)
    if raw is None:
        return None
    try:
        if not str(raw).strip():
            raise UsageError("an empty path or address (an unset variable?)")
        return check_url(raw) if is_url(raw) else raw
    except UsageError as exc:
        raise pytest.UsageError(f"--kvparity-database must be a folder or redis://HOST:PORT/N on this machine, "
                                f"got {raw!r}: {exc}") from None


@pytest.fixture(scope="session")
def kvparity_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    cfg = request.config
    name = cfg.getoption("--kvparity-engine", default=None)
    if not name:
        pytest.skip("no --kvparity-engine given")
    from conformance.engines import parse_engine_args

    return {"name": name, "args": parse_engine_args(cfg.getoption("--kvparity-engine-arg") or []),
            "profile": cfg.getoption("--kvparity-profile"), "report_dir": cfg.getoption("--kvparity-report-dir"),
            "seed": cfg.getoption("--kvparity-seed"),
            "checks": [c for c in (cfg.getoption("--kvparity-checks") or "").split(",") if c.strip()] or None,
            "timeout_s": timeout_value(cfg), "max_examples": max_examples_value(cfg),
            "allow_inconclusive": bool(cfg.getoption("--kvparity-allow-inconclusive")),
            "shard": shard_value(cfg), "database": database_value(cfg)}


@pytest.fixture(scope="session")
def kvparity_engine(kvparity_options: dict[str, Any]) -> Iterator[Any]:
    """The engine, built in this process, for a user's own tests. The suite's tests do not use it: they
    drive the engine in child processes (`conformance.plugin_runs`), where it cannot end the session."""
    from conformance.engines import load_engine

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
        return run_stream(request.config, kvparity_options)
    shared = shared_outcome_file(request.config, tmp_path_factory)
    with exclusive_lock(shared.with_name(shared.name + ".lock")):
        if shared.is_file():
            return read_shared_outcome(request.config, shared)
        try:
            outcome = run_stream(request.config, kvparity_options)
        except BaseException as exc:
            # The others must not run the stream again (it would fail the same way, once per worker).
            noted = request.config.stash.get(RUN_DIRS, [])  # the folder a dead run left, if any
            shared.write_text(json.dumps({"error": str(exc), "run_dir": noted[-1] if noted else None}))
            raise
        shared.write_text(json.dumps({"run_dir": str(outcome.run_dir)}))
        return outcome


def run_stream(config: pytest.Config, o: dict[str, Any]) -> Any:
    """Run the suite as `kvparity run` does, in a supervised child (`conformance.plugin_runs`), from a
    freshly built engine. A child that died, or whose exit code and results disagree, fails every
    per-check test; an interrupted one ends the session with 130."""
    from conformance.plugin_runs import Interrupted, RunProblem
    from conformance.plugin_runs import run_stream as run_in_child

    try:
        outcome = run_in_child(o)
        remember_run_dir(config, outcome.run_dir)
        return outcome
    except RunProblem as exc:  # failed outside the handler: one message, no "during handling" chain
        problem = exc
    remember_run_dir(config, problem.run_dir)
    if isinstance(problem, Interrupted):
        pytest.exit(str(problem), returncode=ExitCode.INTERRUPTED)
    pytest.fail(f"the stream run failed: {problem}", pytrace=False)


def run_machine(o: dict[str, Any]) -> None:
    """The state-machine test's body: the machine in a supervised child; a failure, an engine error, a
    dead child or a disagreeing exit code fails the test, an interruption ends the session."""
    from conformance.plugin_runs import Interrupted, RunProblem
    from conformance.plugin_runs import run_machine as run_in_child

    try:
        run_in_child(o)
        return
    except RunProblem as exc:  # failed outside the handler: one message, no "during handling" chain
        problem = exc
    if isinstance(problem, Interrupted):
        pytest.exit(str(problem), returncode=ExitCode.INTERRUPTED)
    pytest.fail(str(problem), pytrace=False)


RUN_DIRS = pytest.StashKey[list]()


def remember_run_dir(config: pytest.Config, run_dir: Any) -> None:
    """Note a run folder for the session's closing summary; an xdist worker passes it to the controller
    through `workeroutput` (sent when the worker ends)."""
    if not run_dir:
        return
    dirs = config.stash.setdefault(RUN_DIRS, [])
    if str(run_dir) not in dirs:
        dirs.append(str(run_dir))
    if hasattr(config, "workeroutput"):
        config.workeroutput["kvparity_run_dirs"] = list(dirs)  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect the run folders a worker noted."""
    for run_dir in getattr(node, "workeroutput", {}).get("kvparity_run_dirs", []):
        remember_run_dir(node.config, run_dir)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say where the report went and the seed that reruns its stream (nothing in a session that ran no
    kvparity stream)."""
    for run_dir in config.stash.get(RUN_DIRS, []):
        start = recorded_start(Path(run_dir))
        seed = start.get("seed")
        # a shard's seed is its own, derived from the campaign's: kept, --kvparity-shard would derive it again
        alone = " without --kvparity-shard" if start.get("shard") else ""
        terminalreporter.write_line(f"kvparity report: {Path(run_dir) / 'report.md'}"
                                    + (f" (seed {seed}: --kvparity-seed {seed}{alone} reruns the stream)"
                                       if isinstance(seed, int) else f" (seed {seed})" if seed else ""))


def recorded_start(run_dir: Path) -> dict[str, Any]:
    """The run's `run_start` event (its seed: an int, or "derandomised"); {} where unreadable."""
    try:
        with open(run_dir / "history.jsonl", encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return {}
    return first if isinstance(first, dict) and first.get("event") == "run_start" else {}


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


def read_shared_outcome(config: pytest.Config, shared: Path) -> Any:
    """The outcome the first worker left (already checked against its exit code there), or that
    worker's error (raised here too, once per test)."""
    from conformance.plugin_runs import RunProblem, read_outcome

    note = json.loads(shared.read_text())
    remember_run_dir(config, note.get("run_dir"))
    if "error" in note:
        pytest.fail(f"the stream run on another xdist worker failed: {note['error']}", pytrace=False)
    run_dir = Path(note["run_dir"])
    try:
        results = json.loads((run_dir / "results.json").read_text())
        return read_outcome(run_dir, int(results.get("exit_code", -1)))
    except (OSError, ValueError, RunProblem) as exc:
        pytest.fail(f"cannot read the stream run's results in {run_dir}: {exc}", pytrace=False)
