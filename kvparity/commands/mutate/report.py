"""Scores and the written report of `kvparity mutate`: results.json (every row), README.md (for
people), one JSON file per survivor under survivors/ (its diff, its smallest differing scenario)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kvparity.commands.mutate.differ import difference_summary

KILLED = ("killed", "killed-crash", "killed-inconclusive")
# A survivor whose difference shows in these is a wrong answer (or a failure) the suite let through; one
# that differs only in reported counts (cached tokens, drafts) is an efficiency difference.
WRONG_ANSWER = {"output", "finish_reason", "error", "steps", "results"}
# Counts the contract makes no claim about: which drafts a drafter proposes, how many blocks an eviction
# counted, how a prefill was chunked, whether a request was preempted. An engine may report any value
# there as long as its outputs are right, so a survivor that differs only in these is a blind spot of the
# strict score but not of the contract: `claims_score` leaves it out (reported beside, never instead).
FREE_COUNTS = {"draft_proposed", "evictions", "prefill_chunks", "preempted"}
HOW_KILLED = {"killed": "by-fail", "killed-crash": "by-crash", "killed-inconclusive": "by-inconclusive"}


def status(row: Mapping[str, Any]) -> str:
    """killed (any kind), survivor, equivalent, undecided or unfinished."""
    if row["outcome"] in KILLED:
        return "killed"
    if row["outcome"] == "unfinished":
        return "unfinished"
    return row.get("classification") or "undecided"


def tally(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    t: dict[str, int] = defaultdict(int)
    for r in rows:
        t[status(r)] += 1
        if r["outcome"] in KILLED:
            t[HOW_KILLED[r["outcome"]]] += 1
        if status(r) == "survivor" and set(r.get("differs_in") or ()) & WRONG_ANSWER:
            t["survivor-wrong-answer"] += 1
        if status(r) == "survivor" and set(r.get("differs_in") or ()) <= FREE_COUNTS:
            t["survivor-free-counts"] += 1
    return dict(t)


def claims_score(t: Mapping[str, int]) -> float | None:
    """killed / (killed + survivors that differ in something the contract claims: an output, a finish
    reason, an error, a cached or accepted count); None when nothing could have been killed."""
    denom = t.get("killed", 0) + t.get("survivor", 0) - t.get("survivor-free-counts", 0)
    return t.get("killed", 0) / denom if denom else None


def score(t: Mapping[str, int]) -> float | None:
    """killed / (killed + survivors); None when nothing could have been killed (no such mutant)."""
    denom = t.get("killed", 0) + t.get("survivor", 0)
    return t.get("killed", 0) / denom if denom else None


def breakdown(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, dict[str, int]]:
    groups: dict[str, list] = defaultdict(list)
    for r in rows:
        groups[r["mutant"][key]].append(r)
    return {k: tally(v) for k, v in sorted(groups.items())}


def runs(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list[Mapping[str, Any]]]:
    """Rows grouped by (mode, seed): each group is one score."""
    out: dict[tuple[str, int], list] = defaultdict(list)
    for r in rows:
        out[(r["mode"], r["seed"])].append(r)
    return dict(out)


def _pct(s: float | None) -> str:
    return "n/a" if s is None else f"{100 * s:.0f}%"


def _table(title: str, groups: Mapping[str, Mapping[str, int]]) -> list[str]:
    lines = [f"| {title} | killed (fail / crash / inconclusive) | survivors (wrong answer) | equivalent | "
             "unfinished/undecided | score |",
             "|---|---|---|---|---|---|"]
    for name, t in groups.items():
        lines.append(f"| {name} | {t.get('killed', 0)} ({t.get('by-fail', 0)} / {t.get('by-crash', 0)} / "
                     f"{t.get('by-inconclusive', 0)}) | {t.get('survivor', 0)} ({t.get('survivor-wrong-answer', 0)}) | "
                     f"{t.get('equivalent', 0)} | {t.get('unfinished', 0) + t.get('undecided', 0)} | {_pct(score(t))} |")
    return lines


def render(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], survivors: Mapping[str, Mapping[str, Any]],
           notes: str = "") -> str:
    out = ["# Mutation testing of the reference engine", "",
           "Written by `kvparity mutate`. Mutants of the reference engine's decision code, made by cosmic-ray's core",
           "operators, each run through the conformance suite (stopping at the first failure); a mutant the suite does",
           "not kill is classified by a bounded differential search against the unmutated engine: *equivalent* when no",
           "scenario shows a difference, *survivor* (a blind spot) when one does. Score = killed / (killed + survivors).",
           "", "## What was run", "",
           f"- command: `{meta['command']}`",
           f"- commit: `{meta['commit']}`",
           f"- mutants: {meta['sampled']} sampled of {meta['population']} (sample seed {meta['sample_seed']}; modules "
           f"{', '.join(meta['modules'])}; operators: cosmic-ray {meta['cosmic_ray']} core, without "
           f"{', '.join(meta['excluded_operators'])})",
           f"- suite: profile {meta['profile']}, max examples {meta['max_examples'] or 'the profile’s'}, no shrinking, "
           f"Hypothesis seeds {', '.join(map(str, meta['seeds']))}; modes {', '.join(meta['modes'])}; "
           f"per-mutant limit {meta['limit_s']:g} s",
           f"- differential search: {meta['diff_scenarios']} scenarios (seed {meta['diff_seed']}), at most "
           f"{meta['diff_seconds']:g} s per mutant",
           f"- control (unmutated engine, same seeds): {meta['control']}",
           f"- wall time: {meta['seconds']:.0f} s", "", "## Scores", ""]
    if meta.get("partial"):
        out[-2:-2] = [f"- **partial**: the run was still going (or was stopped) after {len(rows)} mutant runs", ""]
    for (mode, seed), group in sorted(runs(rows).items()):
        t = tally(group)
        out.append(f"- **{mode}, seed {seed}**: {_pct(score(t))} ({t.get('killed', 0)} killed, {t.get('survivor', 0)} "
                   f"survivors of which {t.get('survivor-wrong-answer', 0)} with a wrong answer, {t.get('equivalent', 0)} equivalent, "
                   f"{t.get('unfinished', 0) + t.get('undecided', 0)} unfinished or undecided); "
                   f"{t.get('survivor-free-counts', 0)} survivors differ only in counts no claim covers "
                   f"({', '.join(sorted(FREE_COUNTS))}): against the contract's claims {_pct(claims_score(t))}")
    for (mode, seed), group in sorted(runs(rows).items()):
        out += ["", f"### {mode}, seed {seed}: per module", ""] + _table("module", breakdown(group, "module"))
        out += ["", f"### {mode}, seed {seed}: per kind of mutation", ""] + _table("kind", breakdown(group, "kind"))
    out += ["", "## Survivors", ""]
    if not survivors:
        out.append("None.")
    for s in survivors.values():
        d = s["difference"]
        out += [f"### `{s['mutant']['name']}` ({s['mode']})", "", "```diff", s["diff"], "```", "",
                f"Smallest differing scenario ({s['differing']} of {s['compared']} scenarios differed), "
                f"first difference at observation {d['observation']}, in {', '.join(s['differs_in'])}: "
                f"`survivors/{s['file']}`.", "",
                "What differs there (unmutated, mutant):", ""]
        out += [f"- `{where}`: `{json.dumps(pair[0])[:200]}` vs `{json.dumps(pair[1])[:200]}`"
                for where, pair in list(difference_summary(d).items())[:8]] + [""]
    out += ["", "## Every mutant", "", "| mutant | mode | seed | suite | checks failed (or the crash) | examples | s | class |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        said = ", ".join(r["failed_checks"]) or (r.get("cause", "")[:90].replace("|", "/") if r["exit_code"] == 3 else "")
        out.append(f"| `{r['mutant']['name']}` | {r['mode']} | {r['seed']} | {r['outcome']} | {said} | {r['examples'] if r['examples'] is not None else ''} | "
                   f"{r['seconds']:g} | {status(r)} |")
    if notes:
        out += ["", notes.rstrip()]
    return "\n".join(out) + "\n"


def write(out_dir: Path, meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
          survivors: Mapping[str, Mapping[str, Any]], notes: str = "") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "rows": list(rows)}, indent=1) + "\n")
    sdir = out_dir / "survivors"
    for s in survivors.values():
        sdir.mkdir(exist_ok=True)
        (sdir / s["file"]).write_text(json.dumps(s, indent=1) + "\n")
    readme = out_dir / "README.md"
    readme.write_text(render(meta, rows, survivors, notes))
    return readme
