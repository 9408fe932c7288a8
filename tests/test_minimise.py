"""The post-Hypothesis minimiser: a failing scenario padded with irrelevant traffic comes back smaller and
still failing the same check; a passing scenario comes back unchanged."""

from __future__ import annotations

from adapters.reference import ReferenceAdapter
from conformance.contract import Identity, Request
from conformance.minimise import minimise, minimise_from, size, span, still_fails
from conformance.scenario import Batch, Configure, Reset
from fake_engine import FakeDictEngine

SHARED = tuple(range(4, 40))  # 36 tokens: nine blocks of 4


def padded_salt_leak() -> list:
    a, b = Identity(salt="tenant-a"), Identity(salt="tenant-b")
    noise = Batch((Request("n1", tuple(range(10, 60)), 3), Request("n2", tuple(range(20, 90)), 2)))
    return [noise, Reset(), noise,
            Batch((Request("warm", SHARED + (7, 8, 9), 2, identity=a), Request("n3", (5, 6, 7), 1))),
            Batch((Request("poison", SHARED + (9, 9), 2, identity=b),))]


def test_minimiser_shrinks_a_padded_witness_and_keeps_it_failing():
    def engine():
        return FakeDictEngine(bug="salt_leak")

    caps = engine().capabilities()
    steps = padded_salt_leak()
    assert still_fails(engine, caps, "isolation", steps)
    small = minimise(engine, caps, "isolation", steps)
    assert still_fails(engine, caps, "isolation", small)
    assert size(small) < size(steps)
    tokens, requests, _ = size(small)
    assert requests == 2 and tokens <= 2 * (caps.block_size + 1)


def test_minimiser_leaves_a_passing_scenario_alone():
    engine = FakeDictEngine
    caps = engine().capabilities()
    steps = padded_salt_leak()
    assert not still_fails(engine, caps, "isolation", steps)
    assert minimise(engine, caps, "isolation", steps) == steps


def test_minimiser_keeps_a_block_boundary_witness_at_its_boundary():
    """`incomplete_block_cached` registers a block as soon as its tokens exist: with an oracle drafter it
    shows when a request ends exactly at a block boundary with drafts written past max_tokens. Halving
    the prompt moves the end off the boundary: this is the zoo's Hypothesis witness, on which the
    minimiser stayed at 118 tokens before the length-modulo-block moves; dropping whole blocks, or
    handing prompt tokens to the output, keeps the end where it was."""
    def engine():
        return ReferenceAdapter(fault="incomplete_block_cached")

    caps = engine().capabilities()
    steps = [Configure({"block_size": 16, "drafter": "oracle", "k": 3}),
             Batch((Request("long", tuple(range(10, 128)), 10),))]  # 118 + 10 = 128 = 8 blocks
    assert still_fails(engine, caps, "rollback_hygiene", steps)
    small = minimise(engine, caps, "rollback_hygiene", steps)
    assert still_fails(engine, caps, "rollback_hygiene", small)
    [batch] = [s for s in small if isinstance(s, Batch)]
    [q] = batch.items
    assert len(q.prompt) <= 2 * 16 and q.max_tokens <= 16
    assert (len(q.prompt) + q.max_tokens) % 16 == 0


def test_minimiser_drops_runs_of_padding_within_a_small_replay_budget():
    """A first failing example carries dozens of steps: dropping them in runs (halves, quarters, ...)
    reaches the two-request witness within 40 replays, where one step per replay would not."""
    def engine():
        return FakeDictEngine(bug="salt_leak")

    caps = engine().capabilities()
    noise = [Batch((Request(f"n{i}", (50 + i, 51 + i, 52 + i), 1),)) for i in range(40)]
    steps = noise + padded_salt_leak()[3:]
    small = minimise(engine, caps, "isolation", steps, max_replays=40)
    assert still_fails(engine, caps, "isolation", small)
    assert size(small)[1:] == (2, 2)


# The zoo's `scheduled_blocks_cached` witness as Hypothesis shrank it (a preemption under unchunked
# prefill, 33 tokens), and the two requests of the first failing example that showed the bug's own
# mechanism (a block registered when its chunk is scheduled, served to a same-step sharer).
PREEMPTED = [Configure({"block_size": 16, "chunk_size": "none", "drafter": "none", "k": 3, "pool_tokens": 64,
                        "token_budget": 24}),
             Batch((Request("r3", (12, 40, 8, 20, 11, 35, 32, 34, 45, 28, 17, 10, 35, 5, 28, 31, 42, 4, 48, 32, 21, 50,
                                   18, 41, 10, 24, 5, 5, 5, 45, 38, 4), 1),
                    Request("r4", (28, 30, 6, 20, 36, 35, 29, 23, 34, 26, 41, 17, 36, 12, 22), 3),
                    Request("r5", (28, 30, 6, 20, 36, 35, 29, 23, 34, 26, 41, 17, 36, 12, 22, 12, 10, 43, 20, 38, 49,
                                   42, 13, 23, 10, 50, 8, 47, 25, 34, 39, 10, 26), 1, identity=Identity(salt="tenant-a"))))]
SHARER = (287, 305, 371, 294, 330, 796, 65, 36, 201, 201, 816, 458, 357, 311, 456, 300, 311)
CHUNKED = [Configure({"chunk_size": 13, "token_budget": 24}), Batch((Request("noise", (7, 8, 9), 4),)),
           Batch((Request("a", SHARER[:16], 2), Request("b", SHARER, 1)))]


def test_minimiser_keeps_the_start_whose_witness_touches_fewer_blocks():
    """From the shrunk witness alone no cut gets below three blocks; given the first failing example too,
    the minimiser returns the two-block same-step sharer, still failing."""
    def engine():
        return ReferenceAdapter(fault="scheduled_blocks_cached")

    caps = engine().capabilities()
    alone = minimise(engine, caps, "parity", PREEMPTED)
    assert span(alone, 16)[0] >= 3
    both = minimise_from(engine, caps, "parity", [PREEMPTED, CHUNKED])
    assert span(both, 16)[0] <= 2 and still_fails(engine, caps, "parity", both)
    assert [len(q.prompt) for s in both if isinstance(s, Batch) for q in s.items] == [16, 17]


def test_minimiser_ignores_a_start_that_does_not_fail():
    """A passing start is no witness, however small: the failing one is minimised; with no failing start
    the first comes back unchanged."""
    def engine():
        return ReferenceAdapter(fault="scheduled_blocks_cached")

    caps = engine().capabilities()
    passing = [Batch((Request("tiny", (5,), 1),))]
    assert not still_fails(engine, caps, "parity", passing)
    small = minimise_from(engine, caps, "parity", [passing, PREEMPTED])
    assert still_fails(engine, caps, "parity", small) and small != passing
    assert minimise_from(engine, caps, "parity", [passing]) == passing


def test_a_logprob_witness_is_not_cut_to_just_above_epsilon(monkeypatch):
    """FAKE replays (the minimiser's own logic): the deviation falls with the prompt tokens kept (1e-3
    per token). Epsilon 1e-3: the minimiser stops where the deviation would drop below ten times epsilon
    (10 tokens), not at the 2 tokens where the check would still (barely) fail."""
    import attrs

    from conformance import minimise as m
    from conformance.verdicts import CheckFailure, CheckResult, Severity

    def fake_failing(new_engine, caps, check, steps, timeout_s):
        tokens = size(steps)[0]
        if tokens * 1e-3 <= caps.logprob_epsilon:
            return None
        failure = CheckFailure(check, "t", Severity.HIGH, "B", "c", {"logprob_deviation": tokens * 1e-3}, "e", 0)
        return CheckResult(check, "fail", (failure,))

    monkeypatch.setattr(m, "_failing", fake_failing)
    caps = attrs.evolve(FakeDictEngine().capabilities(), logprob_epsilon=1e-3, logprobs_k=2)
    steps = [Batch((Request("q", tuple(range(4, 44)), 2),))]
    small = minimise(FakeDictEngine, caps, "logprob_parity", steps)
    assert 10 <= size(small)[0] < 40
    assert size(minimise(FakeDictEngine, caps, "parity", steps))[0] <= 2  # no floor for a token check
