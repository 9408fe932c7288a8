"""The whole run in one call: `run_suite(engine, config)`.

A Hypothesis `@given` over scenarios against one engine instance (conformance.scenario_runner runs each
one), each example checked as it ends so failures shrink, then the recorded History analysed into
per-check verdicts. Every event goes to history.jsonl first, then to the run's handlers
(conformance.run_handlers): the in-memory History, progress, the report writer, which writes every
report file once at the end. Any engine crash, hang or malformed answer ends the run as `error` with a
one-line cause; the partial history stays on disk. So does a run the user interrupts (Ctrl-C) or whose
history cannot be written (disk full): what was recorded is kept, the verdict is `error`.
"""

from __future__ import annotations

import platform
import random
import time
import warnings
from collections import Counter
from typing import Any, Callable, Sequence

import attrs
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import HypothesisWarning

from conformance import alone
from conformance import known as known_mod
from conformance import example_database, seeded, step_counts, stopping, validation
from conformance.analysis import analyse, example_verdicts, failures_of
from conformance.calls import EngineCalls, one_line
from conformance.checks import CHECKS
from conformance.completion import complete
from conformance.contract import Capabilities, Engine, EngineError
from conformance.exit_codes import ExitCode
from conformance.grouping import group
from conformance.history import HistoryWriteError, HistoryWriter
from conformance.hunt import Hunt
from conformance.oracle import Oracle
from conformance.progress import Progress
from conformance.run_config import PHASES as _PHASES
from conformance.run_config import PROFILES, RunConfig
from conformance.run_folder import new_run_dir
from conformance.run_handlers import InMemoryHistory, ReportWriter, RunHandler, fan_out
from conformance.run_outcome import RunOutcome
from conformance.scenario_runner import ScenarioRunner
from conformance.shards import DERANDOMISED
from conformance.shrink_budget import ShrinkBudget, ShrinkTally, ShrinkTimeUp
from conformance.scenario import Step
from conformance.strategies import scenarios
from conformance.verdicts import FAIL, CheckFailure


class ConformanceFailure(AssertionError):
    """Raised inside a Hypothesis example so the example shrinks; carries the failures found."""

    def __init__(self, failures: list[CheckFailure]) -> None:
        self.failures = failures
        super().__init__("; ".join(f"[{f.check}] {f.title}" for f in failures[:5]))


_STREAM_FAILURE = ConformanceFailure  # run_suite's stream test calls the hunt's under this name


class _EngineBroken(BaseException):
    """Stops Hypothesis at once: an engine that crashed or hung is not worth shrinking against."""


NO_VERSION = "not declared by the adapter (Capabilities.version)"


def versions(caps: Capabilities) -> dict[str, str]:
    from importlib import metadata

    # an adapter that declares no version is said to, not shown as "" (a report read later cannot tell)
    out = {"python": platform.python_version(), "engine": caps.version or NO_VERSION}
    if caps.oracle:  # which oracle judged: the report's versions line names it
        out["oracle"] = caps.oracle
    for dist in ("kvparity", "hypothesis"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def _handlers(given_handlers: Sequence[RunHandler]) -> tuple[InMemoryHistory, list[RunHandler]]:
    """The in-memory History first (the checks read it), then the caller's handlers; a report writer
    unless the caller brought one."""
    builder = InMemoryHistory()
    handlers: list[RunHandler] = [builder, *given_handlers]
    if not any(isinstance(h, ReportWriter) for h in handlers):
        handlers.append(ReportWriter())
    return builder, handlers


def _overrides(config: RunConfig, seed: int | None) -> dict[str, Any]:
    """The settings a run lays over its profile: its own example database, the example count, a seed
    (which replaces a derandomised stream), no shrink phase."""
    db = example_database.database(config.engine_name, config.database_url, config.database_dir)
    overrides: dict[str, Any] = {"database": db}
    if config.max_examples is not None:
        overrides["max_examples"] = config.max_examples
    if seed is not None:
        overrides["derandomize"] = False
    if not config.shrink:  # faster when only the verdict matters (the suite's own tests)
        overrides["phases"] = tuple(p for p in _PHASES if p is not Phase.shrink)
    return overrides


def stream_seed(config: RunConfig) -> tuple[int | None, dict[str, Any]]:
    """The run's Hypothesis seed (None: derandomised) and, for a shard, the `shard` field of its
    `run_start`. A seed is drawn where the profile does not derandomise, so every run records what
    reruns it (not for ci: a seed there would replace its derandomised stream); a shard's seed is
    derived from the campaign seed and its index (conformance.shards), so no two shards draw one stream."""
    seed = config.seed
    if seed is None and not config.settings.derandomize:
        seed = random.randrange(2**32)
    if config.shard is None:
        return seed, {}
    campaign_seed = DERANDOMISED if seed is None else seed
    return config.shard.seed(campaign_seed), {"shard": config.shard.to_json(campaign_seed)}


def run_suite(engine: Engine, config: RunConfig, handlers: Sequence[RunHandler] = (),
              calls: EngineCalls | None = None) -> RunOutcome:
    """Run the suite against a constructed engine and write `report_dir/<engine>/<run>/` (or `run_dir`).

    Fail closed: an engine error, a history that cannot be written and a Ctrl-C all end the run with
    what was recorded kept and analysed; only a run that wrote its `run_end` can pass. `handlers`: told
    every history event and the outcome (conformance.run_handlers); a `Progress` among them is also told
    each finished example. `calls`: the bounded engine calls to use (default: the run's own).

    `config.close`: close the engine as the run's last engine call, before `run_end` and the report, so
    a close that raises or hangs is an `error` event of the history and every report file says so; a run
    the user interrupted is not closed here (its caller closes it after the report).

    Known findings (conformance.known) do not stop the run nor fail it. Several bugs per run: each new
    signature stops Hypothesis and is shrunk on its own (conformance.hunt), then the run looks on, with
    the examples left."""
    with seeded.seed_only():  # the seed alone picks the stream (conformance.seeded)
        return _run_suite(engine, config, handlers, calls)


def _run_suite(engine: Engine, config: RunConfig, handlers: Sequence[RunHandler],
               calls: EngineCalls | None) -> RunOutcome:
    names, profile, max_examples = list(config.checks), config.profile, config.max_examples
    base_settings = config.settings
    seed, shard_fields = stream_seed(config)
    own_calls = calls is None
    calls = calls or EngineCalls(config.timeout_s)
    started = time.monotonic()
    run_dir = config.run_dir if config.run_dir is not None else new_run_dir(config.report_dir, config.engine_name)
    builder, handlers = _handlers(handlers)
    progress = next((h for h in handlers if isinstance(h, Progress)), None)
    writer = HistoryWriter(run_dir / "history.jsonl", sink=fan_out(handlers))
    known: dict[int, dict[str, Any]] = {}  # example -> check -> result, computed once while running
    first_failing: dict[str, int] = {}  # check -> its first failing example (`kvparity run --minimise` starts there too)
    example_scoped = [n for n in names if CHECKS[n].scope == "example"]
    examples = 0
    interrupted, stop_code = False, ExitCode.INTERRUPTED
    closer = _Closer(engine, calls, config.close)
    hunt = Hunt({e["signature"] for e in config.known_findings or ()}, _STREAM_FAILURE, config.keep_looking)
    # checked before each example; the clock starts at the round's first new failure (a known one is not shrunk)
    budget = ShrinkBudget(config.max_shrink_seconds, lambda: hunt.first_new is not None)
    drawn: Counter[str] = Counter()
    tally = ShrinkTally()  # examples run while shrinking, and the ones the shrink cap stopped before they began
    try:
        caps = validation.capabilities(calls(engine.capabilities, "capabilities"))
        if config.tolerance is not None:  # `--calibration`: the measured tau replaces the declared one
            caps = attrs.evolve(caps, tolerance=config.tolerance)
        if config.logprob_epsilon is not None:  # ... and its measured logprob epsilon (logprob_parity)
            caps = attrs.evolve(caps, logprob_epsilon=config.logprob_epsilon)
        known_fields = {} if config.known_findings is None else {
            "known": [dict(e) for e in config.known_findings], "strict_known": config.strict_known}
        writer.append("run_start", engine=config.engine_name, engine_args=dict(config.engine_args),
                      capabilities=caps, versions=versions(caps), seed="derandomised" if seed is None else seed,
                      profile=profile, checks=names, calibration=config.calibration, **known_fields,
                      **shard_fields)
        oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
        runner = ScenarioRunner(engine, writer, oracle, caps, calls=calls)
        runner.budget = tally.guard(budget)
        overrides = _overrides(config, seed)
        if progress is not None:
            progress.start(config.example_budget)

        # The stream's test. Its source is what a derandomised profile (ci) seeds its stream from
        # (Hypothesis hashes the test function): an edit here changes every CI stream, so coverage
        # completion reuses it as it is (`inner_test`) and marks its examples through the scenario, and
        # the hunt for several bugs (conformance.hunt) enters through the two names the test calls:
        # `failures_of` leaves out failures whose signature is known or already shrunk (the run goes
        # on), `ConformanceFailure` raises one exception type per new signature (shrunk on its own).
        failures_of, ConformanceFailure = hunt.failures_of, hunt.failure_for  # noqa: N806
        runner.on_run = lambda scenario: (tally.example(hunt.first_new is not None), hunt.note_scenario(scenario))

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

        example_budget = config.example_budget
        broken = False
        # Where failures are kept: a ci run's default folder, and any store a shard or `--database` names; a
        # seed alone names its stream, so a seeded run given none keeps nothing (Hypothesis' `@seed`).
        keeps = seed is None or config.shard is not None or bool(config.database_url or config.database_dir)
        with step_counts.counting(drawn):
            while not broken and hunt.more(example_budget):
                test = conformance_example
                if hunt.round >= 0:  # a further round: the examples left, a seed of its own, no database replay
                    more = {"derandomize": False, "max_examples": example_budget - hunt.spent,
                            "phases": tuple(p for p in overrides.get("phases", base_settings.phases)
                                            if p is not Phase.reuse)}
                    test = settings(base_settings, **{**overrides, **more})(
                        given(scenarios(caps, max_steps=PROFILES[profile]))(conformance_example.hypothesis.inner_test))
                    test = hypothesis_seed((seed or 0) * 1000 + hunt.round + 1)(test)
                elif seed is not None:
                    test = hypothesis_seed(seed)(test)
                if keeps and (hunt.round >= 0 or seed is not None):  # seeded: the store `@seed` turned off, back
                    example_database.keep_with_seed(test, overrides["database"])  # (a further round saves, no replay)
                hunt.begin(examples, builder.history)
                budget.restart()
                broken = not _run_phase(test, writer)
                examples -= tally.take_cut()  # counted by the test, never recorded: the next round numbers on
            runner.budget = None  # the shrink cap bounds the stream's shrinking, not what follows it
            # Completion where nothing new failed, or where known findings were given: a new signature met
            # in the stream may still resolve to a known one (its lone re-send, below), and a run whose
            # findings are all known is judged on its coverage like a clean one.
            if not broken and (not first_failing or config.known_findings is not None) and not builder.history.errors:
                complete(builder.history, conformance_example.hypothesis.inner_test,
                         lambda test: _run_phase(test, writer), writer,
                         settings(base_settings, **overrides), seed)
        if not builder.history.errors:  # each shrunk witness last again (a report keeps the last failure of a check)
            runner.on_run = lambda scenario: tally.example(True)
            examples = hunt.rerun_witnesses(runner, examples)
        if not builder.history.errors and _any_failed(known):  # each failing request alone (conformance.alone)
            findings = group(builder.history, analyse(builder.history, names, known))
            # where a batch held another identity, was it needed; then each failing request alone
            examples = alone.run_probes(runner, builder.history, findings, examples, alone.context_probes)
            if not builder.history.errors:
                examples = alone.run_probes(runner, builder.history, findings, examples)
        stopping.check()  # stopped before the run ended: INTERRUPTED, not a finished run
        closer(lambda cause: writer.append("error", cause=cause))
        writer.append("run_end", **_run_end(examples, tally.steps, started, calls))
    except EngineError as exc:
        writer.append("error", cause=one_line(exc))
        closer(lambda cause: writer.append("error", cause=cause))
        writer.append("run_end", **_run_end(examples, tally.steps, started, calls))
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
                         shrink_capped=budget.spent, step_kinds=dict(drawn), history=history,
                         decode=None if calls.abandoned else getattr(engine, "decode", None))  # a hung engine is not asked again
    for handler in handlers:
        handler.on_end(outcome)
    return outcome


def _any_failed(known: dict[int, dict[str, Any]]) -> bool:
    """Did any example fail a check (known findings included: they are signed from their lone re-send too)?"""
    return any(r.status == FAIL for per in known.values() for r in per.values())


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


def _run_end(examples: int, shrink_steps: int, started: float, calls: EngineCalls) -> dict[str, Any]:
    """The run_end event's figures. `engine_s`: the time spent inside engine calls (the engine's own
    runs, resets, snapshots, and the plain decoding its baseline gives), so a run says how much of its
    wall time was the engine's and how much the harness's: a GPU engine idle most of a run is waiting
    on the harness, and more shards (`--shard`, `kvparity campaign`) keep it busy."""
    return {"examples": examples, "shrink_steps": shrink_steps,
            "duration_s": round(time.monotonic() - started, 3), "engine_s": round(calls.busy_s, 3)}


def _run_phase(test: Callable[[], None], writer: HistoryWriter) -> bool:
    """Run a Hypothesis test of the run (a round of the stream, or the completion after it). A failure is
    already in the history (the analysis reports its shrunk witness), an engine error too; anything else
    Hypothesis raises is recorded as an error. Ctrl-C and a history that cannot be written go on up.
    False when the engine broke or an error was recorded: no further round then.

    Hypothesis writes a failing example's arguments out as a repr, to name it; kvparity names it by its
    witness file, and a stream's repr runs to tens of kB, past which Hypothesis warns ("Generating overly
    large repr ... Use -Wignore"): two lines in the middle of the progress lines, advice for a pytest
    user, not for a `kvparity run`. That warning is not shown; every other one is."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Generating overly large repr", category=HypothesisWarning)
            test()
    except _EngineBroken:
        return False  # already recorded as an `error` event
    except ShrinkTimeUp:
        return True  # the round's shrink budget is spent: its witness stands, and the hunt may go on
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
