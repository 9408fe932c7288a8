"""Drive an engine through scenarios, write the history first, then check.

`ScenarioRunner` executes one scenario (resolving conversation continuations from the engine's own
outputs), records every call in the history and asks the memoized oracle for baselines. `run_suite` is
the whole product in one call: a Hypothesis `@given` over scenarios against one engine instance, each
example checked so failures shrink, then the stored history re-analysed into per-check verdicts and
written as a report. Any engine crash, hang or malformed answer ends the run as `error` with a one-line
cause; the partial history stays on disk.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from attrs import define
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase

from conformance.analysis import Analysis, analyse, example_failures, select_checks
from conformance.contract import FINISH_REASONS, Capabilities, Engine, EngineError, Introspectable, Request, Result
from conformance.history import HistoryWriter, encode, parse
from conformance.oracle import Oracle
from conformance.strategies import Configure, Continuation, Reset, Step, scenarios
from conformance.verdicts import CheckResult, Failure

T = TypeVar("T")

# --------------------------------------------------------------------------- Hypothesis profiles

_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
          HealthCheck.large_base_example]
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
# An explicit parent: on CI Hypothesis loads its *own* "ci" profile, and a profile without a parent
# would silently inherit it. Ours are namespaced and rooted at "default".
settings.register_profile("kvparity-dev", parent=settings.get_profile("default"), max_examples=12,
                          deadline=None, suppress_health_check=_QUIET, phases=_PHASES, print_blob=True)
settings.register_profile("kvparity-ci", parent=settings.get_profile("default"), max_examples=100,
                          deadline=None, derandomize=True, suppress_health_check=_QUIET, phases=_PHASES,
                          print_blob=True)
settings.register_profile("kvparity-nightly", parent=settings.get_profile("default"), max_examples=1000,
                          deadline=None, suppress_health_check=_QUIET, phases=_PHASES, print_blob=True)
PROFILES = {"dev": 4, "ci": 6, "nightly": 8}  # profile -> max steps per scenario


def profile_settings(profile: str) -> settings:
    if profile not in PROFILES:
        from conformance.contract import UsageError

        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    return settings.get_profile(f"kvparity-{profile}")


# --------------------------------------------------------------------------- one scenario


class _Worker:
    """One long-lived daemon thread that runs engine calls, so a timeout can be enforced without
    paying a thread start per call. A call that hangs abandons the worker; the next call gets a new one."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="kvparity-engine-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
            done.set()


_worker: _Worker | None = None


def call_with_timeout(fn: Callable[[], T], timeout: float, what: str) -> T:
    """Run `fn` on the engine-call thread; a hang past `timeout` becomes an EngineError (the thread is
    abandoned, which is why the run then stops: the engine is no longer trustworthy)."""
    global _worker
    if _worker is None:
        _worker = _Worker()
    box: dict[str, Any] = {}
    done = threading.Event()
    _worker.jobs.put((fn, box, done))
    if not done.wait(timeout):
        _worker = None
        raise EngineError(f"{what} timed out after {timeout:g}s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, EngineError):
            raise exc
        raise EngineError(f"{what} raised {type(exc).__name__}: {one_line(exc)}") from exc
    return box["value"]


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:300]


def scalars(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar keys of a snapshot (what the checks read). Per-block listings can be megabytes per
    batch; the history keeps the counts, the engine's own debugging keeps the rest."""
    if not isinstance(snapshot, Mapping):
        raise EngineError(f"snapshot() returned {type(snapshot).__name__}, not a mapping")
    return {str(k): v for k, v in snapshot.items() if v is None or isinstance(v, (bool, int, float, str))}


def validate_results(requests: Sequence[Request], results: Any, caps: Capabilities) -> list[Result]:
    """Malformed answers are engine errors, never silently checked."""
    if not isinstance(results, (list, tuple)) or len(results) != len(requests):
        raise EngineError(f"run() returned {type(results).__name__} of length "
                          f"{len(results) if hasattr(results, '__len__') else '?'} for {len(requests)} requests")
    for q, r in zip(requests, results):
        if not isinstance(r, Result):
            raise EngineError(f"run() returned {type(r).__name__} for request {q.id}, not Result")
        if r.request_id != q.id:
            raise EngineError(f"result for {r.request_id!r} where {q.id!r} was expected (results out of order)")
        if r.finish_reason not in FINISH_REASONS:
            raise EngineError(f"request {q.id}: unknown finish_reason {r.finish_reason!r}")
        if any(not 0 <= t < caps.vocab_size for t in r.output):
            raise EngineError(f"request {q.id}: output token outside the vocabulary of {caps.vocab_size}")
    return list(results)


class ScenarioRunner:
    """Executes scenarios against one engine, writing every call to the history as it happens."""

    def __init__(self, engine: Engine, writer: HistoryWriter, oracle: Oracle, caps: Capabilities,
                 timeout_s: float = 300.0) -> None:
        self.engine, self.writer, self.oracle, self.caps, self.timeout_s = engine, writer, oracle, caps, timeout_s
        self.introspect = caps.introspection and isinstance(engine, Introspectable)
        self.resolved: dict[str, tuple[Request, Result]] = {}

    def run(self, steps: Sequence[Step], example: int) -> None:
        """Run one scenario from a cold cache. Raises EngineError after recording an `error` event."""
        self.begin(example)
        for step in steps:
            self.step(step)

    def begin(self, example: int) -> None:
        """Start an example (or a stateful session): record it and flush the engine's cache."""
        self.writer.append("example", index=example)
        self.resolved = {}
        self._guarded([], self.reset)

    def step(self, step: Step) -> list[Request]:
        """Execute one step; returns the resolved requests of a batch (empty otherwise)."""
        if isinstance(step, Configure):
            self.writer.append("config", config=dict(step.config))
            self._guarded([], lambda: call_with_timeout(lambda: self.engine.configure(dict(step.config)),
                                                       self.timeout_s, "configure"))
            return []
        if isinstance(step, Reset):
            self._guarded([], self.reset)
            return []
        pending = [self.resolve(item, self.resolved) for item in step.items]
        self._guarded(pending, lambda: self.batch(pending, self.resolved))
        return pending

    def _guarded(self, pending: list[Request], action: Callable[[], Any]) -> None:
        """Run an engine action; on any failure record an `error` event (with the requests in flight and,
        for a failed batch of an introspectable engine, a snapshot of its pool) and raise EngineError with
        a one-line cause."""
        try:
            action()
        except EngineError as exc:
            self.writer.append("error", cause=one_line(exc), requests=[encode(q) for q in pending],
                               snapshot=self._snapshot_after_failure(pending))
            raise
        except Exception as exc:  # noqa: BLE001 - anything unexpected is an engine error with a cause
            cause = f"{type(exc).__name__}: {one_line(exc)}"
            self.writer.append("error", cause=cause, requests=[encode(q) for q in pending],
                               snapshot=self._snapshot_after_failure(pending))
            raise EngineError(cause) from exc

    def _snapshot(self) -> dict[str, Any] | None:
        """The white-box snapshot's scalars, or None for an engine that is not introspectable."""
        if not self.introspect:
            return None
        return scalars(call_with_timeout(self.engine.snapshot, self.timeout_s, "snapshot"))  # type: ignore[attr-defined]

    def _snapshot_after_failure(self, pending: list[Request]) -> dict[str, Any] | None:
        """The pool after a batch the engine failed: a stall is often a leak's last symptom (blocks never
        freed until nothing can be scheduled), and the snapshot says which. None when there is none."""
        if not pending:
            return None
        try:
            return self._snapshot()
        except Exception:  # noqa: BLE001 - the error being recorded matters more than its snapshot
            return None

    def reset(self) -> None:
        call_with_timeout(self.engine.reset, self.timeout_s, "reset")
        self.writer.append("reset", snapshot=self._snapshot())

    def resolve(self, item: Request | Continuation, resolved: Mapping[str, tuple[Request, Result]]) -> Request:
        if isinstance(item, Request):
            return item
        parent = resolved.get(item.parent)
        stop_ids = item.stop_ids
        if parent is None:  # parent never ran (e.g. shrunk away): the turn starts a fresh conversation
            prompt = item.extra
        elif item.restop is not None and parent[1].output:  # the parent again, stopping where it went
            prompt = parent[0].prompt
            stop_ids = (parent[1].output[item.restop % len(parent[1].output)],)
        else:
            prompt = parent[0].prompt + tuple(parent[1].output) + item.extra
        return Request(item.id, prompt[: item.max_prompt] or item.extra[:1], item.max_tokens, stop_ids,
                       item.identity)

    def batch(self, requests: list[Request], resolved: dict[str, tuple[Request, Result]]) -> None:
        raw = call_with_timeout(lambda: self.engine.run(list(requests)), self.timeout_s, "run")
        results = validate_results(requests, raw, self.caps)
        self.writer.append("batch", requests=requests, results=results, snapshot=self._snapshot())
        for q, r in zip(requests, results):
            resolved[q.id] = (q, r)
        for q in requests:
            call_with_timeout(lambda q=q: self.oracle(q), self.timeout_s, "baseline")


def replay(engine: Engine, caps: Capabilities, steps: Sequence[Step], check: str,
           timeout_s: float = 300.0) -> tuple[CheckResult, str | None]:
    """Run `steps` once on `engine` (one example, from a cold cache) and apply `check` to what was
    recorded. Returns the check's result and the engine error that cut the run short, if one did: a
    crash decides nothing by itself, but what was recorded before it (a failed batch's snapshot) may."""
    writer = HistoryWriter(None)
    writer.append("run_start", engine="replay", engine_args={}, capabilities=caps)
    oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
    crashed = None
    try:
        ScenarioRunner(engine, writer, oracle, caps, timeout_s).run(list(steps), 0)
    except EngineError as exc:
        crashed = str(exc)
    return analyse(parse(writer.events), [check]).checks[check], crashed


# --------------------------------------------------------------------------- the whole run


class ConformanceFailure(AssertionError):
    """Raised inside a Hypothesis example so the example shrinks; carries the failures found."""

    def __init__(self, failures: list[Failure]) -> None:
        self.failures = failures
        super().__init__("; ".join(f"[{f.check}] {f.title}" for f in failures[:5]))


class _EngineBroken(BaseException):
    """Stops Hypothesis at once: an engine that crashed or hung is not worth shrinking against."""


@define
class RunOutcome:
    run_dir: Path
    analysis: Analysis
    duration_s: float
    examples: int

    @property
    def verdict(self) -> str:
        return self.analysis.verdict

    @property
    def exit_code(self) -> int:
        return self.analysis.exit_code


def versions(caps: Capabilities) -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version(), "engine": caps.version}
    for dist in ("kvparity", "hypothesis"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def new_run_dir(report_dir: str | os.PathLike[str], engine_name: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    base = Path(report_dir) / engine_name.replace(":", "_").replace("/", "_")
    run_dir = base / (stamp + (f"-{worker}" if worker else ""))
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = base / f"{stamp}-{n}" if not worker else base / f"{stamp}-{worker}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir


def run_suite(engine: Engine, *, engine_name: str, engine_args: Mapping[str, str] | None = None,
              profile: str = "dev", checks: Sequence[str] | None = None,
              report_dir: str | os.PathLike[str] = "reports", seed: int | None = None,
              max_examples: int | None = None, timeout_s: float = 300.0,
              database_dir: str | os.PathLike[str] | None = None, shrink: bool = True) -> RunOutcome:
    """Run the suite against a constructed engine and write `report_dir/<engine>/<run>/`."""
    from conformance.report import write_report

    names = select_checks(checks)
    base_settings = profile_settings(profile)
    started = time.monotonic()
    run_dir = new_run_dir(report_dir, engine_name)
    writer = HistoryWriter(run_dir / "history.jsonl")
    examples = 0
    try:
        caps = call_with_timeout(engine.capabilities, timeout_s, "capabilities")
        if not isinstance(caps, Capabilities):
            raise EngineError(f"capabilities() returned {type(caps).__name__}, not Capabilities")
        writer.append("run_start", engine=engine_name, engine_args=dict(engine_args or {}), capabilities=caps,
                      versions=versions(caps), seed=seed, profile=profile, checks=names)
        oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
        runner = ScenarioRunner(engine, writer, oracle, caps, timeout_s)
        db = DirectoryBasedExampleDatabase(str(Path(database_dir or ".hypothesis") / "kvparity" /
                                               engine_name.replace(":", "_").replace("/", "_")))
        overrides: dict[str, Any] = {"database": db}
        if max_examples is not None:
            overrides["max_examples"] = max_examples
        if seed is not None:
            overrides["derandomize"] = False
        if not shrink:  # faster when only the verdict matters (the suite's own tests)
            overrides["phases"] = tuple(p for p in _PHASES if p is not Phase.shrink)

        @settings(base_settings, **overrides)
        @given(scenarios(caps, max_steps=PROFILES[profile]))
        def conformance_example(scenario: tuple[Step, ...]) -> None:
            nonlocal examples
            start = len(writer.events)
            try:
                runner.run(scenario, examples)
            except EngineError as exc:
                raise _EngineBroken(str(exc)) from exc
            finally:
                examples += 1
            h = parse(writer.events[start:])
            h.capabilities, h.baselines = caps, oracle.cache
            failures = example_failures(h, names)
            if failures:
                raise ConformanceFailure(failures)

        test = hypothesis_seed(seed)(conformance_example) if seed is not None else conformance_example
        try:
            test()
        except _EngineBroken:
            pass  # already recorded as an `error` event
        except (ConformanceFailure, AssertionError):
            pass  # recorded in the history; analysis below reports the shrunk witness
        except BaseException as exc:  # noqa: BLE001 - ExceptionGroup of failures, Flaky, health checks
            if isinstance(exc, KeyboardInterrupt):
                writer.append("error", cause="interrupted")
                raise
            if not _only_conformance(exc):
                writer.append("error", cause=f"{type(exc).__name__}: {one_line(exc)}")
        writer.append("run_end", examples=examples)
    except EngineError as exc:
        writer.append("error", cause=one_line(exc))
    finally:
        writer.close()
    history = parse(writer.events)
    analysis = analyse(history, names)
    outcome = RunOutcome(run_dir, analysis, time.monotonic() - started, examples)
    write_report(run_dir, history, analysis, duration_s=outcome.duration_s)
    return outcome


def _only_conformance(exc: BaseException) -> bool:
    """True for Hypothesis' way of reporting several distinct ConformanceFailures (an ExceptionGroup),
    or a flaky one (engine nondeterminism shows up in the history and the analysis anyway)."""
    inner = getattr(exc, "exceptions", None)
    if inner:
        return all(_only_conformance(e) for e in inner)
    return isinstance(exc, ConformanceFailure) or type(exc).__name__ in ("Flaky", "FlakyFailure")
