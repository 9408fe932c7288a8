"""Faults of the abort path (issue 30): KV of a request stopped mid-flight that is served although it was
never fully written, and a shared block's reference dropped twice.

Registered into the zoo (`faults.FAULTS`) by `faults.py`, from `MIDFLIGHT` (this module imports nothing
of the zoo's, so the two form no import cycle); kept apart
because the zoo's module is long and these three share one helper and one situation: a request aborted
(or preempted) while a block of its table holds tokens whose KV is not written yet — the tail of a
block that a chunked prefill stopped inside, or the last block of prompt + output when it ends on a
block edge (the last sampled token's KV is written by the next step, which never comes).
"""

from __future__ import annotations

from reference_engine.block_pool import BlockPool
from reference_engine.engine import Engine
from reference_engine.prefix_cache import PrefixCache
from reference_engine.scheduler import Scheduler
from reference_engine.sequence import Report, Sequence

# name -> (bug class, method, summary, mechanism, expected checks, supporting classes); the class is
# added by `_registered` below each class, in the order of `faults.fault`'s arguments.
MIDFLIGHT: dict[str, tuple] = {}


# Unwritten KV served shows in whichever output the hit feeds (a later request's, a sharer's partial one)
# and, where the published block carried a rejected draft slot, in the pool at rest.
PUBLISHED_EXPECTED = ("parity", "abort_prefix", "history_independence", "schedule_independence", "spec_independence",
                      "eviction_safety", "isolation", "rollback_hygiene")


def _registered(name: str, bug_class: str, method: str, summary: str, mechanism: str, expected: tuple[str, ...],
                also: tuple[type, ...] = ()):
    def deco(cls: type) -> type:
        MIDFLIGHT[name] = (cls, bug_class, method, summary, mechanism, expected, also)
        return cls
    return deco


def publish_known(cache: PrefixCache, seq: Sequence, identity: object) -> None:
    """Register every block of `seq`'s table whose tokens are all known, written or not (the wrong
    decision both publishing faults share: the correct `register` asks `is_cacheable`, i.e. written)."""
    bs, pool = cache.block_size, cache.pool
    fields = tuple(v for _, v in cache.identity_fields(identity))
    while len(seq.block_keys) < len(seq.block_table) and (len(seq.block_keys) + 1) * bs <= len(seq.tokens):
        i = len(seq.block_keys)
        parent = seq.block_keys[-1] if seq.block_keys else None
        tokens = tuple(seq.tokens[i * bs:(i + 1) * bs])
        key = cache.block_key(parent, tokens, identity)
        pool.register(seq.block_table[i], key, tokens, fields)
        seq.block_keys.append(key)


@_registered("aborted_blocks_published", "B", "abort",
       "an aborted request's blocks are inserted into the prefix cache, the ones not fully written too",
       "SGLang PR 28374 (2026-06): KV of aborted requests was inserted into the radix prefix cache, so later "
       "requests with the same prefix reused invalid KV",
       PUBLISHED_EXPECTED)
class AbortedBlocksPublished(Engine):
    def abort(self, request_id: str) -> Report | None:
        seq = self.live.get(request_id)
        if seq is not None and self.cache is not None and seq.block_table:
            publish_known(self.cache, seq, self.registry.cache_identity(seq.identity))
        return super().abort(request_id)


@_registered("schedule_registration_kept", "B", "release_blocks",
       "blocks registered when scheduled are not rolled back when their request is aborted or preempted "
       "before the write",
       "vLLM PR 43569 (2026-05): blocks are registered in the prefix cache when scheduled, before the worker "
       "writes them; a request preempted or aborted before the write leaves a hash entry that a later "
       "request hits, reading memory nobody wrote (also vLLM PR 50283, a block committed at schedule time "
       "not evicted when its request aborts)",
       PUBLISHED_EXPECTED)
class ScheduleRegistrationKept(Scheduler):
    def release_blocks(self, seq: Sequence) -> None:
        # A normal finish rolls nothing back wrongly here; an abort (finish_reason "abort") or a
        # preemption (no finish reason yet) leaves the schedule-time entries of unwritten blocks behind.
        if self.cache is not None and seq.finish_reason in (None, "abort") and seq.status.name != "WAITING":
            publish_known(self.cache, seq, self.resolve_identity(seq.identity))
        super().release_blocks(seq)


class UncheckedRelease(BlockPool):
    """A pool whose release does not assert (a refcount that may go below zero, as an unchecked counter
    does): the second release of a shared block then corrupts the count instead of crashing the engine."""

    def release(self, bid: int) -> None:
        block = self.blocks[bid]
        block.ref_count -= 1
        if block.ref_count:
            return
        block.provisional = False
        if block.key is not None and self.table.get(block.key) == bid:
            self.lru[bid] = None
            self.lru.move_to_end(bid)
            return
        self._recycle(bid)


@_registered("abort_double_release", "D", "finish",
       "on abort, every block shared with the prefix cache has its reference released twice",
       "SGLang abort cleanup (PRs 40334, 40600, 40262: tiered-cache locks and markers released on abort "
       "beside the normal release path); a shared block then counts one holder too few, is evictable while "
       "a sharer still reads it, and ends below zero",
       ("rollback_hygiene", "parity", "eviction_safety"), also=(UncheckedRelease,))
class AbortDoubleRelease(Scheduler):
    def finish(self, seq: Sequence) -> None:
        if seq.finish_reason == "abort":
            for bid in seq.block_table:
                if self.pool.blocks[bid].key is not None:
                    self.pool.release(bid)
        super().finish(seq)
