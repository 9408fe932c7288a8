"""`kvparity merge RUN_DIR... --out DIR`: one verdict and report for a campaign's shards (`kvparity run
--shard i/n`), judged from their verified histories.

`error` if a shard errored, is missing (n declared, fewer given), did not finish, or its history is not
sealed and intact; findings are listed once across shards (by signature), coverage is summed. Exit codes
as for `kvparity run`: the merged verdict's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from kvparity.parsing import UsageParser, output_dir, run_command, summary


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="kvparity merge", description=summary(__doc__))
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the shards' run folders")
    p.add_argument("--out", required=True, type=output_dir, metavar="DIR",
                   help="where the merged report goes (created; never a run folder nor inside one)")
    return p


def work(args: argparse.Namespace) -> int:
    out = Path(args.out)
    refuse_run_folder(out)  # a shard's folder among them
    return merge_into(out, [Path(d) for d in args.run_dirs])


def refuse_run_folder(out: Path) -> None:
    """A merged report (`merge --out`, `campaign --out`) never goes into a run folder, nor inside one: it
    writes results.json, report.md/.html and junit.xml and empties witnesses/, so over a FAILing run it
    replaced that run's verdict files with the campaign's (PASS) and deleted its witnesses."""
    from conformance.contract import UsageError
    from conformance.history_files import history_in

    where = out.resolve()
    for folder in (where, *where.parents):
        if history_in(folder) is not None:
            what = "a run folder" if folder == where else f"inside the run folder {folder}"
            raise UsageError(f"--out {out} is {what} (it holds a history); the merged report goes elsewhere")


def merge_into(out: Path, run_dirs: Sequence[Path], problems: Sequence[str] = ()) -> int:
    """Merge `run_dirs` into a report in `out` and print its verdict; the exit code. `problems`: what the
    caller knows is wrong beyond the folders (`kvparity campaign`: a shard that left none, and why), each
    an error of the merged verdict. Written even when no folder is given, so `out` never keeps the report
    of an earlier merge."""
    from conformance.report.console import print_summary

    history, analysis, campaign, results = write_merged(out, run_dirs, problems)
    print_summary(analysis, out, history.meta.get("engine"))  # as `kvparity run` prints its own, with the shards
    given = len(results["campaign"]["shards"])
    steps = results["shrink_steps"]
    print(f"{analysis.verdict.upper()}: {given} of {campaign['count'] or '?'} shard(s), {results['examples']} examples"
          f"{f' (+{steps} shrink steps)' if steps else ''}, report {out}")
    return analysis.exit_code


def write_merged(out: Path, run_dirs: Sequence[Path], problems: Sequence[str] = ()) -> tuple[Any, Any, Any, dict]:
    """Merge `run_dirs` and write the merged report into `out`, printing nothing: (history, analysis,
    campaign, results)."""
    from conformance.campaign_merge import merge
    from conformance.campaign_report import write_campaign
    from conformance.contract import UsageError

    history, analysis, campaign = merge(run_dirs)
    analysis.errors[:0] = problems
    campaign["problems"][:0] = problems
    try:
        out.mkdir(parents=True, exist_ok=True)
        results = write_campaign(out, history, analysis, campaign)
    except OSError as exc:
        raise UsageError(f"cannot write the merged report in {out}: {exc}") from None
    return history, analysis, campaign, results


def main(argv: Sequence[str] | None = None, session: object = None) -> int:
    return run_command("kvparity merge", build_parser().parse_args, work, argv)
