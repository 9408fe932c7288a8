"""The right finding first: findings ordered by how directly they show the bug (shortest witness, then a
difference from plain decoding before a pair check's difference between two runs, then severity), each
headed by one sentence an engine developer would file, a pair check's two runs shown beside plain
decoding with the wrong one named; and, for five zoo faults with different mechanisms, a real dev-profile
run whose first finding names the planted mechanism's check and shows plain decoding beside the run.

The unit tests write histories event by event through the real `HistoryWriter` (tests/test_report.py's
`history_of`) and judge them with the real checks; the engine behind them is imagined.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.analysis import analyse
from conformance.contract import Baseline, Request, Result
from conformance.grouping import group
from conformance.report import report_md, results_json
from reference_engine.faults import FAULTS
from test_report import PROMPT, history_of, warm_then_other_identity

REPO = Path(__file__).resolve().parent.parent
OTHER = (21, 22, 23, 24, 25, 26, 27, 28)  # a prompt sharing nothing with PROMPT


def _short_wrong_example():
    """One request, four prompt tokens, output wrong at position 1, no mechanism in play: parity."""
    q = Request("r0", PROMPT[:4], 2)
    return [[(q, Result("r0", (5, 7), "length", cached_tokens=0))]], [(q, Baseline((5, 6), "length", (2.0, 2.0)))]


def _repeat_wrong_example():
    """r0 sends PROMPT and is right; r1 sends it again, hits the cache and is wrong: a pair check's
    difference between two runs (history_independence), 16 prompt tokens in 2 batches."""
    q0, q1 = Request("r0", PROMPT, 2), Request("r1", PROMPT, 2)
    r0 = Result("r0", (5, 6), "length", cached_tokens=0)
    r1 = Result("r1", (5, 9), "length", cached_tokens=4)
    return [[(q0, r0)], [(q1, r1)]], [(q0, Baseline((5, 6), "length", (2.0, 2.0)))]


def _other_prompt_wrong_example():
    """Same size as `_repeat_wrong_example` (16 prompt tokens, 2 batches) but nothing repeated: r1's
    output differs from plain decoding, with no mechanism in play (parity)."""
    q0, q1 = Request("r0", PROMPT, 2), Request("r1", OTHER, 2)
    r0, r1 = Result("r0", (5, 6), "length", cached_tokens=0), Result("r1", (3, 9), "length", cached_tokens=0)
    return [[(q0, r0)], [(q1, r1)]], [(q0, Baseline((5, 6), "length", (2.0, 2.0))),
                                      (q1, Baseline((3, 4), "length", (2.0, 2.0)))]


def test_the_shortest_witness_comes_first_even_before_a_critical_one():
    leak, leak_base = warm_then_other_identity(cached=8, drafts=None)  # isolation: critical, 17 tokens
    short, short_base = _short_wrong_example()  # parity: high, 4 tokens
    h = history_of([leak, short], leak_base + short_base)
    findings = group(h, analyse(h))
    assert [f.check for f in findings] == ["parity", "isolation"]
    assert findings[0].failure.example == 1


def test_at_the_same_size_a_difference_from_plain_decoding_comes_before_a_pair_check():
    pair, pair_base = _repeat_wrong_example()
    plain, plain_base = _other_prompt_wrong_example()
    h = history_of([pair, plain], pair_base + plain_base)
    findings = group(h, analyse(h))
    assert findings[0].failure.example == 1 and findings[0].check == "parity"
    assert findings[1].check == "history_independence" and findings[1].failure.witness.get("earlier_output")


def test_a_pair_check_shows_plain_decoding_beside_both_runs_and_names_the_wrong_one():
    pair, base = _repeat_wrong_example()
    h = history_of([pair], base)
    results = results_json(h, analyse(h), {})
    (fd,) = results["findings"]
    d = fd["story"]["divergence"]
    assert d["pairwise"] and d["baseline"] == [5, 6] and d["wrong"] == "got"
    md = report_md(results)
    assert "| plain decoding | 5 | 6 |" in md
    assert ("**Which run is wrong**: the run in batch 0 matches plain decoding; the run in batch 1 "
            "differs from it.") in md
    assert fd["headline"] == ("A repeated request's output differs from plain decoding after a prefix-cache hit "
                              "(4 cached tokens) (request r1, position 1)")


def test_the_headline_is_a_sentence_with_the_situation_and_the_place():
    leak, base = warm_then_other_identity(cached=0, drafts=3)  # speculation bug
    h = history_of([leak], base)
    (fd,) = results_json(h, analyse(h), {})["findings"]
    assert fd["headline"] == "Output differs from plain decoding with speculative decoding (request r1, position 1)"
    assert f"### 1. {fd['headline']}" in report_md(results_json(h, analyse(h), {}))


def test_the_reference_adapter_names_its_oracle():
    from adapters.reference import ReferenceAdapter

    assert "plain greedy decoding" in ReferenceAdapter().capabilities().oracle


# --------------------------------------------------------------------------- five zoo faults, real runs

# The checks that name each planted mechanism (the cache-hit fault has two: the hit's count, and the
# output after the hit).
MECHANISM_CHECK = {"salt_ignored": {"isolation"}, "hit_uncapped": {"prefix_only", "history_independence"},
                   "rejected_draft_committed": {"spec_independence"},
                   "chunk_positions_from_chunk_start": {"schedule_independence"},
                   "evict_referenced": {"eviction_safety"}}
PLANTED = tuple(MECHANISM_CHECK)


@pytest.mark.slow
@pytest.mark.parametrize("fault", PLANTED)
def test_a_dev_run_s_first_finding_names_the_planted_mechanism_and_shows_plain_decoding(fault, tmp_path):
    """`kvparity run --profile dev` on the reference engine with one zoo fault: the first finding is
    listed under the check of the planted mechanism (one of the fault's expected checks) and shows plain
    decoding beside the engine's run (a pair check: beside both runs, the wrong one named)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "kvparity", "run", "--engine", "reference", "--engine-arg",
                           f"fault={fault}", "--profile", "dev", "--max-shrink-seconds", "20", "--seed", "0", "-q",
                           "--report-dir", str(tmp_path / "runs")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "not named by the adapter" not in proc.stdout
    (results_file,) = (tmp_path / "runs").glob("reference/*/results.json")
    first = json.loads(results_file.read_text())["findings"][0]
    assert first["check"] in MECHANISM_CHECK[fault], (first["check"], first["headline"])
    assert first["check"] in FAULTS[fault].expected
    assert f"first finding: {first['headline']}" in proc.stdout
    d, plain = first["story"]["divergence"], first["story"]["plain"]
    if d is not None:
        assert d["baseline"] is not None
        assert d["wrong"] in ("got", "expected", "both") if d["pairwise"] else d["expected_from"] == "plain greedy decoding"
    else:  # a leak whose tokens are right: the output beside plain decoding says so
        assert plain is not None and plain["baseline"] is not None
    report = (results_file.parent / "report.md").read_text()
    assert "plain decoding" in report.split("### 2.")[0]
    assert (results_file.parent / "witness-1.svg").is_file()


def test_the_readme_s_first_screen_is_the_newcomer_path():
    """Install (with the venv activated), a passing run, a failing run and how to read it, where next —
    before the first reference section."""
    readme = (REPO / "README.md").read_text()
    first = readme[: readme.index("### Choosing a torch build")]
    for needed in ("make setup", "source .venv/bin/activate", "kvparity run --engine reference --profile ci",
                   "--engine-arg fault=salt_ignored", "Reading the failing run", "report.html", "lane diagram",
                   "kvparity replay", "docs/adapters.md", "make test"):
        assert needed in first, needed
    assert len(first.splitlines()) < 60
