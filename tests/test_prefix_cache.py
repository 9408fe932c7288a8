"""Prefix-cache keys: chained, identity-bound, domain-separated; hits capped at Lin - 1; full blocks only."""

from __future__ import annotations

import attrs

from reference_engine.block_pool import BlockPool
from reference_engine.model import LlamaConfig
from reference_engine.prefix_cache import CacheIdentity, PrefixCache
from reference_engine.sequence import Identity, Sequence

CFG = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16)
BASE = CacheIdentity("a", "rev-digest", None, None, None)


def cache(bs=4, n=16) -> PrefixCache:
    return PrefixCache(BlockPool(n, bs, CFG))


def test_every_identity_field_changes_the_key():
    c = cache()
    base = c.block_key(None, [1, 2, 3, 4], BASE)
    variants = [attrs.evolve(BASE, revision_digest="other"), attrs.evolve(BASE, adapter="upper"),
                attrs.evolve(BASE, adapter_digest="d2"), attrs.evolve(BASE, salt="t1")]
    keys = {c.block_key(None, [1, 2, 3, 4], v) for v in variants}
    assert base not in keys and len(keys) == 4


def test_adapter_reloaded_under_the_same_name_gets_a_new_key():
    c = cache()
    old = attrs.evolve(BASE, adapter="mine", adapter_digest="aaaa")
    new = attrs.evolve(BASE, adapter="mine", adapter_digest="bbbb")
    assert c.block_key(None, [1, 2, 3, 4], old) != c.block_key(None, [1, 2, 3, 4], new)


def test_fields_are_domain_separated():
    """Adapter "X" vs salt "X", and values that would collide under string concatenation."""
    c = cache()
    assert c.block_key(None, [1], attrs.evolve(BASE, adapter="X")) != c.block_key(None, [1], attrs.evolve(BASE, salt="X"))
    assert (c.block_key(None, [1], attrs.evolve(BASE, adapter="ab", salt="c"))
            != c.block_key(None, [1], attrs.evolve(BASE, adapter="a", salt="bc")))
    assert c.block_key(None, [12, 3], BASE) != c.block_key(None, [1, 23], BASE)
    assert c.block_key("p", [1], BASE) != c.block_key(None, [1], attrs.evolve(BASE, salt="p"))


def test_keys_are_chained_on_the_parent():
    c = cache()
    k1 = c.block_key(None, [1, 2, 3, 4], BASE)
    k2 = c.block_key(None, [9, 9, 9, 9], BASE)
    assert c.block_key(k1, [5, 6, 7, 8], BASE) != c.block_key(k2, [5, 6, 7, 8], BASE)


def _seq(tokens, computed) -> Sequence:
    s = Sequence("r", tuple(tokens), 4, frozenset(), Identity(), 2)
    s.num_computed = computed
    return s


def test_registration_takes_full_committed_blocks_and_match_caps_at_lin_minus_one():
    c = cache(bs=4)
    seq = _seq(range(10, 22), computed=10)  # 12 tokens, KV for 10: blocks 0 and 1 are full
    seq.block_table = [c.pool.allocate() for _ in range(3)]
    c.register(seq, BASE)
    assert len(seq.block_keys) == 2 and len(c.pool.table) == 2
    # same 8 tokens + 1: both blocks hit; exactly 8 tokens: only the first (the last token is computed)
    assert len(c.match(list(range(10, 18)) + [99], BASE)[0]) == 2
    assert len(c.match(list(range(10, 18)), BASE)[0]) == 1
    assert len(c.match(list(range(10, 18)) + [99], attrs.evolve(BASE, salt="t"))[0]) == 0
    assert len(c.match([10, 11, 12, 99, 14, 15, 16, 17, 1], BASE)[0]) == 0  # mismatch in block 0


def test_lru_evicts_least_recently_released_first_and_never_a_referenced_block():
    c = cache(bs=1, n=3)
    seqs = []
    for t in (1, 2, 3):
        s = _seq([t, 0], computed=1)
        s.block_table = [c.pool.allocate()]
        c.register(s, BASE)
        seqs.append(s)
    c.pool.release(seqs[1].block_table[0])
    c.pool.release(seqs[0].block_table[0])
    victim = c.pool.allocate()
    assert victim == seqs[1].block_table[0]  # released first = least recently used
    assert c.match([1, 0], BASE)[0] == [seqs[0].block_table[0]]
    assert c.pool.allocate() == seqs[0].block_table[0]
    assert c.pool.num_available() == 0  # seqs[2]'s block is referenced: not evictable
