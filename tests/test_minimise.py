"""The post-Hypothesis minimiser: a failing scenario padded with irrelevant traffic comes back smaller and
still failing the same check; a passing scenario comes back unchanged."""

from __future__ import annotations

from adapters.reference import ReferenceAdapter
from conformance.contract import Identity, Request
from conformance.minimise import minimise, size, still_fails
from conformance.strategies import Batch, Configure, Reset
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
