"""The merged report of a campaign (`kvparity merge --out DIR`): the one run report, over the shards'
joined history, with each finding once across shards and a table of the shards.

The same bug found by three shards is three findings of three runs; the campaign lists it once, under
its signature (conformance.signature), with the shards that found it and how often. Everything else
(per-check verdicts, coverage, witnesses, junit.xml) is the ordinary report's, from the same blocks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from conformance.analysis import Analysis
from conformance.history import History
from conformance.report.doc import Heading, Para, Table, page, to_md
from conformance.report.junit import junit_xml
from conformance.report.results import results_json, witness_path, write_witnesses
from conformance.report.sections import report_blocks
from conformance.run_folder import clear_folder, write_text


def shard_of_example(example: int, ranges: Sequence[tuple[int, int, Any]]) -> str:
    return next((str(run.shard) for first, last, run in ranges if first <= example < last), "?")


def engine_args_of_example(example: int, ranges: Sequence[tuple[int, int, Any]]) -> dict[str, Any]:
    """The engine arguments the shard that ran `example` ran with — its own (`--shard-engine-arg`: its
    replica) among them, so its witness replays where it failed."""
    return next((dict(run.history.meta.get("engine_args") or {}) for first, last, run in ranges
                 if first <= example < last), {})


def dedupe(findings: list[dict[str, Any]], ranges: Sequence[tuple[int, int, Any]],
           shards: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One finding per signature, in report order, with the shards that found it: the shard of each
    merged finding, and every shard whose own report lists the signature (a check keeps one failure
    per title, so the merged findings alone under-count the shards)."""
    out: dict[str, dict[str, Any]] = {}
    for fd in findings:
        sig = fd["signature"]["signature"]
        kept = out.setdefault(sig, {**fd, "shards": [], "occurrences": 0})
        kept["occurrences"] += 1
        kept["shards"].append(shard_of_example(int(fd.get("example", -1)), ranges))
    for kept in out.values():
        sig = kept["signature"]["signature"]
        kept["shards"] += [s["shard"] for s in shards if sig in s.get("signatures", ())]
        kept["shards"] = sorted(set(kept["shards"]), key=lambda s: [int(p) for p in s.split("/")] if "/" in s else [0])
    return list(out.values())


def campaign_blocks(campaign: Mapping[str, Any]) -> list[Any]:
    own = any(s.get("own_engine_args") for s in campaign["shards"])
    rows = [[s["shard"], str(s["verdict"] or "(none recorded)"), _examples(s),
             f"`{s['seed']}`", f"`{(s['history_digest'] or '')[:12]}`", f"`{s['run_dir']}`"]
            + ([", ".join(f"`{k}={v}`" for k, v in s["own_engine_args"].items())] if own else [])
            for s in campaign["shards"]]
    out: list[Any] = [Heading(2, "Campaign"),
                      Para(f"{len(campaign['shards'])} of {campaign['count']} shard(s) merged, campaign seed "
                           f"`{campaign['campaign_seed']}`; their histories were verified and judged as one run.")]
    if campaign.get("baselines_differ"):
        out.append(Para(f"{campaign['baselines_differ']} request(s) had another plain decoding in another shard "
                        "(replicas on other hardware, or an engine whose plain decoding is not the same in every "
                        "process): each shard's examples were judged by its own; the first shard's stands for the "
                        "coverage and the findings' stories."))
    if rows:
        out.append(Table(["shard", "its own verdict", "examples", "seed", "history", "run folder"]
                         + (["its own engine arguments"] if own else []), rows))
    found = campaign.get("findings") or []
    if found:  # which shard to rerun for a finding: the console and results.json said, the report did not
        out.append(Table(["finding", "signature", "found by", "failure records"],
                         [[f"[{f['check']}] {f['title']}" + (f" ({f['mechanism']})" if f.get("mechanism") else "")
                           + (", known" if f.get("known") else ""),
                           f"`{f['signature']}`", ", ".join(f["shards"]), str(f["occurrences"])] for f in found]))
    if campaign["problems"]:
        out.append(Para("**The campaign is incomplete or inconsistent:** " + "; ".join(campaign["problems"])))
    return out


def _examples(shard: Mapping[str, Any]) -> str:
    """A shard's examples as its own report counts them: those drawn, then (+N) those run while shrinking."""
    recorded, steps = shard["examples"][1] - shard["examples"][0], shard.get("shrink_steps") or 0
    return f"{recorded - steps}" + (f" (+{steps} shrink steps)" if steps else "")


def write_campaign(out_dir: Path, history: History, analysis: Analysis, campaign: Mapping[str, Any]) -> dict:
    """Write the merged report into `out_dir`; return its results."""
    ranges = campaign["_ranges"]
    block = {k: v for k, v in campaign.items() if not k.startswith("_")}
    paths = {f.case_id: witness_path(out_dir, f) for f in analysis.failures}
    results = results_json(history, analysis, paths)
    results["findings"] = dedupe(results["findings"], ranges, block["shards"])
    block["findings"] = [{**fd["signature"], "shards": fd["shards"], "occurrences": fd["occurrences"],
                          "known": bool(fd.get("known"))} for fd in results["findings"]]
    results["campaign"] = block
    clear_folder(out_dir, "witnesses")  # no earlier merge's witness beside this one
    write_witnesses(out_dir, history, analysis, results["decoded"],
                    engine_args=lambda example: engine_args_of_example(example, ranges))
    write_text(out_dir, "results.json", json.dumps(results, indent=1))
    blocks = report_blocks(results)
    at = next((k for k, b in enumerate(blocks) if isinstance(b, Heading) and b.level == 2), len(blocks))
    blocks[at:at] = campaign_blocks(block)
    write_text(out_dir, "report.md", to_md(blocks))
    write_text(out_dir, "report.html", page(f"kvparity campaign: {results['run'].get('engine')}", blocks))
    write_text(out_dir, "junit.xml", junit_xml(results))
    return results
