"""`kvparity run --engine NAME`: run the conformance suite against an engine and write a run folder
(history.jsonl, report.md / report.html / junit.xml, witnesses/) whose verdict is the exit code.

0 pass, 1 a violation with a shrunk witness, 2 inconclusive (a claimed capability never exercised), 3 an
error (the engine crashed, hung or answered malformed, or bad input), 130 interrupted. From the console
the work runs in a supervised child, so an engine that ends the process itself still gets a verdict."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from conformance.arguments import DEFAULT_TIMEOUT_S, positive_int, positive_seconds
from conformance.engine_lifecycle import Session, build_engine, close_engine
from conformance.exit_codes import ExitCode
from conformance.reproduce import DEFAULT_MAX_SHRINK_SECONDS, seed_line
from conformance.report.sections import engine_time
from conformance.step_counts import table
from kvparity.parsing import UsageParser, named, run_command, summary


def build_parser() -> argparse.ArgumentParser:
    from conformance.run_config import DEFAULT_REPORT_DIR, PROFILES

    run = UsageParser(prog="kvparity run", description=summary(__doc__))
    run.add_argument("--engine", required=True, help="adapter name (see `kvparity engines`) or module:Class")
    run.add_argument("--engine-arg", action="append", default=[], metavar="K=V",
                     help="adapter argument (repeatable, each key once)")
    run.add_argument("--profile", default="dev", choices=list(PROFILES),
                     help="Hypothesis profile: dev 12 examples, ci 100 (derandomized), nightly 1000")
    run.add_argument("--checks", default="", help="comma-separated check names (empty: all)")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, type=named,
                     help="where run folders go (the default is git-ignored; reports/ is for committed results)")
    run.add_argument("--seed", type=int, default=None,
                     help="Hypothesis seed (none: one is drawn and printed; the ci profile is derandomised)")
    run.add_argument("--max-examples", type=positive_int, default=None,
                     help="override the profile's example count (none: the profile's)")
    run.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                     help="seconds per engine call (construction and close included) before it counts as hung")
    run.add_argument("--no-shrink", action="store_true",
                     help="report each failing example unshrunk (faster); the run still looks on for other bugs "
                          "within its examples (docs/running.md, \"Known findings, and several bugs per run\")")
    run.add_argument("-x", "--exitfirst", action="store_true",
                     help="stop at the first failing example, unshrunk: the quickest red, and the only failure the "
                          "run reports (as pytest -x)")
    run.add_argument("--max-shrink-seconds", type=positive_seconds, default=DEFAULT_MAX_SHRINK_SECONDS,
                     help="stop shrinking a failure after this many seconds; the witness so far is reported")
    run.add_argument("--calibration", default=None, type=named, metavar="FILE",
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
    run.add_argument("--known", default=None, type=named, metavar="FILE",
                     help="known-findings file (`kvparity report RUN_DIR --write-known FILE`): failures with its "
                          "signatures are reported as known and do not fail the run; the run goes on looking")
    run.add_argument("--strict-known", action="store_true",
                     help="with --known: a known finding this run did not see (fixed) fails the run")
    run.add_argument("--shard", default=None, metavar="I/N",
                     help="run shard I of N (counted from 1): a stream of its own, its seed derived from the run's "
                          "seed (or, for ci, from the shard alone) and recorded; `kvparity merge` joins the N run "
                          "folders into one verdict (none: not a shard)")
    run.add_argument("--shard-engine-arg", action="append", default=[], metavar="K=V",
                     help="with --shard: an engine argument that is this shard's own, e.g. the replica it drives "
                          "(base_url=...); `kvparity merge` lets a campaign's shards differ in these keys alone")
    run.add_argument("--database", default=None, type=named, metavar="DIR|redis://HOST:PORT/N",
                     help="Hypothesis' example database (failures are replayed first): a folder, or a Redis on this "
                          "machine shared by a campaign's shards (needs kvparity[campaign]; loopback hosts only) "
                          "(none: .hypothesis/ here, for a ci run or a shard; a seed alone names its stream, so a "
                          "dev or nightly run replays nothing)")
    return run


def config_from(args: argparse.Namespace, calibration: Any, known: Any) -> Any:
    """The run's configuration, validated once (conformance.run_config): bad checks, profile or
    --strict-known without --known are a one-line usage error before any engine is built."""
    from conformance.contract import UsageError
    from conformance.engines import parse_engine_args
    from conformance.example_database import is_url
    from conformance.run_config import RunConfig
    from conformance.shards import parse_shard

    own = parse_engine_args(args.shard_engine_arg)
    if own and args.shard is None:
        raise UsageError("--shard-engine-arg is a shard's own engine argument: give --shard I/N too")
    shard = parse_shard(args.shard, tuple(own)) if args.shard is not None else None
    return RunConfig(engine_name=args.engine, engine_args=parse_engine_args([*args.engine_arg,
                                                                             *args.shard_engine_arg]),
                     profile=args.profile, checks=[c for c in args.checks.split(",") if c.strip()],
                     report_dir=args.report_dir, seed=args.seed, max_examples=args.max_examples,
                     timeout_s=args.timeout, shrink=not (args.no_shrink or args.exitfirst),
                     keep_looking=not args.exitfirst,
                     max_shrink_seconds=args.max_shrink_seconds,
                     tolerance=calibration.tau if calibration else None,
                     calibration=calibration.path if calibration else None, close=True,
                     logprob_epsilon=calibration.logprob_epsilon if calibration else None,
                     known_findings=known, strict_known=args.strict_known,
                     shard=shard,
                     database_url=args.database if is_url(args.database) else None,
                     database_dir=None if is_url(args.database) else args.database)


def work(args: argparse.Namespace, session: Session) -> int:
    import attrs

    from conformance import heap, numerics, status
    from conformance.known import load as load_known
    from conformance.progress import Progress
    from conformance.engines import resolve
    from conformance.report import print_summary
    from conformance.run_folder import new_run_dir
    from conformance.run_handlers import ReportWriter
    from conformance.runner import run_suite
    from kvparity.parsing import writable_folder

    calibration = numerics.load_calibration(args.calibration) if args.calibration else None
    config = config_from(args, calibration, load_known(args.known) if args.known else None)
    report_dir = writable_folder(config.report_dir, "--report-dir")
    if config.database_url:  # an unreachable shared store is refused now, not found out mid-run
        from conformance.example_database import reachable

        reachable(config.database_url)
    resolve(config.engine_name)  # an unknown engine is a usage error before anything is built
    engine = build_engine(config.engine_name, dict(config.engine_args), config.timeout_s)
    if args.accept_unsteered:
        from conformance.engine_lifecycle import accept_unsteered

        accept_unsteered(engine)
    config = attrs.evolve(config, run_dir=new_run_dir(report_dir, config.engine_name))
    status.tell(run_dir=str(config.run_dir))
    said: list[str] = []  # what the report writer says (minimised witnesses, numerics), after the summary
    new_engine = lambda: build_engine(config.engine_name, dict(config.engine_args), config.timeout_s)  # noqa: E731
    minimise = (lambda outcome: minimise_failures(outcome, new_engine, config.timeout_s, config.engine_name,
                                                  said.append)) if args.minimise else None
    report = ReportWriter(calibration, minimise, said.append)
    with heap.frozen():  # what this process holds (imports, the engine): skipped by full collections
        outcome = run_suite(engine, config, [report] if args.quiet else [Progress(), report])
    # The engine is closed (a failing close is an error event of the history) before the report is
    # written, so the exit code, every report file and `kvparity report` tell one verdict.
    session.hard_exit = outcome.abandoned or outcome.interrupted
    print_summary(outcome.analysis, outcome.run_dir, config.engine_name)
    if outcome.report_error:
        print(f"ERROR: {outcome.report_error}")
    for line in said:
        print(line)
    return finish(args, outcome, engine)


def finish(args: argparse.Namespace, outcome: Any, engine: Any) -> int:
    """The run's last lines (step counts, the seed line that reruns it, the verdict) and its exit code;
    an interrupted run's engine is closed here, after its report."""
    from conformance import status

    a = outcome.analysis
    code = outcome.exit_code
    if outcome.report_error and not outcome.interrupted:
        code = ExitCode.ERROR  # no report files: the run ends as an error, whatever it found
    word = "INTERRUPTED" if outcome.interrupted else "ERROR" if code == ExitCode.ERROR else a.verdict.upper()
    if outcome.shrink_capped:
        print(f"shrinking stopped at --max-shrink-seconds {args.max_shrink_seconds:g}: each witness is the smallest "
              f"failure found by then (a larger cap, or --minimise, may shrink it further)")
    print(table(Counter(outcome.step_kinds)))
    h = outcome.history
    if h is not None and h.duration_s is not None and h.engine_s is not None:
        duration = round(h.duration_s, 2)  # rounded as results.json rounds them: the console and report agree
        engine = engine_time(duration, round(h.engine_s, 2))
        if engine:
            print(f"time: {duration} s, {engine}")
    print(seed_line(args, outcome.seed))
    shrink = (outcome.history.ended or {}).get("shrink_steps") if outcome.history is not None else None
    shrunk = f" (+{shrink} shrink steps)" if isinstance(shrink, int) and 0 < shrink <= outcome.examples else ""
    drawn = outcome.examples - (shrink if shrunk else 0)
    if args.shard is not None:  # the seed above is the shard's own: the rerun needs no --shard
        print(f"shard {args.shard}: its seed {outcome.seed} is derived from the campaign's (conformance.shards)")
    print(f"{word}: {drawn} examples{shrunk}, near-ties {a.near_ties}, report {outcome.run_dir}", flush=True)
    status.tell(verdict=code)
    if outcome.interrupted and not outcome.closed and not outcome.abandoned:  # closed after its report
        closed = close_engine(engine, args.timeout)
        if closed is not None:
            print(f"ERROR: {closed}")
    return code


def minimise_failures(outcome: Any, new_engine: Callable[[], Any], timeout_s: float,
                      engine: str | None = None, say: Callable[[str], None] = print) -> dict[str, str]:
    """Minimise one witness per failed check, from the witness (the shrunk example) and from the run's
    first example that failed the check (from the outcome's History, not re-read from disk); check ->
    the line saying what came of it."""
    from conformance.scenario import step_from_json

    minimised: dict[str, str] = {}
    examples = {ex.index: ex for ex in outcome.history.examples}
    for f in outcome.analysis.failures:
        witness = outcome.run_dir / "witnesses" / (f.case_id + ".json")
        if f.check not in minimised and witness.is_file():
            first = examples.get(outcome.first_failing.get(f.check, -1))
            also = [[step_from_json(s) for s in first.steps()]] if first else []
            minimised[f.check] = line = minimise_line(witness, new_engine, timeout_s, engine, also=also)
            say(f"  minimised [{f.check}]: {line}")
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
