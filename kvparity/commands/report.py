"""`kvparity report RUN_DIR`: re-analyse a stored run folder from its history (verified first), written to
RUN_DIR/reanalysis/, never over the run's own verdict; or write its findings as a known-findings file.

Exit codes as for `kvparity run`: the re-analysed verdict's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from kvparity.parsing import UsageParser, run_command, summary


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="kvparity report", description=summary(__doc__))
    p.add_argument("run_dir", help="a run folder holding history.jsonl")
    p.add_argument("--checks", default="", help="comma-separated check names (empty: those the run chose; "
                                                "fewer is said to be a narrowed check set)")
    p.add_argument("--write-known", default=None, metavar="FILE",
                   help="instead: write the run's findings as a known-findings file (for --known) to review "
                        "and commit")
    return p


def work(args: argparse.Namespace) -> int:
    from conformance.reanalysis import reanalyse, write_known

    if args.write_known:
        return write_known(Path(args.run_dir), Path(args.write_known))
    return reanalyse(Path(args.run_dir), [c for c in args.checks.split(",") if c.strip()])


def main(argv: Sequence[str] | None = None, session: object = None) -> int:
    return run_command("kvparity report", build_parser().parse_args, work, argv)
