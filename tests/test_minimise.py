"""The post-Hypothesis minimiser: a failing scenario padded with irrelevant traffic comes back smaller and
still failing the same check; a passing scenario comes back unchanged."""

from __future__ import annotations

from conformance.contract import Identity, Request
from conformance.minimise import minimise, size, still_fails
from conformance.strategies import Batch, Reset
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
