"""Reports: `results.json`, `report.md`, `report.html` (self-contained, inline SVG), `junit.xml`, and one
witness file per failure under `witnesses/` that `kvparity replay <path>` re-runs.

Every failure says what an engine developer needs first: the case id, the shrunk witness (prompt,
identity, first divergent position, expected vs got, baseline margin there) and the one-line replay
command.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping
from xml.sax.saxutils import escape, quoteattr

from conformance.analysis import Analysis
from conformance.history import History, encode
from conformance.verdicts import Failure

COLORS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#f9a825", "error": "#6a1b9a", "skip": "#9e9e9e"}


def write_witnesses(run_dir: Path, history: History, analysis: Analysis) -> dict[str, Path]:
    """One JSON file per failure: the engine, its arguments, the failure and the resolved steps."""
    out: dict[str, Path] = {}
    examples = {ex.index: ex for ex in history.examples}
    for failure in analysis.failures:
        ex = examples.get(failure.example)
        path = run_dir / "witnesses" / f"{failure.case_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "kvparity_witness": 1, "engine": history.meta.get("engine"),
            "engine_args": history.meta.get("engine_args", {}), "check": failure.check,
            "failure": failure.to_json(), "steps": ex.steps() if ex else [],
            "capabilities": encode(history.capabilities) if history.capabilities else None,
        }, indent=1))
        out[failure.case_id] = path
    return out


def replay_command(path: Path, engine: str | None = None) -> str:
    """The one-line reproduce command. A witness may only name a registered engine, so one recorded
    with a `module:Class` adapter replays with that adapter named on the command line."""
    named = f" --engine {engine}" if engine and ":" in engine else ""
    return f"kvparity replay {path}{named}"


# What a report holds that its history cannot give back: re-analysis (`kvparity report`) carries these
# over from the results.json it replaces instead of dropping them.
CARRIED = ("duration_s", "minimised", "process")


def results_json(history: History, analysis: Analysis, witnesses: Mapping[str, Path],
                 duration_s: float | None = None, carried: Mapping[str, Any] | None = None) -> dict:
    """The whole report as data. `carried`: earlier results.json values of the CARRIED keys, plus any
    given anew (`minimised`: one line per minimised witness; `process`: how the run's process ended
    when it died without finishing)."""
    data = analysis.to_json()
    for check in data["checks"].values():
        for f in check["failures"]:
            if f["case_id"] in witnesses:
                f["witness_file"] = str(witnesses[f["case_id"]])
                f["replay"] = replay_command(witnesses[f["case_id"]], history.meta.get("engine"))
    meta = {k: v for k, v in history.meta.items() if k != "event"}
    carried = dict(carried or {})
    duration = history.duration_s if history.duration_s is not None else duration_s
    if duration is None:
        duration = carried.get("duration_s")
    return {"run": meta, "examples": len(history.examples),
            "duration_s": None if duration is None else round(float(duration), 2),
            "finished": history.ended is not None, "interrupted": history.interrupted,
            "minimised": dict(carried.get("minimised") or {}), "process": carried.get("process"), **data}


def _failure_md(f: Failure, replay: str | None) -> list[str]:
    w = f.witness
    lines = [f"### [{f.check}] {f.title} — `{f.case_id}`", "",
             f"severity **{f.severity}**, bug class **{f.bug_class}**", "", f.explanation, ""]
    req = w.get("request")
    if isinstance(req, Mapping):
        lines.append(f"- prompt ({len(req.get('prompt', []))} tokens): `{req.get('prompt')}`")
        lines.append(f"- identity: `{w.get('identity', req.get('identity'))}`, max_tokens {req.get('max_tokens')}, "
                     f"stop_ids {req.get('stop_ids')}")
    if "first_divergent_position" in w:
        lines.append(f"- first divergent position {w['first_divergent_position']}: expected `{w.get('expected')}`, "
                     f"got `{w.get('got')}`, baseline margin there `{w.get('baseline_margin')}`")
    if w.get("expected_output") is not None:
        lines.append(f"- expected output `{w['expected_output']}`")
    if "output" in w:
        lines.append(f"- got output `{w['output']}`")
    if replay:
        lines += ["", f"Replay: `{replay}`"]
    return lines + [""]


def report_md(results: Mapping[str, Any]) -> str:
    run = results["run"]
    duration = "unknown time" if results["duration_s"] is None else f"{results['duration_s']} s"
    lines = [f"# kvparity report: {run.get('engine')}", ""]
    if not results["finished"]:
        how = "INTERRUPTED" if results["interrupted"] else "INCOMPLETE"
        lines += [f"**{how}: this run did not finish** — the verdict is `error` unless a failure was found; "
                  "the checks below read what was recorded.", ""]
    lines += [f"verdict **{results['verdict'].upper()}** (exit {results['exit_code']}), profile `{run.get('profile')}`, "
             f"seed `{run.get('seed')}`, {results['examples']} examples in {duration}, "
             f"near-ties {results['near_ties']}", "",
             f"versions: `{json.dumps(run.get('versions', {}))}`", "",
             "| check | status | bug class | claim | notes |", "|---|---|---|---|---|"]
    for name, c in results["checks"].items():
        notes = "; ".join(c["notes"][:3]).replace("|", "/")
        lines.append(f"| {name} | {c['status']} | {c['bug_class']} | {c['title']} | {notes} |")
    if results["errors"]:
        lines += ["", "## Engine errors", ""] + [f"- {e}" for e in results["errors"]]
    failures = [(f, f.get("replay")) for c in results["checks"].values() for f in c["failures"]]
    if failures:
        lines += ["", "## Failures", ""]
        for f, replay in failures:
            lines += _failure_md(Failure.from_json(f), replay)
    if results["minimised"]:
        lines += ["", "## Minimised witnesses (`--minimise`)", ""]
        lines += [f"- `{check}`: {line}" for check, line in results["minimised"].items()]
    return "\n".join(lines) + "\n"


def _svg(results: Mapping[str, Any]) -> str:
    """A horizontal bar per check, coloured by status, with its comparison count — no JS, no libraries."""
    rows = list(results["checks"].items())
    width, bar_h = 640, 22
    height = bar_h * (len(rows) + 1) + 10
    counts = {n: max(int(c["stats"].get("compared", 0)) + int(c["stats"].get("pairs", 0))
                     + int(c["stats"].get("results", 0)), 1) for n, c in rows}
    top = max(counts.values(), default=1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for k, (name, c) in enumerate(rows):
        y = 5 + k * bar_h
        w = 20 + int(380 * counts[name] / top)
        parts.append(f'<text x="0" y="{y + 15}" font-size="12">{html.escape(name)}</text>'
                     f'<rect x="170" y="{y}" width="{w}" height="{bar_h - 4}" fill="{COLORS[c["status"]]}"/>'
                     f'<text x="{175 + w}" y="{y + 15}" font-size="12">{c["status"]} '
                     f'({counts[name]} checked, {c["stats"].get("near_ties", 0)} near-ties)</text>')
    parts.append("</svg>")
    return "".join(parts)


def report_html(results: Mapping[str, Any], md: str) -> str:
    run = results["run"]
    rows = "".join(
        f'<tr><td>{html.escape(n)}</td><td style="color:{COLORS[c["status"]]};font-weight:bold">{c["status"]}</td>'
        f'<td>{c["bug_class"]}</td><td>{html.escape(c["title"])}</td>'
        f'<td>{html.escape("; ".join(c["notes"][:3]))}</td></tr>' for n, c in results["checks"].items())
    failures = "".join(
        f'<div class="f"><h3>[{html.escape(f["check"])}] {html.escape(f["title"])} <code>{f["case_id"]}</code></h3>'
        f'<p>{html.escape(f["explanation"])}</p><pre>{html.escape(json.dumps(f["witness"], indent=1))}</pre>'
        f'<p>Replay: <code>{html.escape(f.get("replay", ""))}</code></p></div>'
        for c in results["checks"].values() for f in c["failures"])
    errors = "".join(f"<li>{html.escape(e)}</li>" for e in results["errors"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kvparity: {html.escape(str(run.get('engine')))}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td,th{{border-bottom:1px solid #ddd;padding:4px}}
pre{{background:#f5f5f5;padding:8px;overflow:auto;max-height:30em}}.f{{border-left:4px solid #c62828;padding-left:1em}}</style>
</head><body><h1>kvparity report: {html.escape(str(run.get('engine')))}</h1>
<p>Verdict <b style="color:{COLORS.get(results['verdict'], '#000')}">{results['verdict'].upper()}</b>
(exit {results['exit_code']}); profile {html.escape(str(run.get('profile')))}; seed {run.get('seed')};
{results['examples']} examples in {results['duration_s']} s; near-ties {results['near_ties']}.</p>
{'' if results['finished'] else '<p><b>' + ('INTERRUPTED' if results['interrupted'] else 'INCOMPLETE') + ': this run did not finish.</b> The checks read what was recorded.</p>'}
{_svg(results)}
<table><tr><th>check</th><th>status</th><th>class</th><th>claim</th><th>notes</th></tr>{rows}</table>
{'<h2>Engine errors</h2><ul>' + errors + '</ul>' if errors else ''}
{'<h2>Failures</h2>' + failures if failures else ''}
</body></html>
"""


def junit_xml(results: Mapping[str, Any]) -> str:
    checks = results["checks"]
    n_fail = sum(c["status"] == "fail" for c in checks.values())
    n_err = sum(c["status"] == "error" for c in checks.values()) + (1 if results["errors"] else 0)
    n_skip = sum(c["status"] in ("skip", "inconclusive") for c in checks.values())
    engine = str(results["run"].get("engine"))
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuite name={quoteattr("kvparity." + engine)} tests="{len(checks) + (1 if results["errors"] else 0)}" '
           f'failures="{n_fail}" errors="{n_err}" skipped="{n_skip}" time="{results["duration_s"]}">']
    for name, c in checks.items():
        out.append(f'<testcase classname={quoteattr("kvparity." + engine)} name={quoteattr(name)}>')
        if c["status"] == "fail":
            text = "\n\n".join(f'{f["case_id"]}: {f["explanation"]}\n{f.get("replay", "")}' for f in c["failures"])
            out.append(f'<failure message={quoteattr(c["failures"][0]["title"])}>{escape(text)}</failure>')
        elif c["status"] == "error":
            out.append(f'<error message={quoteattr("; ".join(c["notes"]) or "error")}/>')
        elif c["status"] in ("skip", "inconclusive"):
            out.append(f'<skipped message={quoteattr(c["status"] + ": " + "; ".join(c["notes"][:3]))}/>')
        out.append("</testcase>")
    if results["errors"]:
        out.append(f'<testcase classname={quoteattr("kvparity." + engine)} name="engine">'
                   f'<error message={quoteattr(results["errors"][0])}/></testcase>')
    out.append("</testsuite>")
    return "\n".join(out) + "\n"


def previous_results(run_dir: Path) -> dict[str, Any]:
    """The CARRIED values of the results.json already in `run_dir` (none if absent or unreadable)."""
    try:
        old = json.loads((Path(run_dir) / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in CARRIED if isinstance(old, dict) and old.get(k) is not None}


def print_summary(analysis: Analysis, run_dir: Path, engine: str | None = None) -> None:
    """The console's view of a report: one line per check, the engine errors, a replay command per failure."""
    for name, r in analysis.checks.items():
        print(f"{name:22s} {r.status}" + (f"  ({r.notes[0]})" if r.notes and r.status != "pass" else ""))
    for e in analysis.errors:
        print(f"ERROR: {e}")
    for f in analysis.failures:
        print(f"FAIL [{f.check}] {f.title} ({f.case_id}): "
              f"{replay_command(run_dir / 'witnesses' / (f.case_id + '.json'), engine)}")


def write_report(run_dir: Path, history: History, analysis: Analysis, duration_s: float | None = None,
                 **carried: Any) -> dict:
    """Write every report file into `run_dir` (history.jsonl is already there) and return results. The
    one writer of every report file: a later addition (minimised witnesses) rewrites the report through
    here, and re-analysis keeps what the history cannot give back (`CARRIED`)."""
    run_dir = Path(run_dir)
    witnesses = write_witnesses(run_dir, history, analysis)
    carried = {**previous_results(run_dir), **{k: v for k, v in carried.items() if v is not None}}
    results = results_json(history, analysis, witnesses, duration_s, carried)
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    md = report_md(results)
    (run_dir / "report.md").write_text(md)
    (run_dir / "report.html").write_text(report_html(results, md))
    (run_dir / "junit.xml").write_text(junit_xml(results))
    return results
