"""The transformers adapter drives the real library: every mode equals the baseline, and the observed
counters (prefix hits, drafts) are real — a repeat hits, the adversarial assistant is never accepted."""

from __future__ import annotations

import pytest

from conformance.contract import Request, UsageError
from reference_engine.training.measure import prompts

pytest.importorskip("transformers")
from adapters.transformers import MODES, TransformersAdapter  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = TransformersAdapter()
    yield a
    a.close()


def requests(n: int, max_tokens: int = 6) -> list[Request]:
    return [Request(id=f"r{i}", prompt=p, max_tokens=max_tokens) for i, p in enumerate(prompts(n))]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_equals_the_reference_baseline(adapter, mode):
    adapter.configure({"mode": mode, "k": 3})
    batch = requests(4)
    for req, res in zip(batch, adapter.run(batch)):
        assert res.output == adapter.baseline(req).output, (mode, req.id)


def test_batch_mode_reports_a_prefix_hit_on_a_repeat(adapter):
    adapter.configure({"mode": "batch"})
    req = requests(1)[0]
    cold = adapter.run([req])[0]
    warm = adapter.run([req])[0]
    assert cold.cached_tokens == 0
    assert warm.cached_tokens == 16 * ((len(req.prompt) - 1) // 16) > 0
    assert warm.output == cold.output


def test_drafts_are_observed_and_the_adversarial_assistant_is_never_accepted(adapter):
    adapter.configure({"mode": "assisted", "k": 3})
    good = adapter.run(requests(2, 10))
    adapter.configure({"mode": "adversarial", "k": 3})
    bad = adapter.run(requests(2, 10))
    assert sum(r.draft_accepted for r in good) > 0
    assert sum(r.draft_proposed for r in bad) > 0 and sum(r.draft_accepted for r in bad) == 0


def test_k_reaches_the_assistant(adapter):
    """transformers reads the draft length from the assistant's own generation config, not from `generate`'s
    arguments: k must reach it (the always-rejected assistant proposes min(k, room left) per verification)."""
    proposed = {}
    for k in (1, 3):
        adapter.configure({"mode": "adversarial", "k": k})
        proposed[k] = adapter.run(requests(1, 10))[0].draft_proposed
    assert proposed[1] <= 10 and proposed[3] > 2 * proposed[1]


def test_top2_logits_are_reported_per_output_token(adapter):
    adapter.configure({"mode": "generate"})
    res = adapter.run(requests(1))[0]
    assert len(res.top2) == len(res.output)
    assert all(t1 == tok and l1 >= l2 for (t1, l1, _, l2), tok in zip(res.top2, res.output))


@pytest.mark.parametrize("args", [{"mode": "beam"}, {"k": "zero"}, {"k": "0"}, {"dtype": "int8"}, {"oracle": "gold"}])
def test_bad_engine_arguments_are_usage_errors(args):
    with pytest.raises(UsageError):
        TransformersAdapter(**args)
