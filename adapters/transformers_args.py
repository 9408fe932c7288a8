"""The transformers adapter's engine arguments as one typed, frozen value (`TransformersArgs`).

Parsed from the command line's strings before transformers is imported: each field converts its own and
a bad one is a one-line UsageError naming it. What only the installed release can say (which modes it
runs) and what needs the checkpoint (an assistant for the draft modes) is still checked by the adapter.
"""

from __future__ import annotations

from typing import Any

from attrs import field, frozen

from adapters.engine_args import list_arg, to_choice, to_int
from adapters.reference_oracle import ORACLES
from conformance.contract import UsageError

MODES = ("generate", "assisted", "adversarial", "prompt_lookup", "batch")
DTYPES = ("float64", "float32", "bfloat16", "float16")


def _modes(value: Any) -> tuple[str, ...]:
    """A comma list of modes; () (the default, "") means every mode the installed release can run."""
    modes = tuple(map(str, value)) if isinstance(value, (list, tuple)) else tuple(list_arg(value))
    if set(modes) - set(MODES) or (value not in ("", (), None) and not modes):
        raise UsageError(f"engine argument modes={value!r}: a comma-separated subset of {', '.join(MODES)}")
    return modes


def _budget(value: Any) -> float | None:
    """Seconds for the landmark search on model=PATH (0: no search); None: the default budget."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"landmark_budget={value!r}: seconds (0: no search)") from None


@frozen
class TransformersArgs:
    """Every engine argument of the transformers adapter, converted and checked. `mode` and `k` are
    also knobs: their values here are the defaults."""

    mode: str = field(default="generate", converter=to_choice(MODES))
    k: int = field(default=3, converter=to_int())
    page_size: int = field(default=16, converter=to_int())
    num_blocks: int = field(default=64, converter=to_int(4))
    dtype: str = field(default="float64", converter=to_choice(DTYPES))
    modes: tuple[str, ...] = field(default="", converter=_modes)
    model: str = field(default="", converter=str)
    draft: str = field(default="", converter=str)
    oracle: str = field(default="reference", converter=to_choice(ORACLES))
    oracle_dtype: str = field(default="float64", converter=str)
    landmark_budget: float | None = field(default=None, converter=_budget)
