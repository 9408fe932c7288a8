"""The fault zoo: real KV-reuse and speculation bugs (../shared/BUG_CLASSES.md), one switch each.

A conformance suite is only as good as the bugs it catches. Each `Fault` here re-creates the mechanism
of a bug that shipped in a real engine by replacing exactly one decision of the reference engine — one
of the small named methods of `PrefixCache`, `Engine`, `Scheduler` and `BlockPool` (`identity_fields`,
`block_key`, `hit_limit`, `is_cacheable`, `eviction_candidate`, `positions`, `accepted_prefix`,
`commit_tokens`, `truncate_at_finish`, `rollback`, `reported_cached_tokens`).

The seam is construction. A fault is a small subclass of the one component it changes, overriding the
one named method (calling `super()` where it needs the correct decision), and `build_engine` builds
the engine from those classes (`engine.Parts`, plus an `Engine` subclass for the engine's own
decisions). Why subclasses rather than a table of decision functions passed in: the decisions are
already methods that read their component's state (`self.pool`, `self.block_size`) and call each
other, so overriding one is the smallest statement of "this engine, with that one decision wrong"; it
adds no indirection to the engine's hot path; and what a fault needs to remember (references it
stole, a memo, the last logits) lives on the instance of its own subclass, never in another object.
Nothing is ever patched on a live instance or at class level: `build_engine(..., fault=None)` builds
exactly the normal classes, so a fault costs nothing and changes nothing when off.

A few mechanisms need a second, supporting subclass (`also`) so that the bug does what it does in the
real engine instead of tripping one of the reference engine's own assertions: a hit that covers the
whole prompt samples the stale logits buffer instead of crashing on an empty forward.

Use: `build_engine(config, registry, fault="salt_ignored")`, or the reference adapter's engine argument
`fault=NAME`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import attrs
import torch

from reference_engine.baseline import finish_reason
from reference_engine.block_pool import BlockPool
from reference_engine.config import EngineConfig
from reference_engine.engine import Engine, Parts
from reference_engine.model_registry import ModelRegistry
from reference_engine.prefix_cache import PrefixCache
from reference_engine.scheduler import Scheduler, Work
from reference_engine.sequence import Sequence

# The components a fault may subclass, by the name `Fault.target` reports.
COMPONENTS: dict[str, type] = {"cache": PrefixCache, "engine": Engine, "scheduler": Scheduler, "pool": BlockPool}


def component_of(cls: type) -> str:
    """Which component `cls` replaces."""
    for name, base in COMPONENTS.items():
        if issubclass(cls, base):
            return name
    raise TypeError(f"{cls.__name__} subclasses none of {', '.join(COMPONENTS)}")


@attrs.frozen
class Fault:
    name: str
    bug_class: str  # A..E of BUG_CLASSES.md
    method: str  # the one decision it replaces
    summary: str  # what is wrong, in one line
    mechanism: str  # the real bug it re-creates
    expected: tuple[str, ...]  # checks expected to catch it (any one suffices)
    cls: type  # the subclass of one component that overrides `method`
    also: tuple[type, ...] = ()  # supporting subclasses of other components

    @property
    def target(self) -> str:
        """The component it changes: "cache" | "engine" | "scheduler" | "pool"."""
        return component_of(self.cls)

    def classes(self) -> dict[str, type]:
        """Component name -> the class to build it from, for every component this fault replaces."""
        return {component_of(c): c for c in (self.cls, *self.also)}


FAULTS: dict[str, Fault] = {}


def fault(name: str, bug_class: str, method: str, summary: str, mechanism: str, expected: tuple[str, ...],
          also: tuple[type, ...] = ()) -> Callable[[type], type]:
    """Register the decorated class as fault `name`. It must override `method`, a method its component
    has: if the engine renames the seam, this fails loudly at import instead of planting nothing."""
    def deco(cls: type) -> type:
        base = COMPONENTS[component_of(cls)]
        if not callable(getattr(base, method, None)) or method not in vars(cls):
            raise TypeError(f"fault {name}: {cls.__name__} must override {base.__name__}.{method}")
        FAULTS[name] = Fault(name, bug_class, method, summary, mechanism, expected, cls, also)
        return cls
    return deco


def build_engine(config: EngineConfig | None = None, registry: ModelRegistry | None = None,
                 fault: str | None = None) -> Engine:
    """An engine with fault `fault` planted (None: the normal engine, built from the normal classes).
    A cache fault on an engine without a prefix cache lies dormant."""
    if fault is None:
        return Engine(config, registry)
    if fault not in FAULTS:
        raise KeyError(f"unknown fault {fault!r}; known: {', '.join(sorted(FAULTS))}")
    classes = FAULTS[fault].classes()
    engine_cls = classes.pop("engine", Engine)
    return engine_cls(config, registry, Parts(**classes))


# --------------------------------------------------------------------------- A: the key misses an input


def _dropping(*dropped: str) -> type[PrefixCache]:
    """A prefix cache whose block key leaves out the named identity fields."""
    class DroppedFields(PrefixCache):
        def identity_fields(self, identity: Any) -> list:
            return [f for f in super().identity_fields(identity) if f[0] not in dropped]
    return DroppedFields


fault("salt_ignored", "A", "identity_fields", "tenant salt (cache_salt) left out of the block key",
      "SGLang PR 23300 (salt never forwarded); vLLM PRs 23186, 49498 (endpoints dropped cache_salt)",
      ("isolation",))(_dropping("salt"))
fault("adapter_ignored", "A", "identity_fields", "LoRA adapter left out of the block key",
      "vLLM PR 3263 and again PR 8240 (LoRA id missing from the block hash); llama.cpp 26207",
      ("isolation", "parity"))(_dropping("adapter", "adapter_digest"))
fault("adapter_name_only", "A", "identity_fields", "adapter keyed by name, not weights digest",
      "vLLM 30931, 42125: after an in-place adapter reload the old adapter's KV came back",
      ("isolation", "parity"))(_dropping("adapter_digest"))
fault("revision_ignored", "A", "identity_fields", "model revision (weights digest) left out of the key",
      "lmdeploy 4917, TRL 3024, SGLang 26792: stale KV after a weight update",
      ("isolation", "parity"))(_dropping("revision_digest"))


@fault("extra_keys_concatenated", "A", "identity_fields",
       "adapter name and salt hashed as one concatenated string (no domain separation)",
       "vLLM 44701 (LoRA name 'X' collides with salt 'X'); SGLang 24638 (concatenated extra keys)",
       ("isolation", "parity"))
class ConcatenatedExtraKeys(PrefixCache):
    def identity_fields(self, identity: Any) -> list:
        return [["revision_digest", identity.revision_digest],
                ["extra", f"{identity.adapter or ''}{identity.salt or ''}"]]


@fault("unchained_block_keys", "A", "block_key",
       "a block's key ignores its parent: it matches whatever precedes it",
       "BUG_CLASSES A 'stale/partial hashes' and nano-vllm-style hashing without the parent hash",
       ("isolation", "parity", "history_independence"))
class UnchainedBlockKeys(PrefixCache):
    def block_key(self, parent: str | None, tokens: Any, identity: Any) -> str:
        return super().block_key(None, tokens, identity)


# --------------------------------------------------------------------------- B: the hit path


class StaleLogitsEngine(Engine):
    """Supporting: with the whole prompt served from cache there is nothing to feed, so sample the
    logits buffer as the last forward left it (llama.cpp 1585) instead of failing on an empty forward."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_sampled: list[int] = []  # the last token the logits buffer produced

    def _forward(self, plan: list[Work]) -> list[list[int]]:
        live = [i for i, w in enumerate(plan) if w.n > 0 or w.drafts]
        out: list[list[int]] = [[] for _ in plan]
        if live:
            for i, preds in zip(live, super()._forward([plan[i] for i in live])):
                out[i] = preds
                if preds:
                    self.last_sampled[:] = [preds[-1]]
        for i, w in enumerate(plan):
            if w.n == 0 and not w.drafts:
                out[i] = [self.last_sampled[0] if self.last_sampled else 0]
        return out


@fault("hit_uncapped", "B", "hit_limit",
       "a hit may cover the last prompt token, so stale logits are sampled",
       "llama.cpp 1585, 4902: whole prompt reused from cache, stale logits sampled",
       ("prefix_only", "parity", "history_independence"), also=(StaleLogitsEngine,))
class UncappedHit(PrefixCache):
    def hit_limit(self, num_tokens: int) -> int:
        return num_tokens


@fault("incomplete_block_cached", "B", "is_cacheable",
       "a block is cached once its tokens exist, before all their KV is written",
       "BUG_CLASSES B 'partial block reused' (hit on a block whose tail KV was never computed)",
       ("parity", "history_independence", "schedule_independence", "rollback_hygiene"))
class IncompleteBlockCached(PrefixCache):
    def is_cacheable(self, seq: Sequence, index: int) -> bool:
        return (index + 1) * self.block_size <= len(seq.tokens)


# --------------------------------------------------------------------------- C: speculation


@fault("rejected_draft_committed", "C", "commit_tokens",
       "the first rejected draft is committed instead of the target's correction",
       "vLLM PR 3951 (rejected token committed / bonus KV never written)",
       ("spec_independence", "parity"))
class RejectedDraftCommitted(Engine):
    def commit_tokens(self, drafts: list[int], preds: list[int], accepted: int) -> list[int]:
        if accepted < len(drafts):
            return drafts[:accepted + 1]
        return super().commit_tokens(drafts, preds, accepted)


@fault("verification_skipped", "C", "accepted_prefix",
       "every draft is accepted without comparing it with the target",
       "llama.cpp 27975: an external drafter changed temperature-0 output (verification skipped)",
       ("spec_independence", "parity"))
class VerificationSkipped(Engine):
    def accepted_prefix(self, drafts: list[int], preds: list[int]) -> int:
        return len(drafts)


@fault("drafts_past_finish", "C", "truncate_at_finish",
       "eos / stop / max_tokens checked once per step, on its last token: accepted drafts past them kept",
       "BUG_CLASSES C 'draft tokens past EOS / stop / max_tokens kept'",
       ("accounting", "parity", "spec_independence"))
class DraftsPastFinish(Engine):
    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        reason = finish_reason(new[-1], len(seq.output) + len(new), seq.max_tokens, seq.stop_ids, seq.eos_id)
        if reason:
            seq.finish_reason = reason
        return new


@fault("provisional_blocks_leaked", "C", "rollback",
       "blocks allocated for rejected drafts are dropped from the table but never freed",
       "vLLM PR 49620 (provisional speculative state left behind); BUG_CLASSES C",
       ("rollback_hygiene",))
class ProvisionalBlocksLeaked(Engine):
    def rollback(self, seq: Sequence, keep: int, written_end: int) -> None:
        kept = self.pool.blocks_for(keep)
        tail = seq.block_table[kept:]
        leaked = [bid for bid in tail if self.pool.blocks[bid].provisional]
        seq.block_table[kept:] = [bid for bid in tail if bid not in leaked]
        super().rollback(seq, keep, written_end)


# --------------------------------------------------------------------------- D: chunking, eviction


@fault("chunk_positions_from_chunk_start", "D", "positions",
       "positions of a later prefill chunk counted from the chunk start, not the sequence start",
       "vLLM PR 23279; MLA + chunked prefill 26042 (worse with smaller chunks)",
       ("schedule_independence", "parity"))
class ChunkPositionsFromChunkStart(Engine):
    def positions(self, seq: Sequence, start: int, count: int) -> torch.Tensor:
        if seq.prefill_chunks > 0 and not seq.prefill_done_once:
            return torch.arange(count)
        return super().positions(seq, start, count)


@fault("evict_referenced", "D", "eviction_candidate",
       "eviction picks the oldest cached block even while running sequences still reference it",
       "TGI PR 2489 (blocks freed while still referenced, then reused as garbage KV)",
       ("eviction_safety", "parity", "history_independence"))
class EvictReferenced(BlockPool):
    """The oldest cache entry is evicted whoever holds it. Its old holders still hold it in their block
    tables; as a refcount bug would, their later releases of it do nothing (instead of tripping the
    pool's own "release of unreferenced block" assertion)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stolen: defaultdict[int, int] = defaultdict(int)  # block -> references evicted from under it

    def eviction_candidate(self) -> int | None:
        bid = next(iter(self.table.values()), None)
        if bid is None:
            return super().eviction_candidate()
        block = self.blocks[bid]
        if block.ref_count:
            self.stolen[bid] += block.ref_count
            block.ref_count = 0
        return bid

    def release(self, bid: int) -> None:
        if self.stolen.get(bid):
            self.stolen[bid] -= 1
            return
        super().release(bid)


# --------------------------------------------------------------------------- E: accounting


@fault("cached_overreported", "E", "reported_cached_tokens",
       "cached tokens reported in whole blocks, counting the recomputed last block",
       "BUG_CLASSES E: cached-token counts that do not match what was served",
       ("isolation", "prefix_only"))
class CachedOverreported(Scheduler):
    def reported_cached_tokens(self, seq: Sequence, hit_tokens: int) -> int:
        n = super().reported_cached_tokens(seq, hit_tokens)
        bs = self.pool.block_size
        return min(len(seq.prompt), -(-(n + 1) // bs) * bs) if n else 0


@fault("cached_count_stale", "E", "reported_cached_tokens",
       "cached-token count memoised by prompt tokens: still reported after a flush or for another tenant",
       "lmdeploy 4917: cached-token counts reported after they stopped being valid",
       ("isolation",))
class CachedCountStale(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memo: dict[tuple, int] = {}  # prompt -> the largest cached count ever reported for it

    def reported_cached_tokens(self, seq: Sequence, hit_tokens: int) -> int:
        n = max(super().reported_cached_tokens(seq, hit_tokens), self.memo.get(seq.prompt, 0))
        self.memo[seq.prompt] = n
        return n
