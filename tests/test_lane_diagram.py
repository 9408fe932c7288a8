"""The page built around the finding: a lane diagram per witness (one bar per request, prompt to scale,
shared prefix shaded, cached span outlined, coloured by identity, aborts and preemption marked, batches
as groups), inline in report.html and written as `witness-<k>.svg` beside report.md; the verdict, then
the first finding with its diagram, then the rest, with checks and coverage below; example counts that
leave shrinking out; and, in headless Chromium at 1400 x 900, the first finding and its diagram above
the fold.

Histories are written event by event through the real `HistoryWriter` and judged by the real checks
(tests/test_report.py's `history_of`); the engine behind them is imagined.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conformance.analysis import analyse
from conformance.contract import Baseline, Request, Result
from conformance.report import report_md, results_json, write_report
from conformance.report.lane import lane_svg
from test_report import PROMPT, history_of, warm_then_other_identity
from test_report_browser import BROWSER

SVG = "{http://www.w3.org/2000/svg}"


def _svg_of(batches, base):
    h = history_of([batches], base)
    results = results_json(h, analyse(h), {})
    return results, ET.fromstring(lane_svg(results["findings"][0]["story"]))


def _rects(root, cls):
    return [r for r in root.iter(SVG + "rect") if r.get("class") == cls]


def test_one_bar_per_request_to_scale_with_the_shared_prefix_shaded_and_the_cached_span_outlined():
    results, root = _svg_of(*warm_then_other_identity(cached=8, drafts=None))
    lanes = list(root.iter(SVG + "g"))
    assert len(lanes) == 2  # r0 and r1
    prompts = [float(r.get("width")) for r in _rects(root, "prompt")]
    assert prompts[1] / prompts[0] == pytest.approx(9 / 8)  # r1's prompt is PROMPT + one token
    (shared,) = _rects(root, "shared")  # r1 shares 8 tokens with r0; r0 shares nothing
    (cached,) = _rects(root, "cached")  # r1 reported 8 cached tokens
    assert float(shared.get("width")) == pytest.approx(prompts[0]) == pytest.approx(float(cached.get("width")))
    assert cached.get("fill") == "none" and cached.get("stroke")  # outlined, not filled
    colours = {r.get("fill") for r in _rects(root, "prompt")}
    assert len(colours) == 2  # two identities, two colours ...
    legend = "".join(t.text or "" for t in root.iter(SVG + "text"))
    assert "salt=tenant-b" in legend and "rev=a" in legend  # ... named in the legend
    assert "first divergence at output position 1" in legend  # r1 diverges at position 1
    assert [ln for ln in root.iter(SVG + "line") if ln.get("class") == "divergence"]


def test_batches_are_groups_a_reset_is_a_rule_and_aborts_and_preemption_are_marked():
    q0, q1, q2 = Request("r0", PROMPT, 2), Request("r1", PROMPT[:4], 2), Request("r2", PROMPT + (19,), 2)
    r0 = Result("r0", (), "abort", cached_tokens=0)
    r1 = Result("r1", (5, 6), "length", cached_tokens=0, preempted=True)
    r2 = Result("r2", (7, 8), "length", cached_tokens=0)
    base = [(q0, Baseline((5, 6), "length", (2.0, 2.0))), (q1, Baseline((5, 6), "length", (2.0, 2.0))),
            (q2, Baseline((7, 9), "length", (1.5, 0.75)))]
    results, root = _svg_of([[(q0, r0), (q1, r1)], [(q2, r2)]], base)
    text = " ".join(t.text or "" for t in root.iter(SVG + "text"))
    assert "batch 0" in text and "batch 1" in text
    assert "aborted" in text and "preempted" in text
    assert len(list(root.iter(SVG + "g"))) == 3


def test_the_report_shows_the_first_finding_with_its_diagram_before_the_checks_and_writes_the_svg(tmp_path):
    batches, base = warm_then_other_identity(cached=8, drafts=None)
    h = history_of([batches], base)
    results = write_report(tmp_path, h, analyse(h))
    svg = (tmp_path / "witness-1.svg").read_text()
    ET.fromstring(svg)  # a well-formed standalone SVG file
    page, md = (tmp_path / "report.html").read_text(), (tmp_path / "report.md").read_text()
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="lanes"' in page
    assert "![Lane diagram of finding 1](witness-1.svg)" in md
    headline = results["findings"][0]["headline"]
    for text, shown in ((page, html.escape(headline)), (md, headline)):  # verdict, first finding, checks, coverage
        verdict, first = text.index("verdict"), text.index(shown)
        checks, coverage = text.index("Checks"), text.index("Coverage")
        assert verdict < first < checks < coverage
    assert page.index('class="lanes"') < page.index("<h2>Checks</h2>")


def test_example_counts_leave_shrinking_out():
    batches, base = warm_then_other_identity(cached=8, drafts=None)
    h = history_of([batches, batches, batches], base)
    h.ended["shrink_steps"] = 2  # two of the three examples were the shrinker's
    results = results_json(h, analyse(h), {})
    assert results["examples"] == 1 and results["shrink_steps"] == 2 and results["examples_recorded"] == 3
    assert "1 examples (+2 shrink steps)" in report_md(results)
    h.ended["shrink_steps"] = 7  # a count past what was recorded is not believed
    assert results_json(h, analyse(h), {})["examples"] == 3


# --------------------------------------------------------------------------- in a browser

MEASURE = """<script>
window.addEventListener('load', () => {
  const f = document.querySelector('section.finding'), svg = f && f.querySelector('svg.lanes');
  const r = (e) => e ? e.getBoundingClientRect() : {top: -1, bottom: -1};
  document.body.setAttribute('data-measure', JSON.stringify({w: innerWidth, h: innerHeight,
    finding_top: r(f).top, lanes_top: r(svg).top, lanes_bottom: r(svg).bottom}));
});
</script>"""


@pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (apt-get install chromium)")
def test_the_first_finding_and_its_lane_diagram_are_above_the_fold_at_1400_by_900(tmp_path):
    """A real failing run's report, measured in headless Chromium at 1400 x 900 (a copy of the page
    with a measuring script: the report itself carries none)."""
    from adapters.reference import ReferenceAdapter
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite

    outcome = run_suite(ReferenceAdapter(fault="salt_ignored"),
                        RunConfig(engine_name="reference", engine_args={"fault": "salt_ignored"}, profile="ci",
                                  max_examples=30, report_dir=tmp_path / "runs", database_dir=tmp_path / "db",
                                  shrink=False, timeout_s=60, keep_looking=False))  # ends at its first finding
    assert outcome.verdict == "fail"
    page = (outcome.run_dir / "report.html").read_text()
    assert "<script" not in page
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "</body>"))
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
                           "--hide-scrollbars", "--dump-dom", measured.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'data-measure="([^"]*)"', proc.stdout)
    assert m, "the measuring script did not run"
    box = json.loads(m.group(1).replace("&quot;", '"'))
    # 1400 px wide; headless Chromium's inner height at --window-size=1400,900 is less than 900 (its
    # window chrome), so "above the fold" is measured as the page's first 900 px.
    assert box["w"] == 1400, box
    assert 0 <= box["finding_top"] < 900, box
    assert 0 < box["lanes_top"] < box["lanes_bottom"] <= 900, box


def test_the_fold_measurement_can_fail(tmp_path):
    """The same reading sees a finding pushed below the fold."""
    if BROWSER is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    low = tmp_path / "low.html"
    low.write_text('<!doctype html><html><body><div style="height:1500px"></div><section class="finding">'
                   '<svg class="lanes" width="10" height="10"></svg></section>' + MEASURE + "</body></html>")
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
                           "--dump-dom", low.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'data-measure="([^"]*)"', proc.stdout)
    assert m and json.loads(m.group(1).replace("&quot;", '"'))["finding_top"] > 900


def test_a_run_whose_shrinking_was_capped_records_its_shrink_steps_and_stays_re_analysable(tmp_path):
    """The shrink cap stops an example before it begins; the run's example count leaves it out (it was
    counted but never recorded, so `kvparity report` refused the history), and the shrink steps are
    recorded apart from the examples drawn."""
    from adapters.reference import ReferenceAdapter
    from conformance.history_chain import verify
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite

    out = run_suite(ReferenceAdapter(fault="salt_ignored"),
                    RunConfig(engine_name="reference", profile="dev", seed=1832811632, report_dir=tmp_path,
                              database_dir=tmp_path / "db", max_shrink_seconds=0.5))
    assert out.verdict == "fail" and out.shrink_capped
    events = [json.loads(line) for line in (out.run_dir / "history.jsonl").read_text().splitlines()]
    assert verify(events).problems == ()
    end = events[-1]
    recorded = sum(ev["event"] == "example" for ev in events)
    assert end["event"] == "run_end" and end["examples"] == recorded == out.examples
    assert 0 < end["shrink_steps"] < recorded
