"""The `reference` oracle: plain greedy decoding by the reference engine's model code, in float64 (or
float32), on the very checkpoint the engine serves — the shipped family (revision, merged LoRA adapter)
or any Llama-family Hugging Face folder (`model_dir`, a user's model: Llama, Mistral, Qwen2).

It shares no code with the engine under test (not its kernels, not its cache, not its dtype), which is
what makes it an independent ground truth; its limit is size (a CPU forward in float64). For models too
big for it, an adapter offers the `self` oracle instead: the engine's own plain mode.

One loaded model per (revision, adapter), kept for the adapter's life: the suite's Oracle memoizes the
answers, this keeps the weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from conformance.contract import Baseline, EngineError, Request, UsageError

ORACLES = ("reference", "self")
DTYPES = ("float64", "float32")


class ReferenceOracle:
    def __init__(self, eos_id: int | None = None, model_dir: str | Path | None = None,
                 dtype: str = "float64") -> None:
        if dtype not in DTYPES:
            raise UsageError(f"oracle_dtype={dtype!r}: the reference oracle computes in {' or '.join(DTYPES)}")
        self.eos_id = eos_id  # None: the checkpoint's own
        self.model_dir = Path(model_dir) if model_dir else None
        self.dtype = dtype
        self._models: dict[tuple[str, str | None], Any] = {}

    @property
    def label(self) -> str:
        return f"reference ({self.dtype})"

    def check_loadable(self) -> None:
        """Refuse, before a run starts, a checkpoint the reference cannot compute (another architecture,
        an unimplemented RoPE variant): one line naming why, and the `oracle=self` way out."""
        if self.model_dir is None:
            return
        from reference_engine import checkpoints
        from reference_engine.model import UnsupportedCheckpoint

        try:
            checkpoints.read_config(self.model_dir)
        except (UnsupportedCheckpoint, FileNotFoundError) as exc:
            raise UsageError(f"oracle=reference cannot load {self.model_dir}: {exc}; use oracle=self") from None

    def _model(self, revision: str, adapter: str | None):
        import torch

        from reference_engine import checkpoints

        key = (revision, adapter)
        if key not in self._models:
            dtype = getattr(torch, self.dtype)
            if self.model_dir is None:
                self._models[key] = checkpoints.load_target(revision, adapter, dtype)
            elif adapter is not None or revision != "a":
                raise EngineError(f"the reference oracle on {self.model_dir} serves revision 'a' only, no adapters")
            else:
                self._models[key] = checkpoints.load_model_dir(self.model_dir, dtype)
        return self._models[key]

    def baseline(self, request: Request, prompt: Sequence[int] | None = None) -> Baseline:
        """Greedy decoding of `request` (of `prompt` instead of its own, where the engine is sent another
        form of it, e.g. text that re-tokenises differently)."""
        from reference_engine.baseline import greedy

        model = self._model(request.identity.revision, request.identity.adapter)
        g = greedy(model, request.prompt if prompt is None else prompt, request.max_tokens,
                   request.stop_ids, self.eos_id)
        return Baseline(g.output, g.finish_reason, g.margins, g.runner_up, g.contenders, g.logprobs)
