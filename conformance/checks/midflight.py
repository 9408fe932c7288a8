"""The check on requests stopped mid-flight (issue 30): what an aborted request did produce is right.

An aborted result is never compared whole (its output is cut short by design: every other check leaves
results with finish_reason "abort" out, `history_facts.occurrences`), but a cut-short output is still
an output: each token of it was the engine's answer, so it must be a prefix of plain decoding, and its
accounting must hold — no more tokens than max_tokens, and a timeline that happened in order (arrived
no later than asked, ended no earlier than it arrived). Whether the KV an aborted request left behind is
served to anyone is judged where it shows: the outputs of later requests (parity, isolation and the
independence checks) and the pool at rest (rollback_hygiene).
"""

from __future__ import annotations

from conformance.checks.common import divergence_witness, request_json
from conformance.checks.registry import CheckRecorder, check
from conformance.contract import Baseline, Request, Result
from conformance.history import History
from conformance.oracle import DIVERGE, NEAR_TIE, compare
from conformance.verdicts import CheckResult, Severity


def partial(base: Baseline, n: int) -> Baseline:
    """Plain decoding cut to its first `n` tokens: what an output aborted after `n` tokens must equal."""
    return Baseline(base.output[:n], "abort", base.margins[:n], base.runner_up[:n], base.contenders[:n])


def timeline_problems(q: Request, r: Result, paced: bool = False) -> list[tuple[str, str]]:
    """What a result's timeline says that cannot have happened (`paced`: the engine's arrivals are paced by
    a client, contract.TIMELINE, so a late one is allowed)."""
    bad = []
    if len(r.output) > q.max_tokens:
        bad.append(("more tokens than max_tokens", f"{len(r.output)} tokens > max_tokens {q.max_tokens}"))
    late = r.arrived_at_step is not None and q.arrive_at_step is not None and r.arrived_at_step > q.arrive_at_step
    if late and not paced:
        bad.append(("arrived later than asked", f"asked for step {q.arrive_at_step}, arrived at {r.arrived_at_step}"))
    if r.arrived_at_step is not None and r.ended_at_step is not None and r.ended_at_step < r.arrived_at_step:
        bad.append(("ended before it arrived", f"arrived at step {r.arrived_at_step}, ended at {r.ended_at_step}"))
    return bad


@check(title="an aborted request's partial output is a prefix of plain decoding", severity=Severity.HIGH,
       bug_class="B", applies=lambda c: "abort" in c.timeline)
def abort_prefix(h: History, f: CheckRecorder) -> CheckResult:
    """Each aborted request's output is a prefix of plain decoding; its counts and timeline are consistent."""
    paced = h.capabilities is not None and "arrival" not in h.capabilities.timeline
    for b in h.batches():
        for i, q, r in b.pairs():
            for title, detail in timeline_problems(q, r, paced):
                f.fail(b.example, title, f"Request {q.id}: {detail}.",
                       {"batch": b.index, "request": request_json(q), "output": list(r.output),
                        "finish_reason": r.finish_reason, "arrived_at_step": r.arrived_at_step,
                        "ended_at_step": r.ended_at_step}, bug_class="E")
            if r.finish_reason != "abort":
                continue
            if q.abort_after is None:
                f.note(f"request {q.id} was aborted without an abort point (by the engine itself)")
            base = h.baseline_for(q)
            if base is None:
                f.note(f"no baseline recorded for request {q.id}")
                continue
            f.stats["aborted"] += 1
            c = compare(partial(base, len(r.output)), r.output, "abort", h.tolerance)
            if c.kind == NEAR_TIE:
                f.stats["near_ties"] += 1
            elif c.kind == DIVERGE:
                f.fail(b.example, "aborted output is not a prefix of plain decoding",
                       f"Request {q.id} ({q.identity.label()}, {len(q.prompt)} prompt tokens) was aborted after "
                       f"{len(r.output)} tokens: {c.describe()}. Every token an engine produced before an abort "
                       f"was its answer, and must be plain decoding's.",
                       divergence_witness(b, i, q, r, c, base.output))
    return f.result(f.stats["aborted"] > 0, "no request was aborted")
