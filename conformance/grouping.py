"""Failures grouped by root: one request's wrong answer is one finding, listed under the most specific
check that explains it, with the other checks that saw it as "also seen by".

One bug trips several checks: a rejected draft committed into the output is a parity failure, a
speculation failure, an eviction-epoch failure when the pool happened to evict, and — when another
identity had sent the same prefix first — an isolation failure, which is *critical*. Listing it four
times, and as a cross-tenant leak, sends an engine developer after the wrong mechanism. So:

- **one root, one finding.** Failures about the same request of the same example (same batch, same
  request id) are one finding: a request has one output, and every check that objects to it objects
  to that output. Failures about a batch's pool (rollback hygiene) are keyed by the batch.
- **which checks saw it is decided from the history**, not only from the failures kept: a check keeps
  one failure per title, so the parity failure of *this* request may have been folded into another
  example's. Where the request's output differs from plain decoding, the checks that compare it
  against plain decoding by definition (parity always; the single-mechanism independence check when
  exactly one mechanism was in play; eviction safety in an epoch that evicted) saw it too.
- **the most specific check is the one whose claim the mechanism in play belongs to** (`ORDER`), and
  isolation only where the history shows reuse across identities: the request reported more cached
  tokens than its own identity's earlier traffic explains and no more than another identity's does (or
  the engine reports no count at all). A request that
  diverges the same way with no cross-identity reuse is not an isolation bug, whatever else it is.
- **identical findings fold** (listed under the same check; same identity, prompt and divergence, in
  different examples) with a count.

Nothing here changes a verdict: the per-check statuses and the exit code are the analysis'.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import attrs
from attrs import frozen

from conformance import alone
from conformance.analysis import Analysis, example_failures
from conformance.checks import CHECKS
from conformance.checks.midflight import partial
from conformance.finding_order import order_key
from conformance.history_facts import is_cross_identity_attempt, mechanisms
from conformance.localise import epoch_evicted, mechanism_support, request_mechanisms
from conformance.history import BatchRecord, Example, History
from conformance.oracle import DIVERGE, FINISH, compare
from conformance.timeline import Line, find_line, timeline
from conformance.verdicts import FAIL, CheckFailure

# Most specific first. A speculation, cache, eviction or schedule check names the mechanism; parity
# says only that the output is wrong; `exercised`'s positive control says only that nothing was reused.
ORDER = ("rollback_hygiene", "isolation", "prefix_only", "spec_independence", "history_independence",
         "eviction_safety", "schedule_independence", "accounting", "abort_prefix", "parity", "exercised")
_SINGLE = {"cache": "history_independence", "spec": "spec_independence", "schedule": "schedule_independence"}


@frozen
class RootCause:
    """A finding: the failure records of one root cause, grouped. One root, listed under `check` (the most specific check that saw it); `failure` is the record
    shown (that check's own where it kept one, else the most specific reporter's); `seen_by` every check
    that saw it, `check` first; `count` how many identical findings were folded into this one; `reasons`
    why it is listed where it is."""

    check: str
    title: str
    failure: CheckFailure
    seen_by: tuple[str, ...]
    failures: tuple[CheckFailure, ...]
    count: int = 1
    reasons: tuple[str, ...] = ()

    @property
    def also_seen_by(self) -> tuple[str, ...]:
        return self.seen_by[1:]

    @property
    def severity(self) -> str:
        return CHECKS[self.check].severity.value if self.check in CHECKS else self.failure.severity.value

    @property
    def bug_class(self) -> str:
        return self.failure.bug_class if self.failure.check == self.check else CHECKS[self.check].bug_class

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "title": self.title, "severity": self.severity, "bug_class": self.bug_class,
                "case_id": self.failure.case_id, "example": self.failure.example,
                "also_seen_by": list(self.also_seen_by), "count": self.count, "reasons": list(self.reasons),
                "failures": [f.case_id for f in self.failures]}


def root_key(f: CheckFailure) -> tuple:
    """What a failure is about: (example, batch, request id) — or (example, batch) for a pool."""
    w = f.witness
    req = w.get("request")
    rid = req.get("id") if isinstance(req, Mapping) else None
    if rid is None:
        return (f.example, w.get("batch"), None, f.check, f.title)
    return (f.example, w.get("batch"), rid)


def _example(history: History, index: int) -> Example | None:
    for ex in history.examples:
        if ex.index == index:
            return ex
    return None


def _record(ex: Example, batch: Any) -> BatchRecord | None:
    return ex.batches[batch] if isinstance(batch, int) and 0 <= batch < len(ex.batches) else None


def cross_identity_reuse(line: Line | None) -> bool | None:
    """Did this request get KV only another identity's earlier traffic can explain — more cached tokens
    than its own identity's traffic shares with it, no more than another identity's does? (More than any
    traffic explains is a wrong count, not a leak.) None: the engine reports no cached tokens, so the
    history cannot tell."""
    if line is None or line.cached_tokens is None:
        return None
    return line.same.tokens < line.cached_tokens <= line.other.tokens


def implied_checks(history: History, f: CheckFailure, chosen: Iterable[str]) -> set[str]:
    """The checks that, by their definition, object to this request's output as well: it differs from
    plain decoding, so parity does; so does the independence check of the one mechanism in play, and
    eviction safety in an evicting epoch; isolation where another identity had sent its prefix first."""
    w = f.witness
    ex = _example(history, f.example)
    b = _record(ex, w.get("batch")) if ex is not None else None
    i = w.get("position_in_batch")
    if b is None or not isinstance(i, int) or not 0 <= i < len(b.results):
        return set()
    q, r = b.requests[i], b.results[i]
    base = history.baseline_for(q)
    if base is None:
        return set()
    if r.finish_reason == "abort":  # cut short by design: its tokens so far are still plain decoding's
        base = partial(base, len(r.output))
    if compare(base, r.output, r.finish_reason, history.tolerance).kind not in (DIVERGE, FINISH):
        return set()
    out = {"parity"}
    active = mechanisms(b, r)
    if len(active) == 1:
        out.add(_SINGLE[next(iter(active))])
    if epoch_evicted(ex, b):
        out.add("eviction_safety")
    line = find_line(timeline(ex), b.index, q.id)
    if line is not None and is_cross_identity_attempt(line.same.tokens, line.other.tokens, history.capabilities):
        out.add("isolation")
    return out & set(chosen)


def _eligible(check: str, failures: Sequence[CheckFailure], line: Line | None) -> bool:
    """May `check` head the finding? Isolation only with evidence of reuse across identities."""
    if check != "isolation":
        return True
    for f in failures:  # the count check's own evidence: more cached than own identity, within another's
        w = f.witness
        if f.check == "isolation" and isinstance(w.get("shared_other_identity"), int):
            if w["shared_same_identity"] < w["cached_tokens"] <= w["shared_other_identity"]:
                return True
    return cross_identity_reuse(line) is not False


def _rank(check: str) -> int:
    return ORDER.index(check) if check in ORDER else len(ORDER)


# The checks that each name one mechanism. When several were in play for a wrong request, the one in play
# most tied to the run's wrong outputs is the likeliest root (`mechanism_support`); the others keep `ORDER`.
MECHANISM_CHECKS = ("spec_independence", "history_independence", "eviction_safety", "schedule_independence")


def _headship(check: str, support: Mapping[str, float]) -> tuple:
    """Sort key among a root's checks: a check with its own specific claim (rollback hygiene, isolation,
    prefix_only) first, then the mechanism checks by support, then the rest by `ORDER`."""
    if check in MECHANISM_CHECKS:
        return (1, -support.get(check, 0), _rank(check))
    return (0 if _rank(check) < _rank(MECHANISM_CHECKS[0]) else 2, 0, _rank(check))


def _in_play(history: History, f: CheckFailure, chosen: Sequence[str]) -> set[str]:
    """The failed mechanism checks whose mechanism was in play for the request of `f`, its KV's writer
    included (`conformance.localise`)."""
    ex = _example(history, f.example)
    b = _record(ex, f.witness.get("batch")) if ex is not None else None
    i = f.witness.get("position_in_batch")
    if b is None or not isinstance(i, int) or not 0 <= i < len(b.results):
        return set()
    return request_mechanisms(ex, b, b.requests[i], b.results[i]) & set(chosen)


def _root(history: History, failures: list[CheckFailure], chosen: Sequence[str],
          support: Mapping[str, float] | None = None) -> RootCause:
    reporters = list(dict.fromkeys(f.check for f in failures))
    seen = set(reporters)
    for f in failures:
        seen |= implied_checks(history, f, chosen)
    ex = _example(history, failures[0].example)
    w = failures[0].witness
    req = w.get("request") if isinstance(w.get("request"), Mapping) else {}
    line = find_line(timeline(ex), w.get("batch"), req.get("id")) if ex is not None else None
    in_play = _in_play(history, failures[0], chosen) if "parity" in seen else set()
    ordered = sorted(seen | in_play, key=lambda c: (not _eligible(c, failures, line), _headship(c, support or {})))
    check = ordered[0]
    if check not in seen:  # named by the run's evidence, not by a record or definition of this request's
        ordered.remove(check)
        ordered = [check] + [c for c in ordered if c in seen]
    own = [f for f in failures if f.check == check]
    shown = own[0] if own else min(failures, key=lambda f: (not _eligible(f.check, failures, line), _rank(f.check)))
    title = shown.title if own else "output differs from plain greedy decoding"
    reasons = []
    if "isolation" in seen and check != "isolation":
        if line is not None and line.cached_tokens is not None and line.cached_tokens <= line.same.tokens:
            why = "the engine reported no more cached tokens than its own identity's earlier traffic explains"
        elif line is not None and line.cached_tokens is not None and line.cached_tokens > line.other.tokens:
            why = ("the engine reported more cached tokens than any earlier traffic shares with the request "
                   "(a wrong count or a wrong hit)")
        else:
            why = "no reuse across identities was seen"
        reasons.append(f"not listed under isolation: {why}, so another identity's KV did not cause it")
    if check not in seen:
        reasons.append(f"listed under {check}: its mechanism was in play for this request (directly or in the "
                       f"request that wrote the KV it read) and is the one most tied to this run's wrong outputs "
                       f"(Ochiai {(support or {}).get(check, 0):.2f}; "
                       + ", ".join(f"{c} {v:.2f}" for c, v in sorted((support or {}).items()) if c != check) + ")")
    elif not own and shown.check == "abort_prefix":
        reasons.append(f"the request was aborted: its partial output differs from plain decoding, and {check}'s "
                       f"claim covers the tokens it did produce (the abort came after them)")
    elif not own:
        reasons.append(f"{check} compares this request by definition; the failure it kept (one per title) is "
                       f"another example's")
    return RootCause(check, title, shown, tuple(ordered), tuple(failures), 1, tuple(reasons))


def _signature(f: RootCause) -> tuple:
    w = f.failure.witness
    req = w.get("request") if isinstance(w.get("request"), Mapping) else {}
    return (f.check, req.get("identity") and str(req.get("identity")), str(req.get("prompt")),
            w.get("first_divergent_position"), w.get("expected"), w.get("got"), w.get("cached_tokens"))


def _merge_alone(shown: RootCause, other: RootCause) -> RootCause:
    """A finding whose request, sent again alone after a reset, failed too (conformance.alone): one
    bug, shown by the lone request, listed under what was in play for it."""
    return RootCause(shown.check, shown.title, shown.failure, tuple(dict.fromkeys(shown.seen_by + other.seen_by)),
                     shown.failures + other.failures, shown.count + other.count, shown.reasons)


def _reproduced_alone(shown: RootCause, pair: tuple[int, str], check: str) -> RootCause:
    why = (f"request {pair[1]} of example {pair[0]} failed there (under {check}) and, sent again alone after a "
           f"reset, gives the same answer, so no batch-mate, other identity or cached prefix is needed (state an "
           f"engine keeps across its reset would be: that is a bug of its own)")
    return attrs.evolve(shown, reasons=shown.reasons + (why,))


def group(history: History, analysis: Analysis) -> list[RootCause]:
    """The run's failures as findings, the one that shows the bug most directly first
    (`conformance.finding_order`: shortest witness, a difference from plain decoding before a pair
    check's, then severity and specificity)."""
    chosen = [n for n, r in analysis.checks.items() if r.status != "skip"]
    failed = {n for n, r in analysis.checks.items() if r.status == FAIL}
    roots: dict[tuple, list[CheckFailure]] = {}
    for f in analysis.failures:
        roots.setdefault(root_key(f), []).append(f)
    support = mechanism_support(history)
    findings = [_root(history, fs, [c for c in chosen if c in failed or c in {x.check for x in fs}], support)
                for fs in roots.values()]
    scoped = [c for c in chosen if CHECKS[c].scope != "run"]
    lone = {ex.index: example_failures(history.only(ex), scoped) for ex in history.examples if ex.alone}
    findings = alone.fold(history, findings, lone, _merge_alone, _reproduced_alone)
    folded: dict[tuple, RootCause] = {}
    for fd in findings:
        sig = _signature(fd)
        if sig in folded:
            old = folded[sig]
            folded[sig] = RootCause(old.check, old.title, old.failure, tuple(dict.fromkeys(old.seen_by + fd.seen_by)),
                                  old.failures + fd.failures, old.count + fd.count, old.reasons)
        else:
            folded[sig] = fd
    return sorted(folded.values(), key=lambda fd: order_key(history, fd.failure, fd.severity, _rank(fd.check)))
