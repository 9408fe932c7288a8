"""Which mechanism the run's wrong outputs point at, when a wrong request had several in play.

A request that was chunked, batched and served after an eviction, and differs from plain decoding, is
seen by three independence checks; only one of them names the bug. Two facts of the whole run decide:

- **where its KV came from.** A request served from the prefix cache reads KV an earlier request
  wrote; when that writer was chunked or speculated, the bug may be in how the KV was written, not in
  the hit (a chunk's positions counted from the chunk start poison the block a later request hits).
  So a cache hit carries the writer's write-side mechanisms along (`request_mechanisms`).
- **which mechanism the wrong outputs share and the right ones lack** (spectrum-based fault
  localisation, Ochiai: wrong(m) / sqrt(wrong * ran(m))). Eviction in a small pool is in play for most
  requests, right ones too; the mechanism behind the bug is in play mostly where outputs go wrong.

Nothing here changes a verdict: `conformance.grouping` uses the scores to choose which check a finding
is listed under.
"""

from __future__ import annotations

import math
from typing import Any

from conformance.history import BatchRecord, Example, History
from conformance.history_facts import batch_evicted, chunked, lcp, mechanisms
from conformance.oracle import DIVERGE, FINISH, compare

SINGLE = {"cache": "history_independence", "spec": "spec_independence", "schedule": "schedule_independence"}


def epoch_evicted(ex: Example, b: BatchRecord) -> bool:
    """Did a batch of this cache epoch and configuration, up to and including `b`, evict?"""
    return any(batch_evicted(x) for x in ex.batches[: b.index + 1] if (x.epoch, x.segment) == (b.epoch, b.segment))


def kv_writer(ex: Example, b: BatchRecord, q: Any) -> tuple[Any, Any] | None:
    """The earlier request of the same identity, cache epoch and configuration that shares the longest
    prefix with `q` (the likeliest writer of the KV `q` hit), with its result; None if there is none."""
    best, best_n = None, 0
    for x in ex.batches[: b.index]:
        if (x.epoch, x.segment) != (b.epoch, b.segment):
            continue
        for _, q2, r2 in x.pairs():
            n = lcp(q.prompt, q2.prompt) if q2.identity == q.identity else 0
            if n > best_n:
                best, best_n = (q2, r2), n
    return best


def request_mechanisms(ex: Example, b: BatchRecord, q: Any, r: Any) -> set[str]:
    """The mechanism checks whose mechanism was in play for this request: its own (cache hit,
    speculation, scheduling), eviction in its epoch, and for a cache hit the write-side mechanisms
    (chunked prefill, speculation) of the request that wrote the KV it read."""
    out = {SINGLE[m] for m in mechanisms(b, r)} | ({"eviction_safety"} if epoch_evicted(ex, b) else set())
    if r.cached_tokens:
        writer = kv_writer(ex, b, q)
        if writer is not None:
            w = writer[1]
            out |= ({"schedule_independence"} if chunked(w) or w.preempted else set()) | \
                   ({"spec_independence"} if w.draft_proposed else set())
    return out


def mechanism_support(history: History) -> dict[str, float]:
    """Each mechanism check's Ochiai score over every request the run sent (see the module docstring)."""
    wrong: dict[str, int] = {}
    ran: dict[str, int] = {}
    total_wrong = 0
    for ex in history.examples:
        for b in ex.batches:
            for _, q, r in b.pairs():
                base = history.baseline_for(q)
                if base is None or r.finish_reason == "abort":
                    continue
                bad = compare(base, r.output, r.finish_reason, history.tolerance).kind in (DIVERGE, FINISH)
                total_wrong += bad
                for c in request_mechanisms(ex, b, q, r):
                    ran[c] = ran.get(c, 0) + 1
                    wrong[c] = wrong.get(c, 0) + bad
    return {c: wrong.get(c, 0) / math.sqrt(total_wrong * n) for c, n in ran.items() if total_wrong and n}
