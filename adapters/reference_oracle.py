"""The oracle of adapters whose engine has no baseline mode of its own: plain greedy decoding by the
reference model, in float64, on the very checkpoint (revision, merged LoRA adapter) the engine serves.

One loaded model per (revision, adapter), kept for the adapter's life: the suite's Oracle memoizes the
answers, this keeps the weights."""

from __future__ import annotations

from typing import Any, Sequence

from conformance.contract import Baseline, Request


class ReferenceOracle:
    def __init__(self, eos_id: int | None = None) -> None:
        self.eos_id = eos_id  # None: the checkpoint's own
        self._models: dict[tuple[str, str | None], Any] = {}

    def baseline(self, request: Request, prompt: Sequence[int] | None = None) -> Baseline:
        """Greedy decoding of `request` (of `prompt` instead of its own, where the engine is sent another
        form of it, e.g. text that re-tokenises differently)."""
        from reference_engine import checkpoints
        from reference_engine.baseline import greedy

        key = (request.identity.revision, request.identity.adapter)
        if key not in self._models:
            self._models[key] = checkpoints.load_target(*key)
        g = greedy(self._models[key], request.prompt if prompt is None else prompt, request.max_tokens,
                   request.stop_ids, self.eos_id)
        return Baseline(g.output, g.finish_reason, g.margins, g.runner_up)
