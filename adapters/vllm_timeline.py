"""A vLLM batch driven along its timeline (issue 30): requests added while others run, aborted mid-flight.

`LLM.generate` submits a whole batch before the first step and runs it to its end, so nothing can arrive
while another request is mid-prefill and nothing can be aborted. vLLM's `LLMEngine` can do both between
`step()` calls (`add_request`, `abort_request`), as its serving front end does; this module gives it to
the shared driver (adapters/timeline_driver.py: the rules of arrival and abort).

A step here is one `LLMEngine.step()` that returned, the unit a front end sees. With vLLM's engine core in
its own process (the default), the core may run more than one forward pass per front-end step: arrivals
and aborts are as precise as a front end can make them, and each result records where its request really
arrived and ended.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import attrs

from adapters.timeline_driver import drive, has_timeline
from conformance.contract import Request

__all__ = ["Stepped", "has_timeline", "run_timeline"]
_IDS = itertools.count()


@attrs.define
class Stepped:
    """One request's last output seen (cumulative), whether it was aborted, and where it arrived/ended."""

    output: Any = None
    aborted: bool = False
    arrived_at_step: int | None = None
    ended_at_step: int | None = None


class _Engine:
    """An `LLMEngine` as a `timeline_driver.Stepper`, keeping each request's last (cumulative) output."""

    def __init__(self, engine: Any, prompts: Sequence[Any], params: Sequence[Any], loras: Sequence[Any]) -> None:
        self.engine, self.prompts, self.params, self.loras = engine, prompts, params, loras
        self.ids: dict[int, str] = {}
        self.ours: dict[str, int] = {}
        self.outputs: dict[int, Any] = {}
        self.closed: set[int] = set()  # finished or aborted: later outputs are not theirs to keep

    def add(self, j: int) -> None:
        rid = f"kvparity-{next(_IDS)}"
        internal = self.engine.add_request(rid, self.prompts[j], self.params[j], lora_request=self.loras[j])
        # outputs name the id given (later vLLM adds a random suffix inside and returns that): both map back
        self.ids[j], self.ours[rid], self.ours[internal] = rid, j, j

    def step(self) -> list[int]:
        finished = []
        for o in self.engine.step():
            j = self.ours.get(o.request_id)
            if j is None or j in self.closed:
                continue
            self.outputs[j] = o
            if o.finished:
                finished.append(j)
                self.closed.add(j)
        return finished

    def held(self, j: int) -> int:
        o = self.outputs.get(j)
        return len(o.outputs[0].token_ids) if o is not None and o.outputs else 0

    def abort(self, j: int) -> None:
        self.engine.abort_request([self.ids[j]])
        self.closed.add(j)


def run_timeline(engine: Any, part: Sequence[Request], prompts: Sequence[Any], params: Sequence[Any],
                 loras: Sequence[Any], max_steps: int = 100_000) -> list[Stepped]:
    """Drive `engine` (an `LLMEngine`) through `part` along its timeline; one `Stepped` per request, in
    batch order. `params` must ask for cumulative outputs (the `SamplingParams` default)."""
    stepper = _Engine(engine, prompts, params, loras)
    ended = drive(part, stepper, "vLLM", max_steps)
    return [Stepped(stepper.outputs.get(j), e.aborted, e.arrived_at_step, e.ended_at_step)
            for j, e in enumerate(ended)]
