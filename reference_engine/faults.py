"""The fault zoo: real KV-reuse and speculation bugs (../shared/BUG_CLASSES.md), one switch each.

A conformance suite is only as good as the bugs it catches. Each `Fault` here re-creates the mechanism
of a bug that shipped in a real engine by replacing exactly one decision of the reference engine — one
of the small named methods of `PrefixCache`, `Engine`, `Scheduler` and `BlockPool` (`identity_fields`,
`block_key`, `hit_limit`, `is_cacheable`, `match`, `eviction_candidate`, `positions`, `accepted_prefix`,
`commit_tokens`, `truncate_at_finish`, `rollback`, `reserve`, `reported_cached_tokens`; `_forward` for
the two faults that change what a forward pass returns).

Each fault needs a *situation* to show (conformance/situations.py counts them in a history): most of
the classic ones show on any prefix hit or accepted draft; the ones added for issue 13 each need one
that a stream must be steered to — eos or a stop id at a given offset of a verification window,
max_tokens inside one, two requests of one batch sharing a block one of them is still computing, a
salt containing the key's separator, an in-place adapter reload, the same text under another
segmentation, a near-tie.

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

import copy
import functools
import hashlib
import json
from collections import defaultdict
from typing import Any, Callable

import attrs
import torch

from reference_engine.baseline import finish_reason
from reference_engine.block_pool import BlockPool
from reference_engine.config import EngineConfig
from reference_engine.engine import Engine, Parts
from reference_engine.model_registry import ModelRegistry
from reference_engine.prefix_cache import DOMAIN, PrefixCache
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


def fault_names(fault: str) -> list[str]:
    """The faults of `fault`: one name, or several joined by "+" (`salt_ignored+provisional_blocks_leaked`),
    so one engine can carry two known bugs at once (a run must report each as its own finding)."""
    names = [n.strip() for n in fault.split("+")]
    for name in names:
        if name not in FAULTS:
            raise KeyError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    if len(set(names)) != len(names):
        raise KeyError(f"fault {fault!r} names a fault twice")
    return names


def _combined(classes: list[type]) -> type:
    """One class carrying every override of `classes` (subclasses of one component): their MRO chains the
    overridden methods through `super()`, so two faults of one component are both planted."""
    if len(classes) == 1:
        return classes[0]
    return type("+".join(c.__name__ for c in classes), tuple(classes), {})


def build_engine(config: EngineConfig | None = None, registry: ModelRegistry | None = None,
                 fault: str | None = None) -> Engine:
    """An engine with fault `fault` planted (None: the normal engine, built from the normal classes);
    `a+b` plants both. A cache fault on an engine without a prefix cache lies dormant."""
    if fault is None:
        return Engine(config, registry)
    by_component: dict[str, list[type]] = defaultdict(list)
    for name in fault_names(fault):
        for component, cls in FAULTS[name].classes().items():
            if cls not in by_component[component]:
                by_component[component].append(cls)
    classes = {component: _combined(clss) for component, clss in by_component.items()}
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


# --------------------------------------------------------------------------- C: where a verification
# window ends a request (eos / stop ids / max_tokens inside or at the end of an accepted run)


def cut_run(seq: Sequence, new: list[int], eos_at: Callable[[int, int], bool] = lambda i, n: True,
            stop_at: Callable[[int, int], bool] = lambda i, n: True, cap: int | None = None) -> list[int]:
    """`Engine.truncate_at_finish` with eos and the stop ids looked for only at the run positions the
    predicates allow (`eos_at(i, len(new))`) and the length cap at `cap` (default: max_tokens): how
    the finish faults below say which check of a verification window their engine gets wrong."""
    produced, cap = len(seq.output), seq.max_tokens if cap is None else cap
    for i, token in enumerate(new):
        eos = seq.eos_id if eos_at(i, len(new)) else None
        stops = seq.stop_ids if stop_at(i, len(new)) else frozenset()
        reason = finish_reason(token, produced + i + 1, cap, stops, eos)
        if reason:
            seq.finish_reason = reason
            return new[:i + 1]
    return new


def _last(i: int, n: int) -> bool:
    return i == n - 1


@fault("eos_checked_on_last_token", "C", "truncate_at_finish",
       "eos looked for only at the last token a verification step commits: an eos accepted as a draft "
       "mid-run is output and generation goes on",
       "transformers 47912 / PR 47931 (assisted decoding appends n_matches + 1 tokens, then the eos "
       "criterion inspects only the last one); koboldcpp 1276 (output continues past an eos drafted "
       "mid-batch)",
       ("accounting", "parity", "spec_independence"))
class EosCheckedOnLastToken(Engine):
    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        return cut_run(seq, new, eos_at=_last)


@fault("eos_bonus_unchecked", "C", "truncate_at_finish",
       "the bonus token (the target's own token after a fully accepted draft run) is appended after the "
       "finish checks: an eos there is output and generation goes on",
       "BUG_CLASSES C (the bonus token takes its own path: vLLM PR 3951); SGLang PR 33758 (the token "
       "sampled after an accepted run leaked past the finish); the mirror image of transformers 47912, "
       "where only the bonus position was checked",
       ("accounting", "parity", "spec_independence"))
class EosBonusUnchecked(Engine):
    """Remembers, per commit, whether the run ends in a bonus token (every draft accepted), so that the
    finish check can skip eos there and only there."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bonus = False  # the run being settled ends in a bonus token

    def commit_tokens(self, drafts: list[int], preds: list[int], accepted: int) -> list[int]:
        self.bonus = bool(drafts) and accepted == len(drafts)
        return super().commit_tokens(drafts, preds, accepted)

    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        bonus = self.bonus
        return cut_run(seq, new, eos_at=lambda i, n: not (bonus and i == n - 1))


@fault("eos_ignored_on_hit", "B", "truncate_at_finish",
       "a request admitted with a prefix hit is served by a warm path whose stopping criteria lack the "
       "model's eos: it never ends on eos",
       "BUG_CLASSES B 'output depends on earlier traffic' (vLLM 5543: generation after a cache hit "
       "stopped differently); the warm path rebuilds per-request state the cold path sets up",
       ("parity", "history_independence", "accounting"))
class EosIgnoredOnHit(Engine):
    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        if seq.cached_tokens:
            return cut_run(seq, new, eos_at=lambda i, n: False)
        return super().truncate_at_finish(seq, new)


@fault("stop_checked_on_last_token", "C", "truncate_at_finish",
       "stop ids looked for only at the last token a verification step commits: a stop id accepted as a "
       "draft mid-run is output and generation goes on",
       "vLLM PR 47616 (the whole accepted batch appended before the stop is evaluated; tokens past the "
       "stop kept); onnxruntime-genai PR 2528 (stop handling extended to target-verified drafts, in order)",
       ("accounting", "parity", "spec_independence"))
class StopCheckedOnLastToken(Engine):
    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        return cut_run(seq, new, stop_at=_last)


@fault("max_tokens_window_overrun", "C", "truncate_at_finish",
       "a verification window crossing max_tokens is cut to the tokens left, then the target's token "
       "after the cut is appended too: one token more than max_tokens",
       "SGLang PR 33758 (finished length must be capped at max_new_tokens when an accept run crosses "
       "it); ik_llama.cpp PR 2358 (an accepted block crossing n_predict mis-charged); distinct from "
       "drafts_past_finish: eos and stop ids are honoured, only the cap is off by one",
       ("accounting", "parity", "spec_independence"))
class MaxTokensWindowOverrun(Engine):
    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        room = seq.max_tokens - len(seq.output)
        if len(new) <= room:
            return super().truncate_at_finish(seq, new)
        # The drafts are cut to `room`; the token after them (correct greedy output) is appended anyway.
        return cut_run(seq, new, eos_at=lambda i, n: i < room, stop_at=lambda i, n: i < room,
                       cap=seq.max_tokens + 1)


@fault("length_checked_before_stop", "C", "truncate_at_finish",
       "when a verification window crosses max_tokens, the cap is checked before eos / stop ids: the run "
       "is cut at max_tokens with finish 'length', keeping the tokens after an eos or stop inside it",
       "SGLang 31599 / PR 31569 and PR 33758 (update_finish_state checked the max_new_tokens cap before "
       "stop strings, stop tokens and eos: FINISH_LENGTH, post-stop tokens leaked)",
       ("accounting", "parity", "spec_independence"))
class LengthCheckedBeforeStop(Engine):
    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        room = seq.max_tokens - len(seq.output)
        if len(new) > room:
            seq.finish_reason = "length"
            return new[:room]
        return super().truncate_at_finish(seq, new)


# --------------------------------------------------------------------------- B/D: same-step sharing


@fault("scheduled_blocks_cached", "B", "reserve",
       "a block enters the prefix cache when a prefill chunk that touches it is scheduled, before its KV "
       "is written: a request admitted in the same step is served a block whose tail the next chunk "
       "computes",
       "vLLM v1 caches blocks at allocation (allocate_slots -> cache_blocks), correct only for blocks the "
       "scheduled tokens fill; counting a partly scheduled block (chunk size not a multiple of the block "
       "size) serves unwritten KV to a same-batch sharer (BUG_CLASSES B 'partial block reused', vLLM "
       "22103 shared-prefix attention under concurrency)",
       ("parity", "schedule_independence", "history_independence"))
class ScheduledBlocksCached(Scheduler):
    def reserve(self, seq: Sequence, end: int) -> bool:
        if not super().reserve(seq, end):
            return False
        if self.cache is not None:
            self.register_scheduled(seq, end)
        return True

    def register_scheduled(self, seq: Sequence, end: int) -> None:
        """Register every block whose tokens exist and some of which [0, end) schedules."""
        bs, cache = self.pool.block_size, self.cache
        identity = self.resolve_identity(seq.identity)
        fields = tuple(v for _, v in cache.identity_fields(identity))
        parent = None
        for i, bid in enumerate(seq.block_table):
            if (i + 1) * bs > len(seq.tokens) or i * bs >= end:
                break
            tokens = tuple(seq.tokens[i * bs:(i + 1) * bs])
            parent = cache.block_key(parent, tokens, identity)
            if self.pool.blocks[bid].key is None:
                self.pool.register(bid, parent, tokens, fields)


# --------------------------------------------------------------------------- B: the shared KV itself


KV_DRIFT = 1e-4  # relative change per reuse: far above float64 noise, too small to flip most argmaxes


@fault("shared_kv_mutated_in_place", "B", "match",
       "a request that reuses cached prefix blocks writes into them in place: their values drift by a "
       "factor 1 + 1e-4 at every reuse, so every later reader attends to slightly wrong KV",
       "a hand-written transformers prefix cache handing its stored DynamicCache to `generate`, which "
       "extends and updates the very object in place instead of a copy (transformers' cached-vs-recompute "
       "assertion, PR 48289, exists for this); on a confident model the tokens rarely change, only the "
       "log-probabilities do (issue 29)",
       ("logprob_parity", "parity", "history_independence"))
class SharedKvMutatedInPlace(PrefixCache):
    def match(self, tokens: Any, identity: Any) -> tuple[list[int], list[str]]:
        blocks, keys = super().match(tokens, identity)
        bs = self.pool.block_size
        for bid in blocks:
            self.pool.v[:, bid * bs:(bid + 1) * bs] *= 1.0 + KV_DRIFT
        return blocks, keys


# --------------------------------------------------------------------------- A: identity inputs


@fault("identity_joined_with_separator", "A", "identity_fields",
       "salt and adapter name joined into one namespace string with ':' (salt 't:upper' without an adapter "
       "is salt 't' with adapter 'upper')",
       "vLLM 44701 and SGLang 24638 (extra keys combined without domain separation), here with a separator "
       "that can occur inside a salt, so only a salt containing it collides — distinct from "
       "extra_keys_concatenated; keyed by adapter name as vLLM keys LoRAs, so an in-place reload collides "
       "too (vLLM 30931)",
       ("isolation", "parity"))
class IdentityJoinedWithSeparator(PrefixCache):
    def identity_fields(self, identity: Any) -> list:
        namespace = ":".join(p for p in (identity.salt, identity.adapter) if p is not None)
        return [["revision_digest", identity.revision_digest], ["namespace", namespace]]


@fault("reload_stale_on_lookup", "A", "match",
       "the lookup path resolves identities through a memo keyed by adapter name: after an in-place "
       "reload, lookups use the old weights digest (registration uses the new one)",
       "vLLM 30931, 42125 (after an in-place adapter reload the old adapter's KV came back); a name-keyed "
       "LoRA lookup table that the reload does not invalidate",
       ("isolation", "parity"))
class ReloadStaleOnLookup(PrefixCache):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resolved: dict[tuple, Any] = {}  # (revision, adapter name, salt) -> first CacheIdentity seen

    def match(self, tokens: Any, identity: Any) -> tuple[list[int], list[str]]:
        memo = self.resolved.setdefault((identity.revision, identity.adapter, identity.salt), identity)
        return super().match(tokens, memo)


@functools.cache
def _tokenizer() -> Any:
    from tokenizers import Tokenizer

    from reference_engine.checkpoints import revision_dir
    return Tokenizer.from_file(str(revision_dir("a") / "tokenizer.json"))


@fault("text_keyed_blocks", "A", "block_key",
       "a block is keyed on its decoded text, not its token ids: two segmentations of the same text "
       "(ids of '(' ')' vs the id of '()') share KV",
       "a prompt cache keyed on text, as a text-mode server or gateway may key it; one text is many id "
       "sequences (mlc-llm 3179 and llama.cpp 11970: the same text tokenized two ways; DESIGN.md: text is "
       "not an identity), so a text key serves one segmentation's KV to another (BUG_CLASSES A)",
       ("isolation", "parity", "history_independence"))
class TextKeyedBlocks(PrefixCache):
    def block_key(self, parent: str | None, tokens: Any, identity: Any) -> str:
        text = _tokenizer().decode([int(t) for t in tokens], skip_special_tokens=False)
        payload = json.dumps([DOMAIN, ["parent", parent], ["identity", self.identity_fields(identity)],
                              ["text", text]], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


# --------------------------------------------------------------------------- B: numerics


def tf32(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded to TF32 (float32's exponent, a 10-bit mantissa), back in x's dtype: what a GEMM with
    TF32 inputs (torch.backends.cuda.matmul.allow_tf32) multiplies."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).to(x.dtype)


class TF32Projection(torch.nn.Module):
    """The vocab projection with its inputs and weights rounded to TF32 (float64 accumulation)."""

    def __init__(self, lm_head: torch.nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight", tf32(lm_head.weight.detach()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tf32(x) @ self.weight.T


@fault("tf32_hit_logits", "B", "_forward",
       "the first token after a prefix hit is sampled from logits whose vocab projection ran in TF32 "
       "(plain decoding: float64): outputs differ only where the top-2 margin is below ~2e-3",
       "vLLM 33123, SGLang 34683 (18/40 greedy flips on a radix hit), TRT-LLM 15503: the hit path runs "
       "another kernel at another precision and flips near-ties; in a tolerance-0 engine any flip is a bug",
       ("parity", "history_independence"))
class TF32HitLogits(Engine):
    """The KV (float64) is computed as usual; the first token of a request admitted with a prefix hit
    is re-sampled from a copy of its model whose vocab projection is TF32, run over the whole sequence.
    Measured on the shipped target (20k random 8-token prompts): the top-2 margin moves by 4.5e-4 at the
    median, 2.3e-3 at the 99.9th percentile; flips seen at margins 2e-4 to 5e-4."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.low: dict[int, Any] = {}  # id(model) -> its copy with a TF32 projection

    def _forward(self, plan: list[Work]) -> list[list[int]]:
        out = super()._forward(plan)
        for i, w in enumerate(plan):
            seq = w.seq
            if w.samples and out[i] and seq.cached_tokens and not seq.prefill_done_once and not w.drafts:
                out[i] = [self.tf32_argmax(seq)]
        return out

    @torch.inference_mode()
    def tf32_argmax(self, seq: Sequence) -> int:
        from reference_engine.model import DenseKV

        model = self.registry.model(seq.identity)
        low = self.low.get(id(model))
        if low is None:
            low = copy.deepcopy(model)
            low.lm_head = TF32Projection(model.lm_head)
            self.low[id(model)] = low
        n = len(seq.tokens)
        logits = low(torch.tensor(seq.tokens), torch.arange(n), DenseKV(low.config, model.dtype),
                     torch.tensor([n - 1]))
        return int(logits[0].argmax())


# The abort path's faults (issue 30) live in their own module; registered here like the others.
from reference_engine.faults_midflight import MIDFLIGHT  # noqa: E402

for _name, (_cls, _bug, _method, _summary, _mechanism, _expected, _also) in MIDFLIGHT.items():
    fault(_name, _bug, _method, _summary, _mechanism, _expected, _also)(_cls)
