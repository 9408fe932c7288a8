"""A transformers continuous-batching batch driven along its timeline (issue 30): requests added while others
run, cancelled mid-flight.

`generate_batch` hands a whole call to the manager's background thread and waits for all of it, so nothing
can arrive while another request is mid-prefill and nothing can be cancelled after N tokens. The manager's
loop is three calls on its batch processor (`prepare_next_batch`, the generation step, `update_batch`);
this module runs that loop on the caller's thread, one step at a time, with the manager's own
`add_request` / `cancel_request` between steps: the same rules as the reference engine's and vLLM's drivers
(reference_engine/timeline.py, adapters/vllm_timeline.py):

- arrival: a request with `arrive_at_step = k` is added once k steps have returned (None or 0: before the
  first); an idle manager does not make it wait (it is added at once and records the earlier step).
- abort: a live request with `abort_after = n` is cancelled after the first step at whose end it holds at
  least n output tokens (n = 0: after the first step since it arrived); its output is what it held then.
  A request that finished first keeps its finish.

The manager is the model's persistent one (the one `generate_batch(persistent_manager=True)` keeps, so
blocks shared with earlier batches can serve these requests, and theirs later ones), left cached and with
the model's attention implementation restored, as `stop(keep_for_next_session=True)` leaves it. Max tokens
and stop ids are per request (`add_request` takes them), so one call carries a whole revision's requests.

It uses the manager's loop internals; `supported` says whether the installed release has them, and the
adapter declares a timeline only where it does (adapters/transformers_versions.py).
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Sequence

import attrs

from conformance.contract import EngineError, Request

_IDS = itertools.count()


def supported() -> bool:
    """Whether this transformers release has the manager loop this driver runs."""
    try:
        from transformers.generation.continuous_batching.continuous_api import (ContinuousBatchingManager,
                                                                                ContinuousBatchProcessor)
    except ImportError:
        return False
    params = inspect.signature(ContinuousBatchingManager.add_request).parameters
    return ({"max_new_tokens", "eos_token_id"} <= set(params)
            and all(hasattr(ContinuousBatchingManager, n) for n in ("_create_batch_processor", "_generation_step",
                                                                    "cancel_request"))
            and all(hasattr(ContinuousBatchProcessor, n) for n in ("prepare_next_batch", "update_batch",
                                                                   "has_pending_requests")))


@attrs.define
class Stepped:
    """One request's output (final, or what it held when cancelled) and where it arrived and ended."""

    request_id: str = ""  # the manager's
    output: list[int] | None = None
    aborted: bool = False
    arrived_at_step: int | None = None
    ended_at_step: int | None = None


def _held(processor: Any, rid: str) -> list[int]:
    s = processor.scheduler
    state = s.active_requests.get(rid) or s.waiting_requests.get(rid)
    return list(state.generated_tokens) if state is not None else []


def run_timeline(model: Any, generation_config: Any, batching_config: Any, part: Sequence[Request],
                 eos_ids: Sequence[list[int]], max_steps: int = 100_000) -> list[Stepped]:
    """Drive `model`'s continuous-batching manager through `part` along its timeline; one `Stepped` per
    request, in batch order. `eos_ids[j]`: the stop ids (eos included) of request j."""
    manager = model.init_continuous_batching(generation_config=generation_config,
                                             continuous_batching_config=batching_config)
    if manager.is_running():
        raise EngineError("the continuous-batching manager is running on its own thread")
    manager.background_thread_status.clear()
    processor = manager._create_batch_processor()  # what the manager's thread does first, kept cache and all
    manager.batch_processor, manager.current_batch = processor, 0
    try:
        state = _drive(manager, processor, part, eos_ids, max_steps)
    finally:
        if manager._original_attn_impl is not None:  # as `stop` does: plain generate must not run paged attention
            model.set_attn_implementation(manager._original_attn_impl)
            manager._original_attn_impl = None
        model._cached_continuous_batching_manager = manager
    return state


def _drive(manager: Any, processor: Any, part: Sequence[Request], eos_ids: Sequence[list[int]],
           max_steps: int) -> list[Stepped]:
    state = [Stepped() for _ in part]
    pending = sorted(range(len(part)), key=lambda j: part[j].arrive_at_step or 0)  # stable within a step
    ids: dict[int, str] = {}
    ours: dict[str, int] = {}
    outputs = manager.output_router.output_queue
    step = 0

    def live() -> bool:
        return any(s.arrived_at_step is not None and s.ended_at_step is None for s in state)

    while pending or live():
        while pending and ((part[pending[0]].arrive_at_step or 0) <= step or not live()):
            j = pending.pop(0)
            rid = f"kvparity-{next(_IDS)}"
            manager.add_request(list(part[j].prompt), request_id=rid, max_new_tokens=part[j].max_tokens,
                                eos_token_id=list(eos_ids[j]))
            ids[j], ours[rid], state[j].arrived_at_step, state[j].request_id = rid, j, step, rid
        if not processor.prepare_next_batch():
            if outputs.empty():
                raise EngineError(f"the continuous-batching manager scheduled nothing with {len(part)} requests live")
        else:
            manager._generation_step()
            manager.current_batch += 1
            processor.update_batch()
            step += 1
        if step > max_steps:
            raise EngineError(f"transformers took more than {max_steps} steps for a batch of {len(part)}")
        while not outputs.empty():
            o = outputs.get_nowait()
            j = ours.get(o.request_id)
            if j is None or state[j].ended_at_step is not None:
                continue
            if o.error:
                raise EngineError(f"continuous batching request {o.request_id}: {o.error}")
            state[j].output, state[j].ended_at_step = list(o.generated_tokens), step
        for j, q in enumerate(part):
            s = state[j]
            if q.abort_after is None or s.arrived_at_step is None or s.ended_at_step is not None:
                continue
            held = _held(processor, ids[j])
            if len(held) >= q.abort_after and (q.abort_after > 0 or step > s.arrived_at_step):
                manager.cancel_request(ids[j])
                s.output, s.aborted, s.ended_at_step = held, True, step
    if any(s.aborted for s in state):
        processor.prepare_next_batch()  # the last cancellations taken in (nothing is left to schedule)
    return state
