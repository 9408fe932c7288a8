"""Drive an engine through scenarios, write the history first, then check.

`ScenarioRunner` executes one scenario (resolving conversation continuations from the engine's own
outputs), records every call in the history and asks the memoized oracle for baselines. `run_suite` is
the whole product in one call: a Hypothesis `@given` over scenarios against one engine instance, each
example checked so failures shrink, then the stored history re-analysed into per-check verdicts and
written as a report. Any engine crash, hang or malformed answer ends the run as `error` with a one-line
cause; the partial history stays on disk. So does a run the user interrupts (Ctrl-C) or whose history
cannot be written (disk full): what was recorded is kept, the verdict is `error`.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs
from attrs import define
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase

from conformance import known as known_mod
from conformance import step_counts, stopping, validation
from conformance.exit_codes import ExitCode
from conformance.analysis import Analysis, analyse, example_verdicts, failures_of, select_checks
from conformance.calls import EngineCalls, one_line
from conformance.checks import CHECKS
from conformance.exit_codes import ExitCode
from conformance.completion import MarkedScenario, complete
from conformance.contract import Capabilities, Engine, EngineError, Introspectable, Request, Result, UsageError
from conformance.history import HistoryBuilder, HistoryWriteError, HistoryWriter, parse
from conformance.oracle import Oracle
from conformance.progress import Progress
from conformance.hunt import Hunt
from conformance.shrink_budget import ShrinkBudget, ShrinkTimeUp
from conformance.scenario import Configure, Continuation, Reset, Step
from conformance.strategies import scenarios
from conformance.verdicts import CheckResult, Failure

DEFAULT_REPORT_DIR = ".kvparity/runs"  # untracked (git-ignored): a user's run never writes into reports/

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
PROFILES = {"dev": 4, "ci": 5, "nightly": 8}  # profile -> max steps per scenario


def profile_settings(profile: str) -> settings:
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    return settings.get_profile(f"kvparity-{profile}")


# --------------------------------------------------------------------------- one scenario


def restop_token(output: Sequence[int], j: int) -> int:
    """The stop id that ends a `restop` turn: the parent's token at output position j (modulo its
    length), or, where that token already occurs earlier in the output (a small model repeats itself;
    the stop would fire there, at position 0 most often, before any draft), the next position's token
    that does not. Only when no later position has a new token is the stop allowed to fire early."""
    n = len(output)
    for i in [*range(j % n, n), *range(1, j % n)]:
        if i and output[i] not in output[:i]:
            return output[i]
    return output[j % n]


class ScenarioRunner:
    """Executes scenarios against one engine, writing every call to the history as it happens."""

    def __init__(self, engine: Engine, writer: HistoryWriter, oracle: Oracle, caps: Capabilities,
                 timeout_s: float = 300.0, calls: EngineCalls | None = None) -> None:
        self.engine, self.writer, self.oracle, self.caps = engine, writer, oracle, caps
        self.calls = calls or EngineCalls(timeout_s)
        self.introspect = caps.introspection and isinstance(engine, Introspectable)
        self.resolved: dict[str, tuple[Request, Result]] = {}
        self.on_run: Callable[[Sequence[Step]], None] = lambda steps: None  # told each scenario it runs
        self.budget: Callable[[], None] | None = None  # run_suite's shrink budget (conformance.shrink_budget)

    def run(self, steps: Sequence[Step], example: int) -> None:
        """Run one scenario from a cold cache. Raises EngineError after recording an `error` event.
        A completion example (`MarkedScenario`) says so in its `example` event. A stop signal that came
        between examples stops the run here (not in the stream's test function, whose source seeds the
        derandomised stream: an added line there draws another CI stream)."""
        stopping.check()
        if self.budget is not None:
            self.budget()
        self.on_run(steps)
        self.begin(example, **(steps.marks if isinstance(steps, MarkedScenario) else {}))
        for step in steps:
            self.step(step)

    def begin(self, example: int, **marks: Any) -> None:
        """Start an example (or a stateful session): record it and flush the engine's cache."""
        self.writer.append("example", index=example, **marks)
        self.resolved = {}
        self._guarded([], self.reset)

    def step(self, step: Step) -> list[Request]:
        """Execute one step; returns the resolved requests of a batch (empty otherwise)."""
        if isinstance(step, Configure):
            self.writer.append("config", config=dict(step.config))
            self._guarded([], lambda: self.calls(lambda: self.engine.configure(dict(step.config)), "configure"))
            return []
        if isinstance(step, Reset):
            self._guarded([], self.reset)
            return []
        pending = [self.resolve(item, self.resolved) for item in step.items]
        self._guarded(pending, lambda: self.batch(pending, self.resolved))
        return pending

    def _guarded(self, pending: list[Request], action: Callable[[], Any]) -> None:
        """Run an engine action; on any failure record an `error` event (for a failed batch of an
        introspectable engine with a snapshot of its pool; the batch's requests are already recorded by
        its `submit`) and raise EngineError with a one-line cause naming the requests in flight."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - anything unexpected is an engine error with a cause
            cause = one_line(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {one_line(exc)}"
            if pending:
                cause += f" (requests {', '.join(q.id for q in pending)})"
            self.writer.append("error", cause=cause, snapshot=self._snapshot_after_failure(pending))
            raise EngineError(cause) from exc

    def _snapshot(self) -> dict[str, Any] | None:
        """The white-box snapshot's scalars, or None for an engine that is not introspectable."""
        if not self.introspect:
            return None
        return validation.snapshot(self.calls(self.engine.snapshot, "snapshot"))  # type: ignore[attr-defined]

    def _snapshot_after_failure(self, pending: list[Request]) -> dict[str, Any] | None:
        """The pool after a batch the engine failed: a stall is often a leak's last symptom (blocks never
        freed until nothing can be scheduled), and the snapshot says which. None when there is none."""
        if not pending or self.calls.abandoned:  # a hung engine is not asked again
            return None
        try:
            return self._snapshot()
        except Exception:  # noqa: BLE001 - the error being recorded matters more than its snapshot
            return None

    def reset(self) -> None:
        self.calls(self.engine.reset, "reset")
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
            stop_ids = (restop_token(parent[1].output, item.restop),)
        else:
            prompt = parent[0].prompt + tuple(parent[1].output) + item.extra
        return Request(item.id, prompt[: item.max_prompt] or item.extra[:1], item.max_tokens, stop_ids,
                       item.identity)

    def batch(self, requests: list[Request], resolved: dict[str, tuple[Request, Result]]) -> None:
        """Record the requests, then call the engine: the request that kills an engine is in the history."""
        self.writer.append("submit", requests=requests)
        raw = self.calls(lambda: self.engine.run(list(requests)), "run")
        results = validation.results(requests, raw, self.caps)
        self.writer.append("batch", results=results, snapshot=self._snapshot())
        for q, r in zip(requests, results):
            resolved[q.id] = (q, r)
        for q, r in zip(requests, results):
            if r.finish_reason != "refused" and self.oracle.missing(q):  # computed on the engine-call thread, recorded from this one
                b = self.calls(lambda q=q: validation.baseline(q, self.engine.baseline(q), self.caps), "baseline")
                self.oracle.store(q, b)


def replay(engine: Engine, caps: Capabilities, steps: Sequence[Step], check: str,
           timeout_s: float = 300.0, calls: EngineCalls | None = None) -> tuple[CheckResult, str | None]:
    """Run `steps` once on `engine` (one example, from a cold cache) and apply `check` to what was
    recorded. Returns the check's result and the engine error that cut the run short, if one did: a
    crash decides nothing by itself, but what was recorded before it (a failed batch's snapshot) may."""
    writer = HistoryWriter(None)
    writer.append("run_start", engine="replay", engine_args={}, capabilities=caps)
    oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
    crashed = None
    own = calls is None
    calls = calls or EngineCalls(timeout_s)
    try:
        ScenarioRunner(engine, writer, oracle, caps, calls=calls).run(list(steps), 0)
    except EngineError as exc:
        crashed = str(exc)
    finally:
        if own:
            calls.close()
    writer.append("run_end", examples=1)
    return analyse(parse(writer.events), [check]).checks[check], crashed


# --------------------------------------------------------------------------- the whole run


class ConformanceFailure(AssertionError):
    """Raised inside a Hypothesis example so the example shrinks; carries the failures found."""

    def __init__(self, failures: list[Failure]) -> None:
        self.failures = failures
        super().__init__("; ".join(f"[{f.check}] {f.title}" for f in failures[:5]))


_STREAM_FAILURE = ConformanceFailure  # run_suite's stream test calls the hunt's under this name


class _EngineBroken(BaseException):
    """Stops Hypothesis at once: an engine that crashed or hung is not worth shrinking against."""


@define
class RunOutcome:
    run_dir: Path
    analysis: Analysis
    duration_s: float
    examples: int
    interrupted: bool = False  # the user stopped it (Ctrl-C): exit 130, the report says so
    abandoned: bool = False  # an engine call hung and its thread was left behind
    report_error: str | None = None  # the report files could not be written (disk full)
    first_failing: dict[str, int] = attrs.Factory(dict)  # check -> the first example that failed it
    closed: bool = False  # run_suite(close=True) closed the engine (its failure, if any, is in the history)
    stop_code: int = 130  # the exit code of an interrupted run: 128 + the signal (conformance.stopping)
    seed: int | None = None  # the Hypothesis seed the stream was drawn from (None: derandomised, as ci is)
    step_kinds: dict[str, int] = attrs.Factory(dict)  # kind -> steps drawn (conformance.step_counts)
    shrink_capped: bool = False  # shrinking ended at `max_shrink_seconds`: the witness is the smallest so far

    @property
    def verdict(self) -> str:
        return self.analysis.verdict

    @property
    def exit_code(self) -> int:
        return self.stop_code if self.interrupted else self.analysis.exit_code


def versions(caps: Capabilities) -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version(), "engine": caps.version}
    if caps.oracle:  # which oracle judged: the report's versions line names it
        out["oracle"] = caps.oracle
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
              report_dir: str | os.PathLike[str] = DEFAULT_REPORT_DIR, seed: int | None = None,
              max_examples: int | None = None, timeout_s: float = 300.0,
              database_dir: str | os.PathLike[str] | None = None, shrink: bool = True,
              run_dir: str | os.PathLike[str] | None = None, calls: EngineCalls | None = None,
              tolerance: float | None = None, calibration: str | None = None,
              progress: Progress | None = None, close: bool = False,
              known_findings: Sequence[Mapping[str, str]] | None = None, strict_known: bool = False,
              keep_looking: bool = True, max_shrink_seconds: float | None = None) -> RunOutcome:
    """Run the suite against a constructed engine and write `report_dir/<engine>/<run>/` (or `run_dir`).

    Fail closed: an engine error, a history that cannot be written and a Ctrl-C all end the run with
    what was recorded kept and analysed; only a run that wrote its `run_end` can pass. `progress`:
    told of every history event and finished example (`kvparity run` without `-q`).

    `close`: close the engine as the run's last engine call, before `run_end` and the report, so a close
    that raises or hangs is an `error` event of the history and every report file says so (`kvparity
    run`); a run the user interrupted is not closed here (its caller closes it after the report).

    `known_findings` (`--known`, conformance.known): failures with those signatures do not stop the run
    nor fail it; they are recorded and reported as known. Several bugs per run: each new signature
    stops Hypothesis and is shrunk on its own (conformance.hunt), then the run looks on, with the examples left
    (`keep_looking=False`: the first round only, as before issue 33; the fault zoo measures that).
    `max_shrink_seconds`: stop shrinking that long after the first failure (None: Hypothesis' own cap)."""
    from conformance.report import write_report

    names = select_checks(checks)
    base_settings = profile_settings(profile)
    if seed is None and not base_settings.derandomize:  # drawn, so every run records what reruns it;
        seed = random.randrange(2**32)  # not for ci: a seed there would replace its derandomised stream
    own_calls = calls is None
    calls = calls or EngineCalls(timeout_s)
    started = time.monotonic()
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir(report_dir, engine_name)
    builder = HistoryBuilder()  # the run's one History, growing as its events are written
    sink = builder.feed if progress is None else (lambda ev: (builder.feed(ev), progress.event(ev)))
    writer = HistoryWriter(run_dir / "history.jsonl", sink=sink)
    known: dict[int, dict[str, Any]] = {}  # example -> check -> result, computed once while running
    first_failing: dict[str, int] = {}  # check -> its first failing example (`kvparity run --minimise` starts there too)
    example_scoped = [n for n in names if CHECKS[n].scope == "example"]
    examples = 0
    interrupted, stop_code = False, ExitCode.INTERRUPTED
    closer = _Closer(engine, calls, close)
    hunt = Hunt({e["signature"] for e in known_findings or ()}, _STREAM_FAILURE, keep_looking)
    budget = ShrinkBudget(max_shrink_seconds, lambda: bool(first_failing))  # checked before each example
    drawn: Counter[str] = Counter()
    try:
        caps = validation.capabilities(calls(engine.capabilities, "capabilities"))
        if tolerance is not None:  # `--calibration`: the measured tau replaces the declared one
            caps = attrs.evolve(caps, tolerance=tolerance)
        writer.append("run_start", engine=engine_name, engine_args=dict(engine_args or {}), capabilities=caps,
                      versions=versions(caps), seed="derandomised" if seed is None else seed, profile=profile,
                      checks=names, calibration=calibration,
                      **({} if known_findings is None else {"known": [dict(e) for e in known_findings],
                                                           "strict_known": strict_known}))
        oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
        runner = ScenarioRunner(engine, writer, oracle, caps, calls=calls)
        runner.budget = budget
        db = DirectoryBasedExampleDatabase(str(Path(database_dir or ".hypothesis") / "kvparity" /
                                               engine_name.replace(":", "_").replace("/", "_")))
        overrides: dict[str, Any] = {"database": db}
        if max_examples is not None:
            overrides["max_examples"] = max_examples
        if seed is not None:
            overrides["derandomize"] = False
        if not shrink:  # faster when only the verdict matters (the suite's own tests)
            overrides["phases"] = tuple(p for p in _PHASES if p is not Phase.shrink)
        if progress is not None:
            progress.start(max_examples if max_examples is not None else base_settings.max_examples)

        # The stream's test. Its source is what a derandomised profile (ci) seeds its stream from
        # (Hypothesis hashes the test function): an edit here changes every CI stream, so coverage
        # completion reuses it as it is (`inner_test`) and marks its examples through the scenario, and
        # the hunt for several bugs (conformance.hunt) enters through the two names the test calls:
        # `failures_of` leaves out failures whose signature is known or already shrunk (the run goes
        # on), `ConformanceFailure` raises one exception type per new signature (shrunk on its own).
        failures_of, ConformanceFailure = hunt.failures_of, hunt.failure_for  # noqa: N806
        runner.on_run = hunt.note_scenario

        @settings(base_settings, **overrides)
        @given(scenarios(caps, max_steps=PROFILES[profile]))
        def conformance_example(scenario: tuple[Step, ...]) -> None:
            nonlocal examples
            try:
                runner.run(scenario, examples)
            except EngineError as exc:
                raise _EngineBroken(str(exc)) from exc
            finally:
                examples += 1
            example = builder.history.examples[-1]
            verdicts = example_verdicts(builder.history, example, names)
            known[example.index] = {n: verdicts[n] for n in example_scoped}
            failures = failures_of(verdicts)
            if progress is not None:
                progress.example(examples, (f.check for f in failures))
            for f in failures:
                first_failing.setdefault(f.check, example.index)
            if failures:
                raise ConformanceFailure(failures)

        example_budget = max_examples if max_examples is not None else base_settings.max_examples
        broken = False
        with step_counts.counting(drawn):
            while not broken and hunt.more(example_budget):
                test = conformance_example
                if hunt.round >= 0:  # a further round: the examples left, a seed of its own, no database replay
                    more = {"database": None, "derandomize": False, "max_examples": example_budget - hunt.spent}
                    test = settings(base_settings, **{**overrides, **more})(
                        given(scenarios(caps, max_steps=PROFILES[profile]))(conformance_example.hypothesis.inner_test))
                    test = hypothesis_seed((seed or 0) * 1000 + hunt.round + 1)(test)
                elif seed is not None:
                    test = hypothesis_seed(seed)(test)
                hunt.begin(examples, builder.history)
                broken = not _run_phase(test, writer)
            runner.budget = None  # the shrink cap bounds the stream's shrinking, not what follows it
            if not broken and not first_failing and not builder.history.errors:  # nothing new failed: completion
                complete(builder.history, conformance_example.hypothesis.inner_test,
                         lambda test: _run_phase(test, writer), writer,
                         settings(base_settings, **overrides), seed)
        if not builder.history.errors:  # each shrunk witness last again (a report keeps the last failure of a check)
            examples = hunt.rerun_witnesses(runner, examples)
        stopping.check()  # stopped before the run ended: INTERRUPTED, not a finished run
        closer(lambda cause: writer.append("error", cause=cause))
        writer.append("run_end", examples=examples, duration_s=round(time.monotonic() - started, 3))
    except EngineError as exc:
        writer.append("error", cause=one_line(exc))
        closer(lambda cause: writer.append("error", cause=cause))
        writer.append("run_end", examples=examples, duration_s=round(time.monotonic() - started, 3))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP in a supervised child (conformance.stopping)
        interrupted, stop_code = True, stopping.exit_code(exc)
        stopping.ignore_further()
        _record_quietly(writer, "interrupted", cause=f"{stopping.describe(exc)} during example {max(examples - 1, 0)}")
    except HistoryWriteError as exc:
        _record_quietly(writer, "error", cause=str(exc))  # in memory: the file cannot take it
        closer(lambda cause: _record_quietly(writer, "error", cause=cause))
    finally:
        writer.close()
        if own_calls:
            calls.close()
        if progress is not None:
            progress.finish()
    history = builder.history
    if writer.write_error and writer.write_error not in history.errors:
        history.errors.append(writer.write_error)
    analysis = known_mod.apply(history, analyse(history, names, known))
    outcome = RunOutcome(run_dir, analysis, time.monotonic() - started, examples, interrupted, calls.abandoned,
                         first_failing=first_failing, closed=closer.closed, stop_code=stop_code, seed=seed,
                         shrink_capped=budget.spent, step_kinds=dict(drawn))
    try:
        decode = None if calls.abandoned else getattr(engine, "decode", None)  # a hung engine is not asked again
        write_report(run_dir, history, analysis, duration_s=outcome.duration_s, decode=decode)
    except OSError as exc:
        outcome.report_error = f"cannot write the report in {run_dir}: {exc}"
    return outcome


class _Closer:
    """Closes the engine once, as the run's last engine call, through the run's bounded calls (the thread
    every other call ran on), so a close that raises or hangs past the timeout is recorded like any other
    engine failure. Not when the caller did not ask, nor when a call was left hanging (the engine may
    still be inside it)."""

    def __init__(self, engine: Engine, calls: EngineCalls, wanted: bool) -> None:
        self.engine, self.calls, self.wanted = engine, calls, wanted
        self.closed = False

    def __call__(self, record: Callable[[str], Any]) -> None:
        if not self.wanted or self.closed or self.calls.abandoned:
            return
        from conformance.status import tell

        self.closed = True
        tell(closing=True)  # a supervised child that dies in close() is answered for as dying there
        try:
            self.calls(self.engine.close, "close()")
        except EngineError as exc:
            record(one_line(exc))


def _run_phase(test: Callable[[], None], writer: HistoryWriter) -> bool:
    """Run a Hypothesis test of the run (a round of the stream, or the completion after it). A failure is
    already in the history (the analysis reports its shrunk witness), an engine error too; anything else
    Hypothesis raises is recorded as an error. Ctrl-C and a history that cannot be written go on up.
    False when the engine broke or an error was recorded: no further round then."""
    try:
        test()
    except (_EngineBroken, ShrinkTimeUp):
        return False  # already recorded as an `error` event; or the shrink budget is spent (the witness stands)
    except (ConformanceFailure, AssertionError):
        pass  # recorded in the history; analysis below reports the shrunk witness
    except (KeyboardInterrupt, HistoryWriteError):
        raise
    except BaseException as exc:  # noqa: BLE001 - ExceptionGroup of failures, Flaky, health checks
        if not _only_conformance(exc):
            writer.append("error", cause=f"{type(exc).__name__}: {one_line(exc)}")
            return False
    return True


def _record_quietly(writer: HistoryWriter, event: str, **fields: Any) -> None:
    """Record an event on the way out; if the disk cannot take it, it still lands in memory."""
    try:
        writer.append(event, **fields)
    except HistoryWriteError:
        pass


def _only_conformance(exc: BaseException) -> bool:
    """True for Hypothesis' way of reporting several distinct ConformanceFailures (an ExceptionGroup),
    or a flaky one (engine nondeterminism shows up in the history and the analysis anyway)."""
    inner = getattr(exc, "exceptions", None)
    if inner:
        return all(_only_conformance(e) for e in inner)
    return isinstance(exc, ConformanceFailure) or type(exc).__name__ in ("Flaky", "FlakyFailure")
