"""The scheduler: which sequences run this step, with how many tokens, in which blocks.

Continuous batching under a per-step token budget:
  1. Running sequences first, oldest first. A decode costs 1 token plus its draft slots (the drafts are
     cut, never the decode, when the budget or the pool is short) — so a long prefill never starves
     decodes. A sequence mid-prefill gets its next chunk (<= chunk_size, <= what the budget has left).
  2. Then waiting sequences are admitted FIFO while the batch has room: the prefix cache is consulted
     (a hit gives the leading blocks and skips their compute) and the first chunk is scheduled.
  3. When the pool cannot hold what a running sequence needs, the youngest running sequence is
     preempted by *recompute*: its blocks are released (registered ones stay cached) and it re-enters
     the queue front with its committed tokens, to be prefilled again. Admission never preempts.

The scheduler only decides and reserves blocks; the engine runs the model and settles the results.
Decisions are small methods so that a subclass can replace exactly one (faults.py overrides
`reported_cached_tokens`).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import attrs

from reference_engine.block_pool import BlockPool
from reference_engine.config import EngineConfig
from reference_engine.prefix_cache import PrefixCache
from reference_engine.sequence import Sequence, Status


@attrs.define
class Work:
    """One sequence's part of a step: feed tokens[start:start+n] plus up to `draft_slots` proposals."""

    seq: Sequence
    start: int
    n: int
    draft_slots: int = 0
    drafts: list[int] = attrs.Factory(list)
    # Set by the engine's forward: the logits at each sampled row (after the last fed token, then after
    # each draft), which the settled tokens' logprobs are read from.
    rows: list = attrs.Factory(list)

    @property
    def samples(self) -> bool:
        """Whether it reaches the sequence's end (read before the step commits tokens): only then does
        the target's next token get sampled; a prefill chunk short of the end samples nothing."""
        return self.start + self.n >= len(self.seq.tokens)


class Scheduler:
    def __init__(self, config: EngineConfig, pool: BlockPool, cache: PrefixCache | None,
                 resolve_identity: Callable, on_preempt: Callable[[Sequence], None], max_context: int) -> None:
        self.config, self.pool, self.cache = config, pool, cache
        self.max_context = max_context
        self.resolve_identity = resolve_identity
        self.on_preempt = on_preempt
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step plan ------------------------------------------------------------------------------
    def schedule(self) -> list[Work]:
        budget = self.config.token_budget
        plan: list[Work] = []
        preempted_now: set[str] = set()
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or budget <= 0:
                continue
            work = self._plan_running(seq, budget, preempted_now)
            if work is not None:
                plan.append(work)
                budget -= work.n + work.draft_slots
        while self.waiting and budget > 0 and len(self.running) < self.config.max_batch:
            seq = self.waiting[0]
            if seq.request_id in preempted_now:
                break  # do not re-admit in the step that evicted it (no thrash)
            work = self._admit(seq, budget)
            if work is None:
                break
            self.waiting.popleft()
            plan.append(work)
            budget -= work.n
        return plan

    def _plan_running(self, seq: Sequence, budget: int, preempted_now: set[str]) -> Work | None:
        if seq.num_uncomputed == 1:
            n, slots = 1, self.draft_slots(seq, budget)
        else:
            n, slots = self.piece(seq, seq.num_computed, budget), 0
        while not self.reserve(seq, seq.num_computed + n + slots):
            if slots:
                slots = 0
                continue
            victim = self.running[-1]
            self.preempt(victim)
            preempted_now.add(victim.request_id)
            if victim is seq:
                return None
        if slots:
            self.mark_provisional(seq)
        return Work(seq, seq.num_computed, n, slots)

    def draft_slots(self, seq: Sequence, budget: int) -> int:
        """Draft positions a decode may use: k, cut by the budget and the model's context."""
        if self.config.drafter == "none":
            return 0
        room = self.max_context - len(seq.tokens)
        return max(0, min(self.config.k, budget - 1, room))

    def _admit(self, seq: Sequence, budget: int) -> Work | None:
        hits: list[int] = []
        keys: list[str] = []
        if self.cache is not None:
            hits, keys = self.cache.match(seq.tokens, self.resolve_identity(seq.identity))
            for bid in hits:
                self.pool.acquire(bid)
        start = len(hits) * self.pool.block_size
        n = self.piece(seq, start, budget)
        seq.block_table = hits
        if not self.reserve(seq, start + n):
            self.release_blocks(seq)
            return None
        seq.block_keys = keys
        seq.num_computed = start
        if not seq.admitted_once:
            seq.cached_tokens = self.reported_cached_tokens(seq, start)
            seq.admitted_once = True
        seq.status = Status.RUNNING
        self.running.append(seq)
        return Work(seq, start, n, 0)

    def piece(self, seq: Sequence, start: int, budget: int) -> int:
        """How many tokens from `start` one prefill piece feeds: the rest, cut by the chunk size and budget."""
        rest = len(seq.tokens) - start
        return min(rest, self.config.chunk_size or rest, budget)

    def reported_cached_tokens(self, seq: Sequence, hit_tokens: int) -> int:
        """Cached tokens reported for a request: its first admission's prefix hit."""
        return hit_tokens

    # -- blocks -------------------------------------------------------------------------------------
    def reserve(self, seq: Sequence, end: int) -> bool:
        """Make `seq`'s block table cover positions [0, end). False if the pool cannot."""
        needed = self.pool.blocks_for(end) - len(seq.block_table)
        if needed <= 0:
            return True
        if needed > self.pool.num_available():
            return False
        seq.block_table.extend(self.pool.allocate() for _ in range(needed))
        return True

    def mark_provisional(self, seq: Sequence) -> None:
        """Blocks that exist only for draft positions (past the block of the next committed token)."""
        first = self.pool.blocks_for(len(seq.tokens))
        for bid in seq.block_table[first:]:
            block = self.pool.blocks[bid]
            if not block.provisional:
                block.provisional = True
                seq.provisional_allocated += 1

    def release_blocks(self, seq: Sequence) -> None:
        """Give back every block of `seq`, tail first (so LRU evicts a prefix's tail before its head)."""
        for bid in reversed(seq.block_table):
            self.pool.release(bid)
        seq.block_table, seq.block_keys = [], []
        seq.num_computed = 0

    def preempt(self, seq: Sequence) -> None:
        self.release_blocks(seq)
        self.running.remove(seq)
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.on_preempt(seq)
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        self.release_blocks(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
