"""`kvparity replay WITNESS`: re-run a recorded failure on a fresh engine and say FIXED (0), FAILED (1),
INCONCLUSIVE (2) or ERROR (3).

A witness may name a registered engine only (it cannot choose code to import) and loopback hosts only;
another adapter or machine is named here, with --engine and --engine-arg. From the console it runs
supervised, like `kvparity run`."""

from __future__ import annotations

import argparse
from typing import Sequence

from conformance.arguments import DEFAULT_TIMEOUT_S, positive_seconds
from conformance.engine_lifecycle import Session
from kvparity.parsing import UsageParser, run_command, summary


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="kvparity replay", description=summary(__doc__))
    p.add_argument("case", help="path to a witness JSON file from a report's witnesses/ folder")
    p.add_argument("--engine", default=None,
                   help="adapter to replay on (none: the registered engine the witness names); the only way "
                        "to replay on an unregistered module:Class adapter")
    p.add_argument("--engine-arg", action="append", default=[], metavar="K=V",
                   help="override an adapter argument; a witness may only name loopback hosts (base_url=...), "
                        "so another machine is reached by naming it here")
    p.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                   help="seconds per engine call before it counts as hung")
    return p


def main(argv: Sequence[str] | None = None, session: Session | None = None) -> int:
    from conformance.engines import parse_engine_args
    from conformance.witness_replay import replay_case

    def work(args: argparse.Namespace) -> int:
        word, code, detail = replay_case(args.case, parse_engine_args(args.engine_arg), args.timeout,
                                         args.engine, session)
        print(f"{word}: {detail}")
        return code

    return run_command("kvparity replay", build_parser().parse_args, work, argv)
