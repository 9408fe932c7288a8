"""End to end against the FAKE engine (tests/fake_engine.py): the clean fake passes, each injected bug is
caught by the check it belongs to, crashes are errors, and the report directory is complete."""

from __future__ import annotations

import json

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.run_config import RunConfig
from conformance.runner import ConformanceFailure, run_suite
from conformance.stateful import session_machine
from fake_engine import FakeDictEngine


def run(tmp_path, bug="none", shrink=False, max_examples=40, checks=None, seed=7, keep_looking=True,
        max_shrink_seconds=None, **kw):
    engine = FakeDictEngine(bug=bug, **kw)
    return run_suite(engine, RunConfig(engine_name=f"fake-{bug}", profile="dev", report_dir=tmp_path / "reports",
                                       seed=seed, max_examples=max_examples, database_dir=tmp_path / "db",
                                       shrink=shrink, timeout_s=2, checks=checks, keep_looking=keep_looking,
                                       max_shrink_seconds=max_shrink_seconds))


def test_clean_fake_passes_and_writes_a_complete_report(tmp_path):
    outcome = run(tmp_path)
    assert outcome.verdict == "pass", {k: (v.status, v.notes) for k, v in outcome.analysis.checks.items()}
    assert outcome.exit_code == 0
    for name in ("history.jsonl", "results.json", "report.md", "report.html", "junit.xml"):
        assert (outcome.run_dir / name).is_file()
    results = json.loads((outcome.run_dir / "results.json").read_text())
    assert results["verdict"] == "pass" and set(results["checks"]) >= {"parity", "isolation", "exercised"}
    assert "<svg" in (outcome.run_dir / "report.html").read_text()
    # the time inside engine calls is part of the run's (a share, not a speed: benchmarks/ measure those)
    assert 0 < results["engine_s"] <= results["duration_s"], (results["engine_s"], results["duration_s"])
    assert "of it inside engine calls" in (outcome.run_dir / "report.md").read_text()


def test_the_engine_share_of_a_run_says_when_more_shards_would_keep_the_engine_busy():
    from conformance.report.sections import engine_time

    assert engine_time(10.0, 8.0) == "80% of it inside engine calls (8.0 s)"  # the engine is the bottleneck
    assert engine_time(10.0, 2.0).endswith("the engine waited on kvparity most of the run: more shards keep it busy")
    assert engine_time(None, 2.0) is None and engine_time(10.0, None) is None and engine_time(0.0, 0.0) is None


@pytest.mark.parametrize("bug,check", [
    ("salt_leak", "isolation"),
    ("overreport", "isolation"),
    ("phantom", "isolation"),
    ("full_hit", "prefix_only"),
    ("wrong_after_hit", "parity"),
    ("wrong_after_hit", "history_independence"),
    ("spec_wrong", "spec_independence"),
    ("spec_overaccept", "accounting"),
    ("chunk_wrong", "schedule_independence"),
    ("leak_blocks", "rollback_hygiene"),
    ("no_report", "exercised"),
])
def test_injected_bug_is_caught_by_its_check(tmp_path, bug, check):
    outcome = run(tmp_path, bug, max_examples=100, checks=[check])
    assert outcome.analysis.checks[check].status == "fail", outcome.analysis.checks[check]
    assert outcome.exit_code == 1


@pytest.mark.parametrize("seed", [7, 1, 2024])
def test_near_ties_are_counted_not_failed_under_tolerance(tmp_path, seed):
    # The fake's near-tie fires on any request with a small margin (not only on cache hits), so this
    # holds for whatever scenarios a seed generates; several seeds prove it does not hang on one.
    lenient = run(tmp_path, "near_tie", tolerance="5", seed=seed, max_examples=20)
    assert lenient.analysis.checks["parity"].status == "pass" and lenient.analysis.near_ties > 0
    strict = run(tmp_path, "near_tie", tolerance="0", seed=seed, max_examples=20)
    assert strict.analysis.checks["parity"].status == "fail"


def test_failure_is_shrunk_to_a_small_witness_with_replay_command(tmp_path):
    """Ten seconds of Hypothesis' shrinking, then the minimiser (`--minimise`): together they reach one cached block and
    the last token. Shrinking alone cannot always: when the first failure it meets is in a `flood` (long
    prompts whose length is drawn from a range, and which stream that is depends on the local modules
    imported: Hypothesis draws their constants), it stays at the range's lower end."""
    from conformance.minimise import minimise_witness_file

    outcome = run(tmp_path, "wrong_after_hit", shrink=True, keep_looking=False, max_shrink_seconds=10)
    (f,) = [f for f in outcome.analysis.failures if f.check == "parity"]
    witness = outcome.run_dir / "witnesses" / f"{f.case_id}.json"
    assert witness.is_file() and f"kvparity replay {witness}" in (outcome.run_dir / "report.md").read_text()
    small = minimise_witness_file(witness, lambda: FakeDictEngine(bug="wrong_after_hit"), timeout_s=5) or witness
    steps = json.loads(small.read_text())["steps"]
    longest = max(len(q["prompt"]) for s in steps if s["step"] == "batch" for q in s["requests"])
    assert longest <= 2 * 4 + 1  # one cached block and the last token


@pytest.mark.parametrize("bug,cause", [("crash", "RuntimeError: fake engine crashed"),
                                       ("malformed", "run() returned list of length"),
                                       ("hang", "timed out")])
def test_engine_crash_hang_or_malformed_answer_is_an_error_with_history_kept(tmp_path, bug, cause):
    outcome = run(tmp_path, bug)
    assert outcome.verdict == "error" and outcome.exit_code == 3
    assert cause in outcome.analysis.errors[0] and "\n" not in outcome.analysis.errors[0]
    events = [json.loads(l)["event"] for l in (outcome.run_dir / "history.jsonl").read_text().splitlines()]
    assert events[0] == "run_start" and "error" in events


def test_state_machine_passes_clean_fake_and_catches_a_leak():
    fast = settings(max_examples=10, stateful_step_count=6, deadline=None, database=None,
                    phases=[Phase.generate])
    run_state_machine_as_test(session_machine(FakeDictEngine()), settings=fast)
    with pytest.raises(ConformanceFailure):
        run_state_machine_as_test(session_machine(FakeDictEngine(bug="wrong_after_hit")),
                                  settings=settings(fast, max_examples=50))


def test_a_run_remembers_the_first_example_each_check_failed_where_shrinking_ends_later(tmp_path):
    """`kvparity run --minimise` starts from it too: shrinking replays smaller failing examples after it,
    and the reported witness is the last of them."""
    outcome = run(tmp_path, bug="salt_leak", shrink=True, checks=["isolation"])
    assert outcome.verdict == "fail"
    (witness,) = [f for f in outcome.analysis.failures if f.check == "isolation"]
    assert outcome.first_failing["isolation"] < witness.example
    clean = run(tmp_path / "clean", checks=["isolation"])
    assert clean.first_failing == {}


def test_hypothesis_warning_about_a_large_repr_is_not_shown_and_other_warnings_are():
    """A failing stream's repr runs to tens of kB, and Hypothesis warned about it in the middle of a run's
    progress lines ("Use -Wignore ..."). The run does not show that warning; any other warning still shows.
    (A FAKE Hypothesis test standing in for the stream: what is tested is the run's phase around it.)"""
    import warnings

    from hypothesis import given, settings, strategies as st

    from conformance.history import HistoryWriter
    from conformance.runner import _run_phase

    @settings(max_examples=1, database=None, derandomize=True)
    @given(st.just("x" * 40_000))
    def fails(big):
        warnings.warn("an engine's own warning", UserWarning)
        raise AssertionError("a failure")

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _run_phase(fails, HistoryWriter(None))
    messages = [str(w.message) for w in seen]
    assert any("an engine's own warning" in m for m in messages), messages
    assert not any("overly large repr" in m for m in messages), messages
