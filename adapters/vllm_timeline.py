"""A vLLM batch driven along its timeline (issue 30): requests added while others run, aborted mid-flight.

`LLM.generate` submits a whole batch before the first step and runs it to its end, so nothing can arrive
while another request is mid-prefill and nothing can be aborted. vLLM's `LLMEngine` can do both between
`step()` calls (`add_request`, `abort_request`), as its serving front end does; this module holds that
loop, as the reference engine's timeline driver does (reference_engine/timeline.py), with the same rules:

- arrival: a request with `arrive_at_step = k` is added once k steps have returned (None or 0: before
  the first); an idle engine does not make it wait (it is added at once and records the earlier step).
- abort: a live request with `abort_after = n` is aborted after the first step at whose end it holds at
  least n output tokens (n = 0: after the first step since it arrived). A step may bring several tokens
  (accepted drafts), so an abort may find more than n; a request that finished first keeps its finish.

A step here is one `LLMEngine.step()` that returned, the unit a front end sees. With vLLM's engine core in
its own process (the default), the core may run more than one forward pass per front-end step: arrivals
and aborts are as precise as a front end can make them, and each result records where its request really
arrived and ended.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import attrs

from conformance.contract import EngineError, Request

_IDS = itertools.count()


@attrs.define
class Stepped:
    """One request's last output seen (cumulative), whether it was aborted, and where it arrived/ended."""

    output: Any = None
    aborted: bool = False
    arrived_at_step: int | None = None
    ended_at_step: int | None = None


def has_timeline(part: Sequence[Request]) -> bool:
    return any(q.arrive_at_step is not None or q.abort_after is not None for q in part)


def run_timeline(engine: Any, part: Sequence[Request], prompts: Sequence[Any], params: Sequence[Any],
                 loras: Sequence[Any], max_steps: int = 100_000) -> list[Stepped]:
    """Drive `engine` (an `LLMEngine`) through `part` along its timeline; one `Stepped` per request, in
    batch order. `params` must ask for cumulative outputs (the `SamplingParams` default)."""
    state = [Stepped() for _ in part]
    pending = sorted(range(len(part)), key=lambda j: part[j].arrive_at_step or 0)  # stable within a step
    vllm_id: dict[int, str] = {}
    ours: dict[str, int] = {}
    step = 0
    while pending or any(s.arrived_at_step is not None and s.ended_at_step is None for s in state):
        while pending and ((part[pending[0]].arrive_at_step or 0) <= step or not engine.has_unfinished_requests()):
            j = pending.pop(0)
            rid = f"kvparity-{next(_IDS)}"
            internal = engine.add_request(rid, prompts[j], params[j], lora_request=loras[j])
            # outputs name the id given (later vLLM adds a random suffix inside and returns that): both map back
            vllm_id[j], ours[rid], ours[internal], state[j].arrived_at_step = rid, j, j, step
        outputs = engine.step()
        step += 1
        if step > max_steps:
            raise EngineError(f"vLLM took more than {max_steps} steps for a batch of {len(part)}")
        for o in outputs:
            j = ours.get(o.request_id)
            if j is None or state[j].ended_at_step is not None:
                continue
            state[j].output = o
            if o.finished:
                state[j].ended_at_step = step
        for j, q in enumerate(part):
            s = state[j]
            if q.abort_after is None or s.arrived_at_step is None or s.ended_at_step is not None:
                continue
            held = len(s.output.outputs[0].token_ids) if s.output is not None and s.output.outputs else 0
            if held >= q.abort_after and (q.abort_after > 0 or step > s.arrived_at_step):
                engine.abort_request([vllm_id[j]])
                s.aborted, s.ended_at_step = True, step
    return state
