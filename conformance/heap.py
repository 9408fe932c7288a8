"""The process's heap during a run: what was alive before it is frozen, so Python's full garbage
collections scan only what the run itself makes.

Before a run starts, a process holds its imports (Hypothesis, torch, numpy), the engine and its model:
~180,000 objects or more, alive to its end. Each full collection of CPython's cyclic garbage collector
walks every one of them — those the run's growing history sets off, and those an engine asks for itself:
transformers' continuous batching (5.24) runs `gc.collect()` at the end of every `generate_batch` and
when its batch processor is deleted, so a kvparity run of its `batch` mode spent 90% of its CPU in
collections (2026-12-07, CI profile, 10 examples: 1,127 collections, 208 ms each; frozen, 69 ms each).
`gc.freeze()` moves every object alive into a permanent generation the collector skips; what the run
allocates is collected as before. Inference engines do the same after warm-up (vLLM's `freeze_gc_heap`,
SGLang's `freeze_gc`). Beside the reference engine (CI profile, a fresh process) the run's collections
took 0.43 s of its ~2.5 s outside the engine, frozen 0.30 s; against the instant FAKE engine 6% of the
run's CPU, frozen 5%: the heap it finds is small.

Collected first, so no garbage already waiting is kept for the run's length (a process that runs many
runs back to back — the fault zoo, a test session — would otherwise carry each run's leftovers into the
next), and unfrozen afterwards, so objects alive now that die later are collected as usual. A process
whose heap someone else froze (an engine that froze its own after warm-up), or whose collector is off,
is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Freeze the heap for the block (not nested: an inner run finds it frozen and leaves it so)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
