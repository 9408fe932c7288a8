"""The one writer of every report file of a run folder: results.json, report.md, report.html,
junit.xml and the witnesses. A later addition (minimised witnesses) rewrites the report through here,
and re-analysis (`kvparity report`) writes beside the run's own files, never over them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

from conformance.analysis import Analysis
from conformance.history import History
from conformance.report.doc import page, to_md
from conformance.report.junit import junit_xml
from conformance.report.lane import lane_file, lane_svg
from conformance.report.results import CARRIED, results_json, witness_path, write_witnesses
from conformance.report.sections import report_blocks
from conformance.run_folder import write_text
from conformance.untrusted import read_json


def previous_results(run_dir: Path) -> dict[str, Any]:
    """The CARRIED values of the results.json already in `run_dir` (none if absent or unreadable)."""
    try:
        old = read_json(Path(run_dir) / "results.json", "results file")
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in CARRIED if isinstance(old, dict) and old.get(k) is not None}


def write_report(run_dir: Path, history: History, analysis: Analysis, duration_s: float | None = None,
                 decode: Callable[[list[int]], str] | None = None, *, subfolder: str = "",
                 reanalysis: Mapping[str, Any] | None = None, **carried: Any) -> dict:
    """Write every report file into `run_dir` (history.jsonl is already there) and return results. The
    one writer of every report file: a later addition (minimised witnesses) rewrites the report through
    here, and re-analysis keeps what the history cannot give back (`CARRIED`, read from the run's
    results.json). `decode`: the adapter's optional hook (token ids -> text); the text it gives is kept
    in results.json and the witnesses. `subfolder` ("reanalysis/") and `reanalysis` (what was re-judged,
    and how, said at the top): `kvparity report`, which writes beside the run's own files, never over them.

    Nothing is written through a symlink inside `run_dir` (conformance.run_folder): a planted one raises
    UnsafeRunFolder, an OSError."""
    run_dir = Path(run_dir)
    subfolder = subfolder.strip("/") + "/" if subfolder.strip("/") else ""
    paths = {f.case_id: witness_path(run_dir / subfolder, f) for f in analysis.failures}
    carried = {**previous_results(run_dir), **{k: v for k, v in carried.items() if v is not None}}
    results = results_json(history, analysis, paths, duration_s, carried, decode)
    if reanalysis is not None:
        results["reanalysis"] = dict(reanalysis)
    write_witnesses(run_dir, history, analysis, results["decoded"], subfolder)
    write_text(run_dir, subfolder + "results.json", json.dumps(results, indent=1))
    blocks = report_blocks(results)
    write_text(run_dir, subfolder + "report.md", to_md(blocks))
    write_text(run_dir, subfolder + "report.html", page(f"kvparity: {results['run'].get('engine')}", blocks))
    write_text(run_dir, subfolder + "junit.xml", junit_xml(results))
    for k, fd in enumerate(results.get("findings", []), start=1):
        if fd.get("story", {}).get("timeline"):
            write_text(run_dir, subfolder + lane_file(k), lane_svg(fd["story"]))
    return results
