"""The vLLM adapter's mid-flight driver (adapters/vllm_timeline.py) against a FAKE `LLMEngine` (one token
per live request per step, cumulative outputs, as vLLM's default output kind): arrivals wait for their
step unless the engine is idle, aborts come after the step that reached their point, a request that
finishes first keeps its finish. The real engine: reports/vllm/README.md ("Mid-flight")."""

from __future__ import annotations

from types import SimpleNamespace

import attrs

from adapters.vllm_timeline import has_timeline, run_timeline
from conformance.contract import Request


class FakeLLMEngine:
    """A FAKE, for the driver's own logic: each live request gains one token per step until max_tokens."""

    def __init__(self) -> None:
        self.live: dict[str, list[int]] = {}
        self.max: dict[str, int] = {}
        self.aborted: list[str] = []

    def add_request(self, rid, prompt, params, lora_request=None):
        self.live[rid], self.max[rid] = [], params.max_tokens
        return rid + "-internal"  # as vLLM 0.32: an internal id returned, outputs and aborts by the given one

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self):
        out = []
        for rid, toks in list(self.live.items()):
            toks.append(7)
            done = len(toks) >= self.max[rid]
            out.append(SimpleNamespace(request_id=rid, finished=done, outputs=[SimpleNamespace(token_ids=list(toks))]))
            if done:
                del self.live[rid]
        return out

    def abort_request(self, ids):
        for rid in ids:
            self.aborted.append(rid)
            self.live.pop(rid, None)


def _run(part):
    params = [SimpleNamespace(max_tokens=q.max_tokens) for q in part]
    engine = FakeLLMEngine()
    return engine, run_timeline(engine, part, [None] * len(part), params, [None] * len(part))


def test_arrivals_wait_for_their_step_and_aborts_come_after_their_point():
    q = Request("q", (1, 2, 3), 6)
    part = [q, attrs.evolve(q, id="late", arrive_at_step=2), attrs.evolve(q, id="cut", abort_after=3),
            attrs.evolve(q, id="early", abort_after=0), attrs.evolve(q, id="done", max_tokens=2, abort_after=4)]
    assert has_timeline(part) and not has_timeline([q])
    engine, s = _run(part)
    assert (s[0].arrived_at_step, s[0].ended_at_step, s[0].aborted) == (0, 6, False)
    assert (s[1].arrived_at_step, s[1].ended_at_step) == (2, 8)
    assert s[2].aborted and s[2].ended_at_step == 3 and len(s[2].output.outputs[0].token_ids) == 3
    assert s[3].aborted and s[3].ended_at_step == 1
    assert not s[4].aborted and s[4].ended_at_step == 2  # finished before its abort point: too late
    assert len(engine.aborted) == 2 and not any(a.endswith("-internal") for a in engine.aborted)


def test_an_idle_engine_does_not_make_a_request_wait():
    q = Request("q", (1, 2, 3), 2, arrive_at_step=5)
    _, s = _run([q])
    assert s[0].arrived_at_step == 0 and s[0].ended_at_step == 2
