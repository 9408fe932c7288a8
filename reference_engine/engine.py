"""The engine: submit requests, step the batch, settle what the model said. Lossless by construction.

Every optimization here — paged KV, prefix cache, speculative decoding, chunked prefill, continuous
batching, preemption by recompute, eviction — changes *which forward passes* produce a token's logits,
never *what they condition on*. The output must therefore equal `baseline.greedy` token for token.

Numerics: float64. Grouping tokens differently (a cache hit, a chunk boundary, a verification run of
k+1 tokens, a batch of 30 sequences) changes matrix shapes and so the floating-point reduction order;
in float32 that moves logits by ~1e-6 relative and would flip a genuine near-tie now and then (the
"numerics" class in BUG_CLASSES B). In float64 the same reordering moves logits by ~1e-15 relative —
orders of magnitude below the smallest top-1/top-2 margin the tests ever observe (see
tests/test_engine_exactness.py, which asserts the smallest margin it saw) — so the reference engine can
declare tolerance 0 and treat *any* divergence as a bug. The speed-ups keep to that rule: attention
over padded batches (block_pool.PagedKV) masks padded keys (exactly zero weight) and drops padded
queries, and computing logits only at the sampled rows (`Llama.forward(logits_rows=)`) changes which
rows are projected, not what any row is — both are regroupings of the same float64 arithmetic.

A step (`step`):
  1. the scheduler plans: which sequences, how many tokens each, blocks reserved;
  2. drafters propose into the draft slots of decoding sequences;
  3. one target forward per weights group (revision, adapter) over all their tokens (PagedKV);
  4. each sequence is settled: a mid-prefill chunk just advances `num_computed`; otherwise the target's
     predictions verify the drafts (`accepted_prefix`), the target's own token follows
     (`commit_tokens`), eos / stop / max_tokens cut the run (`truncate_at_finish`), provisional KV
     past the committed tokens is rolled back and its blocks freed (`rollback`), and newly full
     blocks of committed KV enter the prefix cache.
Each of those decisions is one small method so a fault — a subclass (faults.py) — can replace exactly
one of them; the pool, cache and scheduler classes come in through `Parts` for the same reason.
"""

from __future__ import annotations

import time
from typing import Iterable

import attrs
import torch

from reference_engine.baseline import finish_reason
from reference_engine.block_pool import BlockPool, PagedKV, Segment
from reference_engine.config import EngineConfig
from reference_engine.drafters import make_drafter
from reference_engine.logprobs import LOGPROBS_K, top_logprobs
from reference_engine.errors import BadRequestError, PoolExhaustedError, validate_prompt
from reference_engine.model_registry import ModelRegistry
from reference_engine.prefix_cache import PrefixCache
from reference_engine.scheduler import Scheduler, Work
from reference_engine.sequence import Identity, Report, Sequence

# EngineConfig lives in config.py (the scheduler reads it too) and is re-exported here.
__all__ = ["Engine", "EngineConfig", "Identity", "Parts", "Report", "Request"]


@attrs.frozen
class Parts:
    """The component classes an engine is built from; the defaults make the correct engine.

    Why classes, not instances or patches: every decision a fault of the zoo (faults.py) may change is
    one method of one component, so a fault is a subclass overriding that method, and an engine with
    the fault is *constructed* from it. No live object is ever altered, and an engine built with the
    default parts runs exactly these classes' code."""

    pool: type[BlockPool] = BlockPool
    cache: type[PrefixCache] = PrefixCache
    scheduler: type[Scheduler] = Scheduler


@attrs.frozen
class Request:
    request_id: str
    prompt: tuple[int, ...] = attrs.field(converter=lambda xs: tuple(int(x) for x in xs))
    max_tokens: int = 16
    stop_ids: tuple[int, ...] = attrs.field(default=(), converter=lambda xs: tuple(int(x) for x in xs))
    identity: Identity = attrs.field(factory=Identity)


class Engine:
    def __init__(self, config: EngineConfig | None = None, registry: ModelRegistry | None = None,
                 parts: Parts | None = None) -> None:
        self.config = config or EngineConfig()
        self.registry = registry or ModelRegistry()
        parts = parts or Parts()
        self.model_config = self.registry.config()
        self.pool = parts.pool(self.config.num_blocks, self.config.block_size, self.model_config,
                               self.registry.dtype)
        self.cache = parts.cache(self.pool) if self.config.enable_prefix_cache else None
        self.drafter = make_drafter(self.config.drafter, self.registry, self.config.k)
        self.scheduler = parts.scheduler(self.config, self.pool, self.cache, self.registry.cache_identity,
                                         self._on_preempt, self.model_config.max_position_embeddings)
        self.live: dict[str, Sequence] = {}
        self.finished: dict[str, Report] = {}
        self.target_cost = 0  # target token-forwards, engine-wide: the cost clock

    # -- submission ---------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Iterable[int], max_tokens: int, stop_ids: Iterable[int] = (),
                    identity: Identity | None = None) -> None:
        """Validate and queue a request. Raises a named error (errors.py) and changes nothing if bad."""
        identity = identity or Identity()
        self.check_request(request_id, tuple(prompt), max_tokens, identity)
        self._enqueue(request_id, tuple(prompt), max_tokens, stop_ids, identity)

    def check_request(self, request_id: str, prompt: tuple[int, ...], max_tokens: int, identity: Identity) -> None:
        """Raise the named error `add_request` would raise for this request; changes nothing."""
        c = self.model_config
        validate_prompt(prompt, max_tokens, c.vocab_size, c.max_position_embeddings)
        if request_id in self.live:
            raise BadRequestError(f"duplicate request id {request_id!r}")
        self.registry.validate(identity)
        worst = self.pool.blocks_for(len(prompt) + int(max_tokens) - 1)
        if worst > self.pool.num_blocks:
            raise PoolExhaustedError(f"request {request_id!r} needs up to {worst} blocks; the pool has "
                                     f"{self.pool.num_blocks}")

    def _enqueue(self, request_id: str, prompt: tuple[int, ...], max_tokens: int, stop_ids: Iterable[int],
                 identity: Identity) -> None:
        c = self.model_config
        seq = Sequence(request_id, prompt, int(max_tokens), frozenset(int(s) for s in stop_ids), identity,
                       c.eos_token_id)
        seq.t_arrival, seq.cost_arrival = time.perf_counter(), self.target_cost
        seq.evictions_at_arrival = self.evictions
        self.finished.pop(request_id, None)
        self.live[request_id] = seq
        self.scheduler.add(seq)

    def add_batch(self, requests: list[Request]) -> None:
        """Queue a batch all or nothing: every request is checked (ids against each other too) before
        any is queued. A refused batch therefore leaves no sibling live — otherwise the good requests
        queued before the bad one would hold the pool and collide with the ids of the caller's next
        batch (a retry, or the next example of a conformance run)."""
        seen: set[str] = set()
        for r in requests:
            if r.request_id in seen:
                raise BadRequestError(f"duplicate request id {r.request_id!r} within one batch")
            seen.add(r.request_id)
            self.check_request(r.request_id, r.prompt, r.max_tokens, r.identity)
        for r in requests:
            self._enqueue(r.request_id, r.prompt, r.max_tokens, r.stop_ids, r.identity)

    def abort(self, request_id: str) -> Report | None:
        """Stop a request now; its blocks go back (committed full blocks stay cached)."""
        seq = self.live.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, "abort")

    # -- running ------------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Report]:
        """One scheduling step; returns the reports of requests that finished in it. If anything
        raises mid-step, every in-flight request is aborted (blocks released) before re-raising, so
        the pool and the cache stay consistent."""
        try:
            plan = self.scheduler.schedule()
            if not plan:
                if self.scheduler.has_work():
                    raise RuntimeError("scheduler made no progress")
                return []
            self._propose(plan)
            predictions = self._forward(plan)
            done = []
            for work, preds in zip(plan, predictions):
                report = self._settle(work, preds)
                if report is not None:
                    done.append(report)
            return done
        except BaseException:
            for seq in list(self.live.values()):
                self._finish(seq, "abort")
            raise

    def run(self) -> list[Report]:
        """Step until idle; reports in finishing order."""
        out: list[Report] = []
        while self.scheduler.has_work():
            out.extend(self.step())
        return out

    def generate(self, requests: list[Request]) -> list[Report]:
        """Submit in list order (arrival order), all or nothing (`add_batch`), run to completion; reports in
        the same order."""
        self.add_batch(requests)
        self.run()
        return [self.finished[r.request_id] for r in requests]

    def flush(self) -> None:
        """Forget every reusable KV: the prefix cache's blocks and drafter state."""
        self.pool.drop_cached()
        if self.drafter is not None:
            self.drafter.reset()

    # -- the step's parts ---------------------------------------------------------------------------
    def _propose(self, plan: list[Work]) -> None:
        if self.drafter is None:
            return
        for work in plan:
            if work.draft_slots:
                before = self.drafter.forwards
                work.drafts = list(self.drafter.propose(work.seq, work.draft_slots))[:work.draft_slots]
                work.seq.draft_forwards += self.drafter.forwards - before

    def positions(self, seq: Sequence, start: int, count: int) -> torch.Tensor:
        """Absolute positions of the fed tokens: counted from the sequence start, never a chunk's."""
        return torch.arange(start, start + count)

    def _forward(self, plan: list[Work]) -> list[list[int]]:
        """One target forward per weights group; returns each work's target predictions (argmax) at
        its sampled rows: the last fed token and each draft. A prefill chunk that stops short of the
        sequence's end samples nothing, and only sampled rows go through the vocab projection."""
        groups: dict[tuple, list[int]] = {}
        for i, work in enumerate(plan):
            groups.setdefault(self.registry.weights_key(work.seq.identity), []).append(i)
        out: list[list[int]] = [[] for _ in plan]
        for indices in groups.values():
            ids: list[int] = []
            pos, segments, sampled = [], [], []
            for i in indices:
                w = plan[i]
                fed = w.seq.tokens[w.start:w.start + w.n] + w.drafts
                if w.samples:
                    sampled.append((i, len(ids) + w.n - 1, len(ids) + len(fed)))
                ids.extend(fed)
                pos.append(self.positions(w.seq, w.start, len(fed)))
                segments.append(Segment(tuple(w.seq.block_table), w.start, len(fed)))
                w.seq.target_forwards += len(fed)
            rows = [r for _, first, end in sampled for r in range(first, end)]
            model = self.registry.model(plan[indices[0]].seq.identity)
            logits = model(torch.tensor(ids), torch.cat(pos), PagedKV(self.pool, segments),
                           logits_rows=torch.tensor(rows, dtype=torch.long))
            self.target_cost += len(ids)
            preds = logits.argmax(dim=-1).tolist()
            offset = 0
            for i, first, end in sampled:
                out[i] = preds[offset:offset + end - first]
                plan[i].rows = list(logits[offset:offset + end - first])
                offset += end - first
        return out

    def _settle(self, work: Work, preds: list[int]) -> Report | None:
        """`preds`: the target's argmax after the last fed token and after each draft (empty for a
        prefill chunk that does not reach the end of the sequence)."""
        seq, end = work.seq, work.start + work.n
        if not seq.prefill_done_once:
            seq.prefill_chunks += 1
        if not work.samples:  # a prefill chunk that does not reach the end: nothing to sample
            self._computed(seq, work.start, end, end)
            return None
        seq.prefill_done_once = True
        accepted = self.accepted_prefix(work.drafts, preds)
        new = self.truncate_at_finish(seq, self.commit_tokens(work.drafts, preds, accepted))
        self._draft_stats(seq, work.drafts, min(accepted, len(new)))
        self._logprobs(seq, work, new)
        seq.tokens.extend(new)
        now = time.perf_counter()
        if seq.t_first is None:
            seq.t_first, seq.cost_first = now, self.target_cost
        seq.t_last, seq.cost_last = now, self.target_cost
        written_end = end + len(work.drafts)
        self._computed(seq, work.start, min(end + accepted, len(seq.tokens) - 1), written_end)
        if seq.finish_reason is not None:
            return self._finish(seq, seq.finish_reason)
        return None

    @staticmethod
    def _logprobs(seq: Sequence, work: Work, new: list[int]) -> None:
        """Committed token j was chosen from row j's logits (after the last fed token, then after each
        accepted draft). A token with no row (a fault's forward that sampled none) ends the reporting for
        the request: a shifted list would pair positions with the wrong distributions."""
        if seq.logprobs is None:
            return
        if len(work.rows) < len(new):
            seq.logprobs = None
            return
        seq.logprobs.extend(top_logprobs(row, LOGPROBS_K, token) for row, token in zip(work.rows, new))

    # -- speculation decisions (one method each) ----------------------------------------------------
    def accepted_prefix(self, drafts: list[int], preds: list[int]) -> int:
        """How many drafts the target agrees with: the longest prefix where draft i == target's token i."""
        a = 0
        while a < len(drafts) and drafts[a] == preds[a]:
            a += 1
        return a

    def commit_tokens(self, drafts: list[int], preds: list[int], accepted: int) -> list[int]:
        """The accepted drafts, then the target's own token after them (the bonus / correction)."""
        return drafts[:accepted] + [preds[accepted]]

    def truncate_at_finish(self, seq: Sequence, new: list[int]) -> list[int]:
        """Cut a committed run at the first eos / stop id / max_tokens (that token included); nothing
        past it is output. Sets `seq.finish_reason` when it cuts."""
        produced = len(seq.output)
        for i, token in enumerate(new):
            reason = finish_reason(token, produced + i + 1, seq.max_tokens, seq.stop_ids, seq.eos_id)
            if reason:
                seq.finish_reason = reason
                return new[:i + 1]
        return new

    def rollback(self, seq: Sequence, keep: int, written_end: int) -> None:
        """Only the first `keep` tokens' KV is valid: free the blocks past them (provisional ones) and
        mark the rejected slots left inside the last kept block."""
        bs = self.pool.block_size
        seq.num_computed = keep
        kept = self.pool.blocks_for(keep)
        for bid in reversed(seq.block_table[kept:]):
            if self.pool.blocks[bid].provisional:
                seq.provisional_freed += 1
            self.pool.release(bid)
        del seq.block_table[kept:]
        for p in range(keep, min(written_end, kept * bs)):
            self.pool.blocks[seq.block_table[p // bs]].rejected_slots.add(p % bs)
        for bid in seq.block_table:
            self.pool.blocks[bid].provisional = False

    def _computed(self, seq: Sequence, start: int, keep: int, written_end: int) -> None:
        """KV for [start, written_end) was written; [start, keep) of it is committed."""
        bs = self.pool.block_size
        end = min(keep, len(seq.block_table) * bs)
        for i in range(start // bs, self.pool.blocks_for(end)):  # committed KV overwrote these slots
            block = self.pool.blocks[seq.block_table[i]]
            if block.rejected_slots:
                block.rejected_slots.difference_update(range(max(start, i * bs) - i * bs, min(end, (i + 1) * bs) - i * bs))
        self.rollback(seq, keep, written_end)
        if self.cache is not None:
            self.cache.register(seq, self.registry.cache_identity(seq.identity))

    def _draft_stats(self, seq: Sequence, drafts: list[int], accepted: int) -> None:
        if not drafts:
            return
        seq.verification_steps += 1
        seq.draft_proposed += len(drafts)
        seq.draft_accepted += accepted
        for i in range(len(drafts)):
            if i >= len(seq.proposed_per_position):
                seq.proposed_per_position.append(0)
                seq.accepted_per_position.append(0)
            seq.proposed_per_position[i] += 1
            seq.accepted_per_position[i] += int(i < accepted)

    # -- endings ------------------------------------------------------------------------------------
    def _on_preempt(self, seq: Sequence) -> None:
        if self.drafter is not None:
            self.drafter.forget(seq.request_id)

    def _finish(self, seq: Sequence, reason: str) -> Report:
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        if self.drafter is not None:
            self.drafter.forget(seq.request_id)
        report = seq.report(self.evictions)
        self.live.pop(seq.request_id, None)
        self.finished[seq.request_id] = report
        return report

    # -- introspection ------------------------------------------------------------------------------
    @property
    def evictions(self) -> int:
        return self.pool.evictions

    def pool_counts(self) -> dict:
        tables = [s.block_table for s in self.live.values()]
        counts = self.pool.counts(tables)
        counts["evictions"] = self.evictions
        return counts

    def snapshot(self) -> dict:
        """JSON-able: pool counts plus, per non-free block, its key, identity, token span and refcount."""
        owners: dict[int, list] = {}
        bs = self.pool.block_size
        for seq in self.live.values():
            for i, bid in enumerate(seq.block_table):
                owners.setdefault(bid, []).append([seq.request_id, i * bs, (i + 1) * bs])
        blocks = []
        for b in self.pool.blocks:
            if b.ref_count == 0 and b.key is None:
                continue
            blocks.append({"id": b.id, "key": b.key, "identity": list(b.identity) if b.identity else None,
                           "tokens": list(b.tokens), "spans": owners.get(b.id, []), "refcount": b.ref_count,
                           "state": "in_use" if b.ref_count else "cached",
                           "rejected_slots": sorted(b.rejected_slots)})
        return {**self.pool_counts(), "block_size": bs, "blocks": blocks,
                "live_requests": sorted(self.live)}
