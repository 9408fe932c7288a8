"""Every check, both ways: a hand-built history that satisfies it and one crafted to violate it.

No engine involved: histories are written with the same HistoryWriter the runner uses and parsed back,
so these tests also pin the history format the checks read.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.analysis import analyse
from conformance.checks import CHECKS, run_check
from conformance.contract import Baseline, Capabilities, Identity, Landmarks, Request, Result, evolve
from conformance.history import HistoryWriter, parse
from conformance.history_codec import oracle_key_str

CAPS = Capabilities(name="crafted", vocab_size=64, max_context=256, eos_id=3, block_size=4, prefix_caching=True,
                    reports_cached_tokens=True, speculation=True, reports_drafts=True, chunked_prefill=True,
                    evicts=True, identities={"salt"}, introspection=True, min_hit_prompt=5,
                    config_space={"spec_k": (0, 2), "chunk": (0, 8)},
                    knob_roles={"spec_k": "speculation", "chunk": "schedule"})


def req(rid: str, prompt, max_tokens: int = 3, stop=(), salt: str | None = None, adapter: str | None = None) -> Request:
    return Request(rid, prompt, max_tokens, stop, Identity(salt=salt, adapter=adapter))


def res(rid: str, out, reason: str = "length", cached: int | None = 0, **kw: Any) -> Result:
    return Result(rid, out, reason, cached_tokens=cached, **kw)


class Crafted:
    """Builds a history the way the runner writes one: example, reset, config, batch, baseline events."""

    def __init__(self, caps: Capabilities = CAPS) -> None:
        self.w = HistoryWriter(None)
        self.w.append("run_start", engine="crafted", capabilities=caps)
        self.examples = 0
        self.example()

    def example(self) -> "Crafted":
        self.w.append("example", index=self.examples)
        self.examples += 1
        return self.reset()

    def reset(self, snapshot: dict | None = None) -> "Crafted":
        self.w.append("reset", snapshot=snapshot)
        return self

    def config(self, **config: Any) -> "Crafted":
        self.w.append("config", config=config)
        return self

    def batch(self, *pairs: tuple[Request, Result], snapshot: dict | None = None) -> "Crafted":
        self.w.append("submit", requests=[p[0] for p in pairs])
        self.w.append("batch", results=[p[1] for p in pairs], snapshot=snapshot)
        return self

    def baseline(self, q: Request, out, reason: str = "length", margins=None, runner_up=()) -> "Crafted":
        margins = margins if margins is not None else [5.0] * len(out)
        self.w.append("baseline", key=oracle_key_str(q), baseline=Baseline(out, reason, margins, runner_up))
        return self

    def history(self):
        return parse(self.w.events + [{"event": "run_end"}])  # a finished run

    def status(self, check: str) -> str:
        return analyse(self.history(), [check]).checks[check].status

    def failures(self, check: str):
        return analyse(self.history(), [check]).checks[check].failures


P = tuple(range(10, 22))  # a 12-token prompt: three blocks of 4
Q = req("q", P)


def test_every_design_check_is_registered_with_title_severity_and_bug_class():
    assert set(CHECKS) == {"parity", "history_independence", "spec_independence", "schedule_independence",
                           "eviction_safety", "isolation", "prefix_only", "accounting", "rollback_hygiene", "exercised",
                           "logprob_parity", "abort_prefix"}
    for spec in CHECKS.values():
        assert spec.title and spec.severity and spec.bug_class in "ABCDE"


# ---------------------------------------------------------------- parity


def test_parity_passes_when_output_equals_baseline():
    h = Crafted().batch((Q, res("q", [5, 6, 7]))).baseline(Q, [5, 6, 7])
    assert h.status("parity") == "pass"


def test_parity_fails_with_first_divergent_position_and_margin():
    h = Crafted().batch((Q, res("q", [5, 9, 7]))).baseline(Q, [5, 6, 7], margins=[4.0, 2.5, 1.0])
    (f,) = h.failures("parity")
    assert f.witness["first_divergent_position"] == 1
    assert (f.witness["expected"], f.witness["got"], f.witness["baseline_margin"]) == (6, 9, 2.5)
    assert f.bug_class == "B" and f.case_id.startswith("parity-")


def test_parity_counts_near_tie_below_tau_when_runner_up_chosen():
    caps = Capabilities(name="t", vocab_size=64, max_context=256, tolerance=0.5)
    h = Crafted(caps).batch((Q, res("q", [5, 9, 1]))).baseline(Q, [5, 6, 7], margins=[4, 0.1, 3], runner_up=[1, 9, 2])
    result = analyse(h.history(), ["parity"]).checks["parity"]
    assert result.status == "pass" and result.stats["near_ties"] == 1
    assert any("near-tie" in n for n in result.notes)


def test_parity_small_margin_but_not_runner_up_is_a_divergence():
    caps = Capabilities(name="t", vocab_size=64, max_context=256, tolerance=0.5)
    h = Crafted(caps).batch((Q, res("q", [5, 8, 7]))).baseline(Q, [5, 6, 7], margins=[4, 0.1, 3], runner_up=[1, 9, 2])
    assert h.status("parity") == "fail"


def test_parity_tau_zero_never_excuses():
    h = Crafted().batch((Q, res("q", [5, 9, 7]))).baseline(Q, [5, 6, 7], margins=[4, 0.0, 3], runner_up=[1, 9, 2])
    assert h.status("parity") == "fail"


def test_parity_compares_finish_reason_when_tokens_equal():
    h = Crafted().batch((Q, res("q", [5, 6, 7], reason="stop"))).baseline(Q, [5, 6, 7], reason="length")
    assert h.failures("parity")[0].title == "output differs from plain greedy decoding"


def test_failures_deduplicate_across_examples():
    h = Crafted().batch((Q, res("q", [5, 9, 7]))).baseline(Q, [5, 6, 7])
    h.example().batch((Q, res("q", [5, 9, 7])))
    assert len(h.failures("parity")) == 1


# ---------------------------------------------------------------- independence checks


def _twice(out1, out2, cfg1=None, cfg2=None, cached2=8):
    h = Crafted()
    if cfg1 is not None:
        h.config(**cfg1)
    h.batch((Q, res("q", out1))).baseline(Q, out1)
    q2 = req("q2", P)
    if cfg2 is not None:
        h.config(**cfg2)
    return h.batch((q2, res("q2", out2, cached=cached2)))


def test_history_independence_passes_cold_equals_warm():
    assert _twice([1, 2, 3], [1, 2, 3]).status("history_independence") == "pass"


def test_history_independence_fails_when_warm_differs_from_cold():
    fails = _twice([1, 2, 3], [1, 2, 4]).failures("history_independence")
    assert {f.title for f in fails} >= {"output depends on cache state"}


def test_spec_independence_pair_under_different_k():
    assert _twice([1, 2, 3], [1, 2, 3], {"spec_k": 0}, {"spec_k": 2}, cached2=0).status("spec_independence") == "pass"
    bad = _twice([1, 2, 3], [1, 5, 3], {"spec_k": 0}, {"spec_k": 2}, cached2=0)
    assert bad.status("spec_independence") == "fail"
    assert bad.status("history_independence") != "fail"  # attributed to speculation, not cache state


def _knob_and_hit(wrong_first: bool, wrong_drafts: int) -> Crafted:
    """The same request twice, differing in the speculation knob *and* a cache hit: the run with the hit
    (spec_k 0, `wrong_drafts` drafts reported) is wrong; the one with speculation on and no hit is right
    (the vLLM 0.32.0 LoRA finding's shape: a poisoned cache entry served to a repeat)."""
    hit = (lambda rid: res(rid, [1, 2, 4], cached=8, draft_proposed=wrong_drafts), {"spec_k": 0})
    cold = (lambda rid: res(rid, [1, 2, 3], draft_proposed=3, draft_accepted=1), {"spec_k": 2})
    h = Crafted().baseline(Q, [1, 2, 3])
    for n, (result, config) in enumerate((hit, cold) if wrong_first else (cold, hit)):
        h.config(**config).batch((req(f"q{n}", P), result(f"q{n}")))
    return h


@pytest.mark.parametrize("wrong_first", [False, True])
def test_a_pair_differing_in_a_knob_and_a_hit_is_blamed_on_what_the_wrong_run_used(wrong_first):
    """Plain decoding sides with the speculative run; the wrong one proposed no drafts but was served
    from the cache: a cache finding, witnessed by the wrong run (earlier or later), not a speculation one."""
    h = _knob_and_hit(wrong_first, wrong_drafts=0)
    (f,) = [x for x in h.failures("history_independence") if x.title == "output depends on cache state"]
    assert f.witness["request"]["id"] == ("q0" if wrong_first else "q1") and f.witness["output"] == [1, 2, 4]
    assert f.witness["earlier_output"] == [1, 2, 3]
    assert h.status("spec_independence") != "fail"
    # the control: the wrong run did speculate, so speculation stays a suspect and keeps the pair
    spec = _knob_and_hit(wrong_first, wrong_drafts=2)
    (g,) = [x for x in spec.failures("spec_independence") if x.title == "output depends on speculation"]
    assert g.witness["output"] == [1, 2, 4]
    assert all(x.title != "output depends on cache state" for x in spec.failures("history_independence"))


def test_spec_independence_lone_speculative_result_vs_baseline():
    h = Crafted().batch((Q, res("q", [1, 9, 3], draft_proposed=4, draft_accepted=2))).baseline(Q, [1, 2, 3])
    assert h.status("spec_independence") == "fail"
    ok = Crafted().batch((Q, res("q", [1, 2, 3], draft_proposed=4, draft_accepted=2))).baseline(Q, [1, 2, 3])
    assert ok.status("spec_independence") == "pass"


def test_schedule_independence_different_chunk_size():
    assert _twice([1, 2], [1, 2], {"chunk": 0}, {"chunk": 8}, cached2=0).status("schedule_independence") == "pass"
    assert _twice([1, 2], [3, 2], {"chunk": 0}, {"chunk": 8}, cached2=0).status("schedule_independence") == "fail"


def test_schedule_independence_batch_composition_and_order():
    other = req("o", (40, 41, 42, 43, 44))
    good = Crafted().batch((Q, res("q", [1, 2]))).baseline(Q, [1, 2]).baseline(other, [7])
    good.reset().batch((other, res("o", [7])), (req("q2", P), res("q2", [1, 2])))
    assert good.status("schedule_independence") == "pass"
    bad = Crafted().batch((Q, res("q", [1, 2]))).baseline(Q, [1, 2]).baseline(other, [7])
    bad.reset().batch((other, res("o", [7])), (req("q2", P), res("q2", [1, 6])))
    assert bad.status("schedule_independence") == "fail"


def test_independence_is_inconclusive_with_nothing_to_compare():
    h = Crafted().batch((Q, res("q", [1]))).baseline(Q, [1])
    assert h.status("spec_independence") == "inconclusive"


# ---------------------------------------------------------------- eviction safety


def test_eviction_safety_passes_when_post_eviction_output_is_right():
    h = Crafted().batch((Q, res("q", [1, 2], evictions=2))).baseline(Q, [1, 2])
    assert h.status("eviction_safety") == "pass"


def test_eviction_safety_fails_on_wrong_output_after_eviction_seen_in_snapshot():
    h = Crafted().reset(snapshot={"evictions": 3})
    h.batch((Q, res("q", [1, 2])), snapshot={"evictions": 3}).baseline(Q, [1, 2])
    h.batch((req("q2", P), res("q2", [1, 2])), snapshot={"evictions": 5})
    h.batch((req("q3", P), res("q3", [1, 4])), snapshot={"evictions": 5})
    (f,) = h.failures("eviction_safety")
    assert f.witness["request"]["id"] == "q3"


def test_eviction_safety_inconclusive_without_eviction():
    h = Crafted().batch((Q, res("q", [1, 2])), snapshot={"evictions": 0}).baseline(Q, [1, 2])
    assert h.status("eviction_safety") == "inconclusive"


# ---------------------------------------------------------------- isolation


def test_isolation_passes_hit_within_same_identity():
    h = Crafted().batch((req("a", P, salt="x"), res("a", [1]))).baseline(req("a", P), [1])
    h.batch((req("b", P, salt="x"), res("b", [1], cached=8)))
    assert h.status("isolation") == "pass"


def test_isolation_prompt_plus_output_of_earlier_request_is_cacheable():
    h = Crafted().batch((req("a", P[:8]), res("a", [P[8], P[9], P[10]])))
    h.batch((req("b", P), res("b", [1], cached=11)))
    assert h.status("isolation") == "pass"


def test_isolation_fails_when_cached_tokens_come_from_another_salt():
    h = Crafted().batch((req("a", P, salt="x"), res("a", [1]))).baseline(req("a", P), [1])
    h.batch((req("b", P, salt="y"), res("b", [1], cached=8)))
    (f,) = h.failures("isolation")
    assert f.title == "cached tokens served across identities" and f.bug_class == "A"
    assert f.witness["shared_same_identity"] == 0 and f.witness["shared_other_identity"] == 12


def test_isolation_fails_on_a_hit_no_traffic_explains():
    h = Crafted().batch((req("b", P), res("b", [1], cached=4)))
    assert h.failures("isolation")[0].title == "cached tokens exceed any prefix seen before"


def test_isolation_reset_forgets_earlier_traffic():
    h = Crafted().batch((Q, res("q", [1]))).reset().batch((req("q2", P), res("q2", [1], cached=8)))
    assert h.status("isolation") == "fail"


def test_isolation_fails_when_poisoning_changes_output():
    caps = Capabilities(name="t", vocab_size=64, max_context=256, block_size=4, identities={"adapter"},
                        adapters=("l1",))
    a, b = req("a", P, adapter="l1"), req("b", P)
    h = Crafted(caps).batch((a, res("a", [7], cached=None))).baseline(a, [7])
    h.batch((b, res("b", [7], cached=None))).baseline(b, [2])
    (f,) = h.failures("isolation")
    assert f.title == "output changed after another identity warmed the same prefix"
    good = Crafted(caps).batch((a, res("a", [7], cached=None))).baseline(a, [7])
    good.batch((b, res("b", [2], cached=None))).baseline(b, [2])
    assert good.status("isolation") == "pass"


# ---------------------------------------------------------------- prefix-only


def test_prefix_only_passes_hit_below_prompt_length():
    h = Crafted().batch((Q, res("q", [1]))).batch((req("q2", P), res("q2", [1], cached=11)))
    assert h.status("prefix_only") == "pass"


def test_prefix_only_fails_when_hit_covers_whole_prompt():
    h = Crafted().batch((Q, res("q", [1]))).batch((req("q2", P), res("q2", [1], cached=12)))
    (f,) = h.failures("prefix_only")
    assert f.witness["cached_tokens"] == 12 and f.witness["prompt_len"] == 12


# ---------------------------------------------------------------- accounting


@pytest.mark.parametrize("q,r,title", [
    (req("q", P, 3), res("q", [1, 2, 3, 4]), "more tokens than max_tokens"),
    (req("q", P, 3), res("q", [1, 2], draft_proposed=2, draft_accepted=3), "more drafts accepted than proposed"),
    (req("q", P, 3), res("q", [1, 2]), "finish_reason 'length' without reaching max_tokens"),
    (req("q", P, 3, stop=(9,)), res("q", [1, 2], reason="stop"), "finish_reason 'stop' without a stop token"),
    (req("q", P, 3), res("q", [1, 2], reason="eos"), "finish_reason 'eos' without eos"),
    (req("q", P, 3, stop=(9,)), res("q", [9, 2, 5]), "generation continued past a stop/eos token"),
    (req("q", P, 4), res("q", [3, 2, 5, 6]), "generation continued past a stop/eos token"),
    (req("q", P, 3), res("q", [1, 2, 5], cached=13), "cached tokens out of range"),
])
def test_accounting_flags_each_inconsistency(q, r, title):
    assert title in {f.title for f in Crafted().batch((q, r)).failures("accounting")}


def test_accounting_passes_consistent_results():
    h = Crafted().batch((req("a", P, 3), res("a", [1, 2, 5], draft_proposed=4, draft_accepted=2)),
                        (req("b", P, 3, stop=(9,)), res("b", [1, 9], reason="stop")),
                        (req("c", P, 3), res("c", [1, 3], reason="eos")),
                        (req("d", P, 3), res("d", [1], reason="abort")))
    assert h.status("accounting") == "pass"


def test_accounting_fails_a_request_alone_in_the_engine_reported_preempted():
    h = Crafted().batch((req("a", P, 3), res("a", [1, 2, 5], preempted=True)))
    assert "a request alone in the engine reported preempted" in {f.title for f in h.failures("accounting")}


def test_accounting_passes_preemption_among_several_requests():
    h = Crafted().batch((req("a", P, 3), res("a", [1, 2, 5], preempted=True)),
                        (req("b", P, 3), res("b", [1, 2, 5], preempted=False)))
    assert h.status("accounting") == "pass"


# ---------------------------------------------------------------- rollback hygiene

AT_REST = {"blocks_in_use": 0, "provisional_live": 0, "refcounts_ok": True, "free_blocks": 60,
           "cached_blocks": 4, "total_blocks": 64}


def test_rollback_hygiene_passes_pool_at_rest():
    assert Crafted().batch((Q, res("q", [1])), snapshot=AT_REST).status("rollback_hygiene") == "pass"


@pytest.mark.parametrize("bad", [{"provisional_live": 2}, {"blocks_in_use": 1}, {"refcounts_ok": False},
                                 {"free_blocks": 59}, {"rejected_in_cache": 1}])
def test_rollback_hygiene_fails_when_pool_not_back_to_base(bad):
    h = Crafted().batch((Q, res("q", [1])), snapshot={**AT_REST, **bad})
    assert h.status("rollback_hygiene") == "fail"


def _failed_batch(snapshot: dict) -> Crafted:
    h = Crafted().batch((Q, res("q", [1])), snapshot=AT_REST)
    h.w.append("error", cause="RuntimeError: scheduler made no progress", requests=[Q], snapshot=snapshot)
    return h


def test_rollback_hygiene_passes_a_failed_batch_whose_pool_is_back_at_rest():
    """An engine error alone is the error verdict's business, not this check's."""
    assert _failed_batch(AT_REST).status("rollback_hygiene") == "pass"


def test_rollback_hygiene_fails_a_failed_batch_that_leaves_blocks_behind():
    """A leak that ends in a stall: the engine errors, and the pool after it holds leaked blocks."""
    (f,) = _failed_batch({**AT_REST, "blocks_in_use": 12, "free_blocks": 48}).failures("rollback_hygiene")
    assert f.title == "pool not back to base after a failed batch"
    assert "blocks_in_use=12" in f.explanation and "scheduler made no progress" in f.explanation
    assert f.witness["requests"][0]["id"] == Q.id


def test_rollback_hygiene_skipped_without_introspection():
    caps = Capabilities(name="t", vocab_size=64, max_context=256)
    assert Crafted(caps).batch((Q, res("q", [1]))).status("rollback_hygiene") == "skip"


# ---------------------------------------------------------------- exercised (vacuity guard)


def _busy(leave_out: str | None = None, caps: Capabilities = CAPS) -> Crafted:
    """A history that exercises every capability CAPS claims and every situation relevant to it
    (conformance/situations.py), one batch each; `leave_out` names a situation whose batch is left out."""
    # eos and same-text situations are relevant to an engine with an eos id and a cache, landmarks or
    # not (issue 28.3): the history reaches them, with a same-text pair declared
    caps = evolve(caps, landmarks=Landmarks(same_text=(((50,), (51, 52)),)))
    h = Crafted(caps).config(chunk=8)
    h.batch((req("g", (50,) + P, salt="x"), res("g", [1, 3], "eos")))
    h.batch((req("h", (51, 52) + P, salt="x"), res("h", [1, 3], "eos", cached=4, draft_proposed=2, draft_accepted=1)))
    h.batch((req("a", P, salt="x"), res("a", [1, 2], draft_proposed=2, draft_accepted=1,
                                        prefill_chunks=2, evictions=1)))
    h.batch((req("b", P, salt="x"), res("b", [1], cached=8)))
    h.batch((req("c", P, salt="y"), res("c", [1])))
    if leave_out != "stop_in_speculation":
        h.batch((req("d", P, stop=(2,), salt="x"), res("d", [1, 2], "stop", cached=8, draft_proposed=2, draft_accepted=1)))
    if leave_out != "shared_in_flight":
        fresh = tuple(range(40, 50))
        h.batch((req("e", fresh, salt="x"), res("e", [1], prefill_chunks=2)),
                (req("f", fresh + (3,), salt="x"), res("f", [1], prefill_chunks=2)))
    return h


def test_exercised_passes_when_every_claim_was_exercised():
    assert _busy().status("exercised") == "pass"


@pytest.mark.parametrize("situation", ["stop_in_speculation", "shared_in_flight"])
def test_exercised_names_a_relevant_situation_never_reached(situation):
    result = analyse(_busy(leave_out=situation).history(), ["exercised"]).checks["exercised"]
    assert result.status == "inconclusive"
    assert any(f"situation never reached: {situation}" in n for n in result.notes), result.notes


def test_exercised_inconclusive_when_claims_never_exercised():
    h = Crafted().batch((Q, res("q", [1])))
    result = analyse(h.history(), ["exercised"]).checks["exercised"]
    assert result.status == "inconclusive"
    text = " ".join(result.notes)
    for word in ("cached token", "draft", "eviction", "chunked", "identities"):
        assert word in text


def test_exercised_asks_every_speculation_setting_served_to_have_drafted():
    # spec_k=0 is declared off; under spec_k=2 the engine speculates, so a request that decoded past its
    # first token there with no draft ever proposed leaves that setting unexercised (a drafter silently
    # off, or a knob the engine ignores, looks exactly like this from outside)
    caps = evolve(CAPS, knobs=tuple(evolve(k, off=(0,)) if k.name == "spec_k" else k for k in CAPS.knobs))
    assert caps.prefix_caching_off == {}  # a speculation knob's off values say nothing about the cache

    def run(drafted: int, output=(1, 2)) -> Any:
        h = _busy(caps=caps).config(spec_k=0, chunk=8).batch((req("n", P), res("n", [1, 2], cached=8)))
        h.config(spec_k=2, chunk=8).batch((req("s", P), res("s", list(output), cached=8, draft_proposed=drafted)))
        return analyse(h.history(), ["exercised"]).checks["exercised"]

    assert run(drafted=2).status == "pass"  # and spec_k=0, off, is not asked to draft
    assert run(drafted=0, output=(1,)).status == "pass"  # one token: no decode step, no chance to draft
    assert run(drafted=None).status == "pass"  # the engine reports no draft count on that path
    undrafted = run(drafted=0)
    assert undrafted.status == "inconclusive"
    assert any("speculation setting spec_k=2 never proposed a draft" in n for n in undrafted.notes), undrafted.notes


def test_exercised_positive_control_exact_repeat_must_hit():
    h = Crafted().batch((Q, res("q", [1]))).batch((req("q2", P), res("q2", [1], cached=0)))
    assert h.failures("exercised")[0].title == "exact repeat reported no cache hit"


def test_exercised_positive_control_forgives_repeat_after_reset():
    h = _busy().reset().batch((Q, res("q", [1]))).reset().batch((req("q2", P), res("q2", [1], cached=0)))
    assert h.status("exercised") == "pass"


# ---------------------------------------------------------------- the registry's guarantees


def test_a_crashing_check_is_error_never_pass(monkeypatch):
    spec = CHECKS["parity"]

    def boom(history, findings):
        raise ZeroDivisionError("bug in checker")

    monkeypatch.setitem(CHECKS, "parity", type(spec)(spec.name, spec.title, spec.severity, spec.bug_class, boom))
    result = run_check(CHECKS["parity"], Crafted().history())
    assert result.status == "error" and "ZeroDivisionError" in result.notes[0]


def test_run_verdict_is_error_when_engine_errored():
    h = Crafted().batch((Q, res("q", [1]))).baseline(Q, [1])
    h.w.append("error", cause="run timed out after 1s")
    a = analyse(h.history(), ["parity"])
    assert a.verdict == "error" and a.exit_code == 3
