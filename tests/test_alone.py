"""A failing request sent again alone after a reset (conformance/alone.py): where it fails alone too,
the findings about it fold into the lone request's (one bug, its smallest witness, signed as the lone
request from any context); where it passes alone, its context was needed and the finding stays as found.

The unit tests write histories event by event (tests/test_conformance_checks.py's `Crafted`); the run
tests drive the reference engine with a planted fault."""

from __future__ import annotations

import json

import pytest

from conformance.analysis import analyse
from conformance.grouping import group
from conformance.signature import signed_findings
from test_conformance_checks import Crafted, req, res

PROMPT = tuple(range(10, 22))


def _history(lone_output):
    """Example 0: r0 is wrong in a batch of two (scheduling in play). Example 1: r0 re-sent alone,
    answering `lone_output` (plain decoding says [5, 6, 7])."""
    r0, other = req("r0", PROMPT), req("o", tuple(range(30, 40)))
    c = Crafted().batch((r0, res("r0", [5, 9, 9])), (other, res("o", [1, 2, 3])))
    c.w.append("example", index=1, alone=[[0, "r0"]])
    c.reset().batch((req("alone", PROMPT), res("alone", lone_output)))
    return c.baseline(r0, [5, 6, 7]).baseline(other, [1, 2, 3]).history()


def test_a_request_that_fails_alone_is_one_finding_shown_by_the_lone_request():
    h = _history([5, 9, 9])
    assert h.examples[1].alone == ((0, "r0"),) and h.examples[0].alone is None
    (fd,) = group(h, analyse(h))
    assert fd.failure.example == 1 and fd.failure.witness["request"]["id"] == "alone" and fd.count == 2
    assert fd.check == "parity"  # nothing in play for the lone request
    assert any("alone after a reset, gives the same answer" in why for why in fd.reasons)
    (sig, _), = signed_findings(h, analyse(h))
    assert sig.mechanism.startswith("plain decoding")


def test_a_request_that_passes_alone_keeps_its_context():
    h = _history([5, 6, 7])
    (fd,) = group(h, analyse(h))
    assert fd.failure.example == 0 and fd.count == 1
    assert not any("alone" in why for why in fd.reasons)
    (sig, _), = signed_findings(h, analyse(h))
    assert sig.check == "schedule_independence" and sig.mechanism == "scheduling"


def test_a_request_that_fails_alone_with_another_answer_is_another_bug():
    """Wrong in context and wrong alone, but not the same answer: the lone re-send shows a second bug
    (what a cache hit broke in context, what the request's own setting breaks alone), and folds nothing."""
    h = _history([5, 9, 8])
    findings = group(h, analyse(h))
    assert {fd.failure.example for fd in findings} == {0, 1}
    assert not any("alone" in why for fd in findings for why in fd.reasons)


def test_the_alone_mark_is_read_as_untrusted_data():
    c = Crafted()
    c.w.append("example", index=1, alone=[[0, "r0"], ["0", "r0"], [True, "x"], [1], "junk"])
    assert c.history().examples[1].alone == ((0, "r0"),)
    c.w.append("example", index=2, alone={"example": 0})
    assert c.history().examples[2].alone is None


@pytest.mark.parametrize("fault, folded", [("max_tokens_window_overrun", True), ("salt_ignored", False)])
def test_a_run_re_sends_each_failing_request_alone(fault, folded, tmp_path):
    """A window overrun needs nothing but the request and its speculation setting: its finding is the
    lone request's. A salt the cache key ignores needs another identity's traffic first: the lone
    re-send passes and the finding stays an isolation finding."""
    from adapters.reference import ReferenceAdapter
    from conformance.run_config import RunConfig
    from conformance.runner import run_suite

    out = run_suite(ReferenceAdapter(fault=fault), RunConfig(engine_name="reference", profile="dev", seed=0,
                                                             report_dir=tmp_path, database_dir=tmp_path / "db",
                                                             shrink=False))
    assert out.verdict == "fail"
    probes = [ex for ex in out.history.examples if ex.alone]
    assert probes and all(len(ex.batches) == 1 and len(ex.batches[0].requests) == 1 for ex in probes)
    findings = json.loads((out.run_dir / "results.json").read_text())["findings"]
    lone = [fd for fd in findings if any("alone after a reset, gives the same answer" in why for why in fd["reasons"])]
    assert bool(lone) == folded, [(fd["check"], fd["reasons"]) for fd in findings]
    if not folded:
        assert findings[0]["check"] == "isolation"


def test_every_request_that_fails_alone_is_told_so_when_lone_failures_displace_each_other():
    """A run keeps one failure per check and title, the last: two lone re-sends failing the same way
    keep only the second's failure, and the first's (its own lone failure gone from the findings) must
    still fold its request and say it fails alone."""
    r0, r1 = req("r0", PROMPT), req("r1", PROMPT[::-1])
    c = Crafted().batch((r0, res("r0", [5, 9, 9])), (r1, res("r1", [5, 9, 9])))
    for index, rid, prompt in ((1, "r0", PROMPT), (2, "r1", PROMPT[::-1])):
        c.w.append("example", index=index, alone=[[0, rid]])
        c.reset().batch((req("alone", prompt), res("alone", [5, 9, 9])))
    h = c.baseline(r0, [5, 6, 7]).baseline(r1, [5, 6, 7]).history()
    findings = group(h, analyse(h))
    told = [why for fd in findings for why in fd.reasons if "alone after a reset, gives the same answer" in why]
    assert len(told) == 2 and all("example 0" in why for why in told), [fd.reasons for fd in findings]
    assert len(findings) == 1
    assert all(fd.failure.witness["request"]["id"] == "alone" for fd in findings)
