"""Block pool: refcounts, free list, the three block states, and paged attention equal to dense."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.block_pool import BlockPool, PagedKV, PoolFullError, Segment
from reference_engine.model import DenseKV, Llama, LlamaConfig

CFG = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128)


def test_allocate_release_returns_blocks_to_the_free_list():
    pool = BlockPool(3, 4, CFG)
    ids = [pool.allocate() for _ in range(3)]
    assert sorted(ids) == [0, 1, 2] and pool.num_free() == 0
    with pytest.raises(PoolFullError):
        pool.allocate()
    pool.acquire(ids[0])
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
    bid = pool.allocate()
    assert pool.register(bid, "k", (1, 2, 3, 4), ("digest",)) and pool.lookup("k") == bid
    pool.release(bid)
    assert pool.counts([])["cached_blocks"] == 1 and pool.num_available() == 2
    other = pool.allocate()  # takes the free one first
    assert other != bid and pool.evictions == 0
    again = pool.allocate()  # now evicts the cached one
    assert again == bid and pool.evictions == 1 and pool.lookup("k") is None


def test_a_key_is_registered_once_and_a_hit_takes_the_block_out_of_the_lru():
    pool = BlockPool(3, 4, CFG)
    first, second = pool.allocate(), pool.allocate()
    assert pool.register(first, "k", (1,), ())
    assert not pool.register(second, "k", (1,), ())  # same key computed twice: the first copy stays
    pool.release(second)
    pool.release(first)
    assert pool.counts([])["free_blocks"] == 2 and pool.num_evictable() == 1
    pool.acquire(first)  # a cache hit
    assert pool.num_evictable() == 0 and pool.counts([[first]])["refcounts_ok"]


def test_dropping_the_cache_frees_unreferenced_entries_and_unkeys_referenced_ones():
    pool = BlockPool(3, 4, CFG)
    held, parked = pool.allocate(), pool.allocate()
    pool.register(held, "a", (1,), ())
    pool.register(parked, "b", (2,), ())
    pool.release(parked)
    pool.drop_cached()
    assert pool.lookup("a") is None and pool.lookup("b") is None and pool.blocks[held].key is None
    assert pool.num_free() == 2 and pool.counts([[held]])["refcounts_ok"]
    pool.release(held)
    assert pool.num_free() == 3


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
