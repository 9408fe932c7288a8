"""Requests mid-flight (issue 30): the timeline in the contract, the reference engine honouring it step by
step, the abort_prefix check both ways, the midflight step kind, and the abort-path faults caught."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from adapters.reference import ReferenceAdapter
from conformance.contract import Capabilities, Identity, Request, Result, evolve
from conformance.history_codec import encode, request_from, result_from
from conformance.midflight_steps import abort_edges, midflight
from conformance.scenario import Batch, Configure, Continuation, renamed, step_from_json, step_to_json
from conformance.scenario_runner import replay
from conformance.strategies import scenarios
from conformance.situations import SITUATIONS
from conformance.stream import Stream
from test_conformance_checks import CAPS, Crafted, req, res

RNG = random.Random(30)
PROMPT = tuple(RNG.randrange(3, 500) for _ in range(30))  # random tokens: a corrupted KV shows in the output


# ---------------------------------------------------------------- the contract


def test_timeline_round_trips_and_old_histories_read_as_none():
    q = Request("a", (1, 2, 3), 4, (), Identity(salt="s"), arrive_at_step=2, abort_after=0)
    assert request_from(encode(q)) == q
    r = Result("a", (5,), "abort", arrived_at_step=2, ended_at_step=3)
    assert result_from(encode(r)) == r
    old_q, old_r = encode(q), encode(r)
    for k in ("arrive_at_step", "abort_after"):
        del old_q[k]
    for k in ("arrived_at_step", "ended_at_step"):
        del old_r[k]
    assert request_from(old_q).arrive_at_step is None and request_from(old_q).abort_after is None
    assert result_from(old_r).arrived_at_step is None and result_from(old_r).ended_at_step is None
    assert step_from_json(step_to_json(Batch([q]))) == Batch([q])


def test_oracle_key_ignores_the_timeline_and_a_resend_is_plain():
    q = Request("a", (1, 2, 3), 4, arrive_at_step=1, abort_after=2)
    assert q.oracle_key() == Request("b", (1, 2, 3), 4).oracle_key()
    again = renamed(q, "c", 10)
    assert (again.arrive_at_step, again.abort_after) == (None, None)


# ---------------------------------------------------------------- the reference engine


@pytest.fixture(scope="module")
def chunked() -> ReferenceAdapter:
    return ReferenceAdapter(chunk_size="13", drafter="none")


def test_reference_declares_its_timeline(chunked):
    assert chunked.capabilities().timeline == {"arrival", "abort"}


def test_abort_during_prefill_and_decode_is_step_precise(chunked):
    chunked.reset()
    during_prefill, during_decode, too_late = chunked.run([
        Request("p", PROMPT, 6, abort_after=0), Request("d", PROMPT[:20], 6, abort_after=3),
        Request("l", PROMPT[:8], 2, abort_after=2)])
    assert (during_prefill.output, during_prefill.finish_reason) == ((), "abort")
    base = chunked.baseline(Request("x", PROMPT[:20], 6)).output
    assert during_decode.finish_reason == "abort" and during_decode.output == base[:3]  # no drafter: one a step
    assert too_late.finish_reason == "length" and len(too_late.output) == 2  # finished first: not claimed
    assert chunked.snapshot()["blocks_in_use"] == 0 and chunked.snapshot()["refcounts_ok"]


def test_arrival_at_a_step_while_others_run_and_early_when_idle(chunked):
    chunked.reset()
    lead, late = chunked.run([Request("a", PROMPT, 6), Request("b", PROMPT[:17], 4, arrive_at_step=2)])
    assert (lead.arrived_at_step, late.arrived_at_step) == (0, 2)
    assert late.ended_at_step > 2 and late.output == chunked.baseline(Request("x", PROMPT[:17], 4)).output
    (alone,) = chunked.run([Request("c", PROMPT[:5], 2, arrive_at_step=3)])
    assert alone.arrived_at_step == 0  # the engine was idle: submitted at once, recorded as such


# ---------------------------------------------------------------- the abort_prefix check

TIMED = evolve(CAPS, timeline={"arrival", "abort"})
Q = evolve(req("q", tuple(range(10, 22)), max_tokens=4), abort_after=2)


def test_abort_prefix_passes_on_a_prefix_and_parity_skips_the_partial_output():
    h = Crafted(TIMED).batch((Q, res("q", [5, 6], "abort"))).baseline(Q, [5, 6, 7, 8])
    assert h.status("abort_prefix") == "pass"
    assert h.status("parity") != "fail"


def test_abort_prefix_fails_on_a_token_plain_decoding_would_not_produce():
    h = Crafted(TIMED).batch((Q, res("q", [5, 9], "abort"))).baseline(Q, [5, 6, 7, 8])
    (f,) = h.failures("abort_prefix")
    assert f.witness["first_divergent_position"] == 1 and f.witness["got"] == 9


def test_abort_prefix_fails_past_the_end_of_plain_decoding_and_on_a_timeline_out_of_order():
    h = Crafted(TIMED).batch((Q, res("q", [5, 3, 4], "abort"))).baseline(Q, [5, 3], "eos")
    assert h.status("abort_prefix") == "fail"
    late = evolve(Q, arrive_at_step=1, abort_after=None)
    h = Crafted(TIMED).batch((late, res("q", [5, 6, 7, 8], arrived_at_step=3, ended_at_step=5))).baseline(late, [5, 6, 7, 8])
    assert [f.title for f in h.failures("abort_prefix")] == ["arrived later than asked"]


def test_a_paced_arrival_may_land_late():
    """An engine whose arrivals a client paces (a server: contract.TIMELINE "arrival_paced") may admit a
    request a step or two after the point asked; a step-precise one may not (the test above)."""
    paced = evolve(CAPS, timeline={"arrival_paced", "abort"})
    late = evolve(Q, arrive_at_step=1, abort_after=None)
    landed = res("q", [5, 6, 7, 8], arrived_at_step=3, ended_at_step=5)
    h = Crafted(paced).batch((late, landed)).baseline(late, [5, 6, 7, 8])
    assert not h.failures("abort_prefix")  # (nothing aborted: inconclusive, not failed)
    backwards = res("q", [5, 6, 7, 8], arrived_at_step=3, ended_at_step=2)
    h = Crafted(paced).batch((late, backwards)).baseline(late, [5, 6, 7, 8])
    assert [f.title for f in h.failures("abort_prefix")] == ["ended before it arrived"]


def test_abort_prefix_does_not_apply_without_a_declared_abort():
    h = Crafted().batch((Q, res("q", [5, 6], "abort"))).baseline(Q, [5, 6, 7, 8])
    assert h.status("abort_prefix") == "skip"


# ---------------------------------------------------------------- the strategies

SMALL = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _timed(steps) -> list[Request]:
    return [r for s in steps if isinstance(s, Batch) for r in s.items
            if isinstance(r, Request) and (r.arrive_at_step is not None or r.abort_after is not None)]


@SMALL
@given(st.data())
def test_no_timeline_is_drawn_where_none_is_declared(data):
    assert not _timed(data.draw(scenarios(evolve(CAPS, timeline=frozenset()), max_steps=8)))


def test_abort_edges_are_prefill_one_short_and_the_block_edge():
    assert abort_edges(4, 10, 6) == [0, 2, 5]  # 10 + 2 output tokens = 12, three blocks of 4
    assert abort_edges(4, 8, 6) == [0, 5]  # an aligned prompt: its block edge is the prefill's
    assert abort_edges(16, 10, 1) == [0]


@SMALL
@given(st.data())
def test_midflight_times_a_batch_then_resends_its_aborted_prompts_plainly(data):
    s = Stream(data.draw, evolve(TIMED, max_context=64))
    s.add_batch((s.fresh_request(),))
    resend = midflight(s)
    timed = [r for r in s.steps[-1].items]
    assert timed[0].arrive_at_step is None
    for r in timed:
        assert r.arrive_at_step is None or 0 <= r.arrive_at_step <= timed[0].max_tokens + 1  # the leader's life
        assert r.abort_after is None or 0 <= r.abort_after <= r.max_tokens
    assert not _timed([Batch(resend)])  # sent again plainly (a Continuation carries no timeline)
    assert isinstance(resend[0], Continuation) and resend[0].parent in {r.id for r in timed}


def test_the_timeline_situations_are_registered_and_relevant_only_where_declared():
    names = {"arrival_during_sharer_prefill", "abort_in_prefill", "abort_in_decode", "abort_in_verification",
             "aborted_prompt_resent", "aborted_prompt_resent_other_identity"}
    assert names <= set(SITUATIONS)
    assert all(SITUATIONS[n].relevant(TIMED) for n in names)
    assert not any(SITUATIONS[n].relevant(CAPS) for n in names)


# ---------------------------------------------------------------- the faults


def _aborted_then_resent(fault: str | None, check: str):
    """A prompt aborted during a chunked prefill (13 tokens of a 30-token prompt: its first block of 16
    is written 13/16), then sent again: the only KV of that block anyone may serve is written KV."""
    args = {"fault": fault} if fault else {}
    engine = ReferenceAdapter(chunk_size="13", drafter="none", **args)
    steps = [Configure({"chunk_size": 13, "drafter": "none"}),
             Batch([Request("a", PROMPT, 6, abort_after=0)]), Batch([Request("b", PROMPT, 6)])]
    result, crashed = replay(engine, engine.capabilities(), steps, check)
    assert crashed is None
    return result.status


@pytest.mark.parametrize("fault", ["aborted_blocks_published", "schedule_registration_kept"])
def test_unwritten_blocks_of_an_aborted_request_served_are_caught_by_parity(fault):
    assert _aborted_then_resent(None, "parity") == "pass"
    assert _aborted_then_resent(fault, "parity") == "fail"


def test_a_shared_block_released_twice_on_abort_is_caught_at_rest():
    assert _aborted_then_resent(None, "rollback_hygiene") == "pass"
    engine = ReferenceAdapter(drafter="none", fault="abort_double_release")
    steps = [Batch([Request("w", PROMPT[:20], 2)]), Batch([Request("a", PROMPT, 6, abort_after=1)])]
    result, crashed = replay(engine, engine.capabilities(), steps, "rollback_hygiene")
    assert crashed is None and result.status == "fail"


def test_an_aborted_request_is_no_positive_control_for_its_repeat():
    """Aborted during prefill, a prompt may have written no full block: its exact repeat missing the
    cache is no sign of a broken cache (the control must not fail the unfaulted engine)."""
    long = evolve(req("a", tuple(range(10, 22))), abort_after=0)
    again = req("b", tuple(range(10, 22)))
    h = (Crafted(TIMED).batch((long, res("a", [], "abort"))).baseline(long, [5, 6, 7])
         .batch((again, res("b", [5, 6, 7], cached=0))).baseline(again, [5, 6, 7]))
    assert not [f for f in h.failures("exercised") if f.title == "exact repeat reported no cache hit"]
    plain = evolve(long, abort_after=None)
    h = (Crafted(TIMED).batch((plain, res("a", [5, 6, 7]))).baseline(plain, [5, 6, 7])
         .batch((again, res("b", [5, 6, 7], cached=0))).baseline(again, [5, 6, 7]))
    assert [f.title for f in h.failures("exercised")] == ["exact repeat reported no cache hit"]


def test_an_aborted_request_s_wrong_partial_output_is_listed_under_the_mechanism_in_play():
    """Its tokens came before the abort, so the abort did not cause them: in a run where scheduling is
    found to matter (a later example: the same prompt alone right, in a batch of two wrong), the aborted
    request's finding names scheduling too, as for a request that ran to the end; abort_prefix is also
    seen by. An aborted request whose partial output is right implies nothing."""
    from conformance.analysis import analyse
    from conformance.grouping import group

    other = req("o", tuple(range(40, 52)), max_tokens=2)
    alone, batched = req("a", Q.prompt, max_tokens=4), req("b", Q.prompt, max_tokens=4)
    for got, expect in (([5, 8], "schedule_independence"), ([5, 6], None)):
        h = (Crafted(TIMED).batch((Q, res("q", got, "abort")), (other, res("o", [1, 2])))
             .example().batch((alone, res("a", [5, 6, 7, 8])))
             .batch((batched, res("b", [5, 9, 7, 8])), (other, res("o", [1, 2])))
             .baseline(Q, [5, 6, 7, 8]).baseline(other, [1, 2]).history())
        aborted = [fd for fd in group(h, analyse(h)) if fd.failure.witness["request"]["id"] == "q"]
        if expect is None:
            assert aborted == []
            continue
        (fd,) = aborted
        assert fd.check == expect and {"abort_prefix", "parity"} <= set(fd.seen_by), fd.seen_by
        assert any("aborted" in why for why in fd.reasons)
