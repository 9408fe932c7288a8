"""logprob_parity: a witness below the argmax. A wrong KV block (another identity's, a stale one, one a
later request wrote into) is caught by the token checks only when it flips an argmax, and on a confident
model it often does not; it always moves the distribution. So at every output position up to and
including the first token difference (the engine and plain decoding condition on the same tokens
there), each of the engine's top-k tokens that plain decoding's top-k also holds must have the same
log-probability within epsilon.

Epsilon is measured, never declared: `kvparity calibrate` measures plain mode's logprob deviation from
the oracle and from itself across batch compositions, and `kvparity run --calibration FILE` puts it in
the run's capabilities (`Capabilities.logprob_epsilon`). Without it the check is not run (`skip`, with
a note saying why): a comparison against a guessed epsilon is either blind or a false alarm.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from conformance.checks.common import context_prose, divergence_witness
from conformance.checks.registry import CheckRecorder, check
from conformance.contract import Baseline, Result
from conformance.history import History
from conformance.history_facts import occurrences
from conformance.oracle import compare, first_difference
from conformance.verdicts import SKIP, CheckResult, Severity

NOT_CALIBRATED = ("not run: no logprob epsilon (pass `kvparity run --calibration FILE`, a `kvparity "
                  "calibrate` file that measured logprob deviations)")


@frozen
class Deviation:
    """The largest |logprob(engine) - logprob(oracle)| of one result, where it is, and per position the
    largest (what a report shows next to the tokens)."""

    value: float
    position: int
    token: int
    engine: float
    oracle: float
    per_position: tuple[float, ...]
    compared: int  # (position, token) pairs compared


def deviation(base: Baseline, result: Result) -> Deviation | None:
    """Compare the result's logprobs with the baseline's at every position both have, up to and
    including the first token difference; None when no token was present in both."""
    diff = first_difference(base.output, result.output)
    last = len(result.output) if diff is None else diff + 1
    worst: tuple[float, int, int, float, float] | None = None
    per_position: list[float] = []
    compared = 0
    for pos, (mine, theirs) in enumerate(zip((result.logprobs or ())[:last], base.logprobs[:last])):
        oracle = dict(theirs)
        here = 0.0
        for token, lp in mine:
            if token in oracle:
                d = abs(lp - oracle[token])
                compared += 1
                here = max(here, d)
                if worst is None or d > worst[0]:
                    worst = (d, pos, token, lp, oracle[token])
        per_position.append(here)
    if worst is None:
        return None
    return Deviation(*worst, tuple(per_position), compared)


def _witness(h: History, found: tuple[Deviation, Any, int, Any, Result, Baseline], eps: float) -> dict[str, Any]:
    dev, b, i, q, r, base = found
    w = divergence_witness(b, i, q, r, compare(base, r.output, r.finish_reason, h.tolerance), base.output)
    w.update(logprob_deviation=dev.value, logprob_position=dev.position, logprob_token=dev.token,
             logprob_engine=dev.engine, logprob_oracle=dev.oracle, logprob_epsilon=eps,
             logprob_deviations=[float(f"{d:.3g}") for d in dev.per_position])
    return w


@check(title="per-token log-probabilities equal plain decoding's", severity=Severity.HIGH, bug_class="B",
       applies=lambda c: c.logprobs_k > 0)
def logprob_parity(h: History, f: CheckRecorder) -> CheckResult:
    """Per-token logprobs (top-k) equal plain decoding's within the calibrated epsilon, up to the first divergence."""
    eps = h.capabilities.logprob_epsilon if h.capabilities is not None else None
    if eps is None:
        return CheckResult(f.spec.name, SKIP, notes=(NOT_CALIBRATED,))
    largest = None
    for b, i, q, r in occurrences(h):
        base = h.baseline_for(q)
        if r.logprobs is None or base is None or not base.logprobs:
            continue
        dev = deviation(base, r)
        if dev is None:
            continue
        f.stats["compared"] += dev.compared
        f.stats["results"] += 1
        if dev.value > eps:
            f.stats["results_above_epsilon"] += 1
            if largest is None or dev.value > largest[0].value:
                largest = (dev, b, i, q, r, base)
    if largest is not None:
        dev, b, i, q, r, base = largest
        same = "the tokens are the same" if first_difference(base.output, r.output) is None else \
            f"the tokens first differ at position {first_difference(base.output, r.output)}"
        f.fail(b.example, "log-probabilities differ from plain decoding",
               f"Request {q.id} ({q.identity.label()}, {len(q.prompt)} prompt tokens): at output position "
               f"{dev.position} token {dev.token} has logprob {dev.engine:.6g}, plain decoding {dev.oracle:.6g} "
               f"(|difference| {dev.value:.3g} > epsilon {eps:.3g}); {same}. "
               f"{f.stats['results_above_epsilon']} result(s) of this example above epsilon. "
               f"Context: {context_prose(b, r)}.", _witness(h, largest, eps))
    return f.result(f.stats["compared"] > 0, "no result carried logprobs that plain decoding's top-k shares")
