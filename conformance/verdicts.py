"""Verdict values: what a check says about a history, and how many of those add up to a run's answer.

Jepsen's checker returns `valid?: true | false | unknown`; we add `error` (the engine itself failed) and
`skip` (the check does not apply: the engine never claimed the capability it is about). A check that
crashes is `error`, never `pass` — an analysis that could not run has proved nothing.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterable, Mapping

from attrs import field, frozen

from conformance.exit_codes import ExitCode


class Status(str, Enum):
    """A check's verdict over a history, and a run's (`overall`). A `str` Enum so that results.json,
    junit.xml, the status file and every comparison with a status read back from JSON keep the same
    plain strings ("pass", "fail", ...): a member equals, hashes and formats as its value."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


PASS, FAIL, INCONCLUSIVE, ERROR, SKIP = Status.PASS, Status.FAIL, Status.INCONCLUSIVE, Status.ERROR, Status.SKIP


def _status(value: Any) -> Status:
    """A status given as a member or as its string (read back from results.json); anything else is refused."""
    try:
        return Status(value)
    except ValueError:
        raise ValueError(f"unknown status {value!r}") from None


class Severity(str, Enum):
    """How bad a violation of a check's claim is: `critical` for one identity's KV serving another."""

    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    def __str__(self) -> str:
        return self.value

STATUSES = tuple(Status)
EXIT_CODES = {PASS: ExitCode.PASS, FAIL: ExitCode.FAIL, INCONCLUSIVE: ExitCode.INCONCLUSIVE, ERROR: ExitCode.ERROR,
              SKIP: ExitCode.PASS}


@frozen
class CheckFailure:
    """One failure record of one check (many may share a root: `conformance.grouping.RootCause`);
    schemathesis-style: a title, a severity, a bug class and a witness to replay.

    `witness` is JSON-able: the offending request(s), expected vs got, the first divergent position and
    the baseline margin there. `explanation` is plain prose for an engine developer, not a stack trace.
    """

    check: str
    title: str
    severity: Severity = field(converter=Severity)
    bug_class: str
    case_id: str
    witness: Mapping[str, Any]
    explanation: str
    example: int = 0

    def dedupe_key(self) -> tuple[str, str]:
        """Failures with the same check and title are one bug seen several times (e.g. while shrinking)."""
        return (self.check, self.title)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "title": self.title, "severity": self.severity.value,
                "bug_class": self.bug_class, "case_id": self.case_id, "witness": dict(self.witness),
                "explanation": self.explanation, "example": self.example}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckFailure":
        return cls(**{k: d[k] for k in ("check", "title", "severity", "bug_class", "case_id", "witness",
                                        "explanation")}, example=int(d.get("example", 0)))


@frozen
class CheckResult:
    """A check's answer over one history. `stats` carries counts (compared, near_ties, hits ...)."""

    check: str
    status: Status = field(converter=_status)
    failures: tuple[CheckFailure, ...] = field(default=(), converter=tuple)
    notes: tuple[str, ...] = field(default=(), converter=tuple)
    stats: Mapping[str, int] = field(factory=dict)




def dedupe(failures: Iterable[CheckFailure]) -> list[CheckFailure]:
    """Keep one failure per dedupe key, the *last* one seen.

    Hypothesis replays the minimal failing example last, so "last wins" keeps the shrunk witness.
    """
    by_key: dict[tuple[str, str], CheckFailure] = {}
    for f in failures:
        by_key.pop(f.dedupe_key(), None)
        by_key[f.dedupe_key()] = f
    return list(by_key.values())


def combine(check: str, results: Iterable[CheckResult]) -> CheckResult:
    """Aggregate one check over many examples.

    fail if any example failed; else error if any errored; else pass if any example actually exercised
    the check; else inconclusive if any was inconclusive (never exercised in the whole run); else skip.
    """
    results = list(results)
    statuses = {r.status for r in results}
    stats: dict[str, int] = {}
    for r in results:
        for k, v in r.stats.items():
            stats[k] = stats.get(k, 0) + int(v)
    failures = dedupe(f for r in results for f in r.failures)
    notes = list(dict.fromkeys(n for r in results for n in r.notes))
    for status in (FAIL, ERROR, PASS, INCONCLUSIVE):
        if status in statuses:
            break
    else:
        status = SKIP
    if status in (PASS, FAIL):  # once exercised, "not exercised in example 7" is noise
        notes = [n for r in results if r.status != INCONCLUSIVE for n in r.notes]
        notes = list(dict.fromkeys(notes))
    return CheckResult(check, status, failures, notes[:20], stats)


def overall(results: Iterable[CheckResult]) -> Status:
    """The run's verdict: the worst of its checks, in the order fail > error > inconclusive > pass."""
    statuses = {r.status for r in results}
    for status in (FAIL, ERROR, INCONCLUSIVE):
        if status in statuses:
            return status
    return PASS
