"""report.html in a real browser: headless Chromium (Debian's `chromium`, its own command line — no
driver, no browser download) opens the report of a real failing run, the page renders without a
console message, and the failure section shows the aligned expected-vs-got diff.

`make setup` installs chromium where it can (root with apt-get); elsewhere, without a chromium on
PATH, this test is skipped and says why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (apt-get install chromium; "
                                                         "`make setup` does it when run as root with apt-get)")
CONSOLE = re.compile(r":CONSOLE[:\(]|Uncaught ")


def open_in_chromium(page: Path, profile: Path) -> tuple[str, list[str]]:
    """(the DOM after rendering, the console lines Chromium logged) for a local page."""
    proc = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom",
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [ln for ln in proc.stderr.splitlines() if CONSOLE.search(ln)]


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory) -> Path:
    """A real run: the reference engine with a rejected draft token committed (fault zoo), unshrunk, ended
    at its first finding (the page is what is tested, not how many findings it holds)."""
    from adapters.reference import ReferenceAdapter
    from conformance.runner import run_suite
    from conformance.run_config import RunConfig

    tmp = tmp_path_factory.mktemp("browser")
    outcome = run_suite(ReferenceAdapter(fault="rejected_draft_committed"), RunConfig(engine_name="reference",
                                                                                      engine_args={"fault": "rejected_draft_committed"},
                                                                                      profile="ci", max_examples=30,
                                                                                      report_dir=tmp / "runs",
                                                                                      database_dir=tmp / "db",
                                                                                      shrink=False, timeout_s=60,
                                                                                      keep_looking=False))
    assert outcome.verdict == "fail", {k: v.status for k, v in outcome.analysis.checks.items()}
    return outcome.run_dir / "report.html"


def test_a_failing_report_renders_without_console_messages_and_shows_the_aligned_diff(failing_report, tmp_path):
    dom, console = open_in_chromium(failing_report, tmp_path / "profile")
    assert console == []
    assert "<h2>Findings</h2>" in dom and "First divergence" in dom
    aligned = re.search(r'<table class="align">(.*?)</table>', dom, re.S)
    assert aligned, "no aligned expected-vs-got table in the failure section"
    assert "<td>expected</td>" in aligned.group(1) and "<td>got</td>" in aligned.group(1)
    assert '<td class="diff">' in aligned.group(1)  # the differing tokens are marked
    assert "expected text" in aligned.group(1)  # the reference adapter decoded them
    assert "<svg" in dom and '<h3>Coverage: situations reached</h3>' in dom


def test_the_console_check_sees_a_page_that_logs_errors(tmp_path):
    """The check above can fail: a page with a script error is caught by the same reading."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><body><p>x</p><script>console.error("boom"); missing();</script></body></html>')
    _, console = open_in_chromium(bad, tmp_path / "profile")
    assert any("boom" in ln for ln in console) and any("missing is not defined" in ln for ln in console)
