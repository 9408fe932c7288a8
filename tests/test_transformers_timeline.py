"""The transformers adapter's mid-flight driver (adapters/transformers_timeline.py) on the real library's
continuous-batching manager: a request added while another runs and one cancelled after N tokens, each
held against plain decoding; the arrival and end recorded where they happened; the manager's cache and the
model's attention left as `generate_batch` leaves them. A timeline is declared only for a batch-mode-only
run, and a batch without one still goes through `generate_batch`."""

from __future__ import annotations

import pytest

from conformance.contract import Identity, Request
from reference_engine.training.measure import prompts

pytest.importorskip("transformers")
from adapters import transformers_timeline  # noqa: E402
from adapters.transformers import TransformersAdapter  # noqa: E402

pytestmark = pytest.mark.skipif(not transformers_timeline.supported(),
                                reason="this transformers release has no manager loop to step")


@pytest.fixture(scope="module")
def adapter():
    a = TransformersAdapter(mode="batch", modes="batch")
    yield a
    a.close()


def test_only_a_batch_mode_run_declares_a_timeline(adapter):
    assert adapter.capabilities().timeline == {"arrival", "abort"}
    other = TransformersAdapter(modes="generate,batch")
    try:
        assert other.capabilities().timeline == frozenset()
    finally:
        other.close()


def test_arrivals_and_aborts_mid_flight_match_plain_decoding(adapter):
    adapter.configure({"mode": "batch"})
    p = prompts(3)
    batch = [Request("long", p[0], 10, abort_after=3),
             Request("late", p[0][:20] + p[1][:5], 6, arrive_at_step=2),
             Request("later", p[2], 5, arrive_at_step=4),
             Request("other", p[1], 4, identity=Identity(revision="b"), abort_after=0)]
    results = {r.request_id: r for r in adapter.run(batch)}
    for q in batch:
        r, plain = results[q.id], adapter.baseline(q).output
        if q.abort_after is None:
            assert r.output == plain and r.finish_reason != "abort", q.id
        else:
            assert r.finish_reason == "abort" and r.output == plain[: len(r.output)], q.id
            assert len(r.output) >= max(q.abort_after, 1)
    assert results["late"].arrived_at_step == 2 and results["later"].arrived_at_step == 4
    assert results["long"].ended_at_step == 3 and results["other"].ended_at_step == 1
    assert results["late"].cached_tokens == 16  # the long request's first block, written before it arrived


def test_the_manager_is_left_as_generate_batch_leaves_it(adapter):
    """After a stepped batch, a plain batch hits the blocks it wrote, and plain `generate` (another mode's
    path on the same model) still runs the model's own attention."""
    adapter.configure({"mode": "batch"})
    q = Request("r", prompts(1)[0], 6)
    stepped = adapter.run([Request("s", q.prompt, 6, arrive_at_step=0, abort_after=6)])[0]
    plain_batch = adapter.run([q])[0]
    assert plain_batch.cached_tokens == 16 * ((len(q.prompt) - 1) // 16) > 0
    assert plain_batch.output == adapter.baseline(q).output == stepped.output
    model = adapter._model("a")
    assert model.config._attn_implementation != "paged|sdpa" and "paged" not in str(model.config._attn_implementation)


def test_a_release_without_the_loop_declares_no_timeline(monkeypatch):
    monkeypatch.setattr(transformers_timeline, "supported", lambda: False)
    a = TransformersAdapter(mode="batch", modes="batch")
    try:
        assert a.capabilities().timeline == frozenset()
    finally:
        a.close()
