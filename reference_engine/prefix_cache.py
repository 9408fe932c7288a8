"""The prefix cache's keying policy: which full blocks of committed KV are reusable, under which
chained, identity-bound key, and how much of a prompt a hit may serve.

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
is always computed, so a hit yields fresh logits and never skips generation.

This module holds no block state: the key table, the LRU of unreferenced cached blocks and eviction
(only when no block is free) belong to `block_pool.BlockPool`, the one owner of every block's state;
`match` and `register` go through its public methods. Each decision here is one small method
(`identity_fields`, `block_key`, `hit_limit`, `is_cacheable`), the seams a fault overrides one at a time.
"""

from __future__ import annotations

import hashlib
import json
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
        ids and their keys; the caller takes a reference to each with `BlockPool.acquire`."""
        bs = self.block_size
        usable = max(0, self.hit_limit(len(tokens))) // bs
        blocks, keys, parent = [], [], None
        for i in range(usable):
            key = self.block_key(parent, tokens[i * bs:(i + 1) * bs], identity)
            bid = self.pool.lookup(key)
            if bid is None:
                break
            blocks.append(bid)
            keys.append(key)
            parent = key
        return blocks, keys

    # -- registration -------------------------------------------------------------------------------
    def is_cacheable(self, seq: Seq, index: int) -> bool:
        """Block `index` of `seq` may be registered once it is full of committed, computed tokens."""
        return (index + 1) * self.block_size <= seq.num_computed

    def register(self, seq: Seq, identity: CacheIdentity) -> None:
        """Key every newly cacheable block of `seq` (prompt blocks after prefill and generated blocks
        as decode fills them) and offer it to the pool, which keeps the first copy of a key."""
        bs = self.block_size
        fields: tuple | None = None
        while len(seq.block_keys) < len(seq.block_table) and self.is_cacheable(seq, len(seq.block_keys)):
            i = len(seq.block_keys)
            parent = seq.block_keys[-1] if seq.block_keys else None
            tokens = tuple(seq.tokens[i * bs:(i + 1) * bs])
            key = self.block_key(parent, tokens, identity)
            if fields is None:
                fields = tuple(v for _, v in self.identity_fields(identity))
            self.pool.register(seq.block_table[i], key, tokens, fields)
            seq.block_keys.append(key)
