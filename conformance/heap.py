"""The process's heap during a run: what was alive before it is frozen, so Python's full garbage
collections scan only what the run itself makes. `kvparity run` freezes it — the process every run
lives in, the pytest plugin's, a shard's and a Ray campaign's included — and `run_suite` does not: in a
process that runs many short runs (kvparity's own tests) a freeze costs more than it saves, because the
collector's bookkeeping is stale once the heap is unfrozen and it soon collects the whole heap again
(measured on two test files: 69 full collections, 10.6 s, against 27, 5.4 s).

Before a run starts, a process holds its imports (Hypothesis, torch, numpy), the engine and its model:
~180,000 objects or more, alive to its end. Each full collection of CPython's cyclic garbage collector
walks every one of them — those the run's growing history sets off, and those an engine asks for itself:
transformers' continuous batching (5.24) runs `gc.collect()` at the end of every `generate_batch` and
when its batch processor is deleted, so a kvparity run of its `batch` mode spent 90% of its CPU in
collections (2026-12-07, CI profile, 10 examples: 1,127 collections, 208 ms each; frozen, 69 ms each).
`gc.freeze()` moves every object alive into a permanent generation the collector skips; what the run
allocates is collected as before. Inference engines do the same after warm-up (vLLM's `freeze_gc_heap`,
SGLang's `freeze_gc`). Beside the reference engine (CI profile, fresh processes) the run's collections
took 0.38–0.40 s of its ~2.5 s outside the engine, frozen 0.19–0.24 s; against the instant FAKE engine
6.6–7.0% of the run's CPU, frozen 4.1–4.4%: the heap it finds is small.

Unfrozen afterwards, so objects alive now that die later are collected as usual. Garbage already
waiting when a run starts is frozen with the rest for the run's length and collected after it — except
the leftovers of a run before it in the same process that no full collection has reached since (runs
back to back in one process: `kvparity run` called in-process, as kvparity's tests do), which are
collected first, so that they are not carried from run to run. Not every time: a full collection of a
test worker's heap (~580,000 objects) took 0.35 s, and collecting before each of a test session's 255
runs cost 68 s of CPU. A process whose heap someone else froze (an engine that froze its own after
warm-up), or whose collector is off, is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

# How many full collections the process had made when a run last unfroze the heap (None: no run has).
_full_collections_at_unfreeze: int | None = None


def _full_collections() -> int:
    return gc.get_stats()[2]["collections"]


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Freeze the heap for the block (not nested: an inner run finds it frozen and leaves it so)."""
    global _full_collections_at_unfreeze
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    if _full_collections_at_unfreeze == _full_collections():
        gc.collect()  # the last run's leftovers, not yet collected: not carried into this run
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        _full_collections_at_unfreeze = _full_collections()
