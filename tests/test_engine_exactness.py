"""Exactness: with any combination of features the engine's output equals plain greedy decoding.

Hypothesis draws engine configurations (block size, cache on/off and size — tight enough to evict and
preempt —, drafter and k, chunk size, token budget, batch limit) and request streams (shared prefixes
so the cache hits, several identities, staggered arrivals, aborts, several rounds on one engine so later
rounds reuse earlier KV). Every request must come out token-for-token equal to `baseline.greedy`,
finish for the same reason, and the pool must return to its base after every round.
"""

from __future__ import annotations

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from reference_engine.engine import Engine, EngineConfig
from reference_engine.sequence import Identity
from tests.engine_helpers import IDENTITIES, MARGINS, expected, registry

MAX_NEW = 8
MAX_PROMPT = 40
TOKENS = st.integers(3, 1023)
DRAFTERS = ("none", "oracle", "adversarial", "ngram", "draft")


@st.composite
def engine_configs(draw) -> EngineConfig:
    bs = draw(st.sampled_from((4, 16, 32)))
    tight = -(-(MAX_PROMPT + MAX_NEW + bs) // bs) + draw(st.integers(0, 3))
    return EngineConfig(
        block_size=bs,
        num_blocks=draw(st.sampled_from((tight, 256))),
        enable_prefix_cache=draw(st.booleans()),
        drafter=draw(st.sampled_from(DRAFTERS)),
        k=draw(st.integers(1, 5)),
        chunk_size=draw(st.one_of(st.none(), st.integers(1, 24))),
        token_budget=draw(st.sampled_from((4096, 32, 9, 3))),
        max_batch=draw(st.sampled_from((64, 2, 1))),
    )


@st.composite
def rounds(draw):
    """Rounds of requests: (request_id, prompt, max_tokens, stop_ids, identity, arrival_step, abort_step)."""
    roots = draw(st.lists(st.lists(TOKENS, min_size=6, max_size=MAX_PROMPT), min_size=1, max_size=3))
    out, n = [], 0
    for _ in range(draw(st.integers(1, 4))):
        batch = []
        for _ in range(draw(st.integers(1, 4))):
            root = draw(st.sampled_from(roots))
            cut = draw(st.one_of(st.just(len(root)), st.integers(0, len(root))))
            prompt = (root[:cut] + draw(st.lists(TOKENS, max_size=6)))[:MAX_PROMPT] or [5]
            stop = draw(st.lists(TOKENS, max_size=2))
            batch.append((f"r{n}", tuple(prompt), draw(st.integers(1, MAX_NEW)), tuple(stop),
                          draw(st.sampled_from(IDENTITIES)), draw(st.integers(0, 3)),
                          draw(st.one_of(st.none(), st.integers(0, 6)))))
            n += 1
        out.append(batch)
    return out


def run_round(engine: Engine, batch) -> dict:
    """Submit with staggered arrivals, abort where asked, step to completion; reports by id."""
    reports, step = {}, 0
    pending = sorted(batch, key=lambda r: r[5])
    while pending or engine.has_unfinished():
        while pending and pending[0][5] <= step:
            rid, prompt, max_tokens, stop, ident, _, _ = pending.pop(0)
            engine.add_request(rid, prompt, max_tokens, stop, ident)
        for rid, *_, abort_at in batch:
            if abort_at == step and rid in engine.live:
                reports[rid] = engine.abort(rid)
        for rep in engine.step():
            reports[rep.request_id] = rep
        step += 1
    return reports


def check_round(engine: Engine, batch, reports) -> None:
    for rid, prompt, max_tokens, stop, ident, _, _ in batch:
        rep, want = reports[rid], expected(ident, prompt, max_tokens, stop)
        if rep.finish_reason == "abort":
            assert rep.output == want.output[:len(rep.output)], rid
            continue
        assert rep.output == want.output, (rid, rep, want)
        assert rep.finish_reason == want.finish_reason
        assert 0 <= rep.cached_tokens <= len(prompt) - 1
        assert rep.draft_accepted <= rep.draft_proposed
        assert rep.draft_accepted <= len(rep.output)  # drafts may follow the last prompt token
        assert rep.provisional_freed <= rep.provisional_allocated
        for name, hit in (("prefix hit", rep.cached_tokens), ("draft accepted", rep.draft_accepted),
                          ("draft rejected", rep.draft_proposed - rep.draft_accepted),
                          ("chunked", rep.chunked), ("preempted", rep.preemptions), ("eviction", rep.evictions)):
            if hit:
                event(name)
    counts = engine.pool_counts()
    assert counts["refcounts_ok"] and counts["blocks_in_use"] == 0 and counts["provisional_live"] == 0
    assert counts["rejected_in_cache"] == 0
    assert counts["free_blocks"] + counts["cached_blocks"] == counts["total_blocks"]


@settings(max_examples=500)
@given(config=engine_configs(), stream=rounds())
@example(config=EngineConfig(block_size=4, num_blocks=16, drafter="oracle", k=5, chunk_size=3, token_budget=9),
         stream=[[("r0", tuple(range(10, 30)), 8, (), Identity(), 0, None),
                  ("r1", tuple(range(10, 26)) + (7,), 8, (), Identity(), 1, None)],
                 [("r2", tuple(range(10, 30)), 8, (), Identity(), 0, None),
                  ("r3", tuple(range(10, 30)), 8, (), Identity("a", None, "t1"), 0, None)]])
@example(config=EngineConfig(block_size=16, drafter="adversarial", k=3, chunk_size=None),
         stream=[[("r0", (40,) * 33, 3, (), Identity(), 0, 1), ("r1", (40,) * 33, 8, (), Identity("b"), 0, None)]])
@example(config=EngineConfig(block_size=4, num_blocks=15, drafter="draft", k=4, chunk_size=5, max_batch=2),
         stream=[[("r0", tuple(range(100, 140)), 8, (), Identity(), 0, None),
                  ("r1", tuple(range(100, 136)), 8, (), Identity("a", "upper"), 0, None),
                  ("r2", tuple(range(100, 120)), 8, (), Identity(), 2, None)]])
def test_engine_output_equals_plain_greedy_under_any_feature_mix(config, stream):
    engine = Engine(config, registry())
    for batch in stream:
        check_round(engine, batch, run_round(engine, batch))


def test_smallest_baseline_margin_is_far_above_float64_noise():
    """float64 reorderings move logits by ~1e-13 at most here; every margin seen must dwarf that."""
    import random

    rng = random.Random(0)
    for i in range(60):
        ident = IDENTITIES[i % len(IDENTITIES)]
        expected(ident, tuple(rng.randrange(3, 1024) for _ in range(rng.randrange(1, 40))), MAX_NEW, ())
    smallest = min(MARGINS)
    print(f"smallest baseline top1-top2 margin seen in this process: {smallest:.3g} over {len(MARGINS)} requests")
    assert smallest > 1e-9
