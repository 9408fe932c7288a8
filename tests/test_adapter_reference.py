"""The reference adapter speaks the Engine contract: knobs as strings, usage errors, parity, extras."""

from __future__ import annotations

import pytest

from conformance.contract import Engine, Identity, Introspectable, Request, UsageError
from adapters.reference import ReferenceAdapter


@pytest.mark.parametrize("kwargs", [{"block_size": "0"}, {"k": "x"}, {"drafter": "magic"}, {"colour": "red"},
                                    {"prefix_cache": "maybe"}, {"pool_tokens": "-4"}])
def test_bad_engine_arguments_are_usage_errors(kwargs):
    with pytest.raises(UsageError):
        ReferenceAdapter(**kwargs)


def test_adapter_matches_its_baseline_and_reports_extras():
    adapter = ReferenceAdapter(block_size="4", drafter="oracle", k="3", chunk_size="5", num_blocks="64")
    assert isinstance(adapter, Engine) and isinstance(adapter, Introspectable)
    caps = adapter.capabilities()
    assert caps.tolerance == 0 and caps.introspection and caps.speculation and caps.chunked_prefill
    reqs = [Request(f"r{i}", tuple(range(300, 320 + i)), 6, (), Identity(salt="s" if i else None)) for i in range(3)]
    results = adapter.run(reqs)
    for q, r in zip(reqs, results):
        b = adapter.baseline(q)
        assert r.output == b.output and r.finish_reason == b.finish_reason
        assert {"provisional_allocated", "provisional_freed", "accepted_per_position",
                "verification_steps", "target_forwards", "draft_forwards"} <= set(r.extra)
        assert r.prefill_chunks > 1 and r.evictions is not None and r.preempted is not None
    [again] = adapter.run([Request("again", tuple(range(300, 322)), 6, (), Identity(salt="s"))])
    assert again.cached_tokens == 20
    snap = adapter.snapshot()
    assert snap["blocks_in_use"] == 0 and snap["refcounts_ok"]
    adapter.reset()
    assert adapter.snapshot()["cached_blocks"] == 0


def test_configure_switches_knobs_and_rejects_unknown_ones():
    adapter = ReferenceAdapter()
    adapter.configure({"drafter": "adversarial", "k": 2, "block_size": 32})
    assert adapter.capabilities().block_size == 32 and adapter.config.drafter == "adversarial"
    with pytest.raises(UsageError):
        adapter.configure({"nope": 1})
    with pytest.raises(UsageError):
        adapter.run([Request("bad", (), 4)])


@pytest.mark.parametrize("block_size", [4, 16, 32])
def test_pool_tokens_sizes_the_pool_in_tokens_and_bounds_the_requests(block_size):
    """A 64-token pool is 64 / block_size blocks; a request that fits `context_limits` runs (and
    evicts under three of them); a longer one is a usage error naming the pool (its bound is one token
    looser than the declared limit: the last output token needs no KV)."""
    adapter = ReferenceAdapter()
    adapter.configure({"pool_tokens": 64, "block_size": block_size})
    assert adapter.config.num_blocks == 64 // block_size
    limit = adapter.capabilities().context_limits["pool_tokens"]["64"]
    assert limit == 64
    reqs = [Request(f"r{i}", tuple(range(100 + 30 * i, 100 + 30 * i + limit - 16)), 16) for i in range(3)]
    results = adapter.run(reqs)
    assert [r.output for r in results] == [adapter.baseline(q).output for q in reqs]
    assert adapter.engine.evictions > 0
    [refused] = adapter.run([Request("long", tuple(range(100, 100 + limit - 14)), 16)])
    assert (refused.finish_reason, refused.output) == ("refused", ()) and "blocks" in refused.extra["refusal"]


def test_a_request_past_the_limits_is_refused_alone_and_the_batch_goes_on():
    """Through the contract (`Capabilities.refuses`): in a batch with one request too long for the 64-token
    pool and one past the model's context, those two come back "refused" (no output, the engine's reason
    in `extra`), the others run exactly, the engine holds nothing afterwards, and the ids can be sent again."""
    adapter = ReferenceAdapter()
    assert adapter.capabilities().refuses
    adapter.configure({"pool_tokens": 64, "block_size": 16})
    context = adapter.capabilities().max_context
    good, long = Request("s0", tuple(range(100, 120)), 4), Request("s1", tuple(range(100, 160)), 16)
    past = Request("s2", tuple(4 + i % 500 for i in range(context)), 1)
    results = adapter.run([good, long, past])
    assert [r.finish_reason for r in results[1:]] == ["refused", "refused"]
    assert "blocks" in results[1].extra["refusal"] and "context" in results[2].extra["refusal"]
    assert results[0].output == adapter.baseline(good).output
    snap = adapter.snapshot()
    assert snap["live_requests"] == [] and snap["blocks_in_use"] == 0
    results = adapter.run([good, Request("s1", tuple(range(200, 220)), 4)])
    assert results[0].output == adapter.baseline(good).output
    assert adapter.snapshot()["live_requests"] == []


def test_an_adapter_reload_rebinds_the_name_in_that_adapter_only():
    """An identity naming other shipped weights under a name reloads the name in place (its baseline
    follows), in the adapter that saw it and no other; unknown weights are a usage error."""
    a, b = ReferenceAdapter(), ReferenceAdapter()
    shipped = a.registry.adapters()
    upper, rot13 = shipped["upper"], shipped["rot13"]
    reload = Request("r", tuple(range(300, 320)), 6, (), Identity(adapter="upper", adapter_digest=rot13[:8]))
    [result] = a.run([reload])
    assert a.registry.adapters()["upper"] == rot13 and b.registry.adapters() == shipped
    as_rot13 = Request("r", reload.prompt, 6, (), Identity(adapter="rot13"))
    assert result.output == a.baseline(as_rot13).output == b.baseline(as_rot13).output
    assert f"upper@{upper}" in a.capabilities().adapters  # the old weights stay known: it can reload back
    with pytest.raises(UsageError, match="no such shipped weights"):
        a.run([Request("x", reload.prompt, 2, (), Identity(adapter="upper", adapter_digest="0" * 8))])
