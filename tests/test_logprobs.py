"""Per-token logprobs (issue 29): the contract's boundary both ways, the history codec, logprob_parity
both ways on crafted histories (and "not run" without a calibration), the reference engine against its
own oracle, and the in-place KV mutation fault caught by logprob_parity where the tokens stay equal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conformance import validation
from conformance.analysis import analyse
from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, evolve
from conformance.history_codec import baseline_from, encode, oracle_key_str, result_from
from conformance.numerics import load_calibration
from conformance.scenario import Batch, Configure
from conformance.scenario_runner import replay
from tests.test_conformance_checks import CAPS, Crafted, req

CALIBRATION = Path(__file__).resolve().parent.parent / "reports" / "calibration" / "reference.json"
LP_CAPS = evolve(CAPS, logprobs_k=2, logprob_epsilon=1e-6)
GOOD = (((5, -0.1), (6, -2.5)), ((6, -0.2), (9, -1.9)))


def check(lps, output=(5, 6), caps: Capabilities = LP_CAPS) -> None:
    validation.result(Request("q", [1, 2], 2), Result("q", output, "length", logprobs=lps), caps)


# ---------------------------------------------------------------- the boundary


def test_well_formed_logprobs_pass_the_boundary():
    check(GOOD)
    check((((7, -0.1), (8, -0.3), (5, -4.0)), ((6, -0.2),)))  # chosen outside the top-2: k + 1 pairs


@pytest.mark.parametrize("lps, why", [
    ((((5, -0.1),),), "one entry per output token"),
    ((((5, float("nan")),), ((6, -0.2),)), "finite"),
    ((((5, 0.5),), ((6, -0.2),)), "above 0"),
    ((((6, -2.5), (5, -0.1)), ((6, -0.2),)), "not sorted"),
    ((((7, -0.1), (8, -0.2)), ((6, -0.2),)), "lack the chosen token"),
    ((((5, -0.1), (5, -0.2)), ((6, -0.2),)), "repeat"),
    ((((5, -0.1), (1, -1.0), (2, -2.0), (3, -3.0)), ((6, -0.2),)), "k + 1"),
    ((((500, -0.1),), ((6, -0.2),)), "outside the vocabulary"),
    ((((5, "x"),), ((6, -0.2),)), "not (token id, finite logprob)"),
])
def test_malformed_logprobs_are_an_engine_error_naming_why(lps, why):
    with pytest.raises(EngineError, match="logprobs") as exc:
        check(lps)
    assert why in str(exc.value)


def test_logprobs_from_an_engine_that_declares_no_k_are_refused():
    with pytest.raises(EngineError, match="logprobs_k is 0"):
        check(GOOD, caps=evolve(LP_CAPS, logprobs_k=0))


def test_capabilities_refuse_a_bad_k_or_epsilon():
    for bad in ({"logprobs_k": -1}, {"logprob_epsilon": float("inf")}, {"logprob_epsilon": -1.0}):
        with pytest.raises(EngineError):
            validation.capabilities(evolve(LP_CAPS, **bad))


def test_history_codec_round_trips_logprobs_and_reads_old_lines():
    r = Result("q", (5, 6), "length", logprobs=GOOD)
    assert result_from(json.loads(json.dumps(encode(r)))) == r
    b = Baseline((5, 6), "length", (2.0, 1.0), logprobs=GOOD)
    assert baseline_from(json.loads(json.dumps(encode(b)))) == b
    old = {"request_id": "q", "output": [5], "finish_reason": "length"}
    assert result_from(old).logprobs is None
    assert baseline_from({"output": [5], "finish_reason": "length"}).logprobs == ()


# ---------------------------------------------------------------- the check on crafted histories

P = tuple(range(10, 22))
Q = req("q", P, max_tokens=2)
ORACLE = (((5, -0.1), (6, -2.5)), ((6, -0.2), (9, -1.9)))


def crafted(engine_lps, output=(5, 6), caps: Capabilities = LP_CAPS) -> Crafted:
    h = Crafted(caps).batch((Q, Result("q", output, "length", cached_tokens=0, logprobs=engine_lps)))
    h.w.append("baseline", key=oracle_key_str(Q),
               baseline=Baseline((5, 6), "length", (2.4, 1.7), (6, 9), logprobs=ORACLE))
    return h


def test_logprob_parity_passes_within_epsilon():
    h = crafted((((5, -0.1 + 1e-7), (6, -2.5)), ((6, -0.2), (9, -1.9 - 5e-7))))
    assert h.status("logprob_parity") == "pass"


def test_logprob_parity_fails_above_epsilon_though_every_token_matches():
    h = crafted((((5, -0.1), (6, -2.5)), ((6, -0.2003), (9, -1.9))))
    assert h.status("parity") == "pass"
    (f,) = h.failures("logprob_parity")
    w = f.witness
    assert (w["logprob_position"], w["logprob_token"]) == (1, 6)
    assert w["logprob_deviation"] == pytest.approx(3e-4) and w["request"]["id"] == "q"
    assert w["logprob_deviations"][0] == 0 and "epsilon" in f.explanation


def test_the_report_shows_the_deviations_beside_the_tokens_not_a_finish_reason():
    from conformance.report import report_md, results_json

    h = crafted((((5, -0.1), (6, -2.5)), ((6, -0.2003), (9, -1.9)))).history()
    md = report_md(results_json(h, analyse(h), {}))
    assert "**Below the argmax**" in md and "| abs. logprob difference | 0 | **0.0003** |" in md
    assert "finish reason `None`" not in md


def test_logprob_parity_compares_the_divergent_position_and_nothing_after():
    # position 1 diverges (9 instead of 6): its distribution is compared (same conditioning); a third
    # position would condition on other tokens and is not
    h = crafted((((5, -0.1), (6, -2.5)), ((9, -0.5), (6, -0.6))), output=(5, 9))
    (f,) = h.failures("logprob_parity")
    assert f.witness["logprob_position"] == 1 and f.witness["logprob_token"] == 9


def test_logprob_parity_is_not_run_without_a_calibration():
    h = crafted((((5, -3.0), (6, -3.5)), ((6, -0.2), (9, -1.9))), caps=evolve(LP_CAPS, logprob_epsilon=None))
    assert h.status("logprob_parity") == "skip"
    assert "not run" in analyse(h.history(), ["logprob_parity"]).checks["logprob_parity"].notes[0]


def test_logprob_parity_does_not_apply_to_an_engine_without_logprobs():
    h = crafted(None, caps=evolve(LP_CAPS, logprobs_k=0))
    assert h.status("logprob_parity") == "skip"


# ---------------------------------------------------------------- the reference engine and the fault


def _steps(prompt, n=3):
    return [Configure({}), *(Batch([Request(f"r{i}", prompt, 6)]) for i in range(n))]


def test_reference_engine_logprobs_match_its_oracle_within_the_committed_epsilon():
    from adapters.reference import ReferenceAdapter

    cal = load_calibration(CALIBRATION)
    assert cal.logprob_epsilon is not None and 0 < cal.logprob_epsilon < 1e-10
    engine = ReferenceAdapter()
    caps = evolve(validation.capabilities(engine.capabilities()), logprob_epsilon=cal.logprob_epsilon)
    result, crashed = replay(engine, caps, _steps(tuple(range(40, 80))), "logprob_parity")
    assert crashed is None and result.status == "pass" and result.stats["compared"] > 0


def test_in_place_kv_mutation_is_caught_by_logprobs_while_the_tokens_stay_equal():
    from adapters.reference import ReferenceAdapter

    cal = load_calibration(CALIBRATION)
    engine = ReferenceAdapter(fault="shared_kv_mutated_in_place")
    caps = evolve(validation.capabilities(engine.capabilities()), logprob_epsilon=cal.logprob_epsilon)
    steps = _steps(tuple(range(40, 80)))
    lp, _ = replay(engine, caps, steps, "logprob_parity")
    assert lp.status == "fail", lp
    w = lp.failures[0].witness
    assert w["cached_tokens"] and w["logprob_deviation"] > 1e3 * cal.logprob_epsilon
    assert math.isfinite(w["logprob_deviation"]) and w["output"] == w["expected_output"]
    tokens, _ = replay(ReferenceAdapter(fault="shared_kv_mutated_in_place"), caps, steps, "parity")
    assert tokens.status == "pass"  # the token check alone is blind to it here


# ---------------------------------------------------------------- calibration, export, the zoo's options


def test_calibrate_measures_logprob_epsilon_that_run_reads(tmp_path):
    from kvparity.commands import calibrate

    out = tmp_path / "cal.json"
    assert calibrate.main(["--engine", "reference", "--out", str(out), "--prompts", "4", "--max-tokens", "3",
                           "--batch-sizes", "2"]) == 0
    cal = load_calibration(out)
    section = json.loads(out.read_text())["logprobs"]
    assert set(section["sources"]) == {"oracle", "batch", "config"} and section["sources"]["config"]["n"] > 0
    assert cal.logprob_epsilon == pytest.approx(sum(s["max"] for s in section["sources"].values()))
    data = json.loads(out.read_text())
    del data["logprobs"]  # a file written before logprobs were measured
    out.write_text(json.dumps(data))
    assert load_calibration(out).logprob_epsilon is None


def test_a_logprob_witness_is_not_exported_to_a_checker_that_cannot_see_it(tmp_path):
    from conformance.contract import UsageError
    from kvparity.commands import export

    witness = CALIBRATION.parent.parent / "fault-zoo" / "witnesses" / "shared_kv_mutated_in_place.json"
    with pytest.raises(UsageError, match="cannot be exported"):
        export.export(witness, tmp_path / "x.py")


def test_fault_zoo_refuses_a_bad_calibration_or_check_before_running(tmp_path):
    from conformance.contract import UsageError
    from kvparity.commands.fault_zoo import parse_args

    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    out = str(tmp_path / "z.md")
    with pytest.raises(UsageError, match="calibration"):
        parse_args(["--calibration", str(bad), "--out", out])
    with pytest.raises(UsageError, match="unknown check"):
        parse_args(["--checks", "parity,logprob_parit", "--out", out])
    args = parse_args(["--checks", "parity,logprob_parity", "--calibration", str(CALIBRATION), "--out", out])
    assert args.check_names == ["parity", "logprob_parity"]
