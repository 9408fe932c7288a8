"""The sections of report.md and report.html: the head (verdict, run, engine arguments), the checks
table with each check's own counts, the findings told as stories, the known findings and what the run
exercised. Both files are renderings of the same blocks (`conformance.report.doc`), built from
results.json alone.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from conformance.report.exercised import bar_chart, counts_text
from conformance.report.exercised import blocks as exercised_blocks
from conformance.report.doc import Block, Bullets, Cell, Figure, Heading, Para, Section, Table, page, to_md
from conformance.report.lane import lane_file, lane_svg
from conformance.report.story import blocks as story_blocks


def engine_time(duration_s: float | None, engine_s: float | None) -> str | None:
    """How much of a run's wall time was spent inside engine calls, in words (None: not recorded). Below
    half, the engine waited on kvparity (drawing, recording, checking) most of the run: a fast engine is
    kept busy by more shards, each its own process (`--shard`, `kvparity campaign`)."""
    if duration_s is None or engine_s is None or duration_s <= 0:
        return None
    share = min(1.0, engine_s / duration_s)
    hint = "; the engine waited on kvparity most of the run: more shards keep it busy" if share < 0.5 else ""
    return f"{share:.0%} of it inside engine calls ({engine_s:.1f} s){hint}"


def _head(results: Mapping[str, Any]) -> list[Block]:
    run = results["run"]
    duration = "unknown time" if results["duration_s"] is None else f"{results['duration_s']} s"
    engine = engine_time(results["duration_s"], results.get("engine_s"))
    duration += f", {engine}" if engine else ""
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
    shrink = results.get("shrink_steps")
    out.append(Para(f"verdict **{results['verdict'].upper()}** (exit {results['exit_code']}), profile "
                    f"`{run.get('profile')}`, seed `{run.get('seed')}`, {results['examples']} examples"
                    + (f" (+{shrink} shrink steps)" if shrink else "") + f" in {duration}, "
                    f"near-ties {results['near_ties']}, findings {n_find}"
                    + (f" ({n_known} known)" if n_known else "")
                    + (f", relevant situations not reached: {', '.join(f'`{m}`' for m in missing)}" if missing else "")))
    args = run.get("engine_args") or {}
    if args:
        out.append(Para("engine arguments: " + ", ".join(f"`{k}={v}`" for k, v in sorted(args.items()))))
    return out


def _run_facts(results: Mapping[str, Any]) -> list[Block]:
    """Below the findings: what the run was, for whoever reproduces it."""
    run = results["run"]
    shrink = results.get("shrink_steps")
    return [Heading(2, "Run"),
            Para(f"{results['examples']} examples drawn"
                 + (f", and {shrink} more run while shrinking failures (not counted as examples)" if shrink else "")
                 + f"; seed `{run.get('seed')}`, profile `{run.get('profile')}`."),
            Para(f"versions: `{json.dumps(run.get('versions', {}))}`")]


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
    size = fd.get("witness_size") or {}
    blocks: list[Block] = [
        Heading(3, f"{k}. {known}{fd.get('headline') or fd['title']}{times}", anchor=f"finding-{k}"),
        Para(f"check `{fd['check']}` ({fd['title']}), severity **{fd['severity']}**, bug class **{fd['bug_class']}**, "
             f"example {fd['example']}, `{fd['case_id']}`"
             + (f"; witness: {size['requests']} request(s) in {size['batches']} batch(es), "
                f"{size['prompt_tokens']} prompt tokens" if size else "")
             + (f"; also seen by {', '.join(f'`{c}`' for c in fd['also_seen_by'])}" if fd["also_seen_by"] else ""))]
    if fd.get("story", {}).get("timeline"):
        blocks.append(Figure(lane_svg(fd["story"]), f"![Lane diagram of finding {k}]({lane_file(k)})"))
    blocks.append(Para(("" if fd.get("record_check", fd["check"]) == fd["check"] else f"`{fd['record_check']}` recorded: ")
                       + fd["explanation"]))
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
    out = _head(results)
    if results["errors"]:
        out += [Heading(2, "Engine errors"), Bullets(results["errors"])]
    findings = results.get("findings", [])
    if findings:
        n_fail = sum(len(c["failures"]) for c in results["checks"].values())
        texts = results.get("decoded") or {}
        records = {f["case_id"]: f for c in results["checks"].values() for f in c["failures"]}
        out += [Heading(2, "Findings"),
                Para(f"{len(findings)} finding(s) from {n_fail} failure record(s), the most direct first: shortest "
                     "witness, a difference from plain decoding before a difference between two runs.")]
        out.append(_finding(1, findings[0], texts, records))
        out += [_finding(k, fd, texts, records) for k, fd in enumerate(findings[1:], start=2)]
    out += _checks(results)
    out += known_blocks(results)
    out += exercised_blocks(results)
    if results["minimised"]:
        out += [Heading(2, "Minimised witnesses (`--minimise`)"),
                Bullets([f"`{check}`: {line}" for check, line in results["minimised"].items()])]
    return out + _run_facts(results)


def known_blocks(results: Mapping[str, Any]) -> list[Block]:
    """The run's known-findings file, entry by entry: seen (how often) or fixed."""
    known = results.get("known")
    if not known:
        return []
    rows = []
    for e in known["entries"]:
        n = known["seen"].get(e["signature"], 0)
        strict = (" (--strict-known: judged by the campaign's merge)" if known.get("in_shard") else
                  " (fails the run: --strict-known)") if known["strict"] else ""
        state = Cell(f"seen ×{n}", "") if n else Cell("FIXED: not seen" + strict, "good")
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
