"""The block pool: every block's state, in one owner — refcounts, the free list, the cache-key table,
the LRU of reusable blocks, the eviction count — and the paged KVStore.

Why paging: sequences grow one token (or one verified draft run) at a time and finish in any order.
Giving each a contiguous buffer wastes memory and makes sharing a prefix impossible; fixed-size blocks
plus a per-sequence *block table* (logical block i -> physical block id) make both cheap, and a block
can be shared by several sequences (refcount > 1) when the prefix cache serves it.

A physical block is always in exactly one of three states, which the white-box checks rely on:
  free         refcount 0, no cache key, in `free`              (its KV is garbage)
  cached       refcount 0, has a cache key, in `lru`            (reusable; evictable)
  in use       refcount > 0, referenced by >= 1 block table     (never evicted, never freed)
Why one owner: moving a block between those states touches the refcount, the free list, the key table
and the LRU together, so they live together here (as in nano-vllm's BlockManager) and every transition
is one method of the pool. `prefix_cache.PrefixCache` is the keying *policy* — what a block's key is,
which blocks may be registered, how much of a prompt a hit may serve — and reaches block state only
through the pool's public methods (`lookup`, `acquire`, `register`). The pool never imports it.

Each eviction decision is one small method (`eviction_candidate`), the seam a fault overrides.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import attrs
import torch
import torch.nn.functional as F

from reference_engine.model import LlamaConfig


class PoolFullError(RuntimeError):
    """No free block and nothing evictable: the scheduler must preempt or wait."""


@attrs.define(eq=False)
class Block:
    id: int
    ref_count: int = 0
    key: str | None = None  # set when the prefix cache registers this block (full, committed KV)
    identity: tuple | None = None  # the identity fields the key was made from (for snapshots)
    tokens: tuple[int, ...] = ()  # the token ids whose KV it holds, once registered
    # Slots holding KV of a rejected draft token that no committed token has overwritten yet. A block
    # with such slots must never carry a cache key (white-box: "rejected_in_cache").
    rejected_slots: set[int] = attrs.field(factory=set)
    provisional: bool = False  # allocated for draft positions and not yet settled by verification

    def unregister(self) -> None:
        """No longer a cache entry: its KV stays until the block is freed."""
        self.key, self.identity, self.tokens = None, None, ()

    def reset(self) -> None:
        self.unregister()
        self.rejected_slots.clear()
        self.provisional = False


class BlockPool:
    """Fixed-size blocks of KV for every layer, and all their state: refcounts, free list, key table,
    LRU of cached unreferenced blocks, evictions."""

    def __init__(self, num_blocks: int, block_size: int, model_config: LlamaConfig,
                 dtype: torch.dtype = torch.float64) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))
        self.table: dict[str, int] = {}  # cache key -> the block registered under it
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached and unreferenced; oldest first
        self.evictions = 0
        c = model_config
        shape = (c.num_hidden_layers, num_blocks * block_size, c.num_key_value_heads, c.head_dim)
        # Flat slot-major storage: slot = block_id * block_size + offset. Zeros, not empty: a read of an
        # unwritten slot (a bug) then gives a deterministic wrong answer instead of a random one.
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)

    # -- capacity ---------------------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self.free)

    def num_evictable(self) -> int:
        return len(self.lru)

    def num_available(self) -> int:
        """Blocks an allocation may take now: free ones plus cached-unreferenced (evictable) ones."""
        return len(self.free) + len(self.lru)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- lifecycle ----------------------------------------------------------------------------------
    def allocate(self) -> int:
        """A block with refcount 1. Takes a free block first; evicts the least recently used cached
        block only when none is free (keeping reusable KV as long as possible)."""
        if self.free:
            bid = self.free.popleft()
        elif (evicted := self.evict_one()) is not None:
            bid = evicted
        else:
            raise PoolFullError("no free or evictable KV block")
        block = self.blocks[bid]
        assert block.ref_count == 0, f"allocated block {bid} is still referenced"
        block.reset()
        block.ref_count = 1
        return bid

    def acquire(self, bid: int) -> None:
        """Take one more reference to a block (a cache hit, or a share). A cached block leaves the LRU:
        a referenced block is never evicted."""
        self.lru.pop(bid, None)
        self.blocks[bid].ref_count += 1

    def release(self, bid: int) -> None:
        """Drop one reference. At zero a registered block is parked in the LRU (reusable, most recently
        used), any other goes back to the free list (its KV is garbage from now on)."""
        block = self.blocks[bid]
        if block.ref_count <= 0:
            raise RuntimeError(f"release of unreferenced block {bid}")
        block.ref_count -= 1
        if block.ref_count:
            return
        block.provisional = False
        if block.key is not None and self.table.get(block.key) == bid:
            self.lru[bid] = None
            self.lru.move_to_end(bid)
            return
        self._recycle(bid)

    def _recycle(self, bid: int) -> None:
        """An unreferenced block back to the free list, its KV garbage from now on."""
        self.blocks[bid].reset()
        self.free.append(bid)

    # -- the cache table ----------------------------------------------------------------------------
    def lookup(self, key: str) -> int | None:
        """The block cached under `key`, if any (the caller takes a reference with `acquire`)."""
        return self.table.get(key)

    def register(self, bid: int, key: str, tokens: tuple[int, ...], identity: tuple) -> bool:
        """Make block `bid` the cache entry for `key`. If the key is cached already (another sequence
        computed the same block) the first copy is kept and this block stays private (freed when
        released), as it does if it carries a key already. Returns whether it was registered."""
        block = self.blocks[bid]
        if key in self.table or block.key is not None:
            return False
        self.table[key] = bid
        block.key, block.tokens, block.identity = key, tokens, identity
        return True

    def eviction_candidate(self) -> int | None:
        """The least recently used block nobody references."""
        return next(iter(self.lru), None)

    def evict_one(self) -> int | None:
        """Forget one cached block; returns its id (now unreferenced and keyless) for reuse."""
        bid = self.eviction_candidate()
        if bid is None:
            return None
        self.lru.pop(bid, None)
        block = self.blocks[bid]
        if block.key is not None and self.table.get(block.key) == bid:
            del self.table[block.key]
        block.reset()
        self.evictions += 1
        return bid

    def drop_cached(self) -> None:
        """Forget every cache entry: unreferenced cached blocks are freed, referenced ones lose their key
        (and are freed when released)."""
        for bid in list(self.lru):
            self.lru.pop(bid)
            self._recycle(bid)
        for bid in self.table.values():
            self.blocks[bid].unregister()
        self.table.clear()

    # -- white-box ----------------------------------------------------------------------------------
    def counts(self, tables: list[list[int]]) -> dict:
        """Pool counts and a consistency verdict given every live block table."""
        refs = [0] * self.num_blocks
        for table in tables:
            for bid in table:
                refs[bid] += 1
        cached = set(self.lru)
        free = set(self.free)
        in_use = {b.id for b in self.blocks if b.ref_count > 0}
        ok = (len(free) == len(self.free) and not (free & cached) and not (free & in_use)
              and not (cached & in_use) and len(free) + len(cached) + len(in_use) == self.num_blocks
              and all(b.ref_count == refs[b.id] for b in self.blocks)
              and all(self.blocks[i].key is None for i in free)
              and all(self.blocks[i].key is not None for i in cached))
        return {
            "total_blocks": self.num_blocks,
            "free_blocks": len(free),
            "cached_blocks": len(cached),
            "blocks_in_use": len(in_use),
            "provisional_live": sum(b.provisional for b in self.blocks),
            "rejected_in_cache": sum(1 for b in self.blocks if b.key is not None and b.rejected_slots),
            "refcounts_ok": ok,
        }


@attrs.frozen
class Segment:
    """One sequence's share of a forward pass: `n` new tokens at true positions start..start+n-1."""

    block_table: tuple[int, ...]
    start: int
    n: int


@attrs.frozen
class AttentionBatch:
    """Index tensors for one padded attention call over segments of similar query counts.

    queries [B * Tq]: batch row of each padded query (a padded query repeats its segment's last real
    row and position, so it is well defined, and is dropped); keys [B, L]: slot of positions 0..L-1
    of each segment; mask [B, 1, Tq, L]: True where a query may attend (key position <= its own);
    rows / keep: the batch rows the real queries fill and their indices in the flattened [B * Tq].
    queries, rows and keep are None when the batch is the whole forward, in order, unpadded."""

    queries: torch.Tensor | None
    keys: torch.Tensor
    mask: torch.Tensor | None
    rows: torch.Tensor | None
    keep: torch.Tensor | None
    shape: tuple[int, int]  # (B, Tq)


class PagedKV:
    """The KVStore (see model.py) for one batched forward over several sequences.

    Tokens arrive concatenated segment by segment. For each layer, `attend` writes the new K/V into the
    slots their *true* positions map to through the segment's block table, then lets each segment's
    queries attend over that sequence's KV gathered from its blocks. The slot and the causal mask use
    the engine's bookkeeping of positions, while RoPE used the `positions` fed to the model: so a wrong
    position (chunk offset bug) corrupts exactly what it corrupts in real engines, the rotation.

    Speed: the indices (slots, gathers, masks) do not depend on the layer, so they are built once per
    forward, as Python lists turned into tensors in one call each, rather than many small tensor ops.
    Segments are attended in padded batches, one per query-count bucket (1, 2-3, 4-7, ...: decodes
    together, verifications together, prefill chunks together), so padding wastes at most half a
    batch's queries. Padding is masked or dropped, so it cannot leak into the output.
    """

    def __init__(self, pool: BlockPool, segments: list[Segment]) -> None:
        self.pool, self.segments = pool, segments
        bs = pool.block_size
        self.first_row, row = [], 0  # batch row of each segment's first new token
        for seg in segments:
            self.first_row.append(row)
            row += seg.n
        self.num_rows = row
        width = max(pool.blocks_for(seg.start + seg.n) for seg in segments)
        padded = [bid for seg in segments for bid in (list(seg.block_table[:width]) + [0] * width)[:width]]
        tables = torch.tensor(padded, dtype=torch.long).view(len(segments), width)
        # slot_of[i, p]: the slot holding position p of segment i's sequence (p < width * bs).
        self.slot_of = (tables[:, :, None] * bs + torch.arange(bs)).reshape(len(segments), width * bs)
        flat = [i * width * bs + p for i, seg in enumerate(segments) for p in range(seg.start, seg.start + seg.n)]
        self.slots = self.slot_of.reshape(-1)[torch.tensor(flat, dtype=torch.long)]
        buckets: dict[int, list[int]] = {}
        for i, seg in enumerate(segments):
            buckets.setdefault(seg.n.bit_length(), []).append(i)
        self.batches = [self._batch(members) for members in buckets.values()]

    def _batch(self, members: list[int]) -> AttentionBatch:
        segs = [self.segments[i] for i in members]
        tq, lk = max(s.n for s in segs), max(s.start + s.n for s in segs)
        last = [[min(t, s.n - 1) for t in range(tq)] for s in segs]  # padded query -> real query
        mask = None  # decodes of equal lengths: every key is visible
        if tq > 1 or any(s.start + s.n != lk for s in segs):
            q_pos = torch.tensor([s.start + t for s, ts in zip(segs, last) for t in ts], dtype=torch.long)
            mask = (torch.arange(lk) <= q_pos.view(len(segs), tq, 1))[:, None]
        everyone = len(members) == len(self.segments)  # members are in order: no row selection needed
        keys = (self.slot_of if everyone else self.slot_of[torch.tensor(members, dtype=torch.long)])[:, :lk]
        keys = keys.contiguous()
        rows = [self.first_row[i] + t for i, s in zip(members, segs) for t in range(s.n)]
        if len(rows) == len(segs) * tq and rows == list(range(self.num_rows)):
            return AttentionBatch(None, keys, mask, None, None, (len(segs), tq))
        queries = torch.tensor([self.first_row[i] + t for i, ts in zip(members, last) for t in ts],
                               dtype=torch.long)
        keep = [b * tq + t for b, s in enumerate(segs) for t in range(s.n)]
        return AttentionBatch(queries, keys, mask, torch.tensor(rows, dtype=torch.long),
                              torch.tensor(keep, dtype=torch.long), (len(segs), tq))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        kc, vc = self.pool.k[layer], self.pool.v[layer]
        kc.index_copy_(0, self.slots, k)
        vc.index_copy_(0, self.slots, v)
        out = None
        for b in self.batches:
            # index_select on flat indices: the same gather as kc[keys], a few times cheaper.
            (bsz, tq), lk, head = b.shape, b.keys.shape[1], q.shape[1:]
            qb = q.view(bsz, tq, *head) if b.queries is None else q.index_select(0, b.queries).view(bsz, tq, *head)
            kb = kc.index_select(0, b.keys.view(-1)).view(bsz, lk, *kc.shape[1:])
            vb = vc.index_select(0, b.keys.view(-1)).view(bsz, lk, *vc.shape[1:])
            # heads first for SDPA: [B, heads, Tq or L, D]
            o = F.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                                               attn_mask=b.mask, enable_gqa=True)
            o = o.transpose(1, 2).reshape(-1, *head)
            if b.rows is None:
                return o
            if out is None:
                out = torch.empty_like(q)
            out.index_copy_(0, b.rows, o.index_select(0, b.keep))
        return out
