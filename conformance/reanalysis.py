"""`kvparity report RUN_DIR`: re-judge a stored run from its history alone — without re-verdicting it.

A run's verdict is written once, by the run (or, for a run whose process died, by its supervisor), and
the exit code, results.json, report.md/html and junit.xml agree on it. Re-analysis used to rewrite those
files: two edited lines of the history, or `--checks parity` on a failed run, turned the folder's FAIL
into a PASS and left the old witnesses beside it. Now:

- the history's integrity is verified first (conformance.history_chain): an edited, reordered or cut
  history is refused in one line, exit 3, and nothing is written; so is one whose last chain value is
  not the `history_digest` the run's results.json recorded (a chain stripped to pass as legacy); a
  legacy history (written before the chain, its results.json recording no digest) is re-judged and said
  to be unverified;
- the re-analysis goes to `RUN_DIR/reanalysis/` (its own results.json, reports, junit.xml, witnesses/),
  headed by what was re-judged and how; the run's own files are never touched. Only a run folder with
  no results.json at all (its process was killed before writing one) gets its verdict files written in
  the folder itself: that is the first verdict, not a second one;
- a `--checks` that leaves out checks the run chose is said, on the console and in the re-analysis.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from attrs import frozen

from conformance import known, validation
from conformance.analysis import Analysis, analyse
from conformance.contract import EngineError, UsageError
from conformance.history import History, NotAHistory, parse, read_events
from conformance.history_chain import VERIFIED, Integrity, verify

PROCESS_CHARS = 500  # of results.json's `process` (how the run's process ended), shown as one problem
SUBFOLDER = "reanalysis"  # where a re-analysis goes when the run has its own verdict files


@frozen
class Verified:
    """A run folder's history, read and verified: the parsed history (its problems among its errors),
    the chain's verdict and the problems alone — reading problems, and how the run's process died after
    its history ended where its results.json says so (a campaign merge reports them per shard)."""

    history: History
    integrity: Integrity
    problems: list[str]


def _merged_report(folder: Path) -> bool:
    """Whether `folder` holds the results.json `kvparity merge` writes (it has no history of its own)."""
    from conformance.untrusted import read_json

    try:
        results = read_json(folder / "results.json", "results.json")
    except (OSError, ValueError):  # UsageError (too big, too deep, not JSON) is a ValueError
        return False
    return isinstance(results, dict) and isinstance(results.get("campaign"), dict)


def read_verified(run_dir: Path) -> Verified:
    """The run's history, verified and matched against the verdict written from it; a one-line
    UsageError if it is missing, unreadable, tampered with, or not the history the run was judged on."""
    from conformance.history_files import history_in
    from conformance.untrusted import check_example_size

    path = history_in(run_dir)  # a run's history.jsonl, or a committed folder's history.jsonl.gz
    if path is None:
        hint = (" (a campaign's folder: its shards' run folders are under shards/; `kvparity merge` them again)"
                if (Path(run_dir) / "shards").is_dir() else
                " (a campaign's merged report: `kvparity merge` its shards' run folders again; its results.json "
                "lists them)" if _merged_report(Path(run_dir)) else "")
        raise UsageError(f"no history.jsonl (or history.jsonl.gz) in {run_dir}: not a run folder{hint}")
    try:
        events, problems = read_events(path)
        integrity = verify(events)
        if integrity.problems:
            raise UsageError(f"{path} fails its integrity check, not re-judged: {integrity.line()}")
        history = parse(events)
        for ex in history.examples:  # judging an example costs the square of its size
            check_example_size(len(ex.step_list), sum(len(s.get("requests") or ()) for s in ex.step_list),
                               f"{path} example {ex.index}")
        validation.recorded(history)  # the values the checks read have the types a run writes
    except NotAHistory as exc:
        raise UsageError(str(exc)) from None
    except UsageError:  # already one line (a cap, a damaged gzip): not re-worded
        raise
    except EngineError as exc:
        raise UsageError(f"{path} holds what no run writes: {exc}") from None
    # OverflowError: int(Infinity) of a legacy line; AttributeError: an object where a run writes a mapping
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError) as exc:
        raise UsageError(f"{path} is not a readable kvparity history: {type(exc).__name__}: {exc}") from None
    said = recorded(run_dir)
    refuse_unmatched(run_dir, history, said)
    died = said.get("process")
    if isinstance(died, str) and died.strip():  # what the history cannot say: its process died after it
        died = " ".join(died.split())[:PROCESS_CHARS]  # the supervisor's one line; the file is not trusted with more
        if died not in problems:
            problems.append(died)
    history.errors.extend(problems)
    return Verified(history, integrity, list(problems))


def recorded(run_dir: Path) -> dict[str, Any]:
    """The run's own results.json ({} if absent or unreadable). Two of its values are the re-judging's:
    `history_digest` (the history it was judged on) and `process` (how its process ended, where it died:
    a run killed after its verdict has a complete, sealed history, and only its supervisor's report says
    error — judged from the history alone it was PASS, by `kvparity report` and `kvparity merge` alike)."""
    from conformance.untrusted import read_json

    try:  # capped and depth-checked: results.json is as untrusted as the history (UsageError is a ValueError)
        data = read_json(run_dir / "results.json", "results.json")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def refuse_unmatched(run_dir: Path, history: History, said: dict[str, Any]) -> None:
    """A history that is not the one the run's verdict was written from (its chain stripped to pass as
    legacy, or re-chained after an edit) is refused: the verdict files and the evidence must agree."""
    recorded = said.get("history_digest")
    recorded = recorded if isinstance(recorded, str) else None
    if recorded is not None and history.digest != recorded:
        now = "no chain (read as legacy)" if history.digest is None else f"digest {history.digest[:12]}"
        raise UsageError(f"{run_dir / 'history.jsonl'} fails its integrity check, not re-judged: it is not the "
                         f"history the run was judged on (results.json records digest {recorded[:12]}, the "
                         f"history has {now})")


def run_checks(history: History) -> list[str]:
    """The registered checks the run chose (all of them where it did not record its choice)."""
    from conformance.checks import CHECKS

    chosen = history.meta.get("checks")
    return [c for c in chosen if c in CHECKS] if isinstance(chosen, list) and chosen else list(CHECKS)


def _write(run_dir: Path, subfolder: str, history: History, analysis: Analysis, info: dict[str, Any]) -> None:
    from conformance.report import write_report
    from conformance.run_folder import clear_folder

    try:
        if subfolder:
            clear_folder(run_dir, f"{subfolder}/witnesses")  # no earlier re-analysis' witness beside this one
        write_report(run_dir, history, analysis, subfolder=subfolder, reanalysis=info)
    except OSError as exc:
        raise UsageError(f"cannot write the report in {run_dir}: {exc}") from None


def reanalyse(run_dir: Path, asked: Sequence[str] = ()) -> int:
    """Re-judge `run_dir` with the checks `asked` (none: those the run chose); print the verdict and
    where it was written; return its exit code."""
    from conformance.history_files import history_in

    verified = read_verified(run_dir)
    history, integrity = verified.history, verified.integrity
    analysis = known.apply(history, analyse(history, list(asked) or history.meta.get("checks") or None))
    chosen = list(analysis.checks)
    left_out = [c for c in run_checks(history) if c not in chosen]
    first = not asked and not os.path.lexists(run_dir / "results.json")
    subfolder = "" if first else SUBFOLDER
    summary = (f"checks {', '.join(chosen)}"
               + (f"; check set NARROWED: the run also chose {', '.join(left_out)}, not re-judged here"
                  if left_out else "") + f"; {integrity.line()}")
    _write(run_dir, subfolder, history, analysis,
           {"checks": chosen, "narrowed": left_out, "integrity": integrity.status, "summary": summary})
    for name in analysis.checks:
        print(f"{name:22s} {analysis.status(name)}")
    for e in analysis.errors:
        print(f"ERROR: {e}")
    if integrity.status != VERIFIED:
        print(f"NOTE: {integrity.line()}")
    if left_out:
        print(f"NOTE: check set narrowed to {', '.join(chosen)}; the run also chose {', '.join(left_out)}: "
              "this is not the run's verdict")
    told = "" if first else f"; the run's own verdict files are unchanged, the re-analysis is in {run_dir / SUBFOLDER}"
    print(f"{analysis.verdict.upper()}: re-analysed {len(history.examples)} examples from "
          f"{history_in(run_dir)}{told}")
    return analysis.exit_code


def write_known(run_dir: Path, path: Path) -> int:
    """`kvparity report RUN_DIR --write-known FILE`: the run's findings as known findings, one entry per
    signature, for a person to review and commit — added to FILE's entries where FILE exists (their upstream
    links and notes kept), else a new file.

    Every signature the gate judges is written, not only the findings': a run with `--known` fails on any
    failing example whose signature is not listed (`bugs_seen`), and one bug shows several faces — the
    checks and mechanisms its failures meet. Written from its findings alone, a file did not hold its own
    run (measured on the reference engine's `rejected_draft_committed`, ci, seed 0: 1 finding, 5 example
    signatures; the same seed rerun with the file it wrote: FAIL). Another seed meets other faces (the
    zoo's faults, seeds 1-3: 1 to 8 not met by seed 0), so FILE keeps what it had: written from several
    runs, it holds what each met. An entry no run meets any more is the person's to remove
    (`--strict-known` reports it FIXED)."""
    from conformance.signature import signed_findings

    history = read_verified(run_dir).history
    analysis = analyse(history, history.meta.get("checks") or None)
    existing = known.load(path) if path.exists() else []  # the user's file, reviewed: read as untrusted
    entries: dict[str, dict[str, str]] = {e["signature"]: dict(e) for e in existing}
    had = {e["signature"]: e for e in (known.recorded(history) or ([], False))[0]}  # what the run was given
    new = 0
    for sig, fd in [*signed_findings(history, analysis), *known.example_findings(history, analysis.failed_checks)]:
        if sig.id not in entries:
            note = f"seen in {run_dir.name}, example {fd.failure.example} ({fd.failure.case_id})"
            old = had.get(sig.id, {})
            entries[sig.id] = known.entry(sig, old.get("upstream", ""), old.get("note", note))
            new += 1
    try:
        path.write_text(known.file_text(entries.values()), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write known-findings file {path}: {exc.strerror or exc}") from None
    for e in entries.values():
        print(f"{e['signature']} [{e['check']}] {e['title']} ({e['mechanism']})")
    print(f"wrote {len(entries)} known finding(s) to {path} ({new} new, {len(existing)} it had): review "
          f"it (add upstream links), commit it, and pass it to `kvparity run --known {path}`")
    return 0
