"""The reference engine driven step by step along a batch's timeline (issue 30): each request submitted
at its arrival step, each aborted once it has produced its abort point's tokens.

Why a driver of its own rather than `Engine.generate`: a plain batch is submitted whole before the first
step and run to its end, so no request can arrive while another is mid-prefill, and nothing can be
aborted. Here the caller (the reference adapter) holds the step loop, as a serving front end does, and records where each
request really arrived and ended — in engine steps, the unit the reference engine is precise in.

The rules, stated once:
- arrival: a request with `arrive_at_step = k` is submitted once k steps have run (None or 0: before
  the first). An idle engine does not make a request wait: when nothing runs, the next pending requests
  are submitted at once, and the result records the earlier step (never the asked one).
- abort: a live request with `abort_after = n` is aborted after the first step at whose end it has been
  scheduled (its prefill begun) and holds at least n output tokens — with n = 0, during its prefill when
  that takes several steps (chunked prefill, a token budget), else right after the step that produced
  its first token. A step may commit several tokens (accepted drafts), so an abort may find more than n.
  A request that finished before its abort point keeps its own finish_reason: the abort came too late.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs

from reference_engine.engine import Engine, Request as EngineRequest
from reference_engine.sequence import Report


@attrs.frozen
class Timed:
    """One request of the batch with its timeline."""

    request: EngineRequest
    arrive_at_step: int | None = None
    abort_after: int | None = None


@attrs.frozen
class Ended:
    """A request's report and where it really arrived and ended, in engine steps."""

    report: Report
    arrived_at_step: int
    ended_at_step: int


def run_timeline(engine: Engine, batch: Sequence[Timed], on_step: Callable[[], None] = lambda: None) -> list[Ended]:
    """Run `batch` along its timeline; results in batch order. The requests were checked before (the
    adapter refuses the bad ones first), so a submission cannot fail on its own input."""
    pending = sorted(batch, key=lambda t: t.arrive_at_step or 0)  # stable: list order within one step
    arrived: dict[str, int] = {}
    ended: dict[str, int] = {}
    step = 0
    while pending or engine.has_unfinished():
        while pending and ((pending[0].arrive_at_step or 0) <= step or not engine.has_unfinished()):
            t = pending.pop(0)
            r = t.request
            engine.add_request(r.request_id, r.prompt, r.max_tokens, r.stop_ids, r.identity)
            arrived[r.request_id] = step
        for report in engine.step():
            ended[report.request_id] = step + 1
        step += 1
        on_step()
        for t in batch:
            if t.request.request_id in arrived and t.request.request_id not in ended and _abort_due(engine, t):
                engine.abort(t.request.request_id)
                ended[t.request.request_id] = step
    return [Ended(engine.finished[t.request.request_id], arrived[t.request.request_id],
                  ended[t.request.request_id]) for t in batch]


def _abort_due(engine: Engine, t: Timed) -> bool:
    """Has the live request reached its abort point: begun (scheduled at least once), with at least
    `abort_after` output tokens?"""
    if t.abort_after is None:
        return False
    seq = engine.live.get(t.request.request_id)
    if seq is None:
        return False
    begun = seq.num_computed > 0 or seq.prefill_chunks > 0 or bool(seq.output)
    return begun and len(seq.output) >= t.abort_after
