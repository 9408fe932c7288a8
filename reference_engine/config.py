"""Every engine knob, in one leaf module (like nano-vllm's config.py).

The engine and the scheduler both read the configuration; keeping it here, importing nothing of the
engine's, is what lets scheduler.py depend on it without depending on engine.py (which depends on the
scheduler). The drafter names live here for the same reason: the config validates them, and
drafters.py builds its table from them.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

DRAFTER_NAMES = ("draft", "ngram", "oracle", "adversarial")


def _positive(name: str) -> Callable[[Any, Any, Any], None]:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value is not None and int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return check


@attrs.frozen
class EngineConfig:
    """Every knob. chunk_size None = prefill a prompt in one pass (budget permitting)."""

    block_size: int = attrs.field(default=16, validator=_positive("block_size"))
    num_blocks: int = attrs.field(default=512, validator=_positive("num_blocks"))
    enable_prefix_cache: bool = True
    drafter: str = "none"  # none | draft | ngram | oracle | adversarial
    k: int = attrs.field(default=4, validator=_positive("k"))
    chunk_size: int | None = attrs.field(default=None, validator=_positive("chunk_size"))
    token_budget: int = attrs.field(default=4096, validator=_positive("token_budget"))
    max_batch: int = attrs.field(default=64, validator=_positive("max_batch"))

    def __attrs_post_init__(self) -> None:
        if self.drafter not in ("none", *DRAFTER_NAMES):
            raise ValueError(f"unknown drafter {self.drafter!r}; choose from none, {', '.join(DRAFTER_NAMES)}")
