"""The rules of a batch driven along its timeline (issue 30), shared by the engines that can be stepped from
outside: vLLM's `LLMEngine` (adapters/vllm_timeline.py) and transformers' continuous-batching manager
(adapters/transformers_timeline.py); the reference engine has its own (reference_engine/timeline.py), as
it imports nothing of the suite.

- arrival: a request with `arrive_at_step = k` is submitted once k steps have returned (None or 0: before
  the first); an idle engine does not make it wait (it is submitted at once and records the earlier step).
- abort: a live request with `abort_after = n` is aborted after the first step at whose end it holds at
  least n output tokens (n = 0: after the first step since it arrived). A step may bring several tokens
  (accepted drafts), so an abort may find more than n; a request that finished first keeps its finish.

Each engine supplies the four calls a front end has (`Stepper`); each result says where its request
really arrived and ended, in steps that returned.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

import attrs

from conformance.contract import EngineError, Request


class Stepper(Protocol):
    def add(self, j: int) -> None: ...  # submit request j of the batch
    def step(self) -> Iterable[int]: ...  # one engine step; the requests it finished
    def held(self, j: int) -> int: ...  # output tokens request j holds now
    def abort(self, j: int) -> None: ...


@attrs.define
class Ended:
    """Where one request arrived and ended, and whether it was aborted."""

    arrived_at_step: int | None = None
    ended_at_step: int | None = None
    aborted: bool = False


def has_timeline(part: Sequence[Request]) -> bool:
    return any(q.arrive_at_step is not None or q.abort_after is not None for q in part)


def drive(part: Sequence[Request], engine: Stepper, what: str, max_steps: int = 100_000) -> list[Ended]:
    """Drive `engine` through `part` along its timeline; one `Ended` per request, in batch order."""
    state = [Ended() for _ in part]
    pending = sorted(range(len(part)), key=lambda j: part[j].arrive_at_step or 0)  # stable within a step
    step = 0

    def live() -> bool:
        return any(s.arrived_at_step is not None and s.ended_at_step is None for s in state)

    while pending or live():
        while pending and ((part[pending[0]].arrive_at_step or 0) <= step or not live()):
            j = pending.pop(0)
            engine.add(j)
            state[j].arrived_at_step = step
        finished = list(engine.step())
        step += 1
        if step > max_steps:
            raise EngineError(f"{what} took more than {max_steps} steps for a batch of {len(part)}")
        for j in finished:
            if state[j].ended_at_step is None:
                state[j].ended_at_step = step
        for j, q in enumerate(part):
            s = state[j]
            if q.abort_after is None or s.arrived_at_step is None or s.ended_at_step is not None:
                continue
            if engine.held(j) >= q.abort_after and (q.abort_after > 0 or step > s.arrived_at_step):
                engine.abort(j)
                s.aborted, s.ended_at_step = True, step
    return state
