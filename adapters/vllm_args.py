"""The vLLM adapter's engine arguments as one typed, frozen value (`VllmArgs`).

Parsed from the command line's strings before vLLM is imported (an import costs seconds and a wrong
argument should cost none): each field converts its own and a bad one is a one-line UsageError naming
it. What only the installed vLLM can say (which speculative methods it has) is still checked by the
adapter. Each argument is documented in the module docstring of adapters/vllm.py.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen

from adapters.engine_args import int_arg, list_arg, to_bool, to_choice, to_int, to_num
from conformance.contract import UsageError

DEFAULT_TOLERANCE = 1e-3  # adapters/vllm.py says how it was measured
SPECS = ("none", "ngram", "draft")
VARIABLE = ("spec", "k", "max_num_batched_tokens", "prefix_caching")  # the knobs vary= may name
IDENTITIES = ("salt", "adapter", "revision")
LORA_IDS = {"upper": 1, "rot13": 2}  # the shipped LoRA adapters and their vLLM LoRA ids


def _block_size(value: Any) -> int:
    size = int_arg("block_size", value)
    if size % 32:
        raise UsageError(f"block_size={size}: vLLM CPU needs a multiple of 32")
    return size


def _names(value: Any) -> tuple[str, ...]:
    return tuple(map(str, value)) if isinstance(value, (list, tuple)) else tuple(list_arg(value))


def _identities(value: Any) -> frozenset[str]:
    names = frozenset(value) if isinstance(value, (set, frozenset, list, tuple)) else frozenset(list_arg(value))
    if not names <= set(IDENTITIES):
        raise UsageError(f"identities={value!r}: choose from salt, adapter, revision")
    return names


def _vary(value: Any) -> tuple[str, ...]:
    knobs = _names(value)
    for knob in knobs:
        if knob not in VARIABLE:
            raise UsageError(f"vary: unknown knob {knob!r}; choose from {', '.join(VARIABLE)}")
    return knobs


def _revisions(value: Any) -> tuple[str, ...]:
    from reference_engine import checkpoints

    revisions = _names(value) or ("a",)
    for r in revisions:
        if r not in checkpoints.REVISIONS:
            raise UsageError(f"revisions: unknown revision {r!r}; shipped: {sorted(checkpoints.REVISIONS)}")
    return revisions


@frozen
class VllmArgs:
    """Every engine argument of the vLLM adapter, converted and checked. Defaults are written as the
    command line would say them (converted like any argument)."""

    block_size: int = field(default=32, converter=_block_size)
    prefix_caching: bool = field(default="true", converter=to_bool())
    spec: str = field(default="none", converter=to_choice(SPECS))
    k: int = field(default=3, converter=to_int())
    max_num_batched_tokens: int | None = field(default="none", converter=to_int(allow_none=True))
    lora: bool = field(default="true", converter=to_bool())
    revisions: tuple[str, ...] = field(default="a,b", converter=_revisions)
    identities: frozenset[str] = field(default=",".join(IDENTITIES), converter=_identities)
    vary: tuple[str, ...] = field(default="", converter=_vary)
    max_live: int = field(default=4, converter=to_int())
    dtype: str = field(default="float32", converter=to_choice(("float32", "float16", "bfloat16")))
    kv_space_gb: int = field(default=1, converter=to_int())
    seed: int = field(default=0, converter=to_int(0))
    tolerance: float = field(default=DEFAULT_TOLERANCE, converter=to_num(0))
    logprobs: bool = field(default="true", converter=to_bool())
    model_dir: str = field(default="", converter=str)
    max_num_seqs: int = field(default=8, converter=to_int())
    model: str = field(default="", converter=str)
    max_loras: int = field(default=len(LORA_IDS), converter=to_int())
    rebind: bool = field(default="false", converter=to_bool())

    def checkpoint(self) -> str:
        """model=PATH (model_dir= is the older spelling): a user's checkpoint, or "" for the shipped one."""
        return self.model or self.model_dir
