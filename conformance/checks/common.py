"""What several checks share and nothing outside the checks needs: comparing one result against the
oracle and saying what diverged, with its witness and its context in prose. The facts of a history the
checks share with the rest of kvparity (chunked? evicted? what was cacheable?) are
`conformance.history_facts`."""

from __future__ import annotations

from typing import Any, Iterable

from conformance.checks.registry import CheckRecorder
from conformance.contract import Request, Result
from conformance.history import BatchRecord, History
from conformance.history_codec import encode
from conformance.history_facts import chunked
from conformance.oracle import DIVERGE, FINISH, NEAR_TIE, Comparison, compare


def request_json(q: Request) -> dict[str, Any]:
    return encode(q)


def divergence_witness(b: BatchRecord, i: int, q: Request, r: Result, c: Comparison,
                       baseline_output: Iterable[int] | None = None) -> dict[str, Any]:
    return {"batch": b.index, "position_in_batch": i, "batch_size": len(b.requests), "config": b.config,
            "request": request_json(q), "identity": q.identity.label(), "output": list(r.output),
            "expected_output": None if baseline_output is None else list(baseline_output),
            "finish_reason": r.finish_reason, "cached_tokens": r.cached_tokens,
            "draft_accepted": r.draft_accepted, "comparison": c.to_json(),
            "first_divergent_position": c.position, "expected": c.expected, "got": c.got,
            "baseline_margin": c.margin}


def context_prose(b: BatchRecord, r: Result) -> str:
    bits = [f"batch of {len(b.requests)}", f"config {dict(b.config) or 'default'}"]
    if r.cached_tokens:
        bits.append(f"{r.cached_tokens} prompt tokens reported as served from cache")
    if r.draft_accepted:
        bits.append(f"{r.draft_accepted}/{r.draft_proposed} draft tokens accepted")
    if chunked(r):
        bits.append("prefill was chunked")
    if r.evictions:
        bits.append(f"{r.evictions} evictions")
    return "; ".join(bits)


def vs_baseline(f: CheckRecorder, h: History, b: BatchRecord, i: int, q: Request, r: Result,
                title: str, why: str) -> None:
    """Compare one result against the oracle; record a near-tie or a failure."""
    base = h.baseline_for(q)
    if base is None:
        f.note(f"no baseline recorded for request {q.id}")
        return
    c = compare(base, r.output, r.finish_reason, h.tolerance)
    f.stats["compared"] += 1
    if c.kind == NEAR_TIE:
        f.stats["near_ties"] += 1
        f.note(f"near-tie (counted, not a failure): request {q.id} {c.describe()}")
    elif c.kind in (DIVERGE, FINISH):
        f.fail(b.example, title, f"Request {q.id} ({q.identity.label()}, {len(q.prompt)} prompt tokens): "
               f"{c.describe()}. {why} Context: {context_prose(b, r)}.",
               divergence_witness(b, i, q, r, c, base.output))


