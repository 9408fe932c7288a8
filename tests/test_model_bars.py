"""The measured bars of MODEL_CARD.md, recomputed on a smaller held-out sample so a bad retrain fails."""

from __future__ import annotations

import pytest

from reference_engine.training.measure import measure


@pytest.fixture(scope="module")
def figures():
    return measure(n_prompts=40, n_tokens=40_000)


def test_target_beats_a_bigram_model_clearly(figures):
    assert figures["target_loss"] < figures["bigram_loss"] - 0.5


def test_draft_agrees_with_target_and_is_four_times_cheaper(figures):
    assert figures["draft_agreement"] >= 0.6
    assert figures["draft_cost_ratio"] <= 0.25


@pytest.mark.parametrize("variant", ["differ_revision_b", "differ_adapter_upper", "differ_adapter_rot13"])
def test_identities_are_observable_in_output(figures, variant):
    assert figures[variant] >= 0.5


def test_margins_are_reported(figures):
    assert figures["median_margin"] > 0
    assert 0 <= figures["frac_margin_below_1e-3"] < 0.05
