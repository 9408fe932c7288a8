"""`kvparity run --engine NAME`: run the conformance suite against an engine and write a run folder
(history.jsonl, report.md / report.html / junit.xml, witnesses/) whose verdict is the exit code.

0 pass, 1 a violation with a shrunk witness, 2 inconclusive (a claimed capability never exercised), 3 an
error (the engine crashed, hung or answered malformed, or bad input), 130 interrupted. From the console
the work runs in a supervised child, so an engine that ends the process itself still gets a verdict."""

from __future__ import annotations

import argparse
from collections import Counter
import json
from pathlib import Path
from typing import Any, Callable, Sequence

from conformance.arguments import DEFAULT_TIMEOUT_S, positive_int, positive_seconds
from conformance.engine_lifecycle import Session, build_engine, close_engine
from conformance.contract import UsageError
from conformance.exit_codes import ExitCode
from conformance.reproduce import DEFAULT_MAX_SHRINK_SECONDS, seed_line
from conformance.step_counts import table
from kvparity.parsing import UsageParser, run_command, summary


def build_parser() -> argparse.ArgumentParser:
    from conformance.runner import DEFAULT_REPORT_DIR, PROFILES

    run = UsageParser(prog="kvparity run", description=summary(__doc__))
    run.add_argument("--engine", required=True, help="adapter name (see `kvparity engines`) or module:Class")
    run.add_argument("--engine-arg", action="append", default=[], metavar="K=V",
                     help="adapter argument (repeatable, each key once)")
    run.add_argument("--profile", default="dev", choices=list(PROFILES),
                     help="Hypothesis profile: dev 12 examples, ci 100 (derandomized), nightly 1000")
    run.add_argument("--checks", default="", help="comma-separated check names (empty: all)")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR,
                     help="where run folders go (the default is git-ignored; reports/ is for committed results)")
    run.add_argument("--seed", type=int, default=None,
                     help="Hypothesis seed (none: one is drawn and printed; the ci profile is derandomised)")
    run.add_argument("--max-examples", type=positive_int, default=None,
                     help="override the profile's example count (none: the profile's)")
    run.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                     help="seconds per engine call (construction and close included) before it counts as hung")
    run.add_argument("--no-shrink", "-x", "--exitfirst", action="store_true",
                     help="stop at the first failing example and report it unshrunk (faster)")
    run.add_argument("--max-shrink-seconds", type=positive_seconds, default=DEFAULT_MAX_SHRINK_SECONDS,
                     help="stop shrinking a failure after this many seconds; the witness so far is reported")
    run.add_argument("--calibration", default=None, metavar="FILE",
                     help="a `kvparity calibrate` file: its measured tau replaces the adapter's declared one, and "
                          "features are flagged against its plain near-tie rate (none: the declared tau)")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no progress line (by default: live on a terminal, every tenth of the examples in a log)")
    run.add_argument("--accept-unsteered", action="store_true",
                     help="a situation the adapter found no landmarks for (eos paths, near-ties, same-text pairs) "
                          "and the run never reached is noted, not inconclusive")
    run.add_argument("--minimise", action="store_true",
                     help="after the run, minimise one witness per failed check on fresh engines (<case>.min.json); "
                          "each replay builds an engine, so this is for engines that start fast")
    run.add_argument("--known", default=None, metavar="FILE",
                     help="known-findings file (`kvparity report RUN_DIR --write-known FILE`): failures with its "
                          "signatures are reported as known and do not fail the run; the run goes on looking")
    run.add_argument("--strict-known", action="store_true",
                     help="with --known: a known finding this run did not see (fixed) fails the run")
    return run


def work(args: argparse.Namespace, session: Session) -> int:
    from conformance import numerics, status
    from conformance.analysis import select_checks
    from conformance.progress import Progress
    from conformance.report import print_summary
    from conformance.registry import parse_engine_args, resolve
    from conformance.known import load as load_known
    from conformance.runner import new_run_dir, profile_settings, run_suite
    from kvparity.parsing import writable_folder

    engine_args = parse_engine_args(args.engine_arg)
    checks = select_checks([c for c in args.checks.split(",") if c.strip()])
    profile_settings(args.profile)
    calibration = numerics.load_calibration(args.calibration) if args.calibration else None
    known = load_known(args.known) if args.known else None
    if args.strict_known and known is None:
        raise UsageError("--strict-known needs --known FILE")
    report_dir = writable_folder(args.report_dir, "--report-dir")
    resolve(args.engine)  # an unknown engine is a usage error before anything is built
    engine = build_engine(args.engine, engine_args, args.timeout)
    if args.accept_unsteered:
        from conformance.situations import accept_unsteered

        accept_unsteered(engine)
    run_dir = new_run_dir(report_dir, args.engine)
    status.tell(run_dir=str(run_dir))
    outcome = run_suite(engine, engine_name=args.engine, engine_args=engine_args, profile=args.profile,
                        checks=checks, run_dir=run_dir, seed=args.seed, max_examples=args.max_examples,
                        timeout_s=args.timeout, shrink=not args.no_shrink, max_shrink_seconds=args.max_shrink_seconds,
                        tolerance=calibration.tau if calibration else None,
                        calibration=calibration.path if calibration else None,
                        progress=None if args.quiet else Progress(), close=True, known_findings=known,
                        strict_known=args.strict_known)
    # The engine is closed (a failing close is an error event of the history) before the report is
    # written, so the exit code, every report file and `kvparity report` tell one verdict.
    session.hard_exit = outcome.abandoned or outcome.interrupted
    print_summary(outcome.analysis, outcome.run_dir, args.engine)
    if outcome.report_error:
        print(f"ERROR: {outcome.report_error}")
    minimised = {}
    if args.minimise and not outcome.interrupted and not outcome.report_error:
        minimised = minimise_failures(outcome, lambda: build_engine(args.engine, engine_args, args.timeout),
                                      args.timeout, args.engine)
    if minimised:  # one writer of the report: rewrite it with what minimising found
        from conformance.history import load
        from conformance.report import write_report

        try:
            write_report(outcome.run_dir, load(outcome.run_dir / "history.jsonl"), outcome.analysis,
                         minimised=minimised)
        except OSError as exc:
            outcome.report_error = f"cannot write the report in {outcome.run_dir}: {exc}"
            print(f"ERROR: {outcome.report_error}")
    numerics_summary(outcome.run_dir, calibration)
    a = outcome.analysis
    code = outcome.exit_code
    if outcome.report_error and not outcome.interrupted:
        code = ExitCode.USAGE  # no report files: the run ends as an error, whatever it found
    word = "INTERRUPTED" if outcome.interrupted else "ERROR" if code == ExitCode.USAGE else a.verdict.upper()
    if outcome.shrink_capped:
        print(f"shrinking stopped at --max-shrink-seconds {args.max_shrink_seconds:g}: each witness is the smallest "
              f"failure found by then (a larger cap, or --minimise, may shrink it further)")
    print(table(Counter(outcome.step_kinds)))
    print(seed_line(args, outcome.seed))
    print(f"{word}: {outcome.examples} examples, near-ties {a.near_ties}, report {outcome.run_dir}", flush=True)
    status.tell(verdict=code)
    if outcome.interrupted and not outcome.closed and not outcome.abandoned:  # closed after its report
        closed = close_engine(engine, args.timeout)
        if closed is not None:
            print(f"ERROR: {closed}")
    return code


def numerics_summary(run_dir: Path, calibration: Any) -> None:
    """Near-ties by margin band and feature, and the features flagged for flipping near-ties more often
    than plain mode (conformance.numerics): printed and written as numerics.json beside the report."""
    from conformance import numerics
    from conformance.history import load
    from conformance.run_folder import write_text

    try:
        summary = numerics.summarise(load(run_dir / "history.jsonl"), calibration)
        write_text(run_dir, "numerics.json", json.dumps(summary, indent=1))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"numerics: not summarised ({type(exc).__name__}: {exc})")
        return
    for line in numerics.summary_lines(summary):
        print(line)


def minimise_failures(outcome: Any, new_engine: Callable[[], Any], timeout_s: float,
                      engine: str | None = None) -> dict[str, str]:
    """Minimise one witness per failed check, from the witness (the shrunk example) and from the run's
    first example that failed the check; check -> the line saying what came of it."""
    from conformance.history import load
    from conformance.strategies import step_from_json

    minimised: dict[str, str] = {}
    try:
        examples = {ex.index: ex for ex in load(outcome.run_dir / "history.jsonl").examples}
    except (OSError, ValueError):  # the history is unreadable: minimise from the witness files alone
        examples = {}
    for f in outcome.analysis.failures:
        witness = outcome.run_dir / "witnesses" / (f.case_id + ".json")
        if f.check not in minimised and witness.is_file():
            first = examples.get(outcome.first_failing.get(f.check, -1))
            also = [[step_from_json(s) for s in first.steps()]] if first else []
            minimised[f.check] = line = minimise_line(witness, new_engine, timeout_s, engine, also=also)
            print(f"  minimised [{f.check}]: {line}")
    return minimised


def minimise_line(witness: Path, new_engine: Callable[[], Any], timeout_s: float, engine: str | None = None,
                  also: Sequence[Sequence[Any]] = ()) -> str:
    """Minimise one witness file (and from the further starting points `also`); say in one line what
    came of it."""
    from conformance.minimise import minimise_witness_file, size, witness_steps
    from conformance.report import replay_command

    small = minimise_witness_file(witness, new_engine, timeout_s=timeout_s, also=also)
    if small is None:
        return "nothing smaller still fails"
    before, after = (size(witness_steps(p)) for p in (witness, small))
    return (f"{replay_command(small, engine)} (prompt tokens, requests, steps: {after[0]}, {after[1]}, {after[2]}; "
            f"the run's witness: {before[0]}, {before[1]}, {before[2]})")


def main(argv: Sequence[str] | None = None, session: Session | None = None) -> int:
    session = session or Session()
    return run_command("kvparity run", build_parser().parse_args, lambda args: work(args, session), argv)
