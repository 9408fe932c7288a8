"""From a history to per-check verdicts and a run verdict — the same code for a live run, `kvparity
report RUN_DIR` and `kvparity replay`, so a stored history always re-analyses to the same answer."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import attrs
from attrs import define, field

from conformance.checks import CHECKS, run_check
from conformance.contract import UsageError
from conformance.history import Example, History
from conformance.verdicts import (ERROR, EXIT_CODES, FAIL, INCONCLUSIVE, PASS, CheckFailure, CheckResult, Status, combine,
                                  overall)


def select_checks(names: Iterable[str] | None) -> list[str]:
    """Validate `--checks`; unknown names are a usage error with a did-you-mean."""
    if not names:
        return list(CHECKS)
    import difflib

    chosen = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if name not in CHECKS:
            close = difflib.get_close_matches(name, list(CHECKS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"unknown check {name!r}{hint}; known checks: {', '.join(CHECKS)}")
        chosen.append(name)
    return chosen


@define
class Analysis:
    """Per-check aggregated results plus engine errors; `verdict` and `exit_code` follow DESIGN.md."""

    checks: dict[str, CheckResult] = field(factory=dict)
    errors: list[str] = field(factory=list)
    known: Any = None  # conformance.known.KnownOutcome where the run had a known-findings file

    def status(self, name: str) -> Status:
        """A check's status for the verdict: a failure whose every record is a known finding waived by
        `--known` (conformance.known) does not fail it — unless the check failed elsewhere in the run with
        a signature not known (a failure its record does not show: `known.bugs_seen`)."""
        r = self.checks[name]
        if (r.status == FAIL and self.known is not None and name not in self.known.unknown_in
                and all(f.case_id in self.known.waived for f in r.failures)):
            return PASS
        return r.status

    @property
    def verdict(self) -> Status:
        v = overall(attrs.evolve(r, status=self.status(n), failures=()) for n, r in self.checks.items())
        if self.known is not None and self.known.fails_run and v in (PASS, INCONCLUSIVE):
            v = FAIL  # `--strict-known`: a known finding that no longer occurs means the file is stale
        if self.errors and v != FAIL:
            return ERROR
        return v

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def failures(self) -> list[CheckFailure]:
        return [f for r in self.checks.values() for f in r.failures]

    @property
    def failed_checks(self) -> list[str]:
        """The checks whose own results failed, known findings not waived: what the known-findings gate signs."""
        return [n for n, r in self.checks.items() if r.status == FAIL]

    @property
    def near_ties(self) -> int:
        return int(self.checks["parity"].stats.get("near_ties", 0)) if "parity" in self.checks else 0

    def to_json(self) -> dict[str, Any]:
        known = {"known": self.known.to_json()} if self.known is not None else {}
        return {"verdict": self.verdict, "exit_code": self.exit_code, "errors": self.errors,
                "near_ties": self.near_ties, **known,
                "checks": {name: {"status": self.status(name), "title": CHECKS[name].title, "severity": CHECKS[name].severity.value,
                                  "bug_class": CHECKS[name].bug_class, "notes": list(r.notes), "stats": dict(r.stats),
                                  "failures": [f.to_json() for f in r.failures]}
                           for name, r in self.checks.items()}}


def analyse(history: History, names: Sequence[str] | None = None,
            known: Mapping[int, Mapping[str, CheckResult]] | None = None) -> Analysis:
    """Run example-scoped checks per example (so witnesses stay small and replayable), run-scoped
    checks once over everything, and aggregate. A history without a clean end (a killed, crashed or
    interrupted run) is an error whatever the checks say: they are still run, for information.

    `known`: example index -> check -> the result a live run already computed for that example
    (`example_verdicts`); those are reused, not computed again. A context probe's examples
    (conformance.alone) are a question asked of the engine, not judged: their answers sign a finding, and
    their failures would displace the run's own (one failure is kept per check and title, the last)."""
    chosen = select_checks(names)
    if any(ex.kin or ex.rebatch for ex in history.examples):  # else the same object: coverage is cached by it
        history = attrs.evolve(history, examples=[ex for ex in history.examples if not (ex.kin or ex.rebatch)])
    incomplete = history.incomplete()
    out = Analysis(errors=list(history.errors) + ([incomplete] if incomplete else []))
    known = known or {}
    for name in chosen:
        spec = CHECKS[name]
        if spec.scope == "run" or not history.examples:
            out.checks[name] = combine(name, [run_check(spec, history)])
        else:
            out.checks[name] = combine(name, [known.get(ex.index, {}).get(name) or run_check(spec, history.only(ex))
                                              for ex in history.examples])
    return out


def example_verdicts(history: History, example: Example, names: Sequence[str]) -> dict[str, CheckResult]:
    """Every chosen check over one example — what a Hypothesis example raises on to shrink. Run-scoped
    checks are judged by their per-example part (`CheckSpec.per_example`: the positive control can fail
    within one example; situation coverage cannot), and only the example-scoped results may be reused
    for the run (`analyse(known=...)`)."""
    view = history.only(example)
    return {name: run_check(CHECKS[name].for_one_example(), view) for name in names}


def failures_of(verdicts: Mapping[str, CheckResult]) -> list[CheckFailure]:
    return [f for r in verdicts.values() for f in r.failures]


def example_failures(history: History, names: Sequence[str]) -> list[CheckFailure]:
    """Failures of a one-example history (the state machine's invariant, the fault zoo's first failure)."""
    return [f for name in names for f in run_check(CHECKS[name], history).failures]


def failing_examples(history: History, names: Sequence[str]) -> Iterator[tuple[Example, list[str]]]:
    """Each example with a failure, in run order, with the checks failing there. The first is where the
    suite first caught the bug; the last is the shrunk one (Hypothesis replays it after the others)."""
    for ex in history.examples:
        fails = example_failures(history.only(ex), names)
        if fails:
            yield ex, sorted({f.check for f in fails})
