"""The transformers adapter's per-position logprobs (issue 29): real transformers on the shipped checkpoint,
in float32, judged by the contract's boundary and by logprob_parity against the float64 reference oracle
with the committed calibration's epsilon — passing as measured, failing once one logprob is moved past
epsilon. Also: modes without per-token logits report none, and calibrate measures the epsilon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import validation
from conformance.contract import Identity, Request, evolve
from conformance.history_codec import oracle_key_str
from conformance.numerics import load_calibration
from conformance.scenario import Batch, Configure
from conformance.scenario_runner import replay
from tests.test_conformance_checks import Crafted

pytest.importorskip("transformers")
import torch  # noqa: E402

from adapters.transformers import TransformersAdapter, _logprobs  # noqa: E402
from adapters.transformers_versions import per_token_logits  # noqa: E402

CALIBRATION = Path(__file__).resolve().parent.parent / "reports" / "calibration" / "transformers-float32.json"
MODES = ("generate", "assisted", "adversarial", "prompt_lookup")
PROMPT = tuple(range(40, 60))


@pytest.fixture(scope="module")
def adapter():
    a = TransformersAdapter(dtype="float32", modes=",".join(MODES))
    yield a
    a.close()


@pytest.fixture(scope="module")
def epsilon() -> float:
    eps = load_calibration(CALIBRATION).logprob_epsilon
    assert eps is not None and 0 < eps < 1e-3  # float32 against float64: rounding, not a model difference
    return eps


def caps_with(adapter, eps: float | None):
    return evolve(validation.capabilities(adapter.capabilities()), logprob_epsilon=eps)


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_reports_top_k_logprobs_the_contract_accepts(adapter, mode):
    adapter.configure({"mode": mode, "k": 3})
    caps = caps_with(adapter, None)
    assert caps.logprobs_k == 5
    q = Request("q", PROMPT, 8)
    (r,) = adapter.run([q])
    validation.result(q, r, caps)  # one entry per token, sorted, the chosen token among them
    assert r.logprobs is not None and len(r.logprobs) == len(r.output) > 0
    assert all(len(step) >= 5 for step in r.logprobs)


@pytest.mark.parametrize("mode", ["generate", "assisted"])
def test_logprobs_match_the_float64_oracle_within_the_committed_epsilon(adapter, epsilon, mode):
    steps = [Configure({"mode": mode, "k": 3}), *(Batch([Request(f"r{i}", PROMPT[i:], 8)]) for i in range(3))]
    result, crashed = replay(adapter, caps_with(adapter, epsilon), steps, "logprob_parity")
    assert crashed is None and result.status == "pass", result
    assert result.stats["compared"] >= 3 * 8 * 4  # most of each position's top-5 shared with the oracle's


def test_a_logprob_moved_past_epsilon_fails_logprob_parity(adapter, epsilon):
    """The real result and the real oracle baseline, one logprob moved by 2 epsilon: fail; as measured: pass."""
    adapter.configure({"mode": "assisted", "k": 3})
    q = Request("q", PROMPT, 6)
    (r,) = adapter.run([q])
    base = adapter.baseline(q)
    assert r.output == base.output
    steps = [list(step) for step in r.logprobs]
    token, lp = steps[2][1]
    steps[2][1] = (token, lp - 2 * epsilon)
    moved = evolve(r, logprobs=steps)

    def history(result):
        h = Crafted(caps_with(adapter, epsilon)).batch((q, result))
        h.w.append("baseline", key=oracle_key_str(q), baseline=base)
        return h

    assert history(r).status("logprob_parity") == "pass"
    (f,) = history(moved).failures("logprob_parity")
    assert (f.witness["logprob_position"], f.witness["logprob_token"]) == (2, token)
    assert epsilon < f.witness["logprob_deviation"] <= 3 * epsilon
    assert history(moved).status("parity") == "pass"  # the tokens are the same


def test_batch_mode_reports_no_logprobs_and_a_batch_only_engine_declares_none():
    a = TransformersAdapter(dtype="float32", modes="generate,batch", mode="batch")
    try:
        q = Request("q", PROMPT, 4)
        (r,) = a.run([q])
        assert r.logprobs is None and r.output
        validation.result(q, r, validation.capabilities(a.capabilities()))
    finally:
        a.close()
    b = TransformersAdapter(dtype="float32", modes="batch", mode="batch")
    try:
        assert b.capabilities().logprobs_k == 0
    finally:
        b.close()


def test_per_verification_rows_give_logprobs_only_where_they_cover_the_output_exactly():
    """A release recording assisted generation per verification: rows are mapped by the observed
    acceptances; where they do not add up to the output, no logprobs rather than a guess."""
    vocab = 8
    verif = [torch.randn(1, 4, vocab), torch.randn(1, 4, vocab)]  # k = 3: 3 drafts + 1 per verification
    rows = per_token_logits(verif, [2, 0])  # 2 accepted + bonus, then 0 accepted + the correction
    assert len(rows) == 4 and torch.equal(rows[3], verif[1][:, 0, :])
    output = [int(row[0].argmax()) for row in rows]
    lps = _logprobs(rows, output)
    assert lps is not None and [step[0][0] for step in lps] == output
    assert _logprobs(rows[:3], output) is None  # rows short of the output: none reported
    assert _logprobs(rows, output[:3]) is None


def test_plain_batches_each_revision_apart(adapter):
    """plain() of a batch mixing revisions decodes each under its own weights (calibrate mixes them)."""
    qa, qb = Request("a", PROMPT, 5), Request("b", PROMPT, 5, identity=Identity(revision="b"))
    alone = [adapter.plain([q])[0] for q in (qa, qb)]
    mixed = adapter.plain([qa, qb])
    assert [m.output for m in mixed] == [a.output for a in alone]
    assert alone[0].logprobs != alone[1].logprobs  # two sets of weights: not the same distribution


def test_calibrate_measures_a_transformers_logprob_epsilon(tmp_path):
    from kvparity.commands import calibrate

    out = tmp_path / "cal.json"
    assert calibrate.main(["--engine", "transformers", "--engine-arg", "dtype=float32", "--engine-arg",
                           "modes=generate,assisted", "--out", str(out), "--prompts", "4", "--max-tokens", "4",
                           "--batch-sizes", "2"]) == 0
    section = json.loads(out.read_text())["logprobs"]
    assert all(section["sources"][s]["n"] > 0 for s in ("oracle", "batch", "config"))
    assert 0 < load_calibration(out).logprob_epsilon < 1e-3


def test_the_stored_noise_sample_reads_back_from_pairs_and_from_an_old_flat_list(tmp_path):
    """calibrate stores plain_noise as [value, count] pairs (a file of a 64-prompt sample stays a few KB
    under reports/' size cap); flip_probability reads the same sample as from the old flat list."""
    from conformance.numerics import round_up, value_counts
    from kvparity.commands.calibrate import dumps

    for x in (1.05e-05, 0.1959346, 0.09375, 4.76837158203125e-07, 0.0):
        assert x <= round_up(x) <= x * 1.01 and len(f"{round_up(x):g}".lstrip("0.").split("e")[0]) <= 4

    flat = sorted([0.0] * 900 + [0.05] * 90 + [0.2] * 10)
    pairs = value_counts(reversed(flat))
    assert pairs == [[0.0, 900], [0.05, 90], [0.2, 10]]
    data = json.loads(CALIBRATION.read_text())
    loaded = {}
    for name, stored in (("pairs", pairs), ("flat", flat)):
        path = tmp_path / f"{name}.json"
        path.write_text(dumps({**data, "plain_noise": stored}))
        loaded[name] = load_calibration(path)
        assert loaded[name].flip_probability(0.01) == pytest.approx(101 / 1001)
    assert loaded["pairs"].data["plain_noise"] == flat
    bad = tmp_path / "bad.json"
    bad.write_text(dumps({**data, "plain_noise": [[0.2, 1], [0.1, 1]]}))
    from conformance.contract import UsageError
    with pytest.raises(UsageError, match="ascending"):
        load_calibration(bad)


def test_calibrate_reaches_the_context_end_only_when_asked(adapter):
    """A run's largest float32 logprob deviations sit at its context-end prompts (~1000 tokens: RoPE angles
    in float32), which calibrate's default lengths (2-64) never reach; --max-prompt-len reaches them, with
    every fourth prompt in the top eighth, and leaves the default draws as they were."""
    import random

    from kvparity.commands.calibrate import prompt_lengths, prompt_top

    caps = adapter.capabilities()
    assert prompt_top(caps, 64, 16, 200) == 64 and prompt_top(caps, 1024, 24, 200) == caps.context_limit() - 25
    short = prompt_lengths(16, 64, random.Random(0), random.Random(1))
    rng = random.Random(0)
    assert short == [rng.randint(2, 64) for _ in range(16)]
    long = prompt_lengths(16, 999, random.Random(0), random.Random(1))
    assert all(n >= 999 - 999 // 8 for n in long[3::4]) and max(long) <= 999
