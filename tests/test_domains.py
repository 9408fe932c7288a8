"""Streams drawn from each field's whole declared domain (conformance/domains.py), and the refusal past a
declared limit (`Capabilities.refuses`): the strategies reach the far end of the length domain, the
vocabulary's edges and identity strings derived from those in play; the accounting check fails an
engine that refuses within its limits and passes one that refuses past them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.contract import Capabilities, EngineError, Request, Result
from conformance.domains import (EDGE_PERIOD, EDGE_RESIDUE, at_context_end, derived_salts, edge_tokens,
                                 identity_strings, seeded_tokens, token_range)
from conformance.scenario import Batch, Configure
from conformance.strategies import scenarios
from conformance.validation import result as validate_result
from tests.test_conformance_checks import CAPS, Crafted, req, res

LIMITED = Capabilities(name="limited", vocab_size=64, max_context=96, eos_id=3, block_size=4, prefix_caching=True,
                       identities={"salt", "adapter"}, adapters=("rot13",), refuses=True,
                       config_space={"pool": (96, 24)}, knob_roles={"pool": "cache"},
                       context_limits={"pool": {"24": 24}})


def _lengths(caps: Capabilities, n: int = 150) -> list[tuple[int, int]]:
    """(prompt + max_tokens, context limit of the configuration in effect) for every request drawn."""
    seen: list[tuple[int, int]] = []

    @settings(max_examples=n, deadline=None, database=None)
    @given(scenarios(caps))
    def collect(steps):
        config: dict = {}
        for step in steps:
            if isinstance(step, Configure):
                config = dict(step.config)
            if isinstance(step, Batch):
                seen.extend((len(i.prompt) + i.max_tokens, caps.context_limit(config))
                            for i in step.items if isinstance(i, Request))

    collect()
    return seen


def test_streams_reach_the_far_end_of_the_length_domain_and_one_past_only_where_refused():
    seen = _lengths(LIMITED)
    assert any(total == limit for total, limit in seen), "no request filled its context exactly"
    assert any(total == limit + 1 for total, limit in seen), "no request went one token past its limit"
    assert all(total <= limit + 1 for total, limit in seen)
    quiet = Capabilities(**{**{k: getattr(LIMITED, k) for k in ("name", "vocab_size", "max_context", "eos_id",
                                                                  "block_size", "prefix_caching", "config_space",
                                                                  "knob_roles", "context_limits")}})
    assert all(total <= limit for total, limit in _lengths(quiet, 60)), "past the limit without `refuses`"


@given(st.integers(1, 12), st.integers(20, 400), st.booleans(), st.data())
def test_at_context_end_is_exact_fit_one_short_or_one_past(budget, limit, past, data):
    n = data.draw(at_context_end(budget, limit, past))
    assert limit - budget - n in ((0, 1, -1) if past else (0, 1))


def test_edge_tokens_come_in_one_seed_of_eight_and_only_there():
    edges = set(edge_tokens(CAPS))
    assert edges == {0, 1, 3, 63}
    lo, hi = token_range(CAPS)
    for seed in range(64):
        toks = set(seeded_tokens(CAPS, 200, seed))
        if seed % EDGE_PERIOD == EDGE_RESIDUE:
            assert toks & edges
        else:
            assert not toks & edges and all(lo <= t <= hi for t in toks)


def _one_edit(s: str, seeds: list[str]) -> bool:
    for a in seeds:
        if s == a[:-1] or s == a.swapcase() or (s.startswith(a) and len(s) == len(a) + 1):
            return True
        for b in seeds:
            if s.startswith(a) and s.endswith(b) and len(s) - len(a) - len(b) in (0, 1):
                return True
    return False


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_derived_salts_are_one_edit_away_from_an_identity_string_in_play(data):
    salts = data.draw(derived_salts(LIMITED))
    seeds = identity_strings(LIMITED)
    assert 1 <= len(salts) <= 2 and "rot13" in seeds
    for s in salts:
        assert s and s not in seeds and _one_edit(s, seeds), s


def test_no_derived_salts_where_the_engine_takes_none():
    @given(derived_salts(CAPS.__class__(name="x", vocab_size=8, max_context=8)))
    def none(salts):
        assert salts == ()

    none()


def _refusal(prompt_len: int, max_tokens: int, pool: int | None = None) -> Crafted:
    q = req("r", tuple(range(4, 4 + prompt_len)), max_tokens)
    h = Crafted(LIMITED)
    if pool is not None:
        h.config(pool=pool)
    return h.batch((q, Result("r", (), "refused", extra={"refusal": "too long"})))


def test_accounting_passes_a_refusal_past_the_declared_limit():
    assert _refusal(90, 7).status("accounting") == "pass"  # 97 > max_context 96
    assert _refusal(20, 5, pool=24).status("accounting") == "pass"  # 25 > the 24-token pool's limit


def test_accounting_fails_a_refusal_within_the_declared_limits():
    (f,) = _refusal(20, 4, pool=24).failures("accounting")  # 24: exactly the limit
    assert f.title == "refused a request within the declared limits" and f.witness["limit"] == 24
    (g,) = _refusal(80, 4).failures("accounting")
    assert g.witness["limit"] == 96


def test_a_refused_result_is_not_compared_with_plain_decoding():
    h = _refusal(90, 7)
    assert h.status("parity") != "fail"


def test_a_refused_result_with_output_is_malformed():
    q = Request("r", (5, 6), 2)
    with pytest.raises(EngineError, match="refused request has no output"):
        validate_result(q, Result("r", (7,), "refused"), LIMITED)
    validate_result(q, res("r", (), "refused", cached=None), LIMITED)


def _seeded_by_definition(caps: Capabilities, n: int, seed: int) -> tuple[int, ...]:
    """What `seeded_tokens` is defined as: n choices of a fresh generator seeded by `seed` (one period,
    repeated, for the repeating seed), the vocabulary's edges added for one seed in EDGE_PERIOD."""
    import random

    from conformance.domains import REPEAT_PERIOD, REPEATING_SEED
    lo, hi = token_range(caps)
    alphabet = [t for t in range(lo, hi + 1) if t != caps.eos_id] or [lo]
    if seed % EDGE_PERIOD == EDGE_RESIDUE:
        alphabet += list(edge_tokens(caps)) * max(1, len(alphabet) // 8)
    rng = random.Random(seed)
    if seed == REPEATING_SEED:
        period = [rng.choice(alphabet) for _ in range(REPEAT_PERIOD)]
        return tuple(period[i % REPEAT_PERIOD] for i in range(n))
    return tuple(rng.choice(alphabet) for _ in range(n))


@given(st.lists(st.tuples(st.integers(0, 80), st.one_of(st.integers(0, 15), st.integers(16, 2**24))), max_size=12))
def test_seeded_tokens_are_their_definition_in_any_order_of_asking(asks):
    """A seed's sequence is drawn once and extended (a stream asks for the same seeds at every length):
    whatever order lengths are asked in, each answer is the definition's."""
    for n, seed in asks:
        assert seeded_tokens(CAPS, n, seed) == _seeded_by_definition(CAPS, n, seed)


def test_an_extension_from_a_fresh_generator_is_not_the_sequence():
    """The crafted other side: a cache that extended a prefix with a fresh generator's draws (not the one
    that drew the prefix) would give other tokens, and the definition tells the two apart."""
    import random

    lo, hi = token_range(CAPS)
    alphabet = [t for t in range(lo, hi + 1) if t != CAPS.eos_id]
    first = seeded_tokens(CAPS, 5, 12345)
    fresh = random.Random(12345)
    wrong = first + tuple(fresh.choice(alphabet) for _ in range(5))
    assert wrong != _seeded_by_definition(CAPS, 10, 12345)
    assert seeded_tokens(CAPS, 10, 12345) == _seeded_by_definition(CAPS, 10, 12345)


def test_sampled_is_built_once_per_sequence_and_takes_unhashable_elements():
    from conformance.domains import sampled

    assert sampled([1, 2, 3]) is sampled((1, 2, 3))  # equal sequences: one strategy, validated once
    assert sampled([1, 2]) is not sampled([2, 1])  # order is what shrinking goes by: another strategy
    unhashable = sampled([{"a": 1}, {"a": 2}])  # a configuration's values may be anything
    assert unhashable is not sampled([{"a": 1}, {"a": 2}])

    @given(unhashable)
    def draws(v):
        assert v in ({"a": 1}, {"a": 2})
    draws()
