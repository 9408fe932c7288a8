"""The prefix cache: full blocks of committed KV, found again by a chained, identity-bound key.

A block's KV depends on every token before it and on the weights that produced it, so its key must
say all of that (DESIGN.md "Identity"; BUG_CLASSES A):

  key(block i) = H( domain tag, key(block i-1), identity fields, token ids of block i )

- *chained*: the parent's key is in the hash, so a block matches only after the same whole prefix;
- *identity-bound*: model revision digest, adapter name AND adapter weights digest, tenant salt —
  an adapter reloaded under the same name, or a different tenant, never reuses KV;
- *domain-separated*: fields are hashed as a JSON array of (name, value) pairs, never concatenated
  strings, so adapter "X" cannot collide with salt "X" nor tokens with an identity field.

Only full blocks whose every token is committed and computed are registered, so a partial block and
provisional (draft) KV never enter the cache. A hit is capped at Lin - 1 tokens: the last prompt token
is always computed, so a hit yields fresh logits and never skips generation. Unreferenced cached blocks
sit in an LRU and are evicted only when the pool has no free block.

Each of those decisions is one small method (`identity_fields`, `block_key`, `hit_limit`,
`is_cacheable`, `eviction_candidate`), the seams a fault injector overrides one at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import attrs

if TYPE_CHECKING:
    from reference_engine.block_pool import BlockPool
    from reference_engine.sequence import Sequence as Seq

DOMAIN = "kvparity/reference-engine/kv-block/v1"


@attrs.frozen
class CacheIdentity:
    """An engine identity resolved to what the weights actually are."""

    revision: str
    revision_digest: str
    adapter: str | None
    adapter_digest: str | None
    salt: str | None


class PrefixCache:
    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.table: dict[str, int] = {}  # key -> physical block id
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.evictions = 0
        pool.cache = self

    # -- the key ------------------------------------------------------------------------------------
    def identity_fields(self, identity: CacheIdentity) -> list:
        """Every input the KV depends on besides the tokens, as named fields."""
        return [["revision_digest", identity.revision_digest], ["adapter", identity.adapter],
                ["adapter_digest", identity.adapter_digest], ["salt", identity.salt]]

    def block_key(self, parent: str | None, tokens: Sequence[int], identity: CacheIdentity) -> str:
        payload = json.dumps([DOMAIN, ["parent", parent], ["identity", self.identity_fields(identity)],
                              ["tokens", [int(t) for t in tokens]]], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    # -- lookup -------------------------------------------------------------------------------------
    def hit_limit(self, num_tokens: int) -> int:
        """At most this many of `num_tokens` may be served from cache: all but the last, whose logits
        must be computed fresh (a hit never retrieves a finished answer)."""
        return num_tokens - 1

    def match(self, tokens: Sequence[int], identity: CacheIdentity) -> tuple[list[int], list[str]]:
        """Longest chain of cached full blocks prefixing `tokens` (within `hit_limit`). Returns block
        ids and their keys; the caller takes a reference with `acquire`."""
        bs = self.block_size
        usable = max(0, self.hit_limit(len(tokens))) // bs
        blocks, keys, parent = [], [], None
        for i in range(usable):
            key = self.block_key(parent, tokens[i * bs:(i + 1) * bs], identity)
            bid = self.table.get(key)
            if bid is None:
                break
            blocks.append(bid)
            keys.append(key)
            parent = key
        return blocks, keys

    def acquire(self, bid: int) -> None:
        """Take a reference to a hit block (it leaves the LRU: a referenced block is never evicted)."""
        self.lru.pop(bid, None)
        self.pool.incref(bid)

    # -- registration -------------------------------------------------------------------------------
    def is_cacheable(self, seq: Seq, index: int) -> bool:
        """Block `index` of `seq` may be registered once it is full of committed, computed tokens."""
        return (index + 1) * self.block_size <= seq.num_computed

    def register(self, seq: Seq, identity: CacheIdentity) -> None:
        """Register every newly cacheable block of `seq` (prompt blocks after prefill and generated
        blocks as decode fills them)."""
        bs = self.block_size
        while len(seq.block_keys) < len(seq.block_table) and self.is_cacheable(seq, len(seq.block_keys)):
            i = len(seq.block_keys)
            parent = seq.block_keys[-1] if seq.block_keys else None
            tokens = tuple(seq.tokens[i * bs:(i + 1) * bs])
            key = self.block_key(parent, tokens, identity)
            bid = seq.block_table[i]
            block = self.pool.blocks[bid]
            if key not in self.table and block.key is None:
                # If the key is already cached (another sequence computed the same block), keep the
                # first copy; this block stays private and is freed when released.
                self.table[key] = bid
                block.key, block.tokens = key, tokens
                block.identity = tuple(v for _, v in self.identity_fields(identity))
            seq.block_keys.append(key)

    # -- LRU and eviction ---------------------------------------------------------------------------
    def park(self, bid: int) -> bool:
        """A registered block lost its last reference: keep it reusable (most recently used)."""
        block = self.pool.blocks[bid]
        if self.table.get(block.key) != bid:
            return False
        self.lru[bid] = None
        self.lru.move_to_end(bid)
        return True

    def num_evictable(self) -> int:
        return len(self.lru)

    def eviction_candidate(self) -> int | None:
        """The least recently used block nobody references."""
        return next(iter(self.lru), None)

    def evict_one(self) -> int | None:
        """Forget one cached block and hand its id to the pool for reuse."""
        bid = self.eviction_candidate()
        if bid is None:
            return None
        self.lru.pop(bid, None)
        block = self.pool.blocks[bid]
        if block.key is not None and self.table.get(block.key) == bid:
            del self.table[block.key]
        block.reset()
        self.evictions += 1
        return bid

    def flush(self) -> None:
        """Drop every cached block. Referenced ones lose their key (freed when released)."""
        for bid in list(self.lru):
            self.lru.pop(bid)
            self.pool.recycle(bid)
        for bid in self.table.values():
            self.pool.blocks[bid].unregister()
        self.table.clear()
