"""The coverage model (conformance/situations.py), both ways: a crafted history that contains a situation
is counted, one that only nearly contains it is not. No engine: histories are written with the runner's
HistoryWriter (tests/test_conformance_checks.py's `Crafted`)."""

from __future__ import annotations

import pytest

from conformance.contract import Capabilities, Identity, Landmarks, NearTie, Request
from conformance.situations import SITUATIONS, coverage, missing
from tests.test_conformance_checks import CAPS, Crafted, res

P = tuple(range(10, 22))  # three blocks of 4
Q = tuple(range(30, 42))
LANDMARKED = Capabilities(**{**{a: getattr(CAPS, a) for a in ("name", "vocab_size", "max_context", "eos_id",
                                                               "block_size", "prefix_caching", "reports_cached_tokens",
                                                               "speculation", "reports_drafts", "chunked_prefill",
                                                               "evicts", "introspection", "min_hit_prompt")},
                             "identities": {"salt", "adapter"}, "adapters": ("rot13@aaaaaaaa", "rot13@bbbbbbbb"),
                             "landmarks": Landmarks(near_ties=(NearTie("a", P),), same_text=(((50,), (51, 52)),))})


def q(rid, prompt, salt=None, adapter=None, digest=None, stop=()):
    return Request(rid, prompt, 3, stop, Identity(salt=salt, adapter=adapter, adapter_digest=digest))


def count(h: Crafted, name: str) -> int:
    return {c.name: c.count for c in coverage(h.history())}[name]


def test_every_situation_is_counted_on_an_empty_history_without_crashing():
    rows = coverage(Crafted(LANDMARKED).history())
    assert [r.name for r in rows] == list(SITUATIONS) and all(r.count == 0 for r in rows)
    assert {r.name for r in missing(Crafted(LANDMARKED).history())} >= {"near_tie_met", "same_text_other_ids"}


def test_shared_in_flight_counts_a_block_computed_in_the_same_batch_only():
    fresh = Crafted().batch((q("a", P), res("a", [1])), (q("b", P + (5,)), res("b", [1], prefill_chunks=2)))
    assert count(fresh, "shared_in_flight") == 1 and count(fresh, "shared_in_flight_chunked") == 1
    warm = Crafted().batch((q("w", P), res("w", [1]))).batch((q("a", P), res("a", [1])), (q("b", P + (5,)), res("b", [1])))
    assert count(warm, "shared_in_flight") == 0  # the block was sent by an earlier batch: a plain hit
    other_identity = Crafted().batch((q("a", P), res("a", [1])), (q("b", P, salt="x"), res("b", [1])))
    assert count(other_identity, "shared_in_flight") == 0


@pytest.mark.parametrize("first, second, collides", [
    (dict(salt="t:rot13"), dict(salt="t", adapter="rot13"), True),
    (dict(salt="trot13"), dict(salt="t", adapter="rot13"), True),
    (dict(salt="t"), dict(salt="u", adapter="rot13"), False),
])
def test_naive_identity_collision(first, second, collides):
    h = Crafted(LANDMARKED).batch((q("a", P, **first), res("a", [1]))).batch((q("b", P, **second), res("b", [1])))
    assert count(h, "naive_identity_collision") == int(collides)


def test_same_text_other_ids_counts_a_respelling_not_a_resend():
    a, b = P[:4] + (50,) + P[4:], P[:4] + (51, 52) + P[4:]
    h = Crafted(LANDMARKED).batch((q("a", a), res("a", [1]))).batch((q("b", b), res("b", [1])))
    assert count(h, "same_text_other_ids") == 1
    resend = Crafted(LANDMARKED).batch((q("a", a), res("a", [1]))).batch((q("b", a), res("b", [1], cached=8)))
    assert count(resend, "same_text_other_ids") == 0


def test_adapter_reload_counts_the_same_name_with_other_weights():
    h = Crafted(LANDMARKED).batch((q("a", P, adapter="rot13", digest="aaaaaaaa"), res("a", [1])))
    h.batch((q("b", P, adapter="rot13", digest="bbbbbbbb"), res("b", [1])))
    assert count(h, "adapter_reload") == 1
    same = Crafted(LANDMARKED).batch((q("a", P, adapter="rot13", digest="aaaaaaaa"), res("a", [1])))
    same.batch((q("b", P, adapter="rot13", digest="aaaaaaaa"), res("b", [1])))
    assert count(same, "adapter_reload") == 0


def test_near_tie_met_reads_the_baseline_margin():
    r = q("a", P)
    tie = Crafted(LANDMARKED).batch((r, res("a", [1, 2]))).baseline(r, [1, 2], margins=[3.0, 5e-5])
    assert count(tie, "near_tie_met") == 1
    clear = Crafted(LANDMARKED).batch((r, res("a", [1, 2]))).baseline(r, [1, 2], margins=[3.0, 2e-3])
    assert count(clear, "near_tie_met") == 0


def test_stop_in_speculation_needs_a_stop_past_position_zero_with_accepted_drafts():
    h = Crafted().batch((q("a", P, stop=(2,)), res("a", [1, 2], "stop", draft_proposed=2, draft_accepted=1)))
    assert count(h, "stop_in_speculation") == 1 and count(h, "stop_finish") == 1
    first = Crafted().batch((q("a", P, stop=(1,)), res("a", [1], "stop", draft_proposed=2, draft_accepted=1)))
    assert count(first, "stop_in_speculation") == 0


def test_landmark_situations_stay_relevant_without_landmarks_and_say_not_steered():
    # relevance comes from the claims (an eos id, a cache), not the landmarks (issue 28.3)
    rows = {c.name: c for c in coverage(Crafted().history())}
    assert rows["eos_finish"].relevant and rows["same_text_other_ids"].relevant
    assert rows["eos_finish"].steering.startswith("not steered")
    assert not rows["near_tie_met"].relevant  # an exact engine (tau 0) with no known near-tie


def test_block_after_other_prefix_counts_a_repeated_or_shifted_block_a_lookup_reaches():
    repeating = P[:4] * 3 + (9,)  # block 1 has block 0's tokens
    assert count(Crafted().batch((q("a", repeating), res("a", [1]))).batch((q("b", repeating), res("b", [1]))),
                 "block_after_other_prefix") == 1
    shifted = P[4:] + (9,)  # P's second block now starts the prompt
    assert count(Crafted().batch((q("a", P), res("a", [1]))).batch((q("b", shifted), res("b", [1]))),
                 "block_after_other_prefix") == 1
    # not: the same prompt again (every block after its own prefix), a shifted block no lookup reaches
    # (the block before it was never sent), another identity, or the earlier prompt in the same batch
    assert count(Crafted().batch((q("a", P), res("a", [1]))).batch((q("b", P), res("b", [1]))),
                 "block_after_other_prefix") == 0
    assert count(Crafted().batch((q("a", P), res("a", [1]))).batch((q("b", Q[:4] + P[4:]), res("b", [1]))),
                 "block_after_other_prefix") == 0
    assert count(Crafted().batch((q("a", P), res("a", [1]))).batch((q("b", shifted, salt="x"), res("b", [1]))),
                 "block_after_other_prefix") == 0
    assert count(Crafted().batch((q("a", P), res("a", [1])), (q("b", shifted), res("b", [1]))),
                 "block_after_other_prefix") == 0
