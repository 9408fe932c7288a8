"""Reports: `results.json`, `report.md`, `report.html` (self-contained, inline SVG), `junit.xml`, and one
witness file per failure under `witnesses/` that `kvparity replay <path>` re-runs. `writer.write_report`
is their one writer.

A report says what a person needs to trust the verdict at a glance and to act on a failure: each check
with what it checked in its own unit, the findings — failures grouped by root (`conformance.grouping`),
each told as a story (`story`: timeline, aligned expected-vs-got tokens and text, whose KV was reused, the
raw witness folded) with its replay command — and what the run exercised (`exercised`: situations reached
and not, identities and configurations drawn, margins). report.md and report.html are two renderings of
the same blocks (`doc`, `sections`), built from results.json (`results`) alone; `junit` and `console`
are the CI's and the terminal's views.

This package's face: the entry points the run, replay and re-analysis call.
"""

from __future__ import annotations

from conformance.report.console import print_fixed, print_summary
from conformance.report.junit import junit_xml
from conformance.report.results import CARRIED, replay_command, results_json, witness_path, write_witnesses
from conformance.report.sections import report_blocks, report_html, report_md
from conformance.report.writer import previous_results, write_report

__all__ = ["CARRIED", "junit_xml", "previous_results", "print_fixed", "print_summary", "replay_command",
           "report_blocks", "report_html", "report_md", "results_json", "witness_path", "write_report",
           "write_witnesses"]
