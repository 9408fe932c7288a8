"""conformance.economics on hand-built Results (each claim both ways), and a CI-size `kvparity bench` run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance import economics as ec
from conformance.contract import Result


def res(rid="r", n=3, cached=None, lin=10, proposed=None, accepted=None, timings=None, **extra) -> Result:
    return Result(rid, tuple(range(5, 5 + n)), "length", cached_tokens=cached, draft_proposed=proposed,
                  draft_accepted=accepted, timings=timings or {}, extra={"prompt_tokens": lin, **extra})


# -- reuse ratio ------------------------------------------------------------------------------------
def test_reuse_ratio_is_token_weighted_not_a_mean_of_ratios():
    stream = [res("a", cached=96, lin=100), res("b", cached=0, lin=20), res("c", cached=16, lin=40)]
    r = ec.reuse_ratio(stream)
    assert (r.num, r.den) == (112, 160) and r.value == pytest.approx(0.7)
    mean_of_ratios = (96 / 100 + 0 + 16 / 40) / 3
    assert r.value != pytest.approx(mean_of_ratios)


def test_reuse_ratio_unknown_when_engine_reports_no_hits_and_zero_when_it_reports_zero():
    assert ec.reuse_ratio([res("a"), res("b")]) is None
    assert ec.reuse_ratio([res("a", cached=0), res("b", cached=0)]).value == 0.0


def test_reuse_ratio_takes_prompt_lengths_from_a_mapping_and_refuses_to_guess():
    r = Result("x", (1,), "length", cached_tokens=3)
    assert ec.reuse_ratio([r], {"x": 4}).value == 0.75
    with pytest.raises(ValueError):
        ec.reuse_ratio([r])


# -- latency budget ---------------------------------------------------------------------------------
def test_latency_budget_decomposes_ttft_into_queue_and_prefill_and_decode_into_tpot():
    a = res("a", n=5, timings={"ttft_s": 0.5, "tpot_s": 0.1}, queue_s=0.2, ttft_cost=30, tpot_cost=4.0, queue_cost=10)
    b = res("b", n=1, timings={"ttft_s": 0.3}, queue_s=0.0, ttft_cost=12, queue_cost=0)
    wall = ec.latency_budget([a, b])
    assert wall.queue.p50 == pytest.approx(0.1) and wall.prefill.max == pytest.approx(0.3)
    assert wall.prefill.p50 == pytest.approx(0.3) and wall.prefill.n == 2  # 0.5 - 0.2 and 0.3 - 0
    assert wall.decode.max == pytest.approx(0.4) and wall.decode.n == 2  # (5-1)*0.1 and a 1-token request: 0
    assert wall.tpot.n == 1
    units = ec.latency_budget([a, b], "cost")
    assert units.queue.max == 10 and units.prefill.max == 20 and units.decode.max == 16


def test_latency_budget_reports_unknown_not_zero_for_unreported_timings():
    b = ec.latency_budget([res("a", n=4)])
    assert b.ttft.n == 0 and b.ttft.p50 is None and b.queue.p50 is None and b.decode.p50 is None


def test_inter_token_gaps_window_counts_gaps_ending_inside_it_only():
    a = res("a", token_times_s=[0.0, 1.0, 1.0, 4.0, 5.0])
    assert ec.inter_token_gaps([a]) == [1.0, 0.0, 3.0, 1.0]
    assert ec.inter_token_gaps([a], (1.0, 4.0)) == [3.0]  # the gap ending at the window start is excluded


def test_percentile_interpolates_and_handles_empty():
    assert ec.percentile([1, 2, 3, 4], 50) == 2.5
    assert ec.percentile([7], 99) == 7
    assert ec.percentile([], 50) is None
    d = ec.Dist.of([None, 1.0, 3.0])
    assert (d.n, d.mean, d.max) == (2, 2.0, 3.0)


# -- speculation ------------------------------------------------------------------------------------
def test_acceptance_overall_and_per_position_aggregate_over_requests():
    a = res("a", proposed=6, accepted=3, proposed_per_position=[2, 2, 2], accepted_per_position=[2, 1, 0],
            verification_steps=2)
    b = res("b", proposed=3, accepted=3, proposed_per_position=[1, 1, 1], accepted_per_position=[1, 1, 1],
            verification_steps=1)
    acc = ec.acceptance([a, b, res("plain")])
    assert acc.alpha == pytest.approx(6 / 9)
    assert acc.alpha_per_position == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)]
    assert acc.committed_per_verification == pytest.approx((6 + 3) / 3)
    assert ec.acceptance([res("plain")]) is None


def test_predicted_speedup_formula_limits_and_values():
    assert ec.predicted_speedup(0.0, 4, 0.0) == 1.0
    assert ec.predicted_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)  # all rejected, drafts still cost
    assert ec.predicted_speedup(1.0, 4, 0.0) == 5.0
    assert ec.predicted_speedup(0.5, 2, 0.0) == pytest.approx(1.75)  # 1 + .5 + .25
    assert ec.predicted_speedup(0.8, 3, 0.1) == pytest.approx((1 - 0.8 ** 4) / (0.2 * 1.3))
    for alpha in (0.3, 0.6, 0.9):  # the closed form is the expected accepted run + 1
        assert ec.predicted_speedup(alpha, 4, 0.0) == pytest.approx(sum(alpha ** i for i in range(5)))
    assert ec.predicted_speedup(0.99999, 4, 0.0) == pytest.approx(5.0, rel=1e-4)
    with pytest.raises(ValueError):
        ec.predicted_speedup(1.5, 4, 0.0)


def test_twelve_nine_eighteen():
    w = ec.worked_example()
    assert (w["plain"]["cost"], w["cheap"]["cost"], w["dear"]["cost"]) == (12, 9, 18)
    assert w["cheap"]["tokens"] == w["dear"]["tokens"] == w["plain"]["tokens"] == 3
    assert w["dear"]["alpha"] >= w["cheap"]["alpha"] == 0.4
    m = ec.CostModel(3, 1, 0)
    assert m.target_pass(1) == 4 and m.plain(3) == 12 and m.verification(5) == 9 and m.target_pass(0) == 0
    assert m.with_draft(1.8).verification(5) == pytest.approx(18) and m.with_draft(1.8).c == pytest.approx(0.45)
    # the other way: speculation that accepts everything with free drafts is cheaper than 9
    assert ec.rounds_cost(m, [(2, 2)]) == (6, 3, 1.0)


def test_cost_per_token_prices_what_the_engine_did_and_speedup_compares_per_token():
    m = ec.CostModel(3, 1, 1.8)
    plain = res("p", n=4, timings={"tpot_s": 0.01}, decode_passes=3, decode_forwards=3)
    spec = res("s", n=4, proposed=5, accepted=2, timings={"tpot_s": 0.02}, decode_passes=1, decode_forwards=6)
    cp, cs = ec.cost_per_token([plain], m), ec.cost_per_token([spec], m)
    assert cp.units == 12 and cp.tokens == 3 and cs.units == pytest.approx(18)
    assert ec.cost_per_token([spec], m.with_draft(0)).units == 9
    wall, units = ec.speedup(cp, cs)
    assert wall == pytest.approx(0.5) and units == pytest.approx(12 / 18)
    assert ec.cost_per_token([res("x", n=4)], m).units is None  # not recorded: unknown


def test_temporary_kv_sums_blocks_and_takes_peak_from_the_step_trace():
    a = res("a", provisional_allocated=5, provisional_freed=4)
    b = res("b", provisional_allocated=2, provisional_freed=2)
    t = ec.temporary_kv([a, b], [{"provisional_allocated": 1}, {"provisional_allocated": 3}, {}])
    assert (t.allocated, t.freed, t.promoted, t.peak) == (7, 6, 1, 3)
    assert ec.temporary_kv([a]).peak is None
    assert ec.temporary_kv([res("plain")]) is None


def test_economics_imports_no_engine():
    code = ("import sys, conformance.economics; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('reference_engine', 'adapters', 'torch', 'transformers')]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# -- the bench --------------------------------------------------------------------------------------
def test_ci_bench_on_reference_engine_writes_the_report(tmp_path):
    pytest.importorskip("matplotlib")
    from kvparity.commands import bench

    # No timed assertion: the bench's speed is measured by benchmarks/, never asserted on a shared machine.
    assert bench.main(["--engine", "reference", "--size", "ci", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    for png in ("latency_budget.png", "chunked_prefill.png", "speedup.png", "acceptance_per_position.png"):
        assert (tmp_path / png).stat().st_size > 1000
        assert png in md and png in html
    for needle in ("reuse ratio", "shared system prompt", "multi-turn chat", "no sharing", "12 / 9 / 18",
                   "shared 2-core CPU", "torch", "Temporary KV", "Chunked prefill"):
        assert needle in md
    from kvparity.commands.bench.collect import draft_available

    if draft_available() and (tmp_path / "worked_12_9_18.png").exists():  # the engine demonstration ran
        rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
        assert "| 12.0 |" in rows["plain"] and "| 9.0 |" in rows["n-gram k=5"]
        assert "| 18.0 |" in rows["draft model k=5"] and "| 0.40 |" in rows["draft model k=5"]


# -- the bench command: defaults and usage errors ----------------------------------------------------
def test_bench_default_out_is_the_untracked_kvparity_folder():
    from pathlib import Path

    from kvparity.commands import bench

    args = bench.build_parser().parse_args([])
    assert Path(args.out) == Path(".kvparity/economics") and (args.engine, args.size, args.k) == ("reference", "ci", 4)


def test_bench_help_shows_every_default(capsys, monkeypatch):
    from kvparity import cli

    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["bench", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default: .kvparity/economics)", "(default: reference)", "(default: ci)", "(default: 4)"):
        assert default in out, default


@pytest.mark.parametrize("argv", [["--k", "0"], ["--k", "-2"], ["--k", "nan"], ["--size", "huge"],
                                  ["--engine", "vllm"], ["--bogus"], ["--out", "README.md"],
                                  ["--out", "README.md/economics"]], ids=" ".join)
def test_bench_usage_error_is_one_line_exit_3_before_any_engine(argv, capsys, monkeypatch):
    from pathlib import Path

    from kvparity.commands import bench
    from kvparity import cli

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # README.md: an existing file

    def refuse(*args, **kwargs):
        raise AssertionError("bench ran an engine for a usage error")

    monkeypatch.setattr(bench, "bench", refuse)
    assert cli.main(["bench", *argv]) == 3
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("kvparity bench: error: ")
