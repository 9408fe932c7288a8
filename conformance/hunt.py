"""Several bugs per run, and known bugs that do not stop it (issue 33).

A Hypothesis run stops generating at its first failing example and shrinks it; on an engine with one
known, unfixed bug that is the end of every run. So a live run (conformance.runner) decides per failing
example, by signature (conformance.signature), whether to stop Hypothesis: a known signature
(`--known`) or one already found and shrunk never does; a new one raises an exception class of its own,
so Hypothesis, which tells bugs apart by exception type, shrinks each separately. After a round that
found something new, another round looks on with the examples left (`Hunt.more`).
"""

from __future__ import annotations

from typing import Any, Mapping

from conformance.contract import EngineError
from conformance.signature import example_signatures
from conformance.verdicts import CheckResult, CheckFailure

_FAILURE_TYPES: dict[tuple[type, str], type] = {}


def failure_type(base: type[AssertionError], signature: str) -> type[AssertionError]:
    """One exception class per signature: Hypothesis tells bugs apart by exception type (and place), so
    each signature is its own bug to it, shrunk on its own (`report_multiple_bugs`)."""
    key = (base, signature)
    if key not in _FAILURE_TYPES:
        _FAILURE_TYPES[key] = type(f"{base.__name__}_{signature}", (base,), {})
    return _FAILURE_TYPES[key]


class Hunt:
    """Which failures stop Hypothesis, and whether to look again. A failure whose signature is known
    (`--known`) or was already found and shrunk (an earlier round) does not raise: the example is
    recorded and the run goes on. A new signature raises its own exception type, so Hypothesis shrinks
    it; then a further round looks for the next bug with the examples left — those run up to each
    round's first new signature count against the budget (shrinking does not) — until a round finds
    nothing new or the budget is spent."""

    def __init__(self, known: set[str], failure: type[AssertionError], keep_looking: bool = True) -> None:
        self.quiet, self.failure, self.keep_looking = set(known), failure, keep_looking
        self.found: list[str] = []
        self.minimal: dict[str, Any] = {}  # signature -> the last scenario raised for it (the shrunk one)
        self.round, self.spent, self.started = -1, 0, 0
        self.first_new: int | None = None
        self._history: Any = None
        self._scenario: Any = None
        self._pending: str | None = None

    def note_scenario(self, scenario: Any) -> None:
        """The scenario the stream runs now (ScenarioRunner.on_run): kept as a signature's witness."""
        self._scenario = scenario

    def failures_of(self, verdicts: Mapping[str, CheckResult]) -> list[CheckFailure]:
        """The stream test's `failures_of`: an example's failures, or none when every signature among them
        is quiet (known, or found and shrunk in an earlier round): the example is recorded, the run goes
        on. Remembers the first new signature for `failure_for`."""
        from conformance.analysis import failures_of

        failures = failures_of(verdicts)
        self._pending = None
        if not failures:
            return failures
        example = self._history.examples[-1]
        sigs = example_signatures(self._history, example, verdicts)
        if not sigs:
            return failures  # nothing to sign (every failure is a finding: not expected)
        new = [s for s in sigs if s not in self.quiet]
        if not new:
            return []
        if new[0] not in self.found:
            self.found.append(new[0])
            if self.first_new is None:
                self.first_new = example.index + 1
        self.minimal[new[0]] = self._scenario
        self._pending = new[0]
        return failures

    def failure_for(self, failures: list[CheckFailure]) -> AssertionError:
        """The stream test's `ConformanceFailure`: the exception of the signature `failures_of` found new,
        a type of its own, so Hypothesis shrinks each signature separately."""
        kind = self.failure if self._pending is None else failure_type(self.failure, self._pending)
        return kind(failures)

    def begin(self, examples: int, history: Any) -> None:
        self.round += 1
        self.started, self.first_new, self._history = examples, None, history

    def more(self, budget: int) -> bool:
        """Run (another) round? The first always; another when the last found a new signature and
        examples are left."""
        if self.round < 0:
            return True
        if self.first_new is None or not self.keep_looking:
            return False
        self.spent += self.first_new - self.started
        self.quiet |= set(self.found)
        return self.spent < budget

    def witnesses(self) -> list[Any]:
        """The shrunk scenario of each signature found, to run once more after a run of several rounds:
        a later round records examples failing with an earlier signature (it no longer stops on them),
        and the analysis keeps the *last* failure of each check and title (Hypothesis replays the
        shrunk example last), so each witness is run again, last."""
        return [self.minimal[s] for s in self.found] if self.round > 0 else []

    def rerun_witnesses(self, runner: Any, examples: int) -> int:
        """Run `witnesses()` as the run's last examples; the example count after them."""
        for scenario in self.witnesses():
            try:
                runner.run(scenario, examples)
            except EngineError:
                return examples + 1  # recorded as an `error` event
            examples += 1
        return examples
