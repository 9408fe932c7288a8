"""Reports an engine developer acts on: each check's own counts, the coverage table, findings grouped by
root and told as stories (timeline, aligned expected-vs-got tokens and text, whose KV was reused), the
same content in report.md and report.html, decoded text kept across re-analysis, and run progress.

The histories here are written event by event through the real `HistoryWriter` and judged by the real
checks; the engine behind them is imagined (two or three requests with chosen outputs), which is what
makes each grouping decision testable both ways. `fake_decode` is a FAKE tokenizer: letters for ids.
"""

from __future__ import annotations

import io
import json
import re

from conformance.analysis import Analysis, analyse
from conformance.contract import Baseline, Capabilities, Identity, Request, Result
from conformance.grouping import group
from conformance.history import HistoryWriter, History, parse
from conformance.history_codec import oracle_key_str
from conformance.progress import Progress
from conformance.report import report_html, report_md, results_json, write_report
from conformance.report.exercised import bar_chart, counts_text
from conformance.report.story import story

CAPS = Capabilities(name="imagined", vocab_size=64, max_context=256, block_size=4, prefix_caching=True,
                    reports_cached_tokens=True, speculation=True, reports_drafts=True, identities={"salt"},
                    min_hit_prompt=2)
PROMPT = (11, 12, 13, 14, 15, 16, 17, 18)
TENANT = Identity(salt="tenant-b")


def fake_decode(ids):
    """FAKE tokenizer: id -> a letter (tests the report's text handling, not a tokenizer)."""
    return "".join(chr(ord("a") + int(t) % 26) for t in ids)


def history_of(examples, baselines) -> History:
    """examples: [[ [(Request, Result), ...] per batch ], ...]; baselines: [(Request, Baseline)]."""
    w = HistoryWriter(None)
    w.append("run_start", engine="imagined", engine_args={}, capabilities=CAPS, checks=None)
    for q, b in baselines:
        w.append("baseline", key=oracle_key_str(q), baseline=b)
    for k, batches in enumerate(examples):
        w.append("example", index=k)
        w.append("reset", snapshot=None)
        for batch in batches:
            w.append("submit", requests=[q for q, _ in batch])
            w.append("batch", results=[r for _, r in batch], snapshot=None)
    w.append("run_end", examples=len(examples), duration_s=0.5)
    return parse(w.events)


def warm_then_other_identity(cached: int, drafts: int | None, got=(7, 8)):
    """r0 (default identity) warms PROMPT; r1 (another tenant) sends PROMPT + one token and diverges."""
    r0q = Request("r0", PROMPT, 2)
    r1q = Request("r1", PROMPT + (19,), 2, identity=TENANT)
    r0 = Result("r0", (5, 6), "length", cached_tokens=0)
    r1 = Result("r1", got, "length", cached_tokens=cached, draft_proposed=drafts, draft_accepted=0 if drafts else None)
    base = [(r0q, Baseline((5, 6), "length", (2.0, 2.0))), (r1q, Baseline((7, 9), "length", (1.5, 0.75)))]
    return [[(r0q, r0)], [(r1q, r1)]], base


def test_a_speculation_bug_that_isolation_also_saw_is_listed_under_speculation():
    batches, base = warm_then_other_identity(cached=0, drafts=3)
    h = history_of([batches], base)
    a = analyse(h)
    assert {f.check for f in a.failures} == {"parity", "spec_independence", "isolation"}
    (finding,) = group(h, a)
    assert finding.check == "spec_independence" and finding.severity == "high"
    assert set(finding.also_seen_by) == {"parity", "isolation"}
    assert any("not listed under isolation" in r for r in finding.reasons)
    assert a.checks["isolation"].status == "fail"  # the verdict stands; only its presentation moved


def test_kv_served_across_identities_is_listed_under_isolation():
    batches, base = warm_then_other_identity(cached=8, drafts=None)
    h = history_of([batches], base)
    (finding,) = group(h, analyse(h))
    assert finding.check == "isolation" and finding.severity == "critical"
    assert "parity" in finding.also_seen_by and not finding.reasons


def test_a_hit_no_earlier_traffic_explains_is_not_listed_as_a_leak():
    # r1 reports 9 cached tokens: more than its own identity (0) *and* another identity (8) share with it
    batches, base = warm_then_other_identity(cached=9, drafts=None)
    h = history_of([batches], base)
    (finding,) = group(h, analyse(h))
    assert finding.check != "isolation" and "isolation" in finding.also_seen_by
    assert any("more cached tokens than any earlier traffic" in r for r in finding.reasons)


def test_the_story_names_whose_kv_was_reused_and_aligns_the_divergence():
    batches, base = warm_then_other_identity(cached=8, drafts=None)
    h = history_of([batches], base)
    a = analyse(h)
    s = story(h, group(h, a)[0])
    assert s["reused"]["request"] == "r0" and s["reused"]["identity"] == "rev=a" and s["reused"]["tokens"] == 8
    assert s["reused"]["cross_identity_reuse"] is True
    results = results_json(h, a, {}, decode=fake_decode)
    md, page = report_md(results), report_html(results)
    assert "8 with r0 (**rev=a**, batch 0)" in md and "▶ r1" in md
    assert "request **r0** of identity **rev=a**" in md
    # aligned: position 1 differs (expected 9, got 8), position 0 agrees; the margin there is shown
    assert "| expected | 7 | **9** |" in md and "| got | 7 | **8** |" in md and "0.75" in md
    assert '<tr><td>expected</td><td>7</td><td class="diff">9</td></tr>' in page
    assert 'expected text | `"h"` | **`"j"`**' in md  # 7 -> h, 9 -> j
    assert "<details><summary>raw witness (JSON)</summary>" in md and "<details>" in page


def test_without_a_decoder_the_story_says_text_was_not_recorded():
    batches, base = warm_then_other_identity(cached=8, drafts=None)
    h = history_of([batches], base)
    md = report_md(results_json(h, analyse(h), {}))
    assert "Decoded text not recorded" in md and "expected text" not in md


def test_decoded_text_is_kept_in_the_witness_and_across_re_analysis(tmp_path):
    batches, base = warm_then_other_identity(cached=0, drafts=3)
    h = history_of([batches], base)
    a = analyse(h)
    first = write_report(tmp_path, h, a, decode=fake_decode)
    assert first["decoded"]["7 9"] == "hj"
    again = write_report(tmp_path, h, a)  # `kvparity report`: no engine, no tokenizer
    assert again["decoded"] == first["decoded"] and "Decoded text not recorded" not in (tmp_path / "report.md").read_text()
    witness = json.loads(next((tmp_path / "witnesses").glob("parity-*.json")).read_text())
    assert witness["decoded"] == {"output": "hi", "expected_output": "hj"}


def test_the_console_prints_one_line_per_finding(tmp_path, capsys):
    from conformance.report import print_summary

    batches, base = warm_then_other_identity(cached=0, drafts=3)
    h = history_of([batches], base)
    a = analyse(h)
    print_summary(a, tmp_path, "imagined")  # no report yet: one line per failure record
    assert capsys.readouterr().out.count("FAIL [") == 3
    write_report(tmp_path, h, a)
    print_summary(a, tmp_path, "imagined")
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("FAIL [")]
    assert line.startswith("FAIL [spec_independence]") and "also seen by" in line and "kvparity replay" in line


def test_identical_findings_in_two_examples_fold_with_a_count():
    batches, base = warm_then_other_identity(cached=0, drafts=3)
    h = history_of([batches, batches], base)
    a = analyse(h)
    # each check keeps one failure per title (the last example's); spread them over both examples
    early = analyse(history_of([batches], base))
    checks = dict(a.checks)
    checks["parity"] = early.checks["parity"]
    findings = group(h, Analysis(checks))
    assert len(findings) == 1 and findings[0].count == 2
    assert "×2" in report_md(results_json(h, Analysis(checks), {}))


def test_two_different_requests_are_two_findings():
    batches, base = warm_then_other_identity(cached=0, drafts=3)
    other_q = Request("r2", (30, 31, 32), 2)
    other = [(other_q, Result("r2", (1, 2), "length", cached_tokens=0))]
    h = history_of([batches + [other]], base + [(other_q, Baseline((1, 3), "length", (1.0, 1.0)))])
    assert len(group(h, analyse(h))) == 2


def test_counts_are_each_checks_own_unit_and_bar_labels_fit():
    assert counts_text({}) == "nothing counted"
    assert counts_text({"hits": 82}) == "82 prefix hits"
    assert counts_text({"snapshots": 321}) == "321 pool snapshots"
    assert counts_text({"compared": 1724, "near_ties": 0}) == "1,724 compared with plain decoding"
    checks = {"prefix_only": {"status": "pass", "stats": {"hits": 82}},
              "rollback_hygiene": {"status": "pass", "stats": {"snapshots": 321}},
              "a_check_with_a_long_name": {"status": "fail", "stats": {"pairs": 123456, "near_ties": 3}}}
    svg = bar_chart(checks)
    assert "82 prefix hits" in svg and "321 pool snapshots" in svg and "checked" not in svg
    width = int(re.search(r'width="(\d+)"', svg).group(1))
    for x, label in re.findall(r'<text x="(\d+)" y="\d+">([^<]+)</text>', svg):
        assert int(x) + 7.2 * len(label) <= width, label  # the SVG is as wide as its longest label


def _results_with(situations):
    batches, base = warm_then_other_identity(cached=0, drafts=None, got=(7, 9))
    h = history_of([batches], base)
    results = results_json(h, analyse(h), {})
    results["situations"] = situations
    return results


def test_coverage_table_marks_relevant_situations_never_reached():
    rows = [{"name": "prefix_hit", "title": "prefix cache hit", "claim": "prefix caching", "relevant": True, "count": 82},
            {"name": "accepted_draft", "title": "draft tokens accepted", "claim": "speculation", "relevant": True,
             "count": 0},
            {"name": "preemption", "title": "preempted", "claim": "eviction", "relevant": False, "count": 0}]
    results = _results_with(rows)
    md, page = report_md(results), report_html(results)
    assert "| situation | claim | relevant | count |" in md
    assert "| `accepted_draft` draft tokens accepted | speculation | yes | 0 — **not reached** |" in md
    assert "| `prefix_hit` prefix cache hit | prefix caching | yes | 82 |" in md
    assert "preempted | eviction | no | 0 |" in md  # not relevant: not flagged
    assert page.count('<tr class="missing">') == 1
    reached = _results_with(rows[:1])
    assert "not reached" not in report_md(reached).split("## What was exercised")[1].split("### Drawn")[0]


def test_results_json_holds_the_coverage_model_and_what_was_drawn():
    batches, base = warm_then_other_identity(cached=0, drafts=None, got=(7, 9))
    h = history_of([batches], base)
    results = results_json(h, analyse(h), {})
    assert results["situations"] and {"name", "claim", "relevant", "count"} <= set(results["situations"][0])
    drawn = results["exercised"]
    assert {i["identity"] for i in drawn["identities"]} == {"rev=a", "rev=a,salt=tenant-b"}
    assert drawn["configurations"] == [{"config": "defaults", "requests": 2, "examples": 1}]
    assert sum(b["positions"] for b in drawn["margins"]["bands"]) == 4  # two baselines of two positions


def test_md_and_html_carry_the_same_headings_and_tables():
    batches, base = warm_then_other_identity(cached=8, drafts=None)
    h = history_of([batches], base)
    results = results_json(h, analyse(h), {}, decode=fake_decode)
    md, page = report_md(results), report_html(results)
    md_heads = [re.sub(r"[`*]", "", h_) for h_ in re.findall(r"^#+ (.+)$", md, re.M)]
    html_heads = [re.sub(r"<[^>]+>", "", h_) for h_ in re.findall(r"<h\d[^>]*>(.+?)</h\d>", page)]
    assert md_heads == [__import__("html").unescape(x) for x in html_heads]
    assert md.count("\n|---") == page.count("<table")
    assert "<script" not in page


def test_a_passing_report_has_no_findings_section():
    batches, base = warm_then_other_identity(cached=0, drafts=None, got=(7, 9))
    h = history_of([batches], base)
    results = results_json(h, analyse(h), {})
    assert results["findings"] == [] and "## Findings" not in report_md(results)
    assert "## What was exercised" in report_md(results)


# --------------------------------------------------------------------------- progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_in_a_log_is_a_line_every_n_examples_and_on_a_new_failure():
    out, clock = io.StringIO(), Clock()
    p = Progress(out, tty=False, clock=clock)
    p.start(100)
    for k in range(1, 26):
        clock.t += 1.0
        p.event({"event": "batch", "snapshot": {"blocks_in_use": 0}})
        p.event({"event": "baseline"})
        p.example(k, ["parity"] if k == 13 else [])
    p.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in out.getvalue()  # examples 10, 13 (first failure), 20, and the end
    assert lines[0] == "kvparity: 10/100 examples, no failure, 0:10 elapsed, 30 engine calls (3.0/s)"
    assert lines[1].startswith("kvparity: 13/100 examples, 1 failing check (parity)")
    assert lines[-1].startswith("kvparity: 25/100 examples, 1 failing check (parity), 0:25 elapsed, 75 engine calls")


def test_progress_on_a_terminal_rewrites_one_line():
    out, clock = io.StringIO(), Clock()
    p = Progress(out, tty=True, clock=clock)
    p.start(5)
    for k in range(1, 6):
        clock.t += 1.0
        p.example(k)
    p.finish()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.count("\r\x1b[K") == 6 and text.endswith("5/5 examples, no failure, "
                                                                                    "0:05 elapsed, 0 engine calls (0.0/s)\n")


def test_kvparity_run_shows_progress_unless_quiet(tmp_path, capsys):
    from kvparity.cli import main

    argv = ["run", "--engine", "fake_engine:FakeDictEngine", "--max-examples", "3", "--no-shrink",
            "--report-dir", str(tmp_path)]
    assert main(argv) in (0, 2)  # pass or inconclusive: progress is the point here
    assert "kvparity: 3/3 examples, no failure" in capsys.readouterr().err
    assert main(argv + ["-q"]) in (0, 2)
    assert "kvparity:" not in capsys.readouterr().err


def test_reference_adapter_decodes_with_the_shipped_tokenizer():
    from adapters.reference import ReferenceAdapter
    from reference_engine.checkpoints import load_tokenizer

    ids = load_tokenizer().encode("The cat sat.").ids
    assert ReferenceAdapter.decode(None, ids) == "The cat sat."  # no engine needed: the tokenizer only
    assert ReferenceAdapter.decode(None, [2]) == "<eos>"  # special tokens stay visible

