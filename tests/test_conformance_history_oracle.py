"""The history format round-trips the contract types and survives a crash; the oracle is memoized and
tie-aware; strategies respect what the engine declares."""

from __future__ import annotations

import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.analysis import analyse
from conformance.contract import Baseline, Capabilities, Identity, Request, Result
from conformance.history import HistoryWriter, NotAHistory, load, read_events
from conformance.history_codec import (baseline_from, capabilities_from, encode, json_default, request_from,
                                       result_from)
from conformance.oracle import DIVERGE, EQUAL, FINISH, NEAR_TIE, Oracle, compare, compare_pair
from conformance.domains import adapter_bindings, all_identities, edge_tokens, token_range
from conformance.scenario import Batch, Configure, Continuation, step_from_json, step_to_json
from conformance.strategies import scenarios

CAPS = Capabilities(name="t", vocab_size=64, max_context=128, eos_id=5, block_size=4, identities={"salt", "adapter"},
                    adapters=("l1",), config_space={"spec_k": (0, 2)}, knob_roles={"spec_k": "speculation"},
                    tolerance=0.25)


def test_contract_values_round_trip_through_json():
    q = Request("r1", [1, 2, 3], 4, (9,), Identity(revision="b", adapter="l1", adapter_digest="abc", salt="s"))
    r = Result("r1", [4, 5], "stop", cached_tokens=2, draft_proposed=3, draft_accepted=1,
               top2=((4, 1.5, 6, 1.0),), timings={"ttft": 0.1}, extra={"evictions": 1})
    assert request_from(json.loads(json.dumps(encode(q)))) == q
    assert result_from(json.loads(json.dumps(encode(r)))) == r
    assert capabilities_from(json.loads(json.dumps(encode(CAPS)))) == CAPS


_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=3))
_EVENT_VALUES = st.recursive(
    st.one_of(_JSON_LEAVES, st.builds(Identity, salt=st.none() | st.text(max_size=2)),
              st.builds(Request, st.text(max_size=2), st.lists(st.integers(0, 9), max_size=4), st.integers(1, 4))),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
                            st.frozensets(st.integers(), max_size=3), st.dictionaries(st.text(max_size=2), inner, max_size=3)),
    max_leaves=12)


@given(_EVENT_VALUES)
def test_the_writer_spells_every_value_as_encode_does(value):
    """The history writer lets the JSON encoder walk the containers and calls `json_default` only for what
    it cannot write; the line must be the one `encode` gave (the chain's digests and every reader rely on it)."""
    assert (json.dumps({"v": value}, default=json_default, allow_nan=False)
            == json.dumps({"v": encode(value)}, allow_nan=False))


def test_contract_values_need_the_default_hook():
    with pytest.raises(TypeError):
        json.dumps(Identity(salt="s"))  # the crafted case: without the hook a contract value is not JSON
    assert json.loads(json.dumps(Identity(salt="s"), default=json_default)) == encode(Identity(salt="s"))


def test_history_is_on_disk_before_checking_and_a_torn_line_is_reported(tmp_path):
    path = tmp_path / "history.jsonl"
    w = HistoryWriter(path)
    w.append("run_start", engine="e", capabilities=CAPS)
    w.append("example", index=0)
    w.append("batch", requests=[Request("a", [1, 2], 1)], results=[Result("a", [7], "length")])
    assert len(path.read_text().splitlines()) == 3  # flushed, without closing
    with open(path, "a") as fh:
        fh.write('{"event": "batch", "requ')  # the process died mid-write
    events, problems = read_events(path)
    assert len(events) == 3
    assert problems == ["history.jsonl line 4 is torn: the process died while writing it"]
    h = load(path)
    assert h.capabilities == CAPS and h.examples[0].batches[0].results[0].output == (7,)
    assert problems[0] in h.errors and h.incomplete().startswith("run did not finish: 1 examples recorded")


def _finished_history(path, n_examples=3):
    w = HistoryWriter(path)
    w.append("run_start", engine="e", capabilities=CAPS)
    for i in range(n_examples):
        w.append("example", index=i)
        w.append("submit", requests=[Request(f"a{i}", [1, 2], 1)])
        w.append("batch", results=[Result(f"a{i}", [7], "length")])
    w.append("run_end", examples=n_examples, duration_s=1.5)
    w.close()
    return path


def test_a_corrupt_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = _finished_history(tmp_path / "history.jsonl")
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:-7] + "garbage"  # line 5 of 12
    path.write_text("\n".join(lines) + "\n")
    h = load(path)
    assert "history.jsonl line 5 is not a history event; lines after 4 were not read" in h.errors
    assert analyse(h).verdict == "error"


def test_a_clean_history_has_no_errors_and_its_duration(tmp_path):
    h = load(_finished_history(tmp_path / "history.jsonl"))
    assert h.errors == [] and h.incomplete() is None and h.duration_s == 1.5
    assert [len(ex.batches) for ex in h.examples] == [1, 1, 1]


def test_a_history_without_run_end_is_incomplete_and_names_the_request_in_flight(tmp_path):
    path = _finished_history(tmp_path / "history.jsonl")
    lines = path.read_text().splitlines()[:-2]  # the last answer and run_end never came
    path.write_text("\n".join(lines) + "\n")
    h = load(path)
    assert h.incomplete() == ("run did not finish: 3 examples recorded, last event submit "
                              "(requests a2 submitted, never answered)")
    assert analyse(h).verdict == "error"
    assert h.examples[-1].steps()[-1]["requests"][0]["id"] == "a2"  # replayable


@pytest.mark.parametrize("text", ["", "\n\n", '{"event": "example", "index": 0}\n'])
def test_an_empty_file_or_one_without_run_start_is_not_a_history(tmp_path, text):
    path = tmp_path / "history.jsonl"
    path.write_text(text)
    with pytest.raises(NotAHistory):
        read_events(path)


def test_non_finite_numbers_are_never_written(tmp_path):
    w = HistoryWriter(tmp_path / "history.jsonl")
    with pytest.raises(ValueError):
        w.append("batch", results=[Result("a", [7], "length", timings={"ttft": float("nan")})])


def test_oracle_is_memoized_by_oracle_key_and_ignores_salt():
    calls = []

    def compute(q):
        calls.append(q.id)
        return Baseline([1], "length", [1.0])

    seen = []
    oracle = Oracle(compute, lambda key, b: seen.append(key))
    oracle(Request("a", [1, 2], 1, identity=Identity(salt="x")))
    oracle(Request("b", [1, 2], 1, identity=Identity(salt="y")))
    oracle(Request("c", [1, 2], 1, identity=Identity(adapter="l1")))
    assert calls == ["a", "c"] and len(seen) == 2


def test_compare_kinds():
    base = Baseline([1, 2, 3], "length", [3.0, 0.1, 3.0], [9, 8, 7])
    assert compare(base, [1, 2, 3], "length", 0.25).kind == EQUAL
    assert compare(base, [1, 2, 3], "eos", 0.25).kind == FINISH
    assert compare(base, [1, 8, 4], "length", 0.25).kind == NEAR_TIE  # runner-up at a tie: nothing after compared
    assert compare(base, [1, 7, 3], "length", 0.25).kind == DIVERGE  # not the runner-up
    assert compare(base, [1, 8, 3], "length", 0.0).kind == DIVERGE  # tau = 0: no ties
    c = compare(base, [1, 2], "length", 0.25)
    assert (c.kind, c.position, c.expected, c.got) == (DIVERGE, 2, 3, None)


def test_a_pick_among_several_close_contenders_is_judged_by_its_own_gap():
    """bf16: top three within the noise. Picking the third at gap 0.05 < tau is a near-tie; at 0.3 it is
    not, nor is a token the baseline does not place within tau, nor (without contenders) anything but
    the runner-up."""
    close = ((), ((8, 0.02), (7, 0.05), (6, 0.3)), ())
    base = Baseline([1, 2, 3], "length", [3.0, 0.02, 3.0], [9, 8, 7], close)
    assert compare(base, [1, 7, 4], "length", 0.25).kind == NEAR_TIE
    assert compare(base, [1, 6, 4], "length", 0.25).kind == DIVERGE  # its gap is above tau
    assert compare(base, [1, 5, 4], "length", 0.25).kind == DIVERGE  # not a contender: unplaceable, fail closed
    assert compare(base, [1, 7, 4], "length", 0.04).kind == DIVERGE
    assert compare(Baseline([1, 2, 3], "length", [3.0, 0.02, 3.0], [9, 8, 7]), [1, 7, 4], "length", 0.25).kind == DIVERGE
    assert baseline_from(json.loads(json.dumps(encode(base)))) == base


def test_the_reference_baseline_records_contenders_only_at_close_steps():
    import torch

    from reference_engine.baseline import CONTENDER_WINDOW, ranked

    logits = torch.tensor([5.0, 4.9, 4.8, 1.0, 4.5, 0.0])
    assert ranked(logits) == (0, 5.0, 1, pytest.approx(4.9),
                              ((1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (4, pytest.approx(0.5))))
    assert ranked(torch.tensor([9.0, 9.0 - CONTENDER_WINDOW, 1.0, 0.0, 0.0]))[4] == ()


def test_compare_pair_near_tie_only_on_the_baseline_path():
    base = Baseline([1, 2, 3], "length", [3.0, 0.1, 3.0], [9, 8, 7])
    assert compare_pair([1, 2, 3], "length", [1, 8, 3], "length", base, 0.25).kind == NEAR_TIE
    assert compare_pair([4, 2, 3], "length", [4, 8, 3], "length", base, 0.25).kind == DIVERGE


@settings(max_examples=40, deadline=None, database=None)
@given(scenarios(CAPS))
def test_scenarios_respect_declared_capabilities(steps):
    lo, hi = token_range(CAPS)
    idents = set(all_identities(CAPS))
    bindings = set(adapter_bindings(CAPS))
    step_config: dict = {}
    for step in steps:
        if isinstance(step, Configure):
            assert all(v in CAPS.config_space[k] for k, v in step.config.items())
            step_config = dict(step.config)
        if isinstance(step, Batch):
            assert 1 <= len(step.items) <= 4
            for item in step.items:
                i = item.identity
                # the declared identities, or one `collide` built: any salt over declared weights
                assert i in idents or (i.revision in CAPS.revisions and (i.adapter, i.adapter_digest) in bindings)
                assert 1 <= item.max_tokens <= 16
                tokens = item.extra if isinstance(item, Continuation) else item.prompt
                # the small alphabet (never eos), or the vocabulary's edges (one token seed in eight)
                assert all((lo <= t <= hi and t != CAPS.eos_id) or t in edge_tokens(CAPS) for t in tokens)
                if isinstance(item, Request):  # the whole length domain: up to filling the context
                    assert 1 <= len(item.prompt) <= CAPS.context_limit(step_config) - item.max_tokens + int(CAPS.refuses)
        assert step_from_json(json.loads(json.dumps(step_to_json(step)))) == step


def test_prompt_lengths_concentrate_at_block_multiples():
    from conformance.domains import prompt_lengths

    lengths = []

    @settings(max_examples=200, deadline=None, database=None)
    @given(prompt_lengths(CAPS))
    def collect(n):
        lengths.append(n)

    collect()
    near = sum(n % CAPS.block_size in (0, 1, CAPS.block_size - 1) for n in lengths)
    assert near / len(lengths) > 0.6
