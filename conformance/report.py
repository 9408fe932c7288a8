"""Reports: `results.json`, `report.md`, `report.html` (self-contained, inline SVG), `junit.xml`, and one
witness file per failure under `witnesses/` that `kvparity replay <path>` re-runs. This module is their
one writer.

A report says what a person needs to trust the verdict at a glance and to act on a failure: each check
with what it checked in its own unit, the findings — failures grouped by root (`grouping`), each told as
a story (`report_story`: timeline, aligned expected-vs-got tokens and text, whose KV was reused, the raw
witness folded) with its replay command — and what the run exercised (`report_coverage`: situations
reached and not, identities and configurations drawn, margins). report.md and report.html are two
renderings of the same blocks (`report_doc`), built from results.json alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping
from xml.sax.saxutils import escape, quoteattr

from conformance.analysis import Analysis
from conformance.grouping import Finding, group
from conformance.history import History, encode
from conformance.report_coverage import bar_chart, counts_text, results_part
from conformance.report_coverage import blocks as coverage_blocks
from conformance.report_doc import Block, Bullets, Cell, Figure, Heading, Para, Section, Table, page, to_md
from conformance.report_story import blocks as story_blocks
from conformance.report_story import decode_texts, story, text_key
from conformance.run_folder import write_text
from conformance.signature import signature
from conformance.untrusted import read_json
from conformance.verdicts import Failure


def witness_path(run_dir: Path, failure: Failure) -> Path:
    return Path(run_dir) / "witnesses" / f"{failure.case_id}.json"


def _witness_texts(w: Mapping[str, Any], texts: Mapping[str, str]) -> dict[str, str]:
    """The decoded text of a witness's own sequences, where the run recorded it."""
    out = {}
    for key in ("output", "expected_output", "earlier_output"):
        if isinstance(w.get(key), list) and text_key(w[key]) in texts:
            out[key] = texts[text_key(w[key])]
    return out


def write_witnesses(run_dir: Path, history: History, analysis: Analysis,
                    texts: Mapping[str, str] | None = None, subfolder: str = "") -> dict[str, Path]:
    """One JSON file per failure: the engine, its arguments, the failure, the resolved steps and, where
    the adapter could decode, the text of the outputs (so a reader needs no tokenizer). `subfolder`:
    inside `run_dir` (a re-analysis), reached without following a symlink."""
    out: dict[str, Path] = {}
    examples = {ex.index: ex for ex in history.examples}
    for failure in analysis.failures:
        ex = examples.get(failure.example)
        data = {"kvparity_witness": 1, "engine": history.meta.get("engine"),
                "engine_args": history.meta.get("engine_args", {}), "check": failure.check,
                "failure": failure.to_json(), "steps": ex.steps() if ex else [],
                "capabilities": encode(history.capabilities) if history.capabilities else None}
        decoded = _witness_texts(failure.witness, texts or {})
        if decoded:
            data["decoded"] = decoded
        out[failure.case_id] = write_text(run_dir, f"{subfolder}witnesses/{failure.case_id}.json",
                                          json.dumps(data, indent=1))
    return out


def replay_command(path: Path, engine: str | None = None) -> str:
    """The one-line reproduce command. A witness may only name a registered engine, so one recorded
    with a `module:Class` adapter replays with that adapter named on the command line."""
    named = f" --engine {engine}" if engine and ":" in engine else ""
    return f"kvparity replay {path}{named}"


# What a report holds that its history cannot give back: re-analysis (`kvparity report`) carries these
# over from the results.json it replaces instead of dropping them. `decoded`: token ids -> text, from
# the adapter's `decode` hook at run time (conformance has no tokenizer of its own).
CARRIED = ("duration_s", "minimised", "process", "decoded")


def findings_json(history: History, findings: list[Finding], witnesses: Mapping[str, Path],
                  known: Any = None) -> list[dict]:
    """The grouped findings, each with its signature (conformance.signature), whether `--known` waived it,
    its story (timeline, divergence, reuse) and replay command."""
    out = []
    for fd in findings:
        d = fd.to_json()
        sig = signature(history, fd)
        d["signature"] = sig.to_json()
        d["known"] = known is not None and sig.id in known.seen
        d["story"] = story(history, fd)
        d["explanation"] = fd.failure.explanation
        d["record_check"] = fd.failure.check
        d["witness"] = dict(fd.failure.witness)
        if fd.failure.case_id in witnesses:
            d["replay"] = replay_command(witnesses[fd.failure.case_id], history.meta.get("engine"))
        out.append(d)
    return out


def results_json(history: History, analysis: Analysis, witnesses: Mapping[str, Path],
                 duration_s: float | None = None, carried: Mapping[str, Any] | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> dict:
    """The whole report as data. `carried`: earlier results.json values of the CARRIED keys, plus any
    given anew (`minimised`: one line per minimised witness; `process`: how the run's process ended
    when it died without finishing). `decode`: the adapter's hook, for the text of each story."""
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
    findings = findings_json(history, group(history, analysis), witnesses, analysis.known)
    decoded = {**dict(carried.get("decoded") or {}), **decode_texts([f["story"] for f in findings], decode)}
    return {"run": meta, "examples": len(history.examples), "history_digest": history.digest,
            "duration_s": None if duration is None else round(float(duration), 2),
            "finished": history.ended is not None, "interrupted": history.interrupted,
            "minimised": dict(carried.get("minimised") or {}), "process": carried.get("process"), **data,
            **results_part(history), "findings": findings, "decoded": decoded}


# --------------------------------------------------------------------------- report.md and report.html


def _head(results: Mapping[str, Any]) -> list[Block]:
    run = results["run"]
    duration = "unknown time" if results["duration_s"] is None else f"{results['duration_s']} s"
    out: list[Block] = [Heading(1, f"kvparity report: {run.get('engine')}")]
    if not results["finished"]:
        how = "INTERRUPTED" if results["interrupted"] else "INCOMPLETE"
        out.append(Para(f"**{how}: this run did not finish** — the verdict is `error` unless a failure was found; "
                        "the checks below read what was recorded."))
    if results.get("process"):
        cause = str(results["process"])
        out.append(Para(f"**{cause[:1].upper() + cause[1:]}.**"))
    if results.get("reanalysis"):
        out.append(Para(f"**Re-analysed from the stored history** (`kvparity report`): "
                        f"{results['reanalysis']['summary']}."))
    n_find = len(results.get("findings", []))
    n_known = sum(bool(fd.get("known")) for fd in results.get("findings", []))
    missing = [s["name"] for s in results.get("situations", []) if s["relevant"] and not s["count"]]
    out.append(Para(f"verdict **{results['verdict'].upper()}** (exit {results['exit_code']}), profile "
                    f"`{run.get('profile')}`, seed `{run.get('seed')}`, {results['examples']} examples in {duration}, "
                    f"near-ties {results['near_ties']}, findings {n_find}"
                    + (f" ({n_known} known)" if n_known else "")
                    + (f", relevant situations not reached: {', '.join(f'`{m}`' for m in missing)}" if missing else "")))
    args = run.get("engine_args") or {}
    if args:
        out.append(Para("engine arguments: " + ", ".join(f"`{k}={v}`" for k, v in sorted(args.items()))))
    out.append(Para(f"versions: `{json.dumps(run.get('versions', {}))}`"))
    return out


def _checks(results: Mapping[str, Any]) -> list[Block]:
    listed: dict[str, list[str]] = {}
    for fd in results.get("findings", []):
        for c in fd["also_seen_by"]:
            listed.setdefault(c, []).append(fd["check"])
    rows = []
    for name, c in results["checks"].items():
        notes = list(c["notes"][:3])
        elsewhere = sorted(set(listed.get(name, ())) - {name})
        own = [fd for fd in results.get("findings", []) if fd["check"] == name]
        if c["status"] == "fail" and elsewhere and not own:
            notes.insert(0, f"its failures are listed under {', '.join(elsewhere)} (same root)")
        rows.append([name, Cell(c["status"], "good" if c["status"] == "pass" else
                                "bad" if c["status"] in ("fail", "error") else ""),
                     c["bug_class"], c["title"], counts_text(c.get("stats", {})), "; ".join(notes)])
    return [Heading(2, "Checks"), Figure(bar_chart(results["checks"]), ""),
            Table(["check", "status", "class", "claim", "checked (the check's own counts)", "notes"], rows)]


def _finding(k: int, fd: Mapping[str, Any], texts: Mapping[str, str], records: Mapping[str, Mapping]) -> Block:
    times = f" (×{fd['count']}: identical findings folded)" if fd.get("count", 1) > 1 else ""
    known = "KNOWN: " if fd.get("known") else ""
    sig = fd.get("signature") or {}
    blocks: list[Block] = [
        Heading(3, f"{k}. {known}[{fd['check']}] {fd['title']} — `{fd['case_id']}`{times}", anchor=f"finding-{k}"),
        Para(f"severity **{fd['severity']}**, bug class **{fd['bug_class']}**, example {fd['example']}"
             + (f"; also seen by {', '.join(f'`{c}`' for c in fd['also_seen_by'])}" if fd["also_seen_by"] else "")),
        Para(("" if fd.get("record_check", fd["check"]) == fd["check"] else f"`{fd['record_check']}` recorded: ")
             + fd["explanation"])]
    if sig:
        blocks.append(Para(f"signature `{sig['signature']}`: check `{sig['check']}`, mechanism {sig['mechanism']}"
                           + (" — a known finding (`--known`): recorded, not failing the run" if known else "")))
    if fd.get("reasons"):
        blocks.append(Bullets(fd["reasons"]))
    blocks += story_blocks(fd["story"], texts, fd["check"], fd["witness"])
    if fd.get("replay"):
        blocks.append(Para(f"Replay: `{fd['replay']}`"))
    others = [records[c] for c in fd.get("failures", []) if c != fd["case_id"] and c in records]
    if others:
        blocks.append(Para("Failure records folded into this finding (same root):"))
        blocks.append(Bullets([f"[{r['check']}] {r['title']} — `{r['case_id']}`"
                               + (f": `{r['replay']}`" if r.get("replay") else "") for r in others]))
    return Section(blocks, "finding" + (" critical" if fd["severity"] == "critical" else ""))


def report_blocks(results: Mapping[str, Any]) -> list[Block]:
    """The whole report as blocks; report.md and report.html are two renderings of these."""
    out = _head(results) + _checks(results)
    if results["errors"]:
        out += [Heading(2, "Engine errors"), Bullets(results["errors"])]
    findings = results.get("findings", [])
    if findings:
        n_fail = sum(len(c["failures"]) for c in results["checks"].values())
        out += [Heading(2, "Findings"),
                Para(f"{len(findings)} finding(s) from {n_fail} failure record(s): failures about the same request "
                     "are one finding, listed under the most specific check that saw it.")]
        texts = results.get("decoded") or {}
        records = {f["case_id"]: f for c in results["checks"].values() for f in c["failures"]}
        out += [_finding(k, fd, texts, records) for k, fd in enumerate(findings, start=1)]
    out += known_blocks(results)
    out += coverage_blocks(results)
    if results["minimised"]:
        out += [Heading(2, "Minimised witnesses (`--minimise`)"),
                Bullets([f"`{check}`: {line}" for check, line in results["minimised"].items()])]
    return out


def known_blocks(results: Mapping[str, Any]) -> list[Block]:
    """The run's known-findings file, entry by entry: seen (how often) or fixed."""
    known = results.get("known")
    if not known:
        return []
    rows = []
    for e in known["entries"]:
        n = known["seen"].get(e["signature"], 0)
        state = Cell(f"seen ×{n}", "") if n else Cell("FIXED: not seen" + (" (fails the run: --strict-known)"
                                                                        if known["strict"] else ""), "good")
        rows.append([f"`{e['signature']}`", state, e.get("check", ""), e.get("title", ""), e.get("upstream", ""),
                     e.get("note", "")])
    return [Heading(2, "Known findings (`--known`)"),
            Para("Failures with these signatures are recorded and shown, and do not fail the run; one not seen "
                 "is reported as fixed."),
            Table(["signature", "this run", "check", "title", "upstream", "note"], rows)]


def report_md(results: Mapping[str, Any]) -> str:
    return to_md(report_blocks(results))


def report_html(results: Mapping[str, Any]) -> str:
    """The same blocks as report.md, as one self-contained page (inline SVG, no scripts)."""
    return page(f"kvparity: {results['run'].get('engine')}", report_blocks(results))


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
        old = read_json(Path(run_dir) / "results.json", "results file")
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in CARRIED if isinstance(old, dict) and old.get(k) is not None}


def print_fixed(analysis: Analysis) -> None:
    """One line per known finding (`--known`) the run did not see."""
    if analysis.known is not None:
        for e in analysis.known.fixed:
            print(f"FIXED known finding {e['signature']} [{e.get('check', '?')}] {e.get('title', '')}: not seen in "
                  f"this run" + ("; --strict-known fails the run until it leaves the known-findings file"
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
    for fd in findings:
        also = f"; also seen by {', '.join(fd['also_seen_by'])}" if fd.get("also_seen_by") else ""
        times = f"; x{fd['count']}" if fd.get("count", 1) > 1 else ""
        sig = (fd.get("signature") or {}).get("signature")
        print(f"{'KNOWN' if fd.get('known') else 'FAIL'} [{fd['check']}] {fd['title']} ({fd['case_id']}{also}{times}"
              f"{f'; signature {sig}' if sig else ''}): "
              f"{replay_command(run_dir / 'witnesses' / (fd['case_id'] + '.json'), engine)}")
    print_fixed(analysis)


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
    return results
