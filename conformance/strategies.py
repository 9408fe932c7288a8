"""Hypothesis strategies for request streams, driven by what the engine declares (`Capabilities`).

Bugs in KV reuse live where prefixes are shared, so streams are drawn as prefix trees: a few shared
roots (a system prompt, few-shot examples) that requests extend, exact resends in another grouping or
order, multi-turn conversations (next prompt = previous prompt + its *output* + new tokens — only known
at run time, so a `Continuation` is resolved by the runner), and poisoning (identity A warms a prefix,
identity B sends the same tokens). Lengths concentrate at multiples of the block size +/- 1, where
partial-block and last-token bugs hide (BUG_CLASSES B). Sizes stay small so CI is fast.

The pieces: `scenario` (the step types), `domains` (what each field is drawn from), `stream` (a stream
being drawn), `step_kinds` (how it grows), `steering` (closing steps). This module puts them together.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.contract import Capabilities
from conformance.domains import sampled
from conformance.scenario import Step
from conformance.steering import STEERING, TAILS
from conformance.step_kinds import KINDS, draw_step
from conformance.stream import Stream


@st.composite
def scenarios(draw: st.DrawFn, caps: Capabilities, max_steps: int = 6, max_batch: int = 4) -> tuple[Step, ...]:
    """A request stream as a prefix tree, with resends, conversations, poisoning and reconfiguration."""
    s = Stream(draw, caps, max_batch)
    if caps.config_space:
        s.configure()
    for _ in range(draw(st.integers(min(2, max_steps), max_steps))):
        draw_step(s, draw(sampled(KINDS)))
    for tail in TAILS:
        if tail.applies(s) and draw(st.booleans()):
            tail.build(s)
    for tail, flips in STEERING:
        if tail.applies(s) and all(draw(st.booleans()) for _ in range(flips)):
            tail.build(s)
    return tuple(s.steps)
