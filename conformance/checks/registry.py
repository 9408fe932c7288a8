"""The check registry: each check is a named pure function over a recorded history (schemathesis'
`core/registries.py` shape). A check's name is its function's name, stated once; `run_check` gives it a
`CheckRecorder` to write to and turns a crashing check into `error` — an analysis that could not run has
proved nothing, so it must never read as a pass (Jepsen's "unknown")."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any, Callable, Mapping

import attrs
from attrs import frozen

from conformance.contract import Capabilities
from conformance.history import History
from conformance.history_codec import encode
from conformance.verdicts import ERROR, FAIL, INCONCLUSIVE, PASS, SKIP, CheckResult, CheckFailure, Severity


@frozen
class CheckSpec:
    name: str
    title: str
    severity: Severity
    bug_class: str
    fn: Callable[[History, "CheckRecorder"], CheckResult]
    scope: str = "example"  # "example": judged per Hypothesis example; "run": over the whole run
    applies: Callable[[Capabilities], bool] = lambda caps: True
    doc: str = ""
    # a run-scoped check's part that can fail within one example (what a Hypothesis example raises on);
    # None: the whole check, per example too
    per_example: Callable[[History, "CheckRecorder"], CheckResult] | None = None

    def for_one_example(self) -> "CheckSpec":
        """The spec to judge one example by: a run-scoped check's `per_example` part where it has one."""
        return self if self.per_example is None else attrs.evolve(self, fn=self.per_example, per_example=None)


CHECKS: dict[str, CheckSpec] = {}


def check(*, title: str, severity: Severity, bug_class: str, scope: str = "example",
          applies: Callable[[Capabilities], bool] = lambda caps: True,
          per_example: Callable[[History, "CheckRecorder"], CheckResult] | None = None):
    """Register a check under its function's name (the name users pass to `--checks`)."""

    def deco(fn: Callable[[History, CheckRecorder], CheckResult]) -> Callable[[History, CheckRecorder], CheckResult]:
        name = fn.__name__
        if name in CHECKS:
            raise ValueError(f"check {name!r} registered twice")
        CHECKS[name] = CheckSpec(name, title, Severity(severity), bug_class, fn, scope, applies,
                                 (fn.__doc__ or "").strip().split("\n")[0], per_example)
        return fn

    return deco


def run_check(spec: CheckSpec, history: History) -> CheckResult:
    """Run one check; a check that does not apply is `skip`, one that crashes is `error`."""
    caps = history.capabilities
    if caps is not None and not spec.applies(caps):
        return CheckResult(spec.name, SKIP, notes=("the engine does not claim what this check is about",))
    try:
        result = spec.fn(history, CheckRecorder(spec))
    except Exception as exc:  # noqa: BLE001 - a crashing checker is "unknown", reported as error
        return CheckResult(spec.name, ERROR, notes=(f"check crashed: {type(exc).__name__}: {exc}",))
    if not isinstance(result, CheckResult):
        return CheckResult(spec.name, ERROR, notes=(f"check returned {type(result).__name__}",))
    return result


class CheckRecorder:
    """What one check records while it reads one history: its failures (`fail`), its counts in its own
    unit (`stats`) and its notes. Handed to the check by `run_check`; the check's verdict is built from it."""

    def __init__(self, spec: CheckSpec) -> None:
        self.spec = spec
        self.failures: list[CheckFailure] = []
        self.stats: Counter[str] = Counter()
        self.notes: list[str] = []

    def fail(self, example: int, title: str, explanation: str, witness: Mapping[str, Any],
             bug_class: str | None = None) -> None:
        witness = {"example": example, **encode(dict(witness))}
        digest = hashlib.sha1(json.dumps([title, witness], sort_keys=True).encode()).hexdigest()[:10]
        self.failures.append(CheckFailure(self.spec.name, title, self.spec.severity,
                                     bug_class or self.spec.bug_class, f"{self.spec.name}-{digest}",
                                     witness, explanation, example))

    def note(self, text: str) -> None:
        if len(self.notes) < 20 and text not in self.notes:
            self.notes.append(text)

    def result(self, exercised: bool, why_not: str) -> CheckResult:
        if self.failures:
            status = FAIL
        elif exercised:
            status = PASS
        else:
            status = INCONCLUSIVE
            self.note(why_not)
        return CheckResult(self.spec.name, status, self.failures, self.notes, dict(self.stats))
