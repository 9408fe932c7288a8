"""The museum's page (`reports/museum.md`): per exhibit, was the bug caught on the buggy release (by which
check, after how many examples, with how small a witness, and the command that replays it), and does the
fixed release pass; then the CI profile across releases. Judged from the run folders alone."""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Callable

from attrs import frozen

from kvparity.commands.museum.exhibits import Exhibit, VersionRun
from kvparity.commands.museum.outcome import Outcome

CAUGHT_AND_FIXED = "caught; fixed release passes"


@frozen
class Judged:
    status: str
    good: bool  # caught on the buggy release, and passing on the fixed one (or no fixed release exists)
    buggy: Outcome
    fixed: Outcome | None


def slug(run: VersionRun) -> str:
    return f"versions-{run.family}-" + re.sub(r"[^a-z0-9]+", "-", run.title.lower()).strip("-")


def judge(e: Exhibit, buggy: Outcome, fixed: Outcome | None) -> Judged:
    caught = buggy.says(e.check, e.expect) and buggy.verdict in ("fail", "inconclusive")
    if buggy.note == "not run" and buggy.run_dir is None:
        return Judged("not run yet", False, buggy, fixed)
    if buggy.verdict == "error" and not caught:
        return Judged(f"buggy release: error ({buggy.note})", False, buggy, fixed)
    if not caught:
        return Judged(f"NOT caught: `{e.check}` said {buggy.checks.get(e.check, 'nothing')}, run {buggy.verdict}",
                      False, buggy, fixed)
    if fixed is None:
        return Judged("caught; no fixed release exists", True, buggy, None)
    if fixed.verdict == "pass":
        return Judged(CAUGHT_AND_FIXED, True, buggy, fixed)
    return Judged(f"caught, but the fixed release says {fixed.verdict}"
                  + (f" ({fixed.note})" if fixed.verdict == "error" else ""), False, buggy, fixed)


def _witness(o: Outcome) -> str:
    if o.witness_tokens is None:
        return "-"
    return f"{o.witness_requests} req, {o.witness_tokens} tok ({o.witness_blocks:.1f} blocks)"


def _failing(o: Outcome) -> str:
    bad = [c for c, s in o.checks.items() if s in ("fail", "error", "inconclusive")]
    return ", ".join(f"{c} {o.checks[c]}" for c in bad) or "-"


def page(exhibits: list[Exhibit], runs: list[VersionRun], root: Path,
         read: Callable[[Path, str | None], tuple[dict | None, Outcome]]) -> tuple[str, dict[str, Judged]]:
    judged: dict[str, Judged] = {}
    records: dict[str, tuple[dict | None, Outcome, dict | None, Outcome | None]] = {}
    for e in exhibits:
        brec, buggy = read(root / e.id / e.buggy, e.check)
        frec, fixed = read(root / e.id / e.fixed, None) if e.fixed else (None, None)
        judged[e.id] = judge(e, buggy, fixed)
        records[e.id] = (brec, buggy, frec, fixed)
    good = sum(j.good for j in judged.values())
    out = ["# The bug museum: real bugs in released engine versions, rediscovered",
           "",
           f"Written by `kvparity museum` on {_dt.date.today().isoformat()} from the run folders under `{root}`. "
           f"Each exhibit is a public bug: the suite is run, untuned, on the release that has it and on the "
           f"release that fixed it, each in its own venv (`.kvparity/venvs/<package>-<version>`, built by the "
           f"museum from PyPI). **{good} of {len(exhibits)} exhibits caught on the buggy release and passing "
           f"on the fixed one** (or caught where no release fixes it yet). One command re-runs a row: "
           f"`kvparity museum --exhibit ID --runs {root}`; the catalogue is "
           f"`kvparity/commands/museum/exhibits/*.toml`; `kvparity report RUN_DIR` renders a run folder's "
           f"report.html again from its history.",
           "",
           "| exhibit | bug (source) | buggy release: caught by, examples to 1st failure, witness | fixed release | result |",
           "|---|---|---|---|---|"]
    for e in exhibits:
        j = judged[e.id]
        b = j.buggy
        caught = (f"`{e.buggy}`: {b.verdict} — `{e.check}` {b.checks.get(e.check, '-')}, "
                  f"{b.first_failure or '-'} of {b.examples} examples, {_witness(b)}")
        if b.verdict == "error" and b.run_dir is None:
            caught = f"`{e.buggy}`: {b.note}"
        fixed = "(none)" if j.fixed is None else (
            f"`{e.fixed}`: {j.fixed.verdict}" + (f" ({j.fixed.examples} examples)" if j.fixed.examples else "")
            + (f" — {j.fixed.note}" if j.fixed.verdict == "error" else ""))
        out.append(f"| `{e.id}` | {e.title} ({e.source}) | {caught} | {fixed} | {'**' + j.status + '**' if j.good else j.status} |")
    for e in exhibits:
        brec, b, frec, f = records[e.id]
        out += ["", f"## {e.id}", "", f"{e.title}. Source: {e.source}. Bug class {e.bug_class} (shared/BUG_CLASSES.md).",
                ""]
        if e.notes:
            out += [e.notes, ""]
        out.append(f"- Run: `kvparity run {' '.join(e.args)} --seed {e.seed}` in each release's venv.")
        for word, rec, o in (("buggy", brec, b), ("fixed", frec, f)):
            if o is None:
                continue
            where = f" — run folder `{o.run_dir}`" if o.run_dir else ""
            took = f", {rec['seconds']:.0f} s" if rec and rec.get("seconds") else ""
            out.append(f"- {word} `{rec['version'] if rec else (e.buggy if word == 'buggy' else e.fixed)}`"
                       f" (adapter saw {o.engine_version or '?'}): {o.verdict}; failing checks: {_failing(o)}{took}{where}")
            if o.witness is not None and rec:
                out.append(f"  - replay: `{rec['venv']}/bin/kvparity replay {o.witness}`")
            if o.note and o.verdict != "pass":
                out.append(f"  - note: {o.note}")
    if runs:
        out += ["", "## The CI profile across releases", "",
                "| engine | release | verdict | failing checks | examples | run folder |", "|---|---|---|---|---|---|"]
        for r in runs:
            for v in r.versions:
                rec, o = read(root / slug(r) / v, None)
                out.append(f"| {r.package.name}: {r.title} | `{v}` | {o.verdict} | {_failing(o)} | {o.examples or '-'} | "
                           f"{('`' + str(o.run_dir) + '`') if o.run_dir else o.note} |")
            if r.notes:
                out += ["", f"{r.package.name}, {r.title}: {r.notes}", ""]
    return "\n".join(out) + "\n", judged
