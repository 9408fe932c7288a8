"""White-box behaviour of the reference engine: bad input, aborts and errors mid-batch, speculation
bookkeeping, reuse of generated tokens, identity isolation, snapshots."""

from __future__ import annotations

import pytest

from reference_engine import errors
from reference_engine.engine import Engine, EngineConfig, Request
from reference_engine.sequence import Identity
from tests.engine_helpers import expected, registry

PROMPT = tuple(range(200, 240))


def at_rest(engine: Engine) -> None:
    c = engine.pool_counts()
    assert c["refcounts_ok"] and c["blocks_in_use"] == 0 and c["provisional_live"] == 0
    assert c["rejected_in_cache"] == 0 and c["free_blocks"] + c["cached_blocks"] == c["total_blocks"]


@pytest.mark.parametrize("call, error", [
    (lambda e: e.add_request("x", [], 4), errors.EmptyPromptError),
    (lambda e: e.add_request("x", [5, 5000], 4), errors.OutOfVocabularyError),
    (lambda e: e.add_request("x", [5] * 1000, 100), errors.ContextOverflowError),
    (lambda e: e.add_request("x", [5], 0), errors.BadRequestError),
    (lambda e: e.add_request("x", [5], 4, identity=Identity("zz")), errors.UnknownRevisionError),
    (lambda e: e.add_request("x", [5], 4, identity=Identity("a", "nope")), errors.UnknownAdapterError),
])
def test_bad_input_is_a_named_error_and_changes_nothing(call, error):
    engine = Engine(EngineConfig(), registry())
    with pytest.raises(error):
        call(engine)
    assert not engine.has_unfinished()
    at_rest(engine)


def test_duplicate_request_id_and_oversized_request_are_refused():
    engine = Engine(EngineConfig(block_size=4, num_blocks=4), registry())
    engine.add_request("a", [5, 6], 4)
    with pytest.raises(errors.BadRequestError):
        engine.add_request("a", [7], 4)
    with pytest.raises(errors.PoolExhaustedError):
        engine.add_request("b", PROMPT, 4)
    engine.run()
    at_rest(engine)


def test_abort_mid_batch_leaves_pool_and_cache_consistent():
    engine = Engine(EngineConfig(block_size=4, drafter="draft", k=3, chunk_size=7), registry())
    for i in range(4):
        engine.add_request(f"r{i}", PROMPT[: 20 + i], 8)
    engine.step()
    engine.step()
    rep = engine.abort("r1")
    assert rep.finish_reason == "abort"
    engine.abort("r3")
    reports = {r.request_id: r for r in engine.run()}
    assert reports["r0"].output == expected(Identity(), PROMPT[:20], 8, ()).output
    at_rest(engine)


def test_error_mid_batch_aborts_in_flight_requests_and_pool_returns_to_base(monkeypatch):
    engine = Engine(EngineConfig(block_size=4, drafter="oracle", k=4, chunk_size=5), registry())
    for i in range(3):
        engine.add_request(f"r{i}", PROMPT[: 18 + i], 8)
    engine.step()
    engine.step()
    original = type(engine)._settle

    def broken(self, work, logits):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(type(engine), "_settle", broken)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    monkeypatch.setattr(type(engine), "_settle", original)
    assert not engine.has_unfinished() and all(r.finish_reason == "abort" for r in engine.finished.values())
    at_rest(engine)
    # and the engine still serves correctly afterwards, reusing what was cached before the failure
    out = engine.generate([Request("again", PROMPT[:18], 8)])
    assert out[0].output == expected(Identity(), PROMPT[:18], 8, ()).output
    at_rest(engine)


def test_oracle_drafter_accepts_everything_k_plus_one_tokens_per_verification():
    engine = Engine(EngineConfig(drafter="oracle", k=3), registry())
    prompt = PROMPT[:10]
    want = expected(Identity(), prompt, 13, ())
    [rep] = engine.generate([Request("r", prompt, 13)])
    assert rep.output == want.output
    if len(want.output) == 13:  # no early eos
        assert rep.draft_accepted == rep.draft_proposed == 9  # 1 + 3 x (3 drafts + 1 own) = 13
        assert rep.verification_steps == 3 and rep.accepted_per_position == (3, 3, 3)
    at_rest(engine)


def test_adversarial_drafter_is_never_accepted_and_its_blocks_are_freed():
    engine = Engine(EngineConfig(block_size=4, drafter="adversarial", k=5), registry())
    [rep] = engine.generate([Request("r", PROMPT[:10], 12)])
    assert rep.output == expected(Identity(), PROMPT[:10], 12, ()).output
    assert rep.draft_proposed > 0 and rep.draft_accepted == 0
    assert rep.provisional_allocated > 0 and rep.provisional_freed == rep.provisional_allocated
    at_rest(engine)


def test_generated_tokens_become_reusable_and_hits_never_cross_identities():
    engine = Engine(EngineConfig(block_size=4), registry())
    [first] = engine.generate([Request("r0", PROMPT[:10], 8)])
    follow_up = PROMPT[:10] + first.output + (7,)
    [again] = engine.generate([Request("r1", follow_up, 4)])
    assert again.cached_tokens == (len(follow_up) - 1) // 4 * 4  # prompt AND generated blocks hit
    for other in (Identity(salt="t1"), Identity("b"), Identity("a", "upper")):
        [rep] = engine.generate([Request(f"x-{other}", follow_up, 4, (), other)])
        assert rep.cached_tokens == 0
        assert rep.output == expected(other, follow_up, 4, ()).output
    at_rest(engine)


def test_prefill_chunks_and_preemption_are_reported():
    engine = Engine(EngineConfig(block_size=4, num_blocks=16, chunk_size=6, token_budget=10), registry())
    reqs = [Request(f"r{i}", PROMPT[i:i + 30], 8) for i in range(3)]
    reports = engine.generate(reqs)
    for q, r in zip(reqs, reports):
        assert r.output == expected(Identity(), q.prompt, 8, ()).output
    assert all(r.chunked for r in reports)
    assert sum(r.preemptions for r in reports) > 0
    at_rest(engine)


def test_snapshot_lists_cached_blocks_with_keys_identity_and_tokens():
    engine = Engine(EngineConfig(block_size=4), registry())
    engine.generate([Request("r0", PROMPT[:9], 2, (), Identity(salt="t9"))])
    snap = engine.snapshot()
    assert snap["cached_blocks"] == 2 and snap["blocks_in_use"] == 0 and snap["evictions"] == 0
    blocks = sorted(snap["blocks"], key=lambda b: b["tokens"])
    assert [b["tokens"] for b in blocks] == [list(PROMPT[0:4]), list(PROMPT[4:8])]
    assert all(b["identity"][-1] == "t9" and b["refcount"] == 0 and b["key"] for b in blocks)
    engine.flush()
    assert engine.snapshot()["cached_blocks"] == 0


@pytest.mark.parametrize("refused, error", [
    (Request("b", PROMPT, 4), errors.PoolExhaustedError),  # longer than the whole pool
    (Request("b", [5, 5000], 4), errors.OutOfVocabularyError),
    (Request("b", [5], 4, (), Identity("zz")), errors.UnknownRevisionError),
    (Request("a", [7, 8], 4), errors.BadRequestError),  # the good request's id twice in one batch
])
def test_a_refused_request_leaves_no_sibling_of_its_batch_live(refused, error):
    """Batch submission is all or nothing: a caller that sees the refusal (the conformance runner, a
    retry) must find the engine as it was, not holding the good requests submitted before the bad one
    (which then collide with the next batch's ids and hold the pool)."""
    engine = Engine(EngineConfig(block_size=4, num_blocks=4), registry())
    with pytest.raises(error):
        engine.generate([Request("a", [5, 6], 4), refused])
    assert not engine.has_unfinished() and not engine.live
    at_rest(engine)
    reports = engine.generate([Request("a", [5, 6], 4), Request("b", [7, 8], 4)])
    assert [r.output for r in reports] == [expected(Identity(), p, 4, ()).output for p in ([5, 6], [7, 8])]
    at_rest(engine)


def test_greedy_runs_are_shared_per_prompt_and_weights_and_never_across_weights():
    """The oracle drafter and the baseline read one greedy run per (weights, prompt): a salt shares it,
    other weights never do, and what either reads equals a fresh greedy decode."""
    from reference_engine.baseline import greedy
    from reference_engine.drafters import OracleDrafter
    from reference_engine.sequence import Sequence

    reg = registry()
    drafter = OracleDrafter(reg, k=3)
    base, upper = Identity(), Identity("a", "upper")
    fresh = greedy(reg.model(base), PROMPT, 12, eos_id=-1).output
    seq = Sequence("x", PROMPT, 9, frozenset(), base, 2)
    seq.tokens.extend(fresh[:5])
    assert drafter.propose(seq, 3) == list(fresh[5:8])
    run = reg.greedy_run(base, PROMPT)
    assert len(run.steps) == 8  # decoded only as far as asked
    assert reg.greedy_run(Identity("a", None, "t1"), PROMPT) is run  # a salt does not change the weights
    assert greedy(reg.model(base), PROMPT, 12, eos_id=-1, run=run).output == fresh  # extended on demand
    assert len(run.steps) == 12
    other = reg.greedy_run(upper, PROMPT)
    assert other is not run
    assert greedy(reg.model(upper), PROMPT, 12, eos_id=-1, run=other).output == \
        greedy(reg.model(upper), PROMPT, 12, eos_id=-1).output != fresh
