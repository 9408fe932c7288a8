"""`kvparity mutate` (issue 28 part 1): mutants of the reference engine's decision code made by
cosmic-ray, run through the suite black-box, and the bounded differential search that tells an
equivalent mutant from a survivor. The CI sample is fixed and small: one killable mutant (the prefix
hit not capped at Lin - 1) is killed and the unmutated engine passes; the differential search classifies
the unmutated engine against itself equivalent and a mutant that changes only a reported count a
survivor. A mutant that changes nothing an engine shows, run through the whole path (suite, then
differential, then the report), is classified equivalent under `-m slow`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvparity.commands import mutate
from kvparity.commands.mutate import differ, report
from kvparity.commands.mutate.suite import run_suite_on
from kvparity.commands.mutate.mutants import (DECISION_MODULES, EXCLUDED_OPERATORS, MutantTree, diff,
                                              enumerate_mutants, sample, source_root)
from adapters.reference import ReferenceAdapter
from conformance.contract import UsageError

KILLABLE = "prefix_cache:71:NumberReplacer#1"  # hit_limit: num_tokens - 1 -> num_tokens - 0 (hit uncapped)
EQUIVALENT = "prefix_cache:77:NumberReplacer#2"  # max(0, limit) // bs -> max(1, limit) // bs: same for bs > 1
COUNT_ONLY = "prefix_cache:71:NumberReplacer#0"  # num_tokens - 1 -> num_tokens - 2: one block less reused


def _by_name(name: str):
    return next(m for m in enumerate_mutants(["prefix_cache"]) if m.name == name)


# -- the mutants -------------------------------------------------------------------------------------------
def test_mutants_cover_every_decision_module_and_are_named_stably():
    population = enumerate_mutants()
    assert {m.module for m in population} == set(DECISION_MODULES)
    assert not {m.operator for m in population} & set(EXCLUDED_OPERATORS)  # no operator that draws at random
    assert [m.name for m in enumerate_mutants()] == [m.name for m in population]
    assert "- 1" in diff(_by_name(KILLABLE)) and "+        return num_tokens - 0" in diff(_by_name(KILLABLE))


def test_sample_is_seeded_and_stratified_by_module():
    population = enumerate_mutants()
    a, b, c = sample(population, 30, 0), sample(population, 30, 0), sample(population, 30, 1)
    assert a == b and a != c and len(a) == 30
    assert {m.module for m in a} == set(DECISION_MODULES)


def test_a_mutant_lives_in_a_temporary_copy_never_in_the_working_tree():
    m = _by_name(KILLABLE)
    original = (source_root() / "prefix_cache.py").read_text()
    with MutantTree(m) as src:
        mutated = (src / "reference_engine" / "prefix_cache.py").read_text()
        assert mutated != original and "return num_tokens - 0" in mutated
        assert (src / "reference_engine" / "checkpoints").is_dir()  # linked, so the engine loads its models
        assert (src / "reference_engine" / "engine.py").read_text() == (source_root() / "engine.py").read_text()
    assert not src.exists()
    assert (source_root() / "prefix_cache.py").read_text() == original


# -- black-box: the adapter can declare no introspection ----------------------------------------------------
def test_reference_adapter_introspection_off_declares_none():
    assert ReferenceAdapter().capabilities().introspection is True
    assert ReferenceAdapter(introspection="off").capabilities().introspection is False
    with pytest.raises(UsageError, match="introspection"):
        ReferenceAdapter(introspection="sometimes")


# -- the CI sample: killed, control passes; the whole path to "equivalent" under -m slow -------------------
def _sample(tmp_path, capsys, mutants: list[str], max_examples: int) -> dict[str, dict]:
    """`kvparity mutate` over `mutants` (the control first): its rows by mutant, after asserting that the
    control passed and that nothing survived."""
    out = tmp_path / "mutation"
    code = mutate.main(["--mutants", ",".join(mutants), "--profile", "ci", "--max-examples", str(max_examples),
                        "--diff-scenarios", "6", "--diff-seconds", "60", "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["control"].startswith("blackbox seed 0: pass")
    readme = (out / "README.md").read_text()
    assert "blackbox, seed 0**: 100%" in readme and "## Survivors\n\nNone." in readme
    return {r["mutant"]["name"]: r for r in results["rows"]}


def test_ci_sample_kills_the_killable_mutant_and_passes_the_control(tmp_path, capsys):
    rows = _sample(tmp_path, capsys, [KILLABLE], 10)
    assert rows[KILLABLE]["outcome"].startswith("killed")


@pytest.mark.slow  # 70 s: the equivalent mutant's suite run and differential search; CI proves the
# classifier both ways below (test_differential_search_...: equivalent and survivor) without the suite run
def test_a_mutant_the_suite_cannot_kill_and_that_changes_nothing_is_classified_equivalent(tmp_path, capsys):
    rows = _sample(tmp_path, capsys, [KILLABLE, EQUIVALENT], 30)
    assert rows[KILLABLE]["outcome"].startswith("killed")
    assert rows[EQUIVALENT]["outcome"] == "survived-suite" and rows[EQUIVALENT]["classification"] == "equivalent"


def test_differential_search_keeps_the_smallest_differing_scenario_of_a_survivor(tmp_path):
    scenarios = differ.draw_scenarios(6, 0, "ci", blackbox=True)
    assert scenarios == differ.draw_scenarios(6, 0, "ci", blackbox=True)  # seeded: the same every time
    with MutantTree(None) as src:
        reference = differ.run_observer(src, differ.engine_args(True), scenarios, 120, tmp_path / "ref")
    with MutantTree(_by_name(COUNT_ONLY)) as src:
        mutated = differ.run_observer(src, differ.engine_args(True), scenarios, 120, tmp_path / "mut")
    c = differ.classify(reference, mutated, scenarios)
    assert c.verdict == "survivor" and c.compared == 6 and c.fields == ("cached_tokens",)
    sizes = [differ.scenario_size(s) for s, a, b in zip(scenarios, reference, mutated)
             if differ.first_difference(a, b) is not None]
    assert differ.scenario_size(c.scenario) == min(sizes)
    assert differ.classify(reference, reference, scenarios).verdict == "equivalent"
    assert differ.classify(reference, [None] * 6, scenarios).verdict == "undecided"  # nothing compared


def test_a_suite_run_past_its_limit_is_unfinished_not_killed(tmp_path):
    with MutantTree(None) as src:
        r = run_suite_on(src, tmp_path / "run", profile="ci", seed=0, blackbox=True, max_examples=None, limit_s=1)
    assert r.outcome == "unfinished" and r.exit_code is None
    assert report.status({"outcome": r.outcome}) == "unfinished"  # left out of the score, reported


# -- fail closed ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, says", [
    (["--modules", "model"], "--modules"),
    (["--mutants", "prefix_cache:1:Nothing#0"], "no such mutant"),
    (["--seeds", "a"], "integers"),
    (["--bar", "2"], "between 0 and 1"),
])
def test_bad_arguments_are_one_line_and_exit_3(argv, says, capsys):
    assert mutate.main(argv) == 3
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_list_prints_the_sample_without_running_anything(capsys, tmp_path):
    assert mutate.main(["--list", "--sample", "5", "--out", str(tmp_path / "m")]) == 0
    names = capsys.readouterr().out.split()
    assert len(names) == 5 and all(n.split(":")[0] in DECISION_MODULES for n in names)
    assert not (tmp_path / "m").exists()


def test_the_claims_score_leaves_out_only_survivors_that_differ_in_counts_no_claim_covers():
    """A drafter proposing other drafts (same outputs) is a survivor of the strict score, not of the
    contract's claims; a survivor with another cached count or output counts against both."""
    from kvparity.commands.mutate.report import claims_score, score, tally

    def row(outcome, classification=None, differs=()):
        return {"outcome": outcome, "classification": classification, "differs_in": list(differs)}

    rows = [row("killed")] * 8 + [row("survived-suite", "survivor", ["draft_proposed"]),
                                  row("survived-suite", "survivor", ["cached_tokens", "evictions"]),
                                  row("survived-suite", "equivalent")]
    t = tally(rows)
    assert t["survivor"] == 2 and t["survivor-free-counts"] == 1 and t["equivalent"] == 1
    assert score(t) == 8 / 10 and claims_score(t) == 8 / 9
    assert claims_score(tally([row("survived-suite", "survivor", ["output"])])) == 0.0


def _obs(finish: str, free: bool, cached: int | None = 0) -> list[dict]:
    row = {"request_id": "r0", "output": [] if finish == "refused" else [7], "finish_reason": finish,
           "cached_tokens": cached}
    return [{"results": [{**row, "free": True} if free else row], "snapshot": None}]


def test_a_refusal_past_the_declared_limits_is_no_difference_but_one_within_them_is():
    # Past the limits the contract lets an engine refuse or answer exactly: either is conformant.
    assert differ.first_difference(_obs("length", True), _obs("refused", True)) is None
    # Within them a refusal is a wrong answer, and past them an answer still has to be the same answer.
    assert differ.first_difference(_obs("length", False), _obs("refused", False)) is not None
    assert differ.first_difference(_obs("length", True), _obs("length", True, cached=16)) is not None


def test_after_a_refusal_meets_an_answer_only_answers_are_compared():
    # One engine answered a request past the limits that the other refused: both conformant, and from then
    # on each holds other KV, so later counts may differ (evictions, cached tokens) but answers may not.
    def step(finish: str, free: bool, evictions: int, output=(7,)) -> dict:
        return {"results": [{"request_id": "r", "output": [] if finish == "refused" else list(output),
                             "finish_reason": finish, "evictions": evictions, **({"free": True} if free else {})}],
                "snapshot": None}

    unmutated = [step("length", True, 0), step("length", False, 3)]
    assert differ.first_difference(unmutated, [step("refused", True, 0), step("length", False, 5)]) is None
    assert differ.first_difference(unmutated, [step("refused", True, 0), step("length", False, 5, (8,))]) == {
        "observation": 1, "unmutated": unmutated[1], "mutant": step("length", False, 5, (8,))}
    # The refused request's batch-mates shared the step and the pool with it: their counts may differ too.
    def pair(finish: str, evictions: int) -> dict:
        return {"results": step(finish, True, 0)["results"] + step("length", False, evictions)["results"],
                "snapshot": None}

    assert differ.first_difference([pair("length", 3)], [pair("refused", 5)]) is None
    # Without that divergence the same count is a difference.
    assert differ.first_difference([step("length", True, 0), step("length", False, 3)],
                                   [step("length", True, 0), step("length", False, 5)]) is not None
