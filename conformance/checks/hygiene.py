"""(White-box) rollback hygiene: after every batch — also one the engine failed — no provisional or
rejected KV survives and the pool is back at its base (BUG_CLASSES C: provisional KV of rejected drafts
left in place or entered into the prefix cache)."""

from __future__ import annotations

from typing import Any, Mapping

from conformance.checks.common import context_prose, request_json
from conformance.checks.registry import CheckRecorder, check
from conformance.history import History
from conformance.verdicts import CheckResult, Severity

# Snapshot keys read by rollback_hygiene (see contract.Introspectable): each is optional; present ones
# must hold their value once a batch has completed.
SNAPSHOT_AT_REST = {"blocks_in_use": 0, "provisional_live": 0, "rejected_in_cache": 0, "refcounts_ok": True}


@check(title="pool returns to its base after every batch", severity=Severity.HIGH, bug_class="C",
       applies=lambda c: c.introspection)
def rollback_hygiene(h: History, f: CheckRecorder) -> CheckResult:
    """(white-box) No provisional or rejected KV survives a batch; the pool returns to its base. Also
    after a batch the engine failed: a leak often ends in a stall, and its snapshot names the leak."""
    for b in h.batches():
        if b.snapshot is None:
            continue
        f.stats["snapshots"] += 1
        problems = pool_problems(b.snapshot)
        if problems:
            f.fail(b.example, "pool not back to base after a batch",
                   f"After batch {b.index} completed ({context_prose(b, b.results[0]) if b.results else ''}): "
                   + "; ".join(problems) + ". Provisional (rejected draft) KV or leaked blocks survive the batch.",
                   {"batch": b.index, "snapshot": dict(b.snapshot), "config": b.config,
                    "requests": [request_json(q) for q in b.requests]})
    for ex in h.examples:
        for fb in ex.failed_batches:
            f.stats["snapshots"] += 1
            problems = pool_problems(fb.snapshot)
            if problems:
                f.fail(fb.example, "pool not back to base after a failed batch",
                       f"Batch {fb.index} ({len(fb.requests)} requests; config {dict(fb.config)}) ended in an engine "
                       f"error ({ex.errors[-1] if ex.errors else 'unknown'}), and the pool is not back to base: "
                       + "; ".join(problems) + ". Blocks that outlive their requests are a leak; a leak ends in "
                       "a stall once nothing more can be allocated.",
                       {"batch": fb.index, "snapshot": dict(fb.snapshot), "config": dict(fb.config),
                        "requests": [request_json(q) for q in fb.requests]})
    return f.result(f.stats["snapshots"] > 0, "introspection claimed but no snapshot recorded")


def pool_problems(snap: Mapping[str, Any]) -> list[str]:
    """What in a snapshot differs from the pool at rest (SNAPSHOT_AT_REST; free + cached = total)."""
    problems = [f"{k}={snap[k]!r} (expected {v!r})" for k, v in SNAPSHOT_AT_REST.items() if k in snap and snap[k] != v]
    if all(k in snap for k in ("free_blocks", "cached_blocks", "total_blocks")):
        if int(snap["free_blocks"]) + int(snap["cached_blocks"]) != int(snap["total_blocks"]):
            problems.append(f"free_blocks {snap['free_blocks']} + cached_blocks {snap['cached_blocks']} != "
                            f"total_blocks {snap['total_blocks']}")
    return problems
