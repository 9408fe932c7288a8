"""The fault zoo: every planted fault is caught by the CI profile with its expected check and a shrunk
witness; the unfaulted engine passes; faults cost nothing when off."""

from __future__ import annotations

import pytest

import adapters.reference as ref
from adapters.fault_zoo import measure
from conformance.contract import UsageError
from reference_engine.engine import Engine
from reference_engine.faults import FAULTS, apply_fault
from tests.engine_helpers import registry

CLASSES = {f.bug_class for f in FAULTS.values()}


@pytest.fixture(autouse=True)
def _own_models(monkeypatch):
    # A registry of its own: the zoo rebinds adapter names (reloads), which must not leak into the
    # process-wide registry other tests memoise baselines against.
    monkeypatch.setattr(ref, "_REGISTRY", registry.__wrapped__())


def test_zoo_covers_every_bug_class():
    assert len(FAULTS) >= 15 and set("ABCDE") <= CLASSES


def test_default_engine_runs_with_no_fault():
    adapter = ref.ReferenceAdapter()
    assert adapter.fault is None and getattr(adapter.engine, "fault", None) is None
    engine = adapter.engine
    for comp in (engine, engine.cache, engine.scheduler, engine.pool):
        assert not any(callable(v) for k, v in vars(comp).items() if not k.startswith("__")
                       and k in {f.method for f in FAULTS.values()} | {"_forward", "release"})


def test_unknown_fault_is_a_usage_error_listing_known_ones():
    with pytest.raises(UsageError, match="salt_ignored"):
        ref.ReferenceAdapter(fault="no_such_fault")
    with pytest.raises(KeyError):
        apply_fault(Engine(registry=ref._REGISTRY), "no_such_fault")


def test_fault_patches_only_its_instance():
    a = ref.ReferenceAdapter(fault="salt_ignored")
    b = ref.ReferenceAdapter()
    assert "identity_fields" in vars(a.engine.cache) and "identity_fields" not in vars(b.engine.cache)


def test_unfaulted_engine_passes_ci_profile(tmp_path):
    row = measure(None, profile="ci", report_dir=tmp_path, shrink=False)
    assert row.verdict == "pass", row


@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_is_caught_with_expected_check_and_a_witness(name, tmp_path):
    # No shrinking here: what a time-capped shrink reaches depends on the machine's load, and a CI test
    # must not. The test asserts what is deterministic (derandomised CI profile): the fault is caught,
    # by an expected check, with a replayable witness written. Witness *size* after shrinking is
    # measured by `python -m adapters.fault_zoo` (reports/fault-zoo.md) and by the shrink test below.
    row = measure(name, profile="ci", report_dir=tmp_path, shrink=False)
    assert row.caught and row.verdict == "fail", row
    assert row.expected_ok, f"{name}: caught by {row.checks_first} / {row.checks_witness}, " \
                            f"expected one of {FAULTS[name].expected}"
    assert row.witness_requests and row.witness_prompt_tokens, row
    assert list(tmp_path.rglob("witnesses/*.json")), "no witness file written"


def test_shrinking_reaches_a_small_witness(tmp_path):
    # Shrinking quality, bounded by a shrink count rather than by wall time: token lists are one seeded
    # choice, so a prompt's length shrinks without reinterpreting the rest of the scenario.
    from hypothesis.internal.conjecture import engine as conjecture

    saved = conjecture.MAX_SHRINKS
    conjecture.MAX_SHRINKS = 150
    try:
        row = measure("salt_ignored", profile="ci", report_dir=tmp_path, shrink_seconds=600)
    finally:
        conjecture.MAX_SHRINKS = saved
    assert row.caught and "isolation" in row.checks_witness, row
    assert row.witness_blocks is not None and row.witness_blocks <= 2, row
