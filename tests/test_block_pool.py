"""Block pool: refcounts, free list, the three block states, and paged attention equal to dense."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.block_pool import BlockPool, PagedKV, PoolFullError, Segment
from reference_engine.model import DenseKV, Llama, LlamaConfig
from reference_engine.prefix_cache import PrefixCache

CFG = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)


def test_allocate_release_returns_blocks_to_the_free_list():
    pool = BlockPool(3, 4, CFG)
    ids = [pool.allocate() for _ in range(3)]
    assert sorted(ids) == [0, 1, 2] and pool.num_free() == 0
    with pytest.raises(PoolFullError):
        pool.allocate()
    pool.incref(ids[0])
    pool.release(ids[0])
    assert pool.num_free() == 0  # still referenced once
    for bid in ids:
        pool.release(bid)
    assert pool.num_free() == 3
    assert pool.counts([])["refcounts_ok"]
    with pytest.raises(RuntimeError):
        pool.release(ids[0])


def test_registered_block_is_parked_not_freed_and_evicted_only_when_needed():
    pool = BlockPool(2, 4, CFG)
    cache = PrefixCache(pool)
    bid = pool.allocate()
    pool.blocks[bid].key = "k"
    cache.table["k"] = bid
    pool.release(bid)
    assert pool.counts([])["cached_blocks"] == 1 and pool.num_available() == 2
    other = pool.allocate()  # takes the free one first
    assert other != bid and cache.evictions == 0
    again = pool.allocate()  # now evicts the cached one
    assert again == bid and cache.evictions == 1 and "k" not in cache.table


def test_counts_flag_a_refcount_that_disagrees_with_the_block_tables():
    pool = BlockPool(4, 4, CFG)
    a = pool.allocate()
    assert pool.counts([[a]])["refcounts_ok"]
    assert not pool.counts([])["refcounts_ok"]


@settings(max_examples=60)
@given(bs=st.sampled_from([1, 4, 16]), chunks=st.lists(st.integers(1, 9), min_size=1, max_size=5),
       perm_seed=st.integers(0, 1000))
def test_paged_attention_equals_dense_attention(bs, chunks, perm_seed):
    """Any chunking, any (scrambled) physical block order: the same numbers as contiguous KV."""
    torch.manual_seed(0)
    model = Llama(CFG).double().eval()
    total = sum(chunks)
    ids = torch.randint(0, CFG.vocab_size, (total,))
    dense = model(ids, torch.arange(total), DenseKV(CFG))
    pool = BlockPool(64, bs, CFG)
    gen = torch.Generator().manual_seed(perm_seed)
    table = torch.randperm(64, generator=gen)[:-(-total // bs)].tolist()
    start, rows = 0, []
    for n in chunks:
        kv = PagedKV(pool, [Segment(tuple(table), start, n)])
        rows.append(model(ids[start:start + n], torch.arange(start, start + n), kv))
        start += n
    assert torch.allclose(torch.cat(rows), dense, rtol=0, atol=1e-12)
