"""The oracle: plain greedy decoding, memoized, and the tie-aware comparison against it (DESIGN.md).

Greedy decoding is only well defined where the top-1 logit clearly beats the top-2. A different GEMM
shape on a cache hit can flip a genuine near-tie (BUG_CLASSES B, "numerics"), which is legitimate; a flip
where the baseline was confident is a bug. So the first divergent position decides: if the baseline's
top-1/top-2 margin there is below the engine's declared tolerance tau *and* the engine picked the
runner-up — or, where the baseline records the step's contenders, any token whose logit is within tau
of the top-1 — it is a near-tie: counted and reported, not a failure, and nothing after it can be
compared (the two continuations now condition on different tokens). Anything else is a divergence,
including a pick the baseline cannot place within tau (fail closed).
"""

from __future__ import annotations

from typing import Callable, Sequence

from attrs import frozen

from conformance.contract import Baseline, Request
from conformance.history_codec import oracle_key_str

EQUAL, NEAR_TIE, DIVERGE, FINISH = "equal", "near_tie", "diverge", "finish"


@frozen
class Comparison:
    """How one output relates to another (or to the baseline)."""

    kind: str
    position: int | None = None
    expected: int | None = None  # None: the expected sequence had already ended
    got: int | None = None  # None: the engine's sequence had already ended
    margin: float | None = None
    expected_finish: str | None = None
    got_finish: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind in (EQUAL, NEAR_TIE)

    def describe(self) -> str:
        if self.kind == EQUAL:
            return "equal"
        if self.kind == FINISH:
            return f"same tokens, finish_reason {self.got_finish!r} instead of {self.expected_finish!r}"
        exp = "<end>" if self.expected is None else str(self.expected)
        got = "<end>" if self.got is None else str(self.got)
        margin = "n/a" if self.margin is None else f"{self.margin:.4g}"
        word = "near-tie" if self.kind == NEAR_TIE else "diverges"
        return f"{word} at output position {self.position}: expected {exp}, got {got} (baseline margin {margin})"

    def to_json(self) -> dict:
        return {"kind": self.kind, "position": self.position, "expected": self.expected, "got": self.got,
                "margin": self.margin, "expected_finish": self.expected_finish, "got_finish": self.got_finish}


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _at(seq: Sequence, i: int):
    return seq[i] if 0 <= i < len(seq) else None


def compare(baseline: Baseline, output: Sequence[int], finish_reason: str, tau: float) -> Comparison:
    """Engine output vs the baseline, tie-aware."""
    pos = first_difference(baseline.output, output)
    if pos is None:
        if finish_reason != baseline.finish_reason:
            return Comparison(FINISH, expected_finish=baseline.finish_reason, got_finish=finish_reason)
        return Comparison(EQUAL)
    expected, got = _at(baseline.output, pos), _at(output, pos)
    margin = _at(baseline.margins, pos)
    kind = DIVERGE
    if expected is not None and got is not None and margin is not None and margin < tau:
        runner_up = _at(baseline.runner_up, pos)
        contenders = dict(_at(baseline.contenders, pos) or ())
        if runner_up is None or runner_up == got or contenders.get(got, tau) < tau:
            kind = NEAR_TIE
    return Comparison(kind, pos, expected, got, margin, baseline.finish_reason, finish_reason)


def compare_pair(first: Sequence[int], first_finish: str, second: Sequence[int], second_finish: str,
                 baseline: Baseline | None, tau: float) -> Comparison:
    """Two engine outputs for the same oracle key. `first` plays "expected".

    Where they differ, the pair is a near-tie only if both agree with the baseline up to that position
    and the baseline margin there is below tau: then the baseline itself could have gone either way.
    """
    pos = first_difference(first, second)
    if pos is None:
        if first_finish != second_finish:
            return Comparison(FINISH, expected_finish=first_finish, got_finish=second_finish)
        return Comparison(EQUAL)
    expected, got = _at(first, pos), _at(second, pos)
    margin = None
    kind = DIVERGE
    if baseline is not None:
        margin = _at(baseline.margins, pos)
        on_baseline = tuple(baseline.output[:pos]) == tuple(first[:pos])
        if on_baseline and expected is not None and got is not None and margin is not None and margin < tau:
            kind = NEAR_TIE
    return Comparison(kind, pos, expected, got, margin, first_finish, second_finish)


class Oracle:
    """Memoized baselines keyed by `Request.oracle_key()`.

    The baseline is computed once per key for a whole run (it is the expensive part: plain decoding of
    every distinct request) and `on_new` is told about each new one so it lands in the history.
    """

    def __init__(self, compute: Callable[[Request], Baseline],
                 on_new: Callable[[str, Baseline], None] | None = None) -> None:
        self._compute = compute
        self._on_new = on_new
        self.cache: dict[str, Baseline] = {}

    def __call__(self, request: Request) -> Baseline:
        if self.missing(request):
            self.store(request, self._compute(request))
        return self.cache[oracle_key_str(request)]

    def missing(self, request: Request) -> bool:
        return oracle_key_str(request) not in self.cache

    def store(self, request: Request, baseline: Baseline) -> None:
        """Memoize a baseline computed elsewhere (the runner computes it on its engine-call thread and
        stores it from the main thread, which owns the history)."""
        if not isinstance(baseline, Baseline):
            from conformance.contract import EngineError
            raise EngineError(f"baseline() returned {type(baseline).__name__}, not Baseline")
        key = oracle_key_str(request)
        self.cache[key] = baseline
        if self._on_new is not None:
            self._on_new(key, baseline)
