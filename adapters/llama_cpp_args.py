"""The llama.cpp adapter's engine arguments as one typed, frozen value (`LlamaCppArgs`).

Parsed from the command line's strings before llama-cpp-python is imported or any GGUF exported: each
field converts its own and a bad one is a one-line UsageError naming it. What only the installed
llama-cpp-python can say (speculative decoding, GGUF LoRA) is still checked by the adapter.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen

from adapters.engine_args import list_arg, num_arg, to_bool, to_choice, to_int
from conformance.contract import UsageError

GGML_TYPE = {"f32": 0, "f16": 1}
DRAFTERS = ("none", "prompt_lookup", "draft_model", "adversarial")
CACHES = ("none", "ram", "disk")
KNOBS = ("drafter", "k", "n_batch", "cache")


def _vary(value: Any) -> tuple[str, ...]:
    knobs = tuple(map(str, value)) if isinstance(value, (list, tuple)) else tuple(list_arg(value))
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        raise UsageError(f"vary: unknown knob(s) {', '.join(unknown)}; choose from {', '.join(KNOBS)}")
    return knobs


def _tolerance(value: Any) -> float | None:
    """A tie tolerance in logits, or None ("" too) for the measured default."""
    return None if value in (None, "") else num_arg("tolerance", value)


def _path(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


@frozen
class LlamaCppArgs:
    """Every engine argument of the llama.cpp adapter, converted and checked. `drafter`, `k`, `n_batch`
    and `cache` are also knobs (`vary`): their values here are the defaults, shrunk towards. Defaults are
    written as the command line would say them (converted like any argument)."""

    gguf_dir: str | None = field(default=None, converter=_path)
    n_ctx: int = field(default=1024, converter=to_int(16))
    n_batch: int = field(default=512, converter=to_int())
    kv_type: str = field(default="f32", converter=to_choice(tuple(GGML_TYPE)))
    drafter: str = field(default="none", converter=to_choice(DRAFTERS))
    k: int = field(default=4, converter=to_int())
    cache: str = field(default="none", converter=to_choice(CACHES))
    cache_dir: str | None = field(default=None, converter=_path)
    tolerance: float | None = field(default=None, converter=_tolerance)
    n_threads: int = field(default=1, converter=to_int())
    seed: int = field(default=0, converter=to_int(0))
    lora: str = field(default="auto", converter=to_choice(("auto", "off")))
    cache_scope: str = field(default="shared", converter=to_choice(("shared", "identity")))
    logits_all: bool = field(default=True, converter=to_bool())
    vary: tuple[str, ...] = field(default=",".join(KNOBS), converter=_vary)

    def knob_defaults(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "k": self.k, "n_batch": self.n_batch, "cache": self.cache}
