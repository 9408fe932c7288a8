"""A transformers continuous-batching batch driven along its timeline (issue 30): requests added while others
run, cancelled mid-flight.

`generate_batch` hands a whole call to the manager's background thread and waits for all of it, so nothing
can arrive while another request is mid-prefill and nothing can be cancelled after N tokens. The manager's
loop is three calls on its batch processor (`prepare_next_batch`, the generation step, `update_batch`);
this module runs that loop on the caller's thread, one step at a time, with the manager's own
`add_request` / `cancel_request` between steps, under the shared rules of arrival and abort
(adapters/timeline_driver.py); a cancelled request's output is what it held when cancelled.

The manager is the model's persistent one (the one `generate_batch(persistent_manager=True)` keeps, so
blocks shared with earlier batches can serve these requests, and theirs later ones), left cached and with
the model's attention implementation restored, as `stop(keep_for_next_session=True)` leaves it. Max tokens
and stop ids are per request (`add_request` takes them), so one call carries a whole revision's requests.

It uses the manager's loop internals; `supported` says whether the installed release has them, and the
adapter declares a timeline only where it does.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, Sequence

import attrs

from adapters.timeline_driver import drive
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
    stepper = _Manager(manager, processor, part, eos_ids)
    try:
        ended = drive(part, stepper, "transformers", max_steps)
        if any(e.aborted for e in ended):
            processor.prepare_next_batch()  # the last cancellations taken in (nothing is left to schedule)
    finally:
        if manager._original_attn_impl is not None:  # as `stop` does: plain generate must not run paged attention
            model.set_attn_implementation(manager._original_attn_impl)
            manager._original_attn_impl = None
        model._cached_continuous_batching_manager = manager
    return [Stepped(stepper.ids.get(j, ""), stepper.outputs.get(j), e.aborted, e.arrived_at_step, e.ended_at_step)
            for j, e in enumerate(ended)]


class _Manager:
    """The manager's loop as a `timeline_driver.Stepper`: each step is `prepare_next_batch`, the generation
    step and `update_batch`; a cancelled request's output is what it held when cancelled."""

    def __init__(self, manager: Any, processor: Any, part: Sequence[Request], eos_ids: Sequence[list[int]]) -> None:
        self.manager, self.processor, self.part, self.eos_ids = manager, processor, part, eos_ids
        self.ids: dict[int, str] = {}
        self.ours: dict[str, int] = {}
        self.outputs: dict[int, list[int]] = {}

    def add(self, j: int) -> None:
        rid, q = f"kvparity-{next(_IDS)}", self.part[j]
        self.manager.add_request(list(q.prompt), request_id=rid, max_new_tokens=q.max_tokens,
                                 eos_token_id=list(self.eos_ids[j]))
        self.ids[j], self.ours[rid] = rid, j

    def step(self) -> list[int]:
        queue = self.manager.output_router.output_queue
        if self.processor.prepare_next_batch():
            self.manager._generation_step()
            self.manager.current_batch += 1
            self.processor.update_batch()
        elif queue.empty():
            raise EngineError(f"the continuous-batching manager scheduled nothing with {len(self.part)} requests")
        finished = []
        while not queue.empty():
            o = queue.get_nowait()
            j = self.ours.get(o.request_id)
            if j is None or j in self.outputs:
                continue
            if o.error:
                raise EngineError(f"continuous batching request {o.request_id}: {o.error}")
            self.outputs[j] = list(o.generated_tokens)
            finished.append(j)
        return finished

    def held(self, j: int) -> int:
        return len(self._held(j))

    def abort(self, j: int) -> None:
        self.outputs[j] = self._held(j)
        self.manager.cancel_request(self.ids[j])

    def _held(self, j: int) -> list[int]:
        s = self.processor.scheduler
        state = s.active_requests.get(self.ids[j]) or s.waiting_requests.get(self.ids[j])
        return list(state.generated_tokens) if state is not None else []
