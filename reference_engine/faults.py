"""The fault zoo: real KV-reuse and speculation bugs (../shared/BUG_CLASSES.md), one switch each.

A conformance suite is only as good as the bugs it catches. Each `Fault` here re-creates the mechanism
of a bug that shipped in a real engine by replacing exactly one decision of the reference engine — the
small named methods of `PrefixCache`, `Engine` and `Scheduler` (`identity_fields`, `block_key`,
`hit_limit`, `is_cacheable`, `eviction_candidate`, `positions`, `accepted_prefix`, `commit_tokens`,
`truncate_at_finish`, `rollback`, `reported_cached_tokens`) — on one engine *instance*. Nothing is
patched at class level, so an engine built without a fault runs exactly the code it always ran: zero
cost and no behaviour change when off.

A few mechanisms need a second, supporting patch so that the bug does what it does in the real engine
instead of tripping one of the reference engine's own assertions (named in `also`): a hit that covers
the whole prompt samples the stale logits buffer instead of crashing on an empty forward, and a block
evicted while referenced has its holders' references forgotten, as a refcount bug would.

Use: `apply_fault(engine, "salt_ignored")`, or the reference adapter's engine argument `fault=NAME`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable

import attrs
import torch

from reference_engine.baseline import finish_reason

if TYPE_CHECKING:
    from reference_engine.engine import Engine

# A patch builds the replacement for one method: (engine, component, original bound method) -> callable.
Patch = Callable[[Any, Any, Callable], Callable]


@attrs.frozen
class Fault:
    name: str
    bug_class: str  # A..E of BUG_CLASSES.md
    target: str  # component: "cache" | "engine" | "scheduler" | "pool"
    method: str  # the one decision it replaces
    summary: str  # what is wrong, in one line
    mechanism: str  # the real bug it re-creates
    expected: tuple[str, ...]  # checks expected to catch it (any one suffices)
    patch: Patch
    also: tuple[tuple[str, str, Patch], ...] = ()  # supporting patches (target, method, patch)


FAULTS: dict[str, Fault] = {}


def fault(name: str, bug_class: str, target: str, method: str, summary: str, mechanism: str,
          expected: tuple[str, ...], also: tuple[tuple[str, str, Patch], ...] = ()):
    def deco(patch: Patch) -> Patch:
        FAULTS[name] = Fault(name, bug_class, target, method, summary, mechanism, expected, patch, also)
        return patch
    return deco


def component(engine: Engine, target: str) -> Any:
    return {"cache": engine.cache, "engine": engine, "scheduler": engine.scheduler, "pool": engine.pool}[target]


def apply_fault(engine: Engine, name: str | None) -> Engine:
    """Switch fault `name` on for this engine instance (None: nothing happens). A cache fault on an
    engine without a prefix cache lies dormant."""
    if name is None:
        return engine
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    f = FAULTS[name]
    for target, method, patch in ((f.target, f.method, f.patch), *f.also):
        comp = component(engine, target)
        if comp is None:
            continue
        original = getattr(comp, method)  # AttributeError if the engine renamed the seam: fail loudly
        setattr(comp, method, patch(engine, comp, original))
    engine.fault = name
    return engine


# --------------------------------------------------------------------------- A: the key misses an input


def _drop_fields(*dropped: str) -> Patch:
    def patch(engine, cache, original):
        def identity_fields(identity):
            return [f for f in original(identity) if f[0] not in dropped]
        return identity_fields
    return patch


fault("salt_ignored", "A", "cache", "identity_fields", "tenant salt (cache_salt) left out of the block key",
      "SGLang PR 23300 (salt never forwarded); vLLM PRs 23186, 49498 (endpoints dropped cache_salt)",
      ("isolation",))(_drop_fields("salt"))
fault("adapter_ignored", "A", "cache", "identity_fields", "LoRA adapter left out of the block key",
      "vLLM PR 3263 and again PR 8240 (LoRA id missing from the block hash); llama.cpp 26207",
      ("isolation", "parity"))(_drop_fields("adapter", "adapter_digest"))
fault("adapter_name_only", "A", "cache", "identity_fields", "adapter keyed by name, not weights digest",
      "vLLM 30931, 42125: after an in-place adapter reload the old adapter's KV came back",
      ("isolation", "parity"))(_drop_fields("adapter_digest"))
fault("revision_ignored", "A", "cache", "identity_fields", "model revision (weights digest) left out of the key",
      "lmdeploy 4917, TRL 3024, SGLang 26792: stale KV after a weight update",
      ("isolation", "parity"))(_drop_fields("revision_digest"))


@fault("extra_keys_concatenated", "A", "cache", "identity_fields",
       "adapter name and salt hashed as one concatenated string (no domain separation)",
       "vLLM 44701 (LoRA name 'X' collides with salt 'X'); SGLang 24638 (concatenated extra keys)",
       ("isolation", "parity"))
def _concatenated(engine, cache, original):
    def identity_fields(identity):
        return [["revision_digest", identity.revision_digest],
                ["extra", f"{identity.adapter or ''}{identity.salt or ''}"]]
    return identity_fields


@fault("unchained_block_keys", "A", "cache", "block_key",
       "a block's key ignores its parent: it matches whatever precedes it",
       "BUG_CLASSES A 'stale/partial hashes' and nano-vllm-style hashing without the parent hash",
       ("isolation", "parity", "history_independence"))
def _unchained(engine, cache, original):
    def block_key(parent, tokens, identity):
        return original(None, tokens, identity)
    return block_key


# --------------------------------------------------------------------------- B: the hit path


def _stale_logits_forward(engine, eng, original):
    """With the whole prompt served from cache there is nothing to feed: sample the logits buffer as the
    last forward left it (llama.cpp 1585), instead of failing on an empty forward."""
    last: list[int] = []

    def _forward(plan):
        live = [i for i, w in enumerate(plan) if w.n > 0 or w.drafts]
        out: list[list[int]] = [[] for _ in plan]
        if live:
            for i, preds in zip(live, original([plan[i] for i in live])):
                out[i] = preds
                if preds:
                    last[:] = [preds[-1]]
        for i, w in enumerate(plan):
            if w.n == 0 and not w.drafts:
                out[i] = [last[0] if last else 0]
        return out
    return _forward


@fault("hit_uncapped", "B", "cache", "hit_limit",
       "a hit may cover the last prompt token, so stale logits are sampled",
       "llama.cpp 1585, 4902: whole prompt reused from cache, stale logits sampled",
       ("prefix_only", "parity", "history_independence"),
       also=(("engine", "_forward", _stale_logits_forward),))
def _uncapped(engine, cache, original):
    return lambda num_tokens: num_tokens


@fault("incomplete_block_cached", "B", "cache", "is_cacheable",
       "a block is cached once its tokens exist, before all their KV is written",
       "BUG_CLASSES B 'partial block reused' (hit on a block whose tail KV was never computed)",
       ("parity", "history_independence", "schedule_independence", "rollback_hygiene"))
def _incomplete(engine, cache, original):
    def is_cacheable(seq, index):
        return (index + 1) * cache.block_size <= len(seq.tokens)
    return is_cacheable


# --------------------------------------------------------------------------- C: speculation


@fault("rejected_draft_committed", "C", "engine", "commit_tokens",
       "the first rejected draft is committed instead of the target's correction",
       "vLLM PR 3951 (rejected token committed / bonus KV never written)",
       ("spec_independence", "parity"))
def _rejected(engine, eng, original):
    def commit_tokens(drafts, preds, accepted):
        if accepted < len(drafts):
            return drafts[:accepted + 1]
        return original(drafts, preds, accepted)
    return commit_tokens


@fault("verification_skipped", "C", "engine", "accepted_prefix",
       "every draft is accepted without comparing it with the target",
       "llama.cpp 27975: an external drafter changed temperature-0 output (verification skipped)",
       ("spec_independence", "parity"))
def _unverified(engine, eng, original):
    return lambda drafts, preds: len(drafts)


@fault("drafts_past_finish", "C", "engine", "truncate_at_finish",
       "eos / stop / max_tokens checked once per step, on its last token: accepted drafts past them kept",
       "BUG_CLASSES C 'draft tokens past EOS / stop / max_tokens kept'",
       ("accounting", "parity", "spec_independence"))
def _past_finish(engine, eng, original):
    def truncate_at_finish(seq, new):
        reason = finish_reason(new[-1], len(seq.output) + len(new), seq.max_tokens, seq.stop_ids, seq.eos_id)
        if reason:
            seq.finish_reason = reason
        return new
    return truncate_at_finish


@fault("provisional_blocks_leaked", "C", "engine", "rollback",
       "blocks allocated for rejected drafts are dropped from the table but never freed",
       "vLLM PR 49620 (provisional speculative state left behind); BUG_CLASSES C",
       ("rollback_hygiene",))
def _leak(engine, eng, original):
    pool = engine.pool

    def rollback(seq, keep, written_end):
        kept = pool.blocks_for(keep)
        tail = seq.block_table[kept:]
        leaked = [bid for bid in tail if pool.blocks[bid].provisional]
        seq.block_table[kept:] = [bid for bid in tail if bid not in leaked]
        original(seq, keep, written_end)
    return rollback


# --------------------------------------------------------------------------- D: chunking, eviction


@fault("chunk_positions_from_chunk_start", "D", "engine", "positions",
       "positions of a later prefill chunk counted from the chunk start, not the sequence start",
       "vLLM PR 23279; MLA + chunked prefill 26042 (worse with smaller chunks)",
       ("schedule_independence", "parity"))
def _chunk_positions(engine, eng, original):
    def positions(seq, start, count):
        if seq.prefill_chunks > 0 and not seq.prefill_done_once:
            return torch.arange(count)
        return original(seq, start, count)
    return positions


def _forget_stolen_refs(engine, pool, original):
    """A stolen block's old holders still hold it; their releases are the refcount bug's no-ops."""
    stolen: dict[int, int] = engine.__dict__.setdefault("_fault_stolen", defaultdict(int))

    def release(bid):
        if stolen.get(bid):
            stolen[bid] -= 1
            return
        original(bid)
    return release


@fault("evict_referenced", "D", "cache", "eviction_candidate",
       "eviction picks the oldest cached block even while running sequences still reference it",
       "TGI PR 2489 (blocks freed while still referenced, then reused as garbage KV)",
       ("eviction_safety", "parity", "history_independence"),
       also=(("pool", "release", _forget_stolen_refs),))
def _evict_referenced(engine, cache, original):
    stolen: dict[int, int] = engine.__dict__.setdefault("_fault_stolen", defaultdict(int))

    def eviction_candidate():
        bid = next(iter(cache.table.values()), None)
        if bid is None:
            return original()
        block = cache.pool.blocks[bid]
        if block.ref_count:
            stolen[bid] += block.ref_count
            block.ref_count = 0
        return bid
    return eviction_candidate


# --------------------------------------------------------------------------- E: accounting


@fault("cached_overreported", "E", "scheduler", "reported_cached_tokens",
       "cached tokens reported in whole blocks, counting the recomputed last block",
       "BUG_CLASSES E: cached-token counts that do not match what was served",
       ("isolation", "prefix_only"))
def _overreported(engine, sched, original):
    bs = engine.pool.block_size

    def reported_cached_tokens(seq, hit_tokens):
        n = original(seq, hit_tokens)
        return min(len(seq.prompt), -(-(n + 1) // bs) * bs) if n else 0
    return reported_cached_tokens


@fault("cached_count_stale", "E", "scheduler", "reported_cached_tokens",
       "cached-token count memoised by prompt tokens: still reported after a flush or for another tenant",
       "lmdeploy 4917: cached-token counts reported after they stopped being valid",
       ("isolation",))
def _stale_count(engine, sched, original):
    memo: dict[tuple, int] = {}

    def reported_cached_tokens(seq, hit_tokens):
        n = max(original(seq, hit_tokens), memo.get(seq.prompt, 0))
        memo[seq.prompt] = n
        return n
    return reported_cached_tokens

