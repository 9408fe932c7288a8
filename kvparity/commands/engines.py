"""`kvparity engines`: list the registered engine adapters (name and the class it loads).

The list is the entry-point group `kvparity.adapters` plus the shipped ones; `--engine` of `run` and
`replay` takes any of these names, or a `module:Class` of your own."""

from __future__ import annotations

import argparse
from typing import Sequence

from conformance.exit_codes import ExitCode
from kvparity.parsing import UsageParser, run_command, summary


def build_parser() -> argparse.ArgumentParser:
    return UsageParser(prog="kvparity engines", description=summary(__doc__))


def work(args: argparse.Namespace) -> int:
    from conformance.engines import known_engines

    for name, target in known_engines().items():
        print(f"{name:14s} {target}")
    return ExitCode.PASS


def main(argv: Sequence[str] | None = None, session: object = None) -> int:
    return run_command("kvparity engines", build_parser().parse_args, work, argv)
