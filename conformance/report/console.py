"""The console's view of a report: what `kvparity run`, `kvparity replay` and `kvparity merge` print when the
files are written — one line per check, per engine error and per finding, each finding with its replay command."""

from __future__ import annotations

from pathlib import Path

from conformance.analysis import Analysis
from conformance.report.results import replay_command
from conformance.untrusted import read_json


def print_fixed(analysis: Analysis) -> None:
    """One line per known finding (`--known`) the run did not see."""
    if analysis.known is not None:
        for e in analysis.known.fixed:
            print(f"FIXED known finding {e['signature']} [{e.get('check', '?')}] {e.get('title', '')}: not seen in "
                  f"this run" + ("; --strict-known: judged by the campaign's merge (another shard may see it)"
                                 if analysis.known.strict and analysis.known.in_shard else
                                 "; --strict-known fails the run until it leaves the known-findings file"
                                 if analysis.known.strict else ""))


def print_summary(analysis: Analysis, run_dir: Path, engine: str | None = None) -> None:
    """The console's view of a report: one line per check, the engine errors, and one line per finding
    (grouped by root, as in the report; per failure where the report has none) with its replay command."""
    for name, r in analysis.checks.items():
        status = analysis.status(name)  # a check failing only on known findings (`--known`) passes
        print(f"{name:22s} {status}" + (f"  ({r.notes[0]})" if r.notes and status != "pass" else "")
              + ("  (known findings only)" if status != r.status else ""))
    for e in analysis.errors:
        print(f"ERROR: {e}")
    try:
        findings = read_json(Path(run_dir) / "results.json", "results file").get("findings")
    except (OSError, ValueError, AttributeError):
        findings = None
    if not findings:
        for f in analysis.failures:
            print(f"FAIL [{f.check}] {f.title} ({f.case_id}): "
                  f"{replay_command(run_dir / 'witnesses' / (f.case_id + '.json'), engine)}")
        print_fixed(analysis)
        return
    print(f"first finding: {findings[0].get('headline') or findings[0].get('title')}")
    for fd in findings:
        also = f"; also seen by {', '.join(fd['also_seen_by'])}" if fd.get("also_seen_by") else ""
        times = f"; x{fd['count']}" if fd.get("count", 1) > 1 else ""
        sig = (fd.get("signature") or {}).get("signature")
        shards = f"; shards {', '.join(fd['shards'])}" if fd.get("shards") else ""  # a campaign's (`kvparity merge`)
        print(f"{'KNOWN' if fd.get('known') else 'FAIL'} [{fd['check']}] {fd['title']} ({fd['case_id']}{also}{times}"
              f"{f'; signature {sig}' if sig else ''}{shards}): "
              f"{replay_command(run_dir / 'witnesses' / (fd['case_id'] + '.json'), engine)}")
    print_fixed(analysis)
