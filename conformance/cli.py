"""`kvparity` command line: run, replay, report, engines.

Exit codes (DESIGN.md): 0 pass, 1 fail, 2 inconclusive, 3 error or usage/config problem, 130 interrupted
(Ctrl-C); a supervised run stopped by SIGTERM exits 143, by SIGHUP 129 (128 + the signal, conformance.stopping).
Every error path prints one line saying why. Bad input is refused before an engine is built.

`kvparity run` and `kvparity replay` from the console are supervised (`conformance.supervisor`): the
work runs in a child process, so an engine that ends the process itself (`os._exit`, an abort in C, the
OOM killer) still gets an `error` verdict and a report instead of an exit code that reads as a pass.
`main()` itself runs in-process (the suite's own tests call it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from conformance.arguments import DEFAULT_TIMEOUT_S, positive_int, positive_seconds  # noqa: F401 - re-exported
from conformance.contract import EngineError, UsageError
from conformance.exit_codes import ExitCode
from conformance.reproduce import DEFAULT_MAX_SHRINK_SECONDS, seed_line
from conformance.step_counts import table

WITNESS_VERSION = 1


# --------------------------------------------------------------------------- argument types


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting 2: our usage errors are one line, exit 3."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    from conformance.runner import DEFAULT_REPORT_DIR, PROFILES

    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = _Parser(prog="kvparity", description="Does an engine's KV reuse change what it says?", formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"kvparity {installed_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run the suite against an engine", formatter_class=fmt)
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
                     help="stop shrinking a failure after this many seconds; the witness so far is reported "
                          f"(default {DEFAULT_MAX_SHRINK_SECONDS:g})")
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

    replay = sub.add_parser("replay", help="re-run a recorded failure: FIXED / FAILED / ERROR", formatter_class=fmt)
    replay.add_argument("case", help="path to a witness JSON file from a report's witnesses/ folder")
    replay.add_argument("--engine", default=None,
                        help="adapter to replay on (none: the registered engine the witness names); the only way "
                             "to replay on an unregistered module:Class adapter")
    replay.add_argument("--engine-arg", action="append", default=[], metavar="K=V",
                        help="override an adapter argument; a witness may only name loopback hosts (base_url=...), "
                             "so another machine is reached by naming it here")
    replay.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S,
                        help="seconds per engine call before it counts as hung")

    report = sub.add_parser("report", help="re-analyse a stored run directory from its history.jsonl (verified "
                                           "first; written to RUN_DIR/reanalysis/, never over the run's own verdict)",
                            formatter_class=fmt)
    report.add_argument("run_dir", help="a run folder holding history.jsonl")
    report.add_argument("--checks", default="", help="comma-separated check names (empty: those the run chose; "
                                                     "fewer is said to be a narrowed check set)")
    report.add_argument("--write-known", default=None, metavar="FILE",
                        help="instead: write the run's findings as a known-findings file (for --known) to review "
                             "and commit")

    sub.add_parser("engines", help="list the registered engine adapters", formatter_class=fmt)
    for name, target in plugin_commands().items():
        sub.add_parser(name, help=command_summary(target), add_help=False)
    return p


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvparity")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def command_summary(target: str) -> str:
    """The first line of a plugin command's module docstring, read without importing the module (a command
    may import an engine library; `kvparity --help` must stay instant and never run plugin code)."""
    import ast
    from importlib.util import find_spec

    module = target.partition(":")[0]
    try:
        spec = find_spec(module)
        origin = spec.origin if spec else None
        doc = ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8"))) if origin else None
    except (ImportError, OSError, SyntaxError, ValueError):
        doc = None
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    sentence = re.sub(r"^`kvparity [^`]*`:\s*", "", paragraph).split(". ")[0].rstrip(".")
    return sentence[:1].lower() + sentence[1:] if sentence else f"plugin command ({target})"


def plugin_commands() -> dict[str, str]:
    """Subcommands contributed through the entry-point group `kvparity.commands` (bench, fault-zoo,
    export-gguf live beside the engines they drive, so conformance never imports an engine)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="kvparity.commands")}


def run_plugin_command(name: str, argv: Sequence[str]) -> int:
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="kvparity.commands") if ep.name == name]
    return int(ep.load()(list(argv)) or 0)


# --------------------------------------------------------------------------- run


def writable_folder(path: str | Path, what: str) -> Path:
    """`path` as a folder this process can write into (created if missing), or a one-line UsageError."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{what} {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".kvparity-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{what} {folder} is not writable: {exc.strerror or exc}") from None
    return folder


class Session:
    """What one command did that its caller must know after it returns: whether an engine call was left
    hanging on a thread (then the process must end with os._exit, not wait for that thread at shutdown)."""

    def __init__(self) -> None:
        self.hard_exit = False


def build_engine(name: str, engine_args: dict[str, str], timeout_s: float) -> Any:
    """Construct the adapter on the main thread (some engines install signal handlers, which only the
    main thread may), bounded by a watchdog."""
    from conformance.calls import watchdog
    from conformance.registry import load_engine

    with watchdog(timeout_s, f"building engine {name!r}"):
        return load_engine(name, engine_args)


def close_engine(engine: Any, timeout_s: float) -> str | None:
    """Close an engine within the timeout; the cause in one line if close() failed, else None."""
    from conformance.calls import one_line, watchdog

    try:
        with watchdog(timeout_s, "close()"):
            engine.close()
    except Exception as exc:  # noqa: BLE001 - reported, not swallowed
        return f"close() raised {type(exc).__name__}: {one_line(exc)}"
    return None


def cmd_run(args: argparse.Namespace, session: Session) -> int:
    from conformance import numerics, status
    from conformance.analysis import select_checks
    from conformance.progress import Progress
    from conformance.report import print_summary
    from conformance.registry import parse_engine_args, resolve
    from conformance.known import load as load_known
    from conformance.runner import new_run_dir, profile_settings, run_suite

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
    from conformance.scenario import step_from_json

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


# --------------------------------------------------------------------------- replay


def read_witness(path: str | Path, engine: str | None) -> tuple[str, dict[str, Any], str, list[Any]]:
    """(engine name, engine args, check, steps) of a witness file. Nothing in the file chooses code to
    run: it may name a *registered* engine only; an unregistered `module:Class` is used only when the
    user names it with --engine."""
    from conformance.registry import known_engines
    from conformance.scenario import step_from_json
    from conformance.untrusted import read_json

    try:
        data = read_json(path, "witness")
        version = data.get("kvparity_witness")
        named, check, raw_steps = data["engine"], data["check"], data["steps"]
        args = data.get("engine_args") or {}
    except UsageError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"not a kvparity witness file: {path} ({exc})") from exc
    if version != WITNESS_VERSION:
        raise UsageError(f"{path}: witness format version {version!r}; this kvparity reads version {WITNESS_VERSION}")
    if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
        raise UsageError(f"{path}: engine_args must map names to strings")
    if engine is None:
        if not isinstance(named, str) or named not in known_engines():
            raise UsageError(f"{path} names engine {named!r}, which is not a registered engine (`kvparity engines`); "
                             f"a witness cannot choose code to import. To replay on that adapter, name it yourself: "
                             f"kvparity replay {path} --engine {named}")
        engine = named
    try:
        steps = [step_from_json(s) for s in raw_steps]
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"not a kvparity witness file: {path} (bad steps: {exc})") from exc
    return engine, args, check, steps


def replay_case(path: str | Path, engine_args: dict[str, str] | None = None,
                timeout_s: float = DEFAULT_TIMEOUT_S, engine: str | None = None,
                session: Session | None = None) -> tuple[str, int, str]:
    """Re-run a witness's steps against a fresh engine and re-check its check.

    Returns (word, exit code, one-line detail): FIXED 0, FAILED 1, INCONCLUSIVE 2, ERROR 3. A witness of
    an engine error (check "error") is FAILED while the engine still fails on it and FIXED once it runs.
    """
    from conformance import validation
    from conformance.calls import EngineCalls
    from conformance.runner import replay
    from conformance.scenario import Configure
    from conformance.untrusted import check_configs, refuse_remote_hosts

    name, witness_args, check, steps = read_witness(path, engine)
    refuse_remote_hosts(witness_args, engine_args or {}, str(path))  # before anything connects
    args = {**witness_args, **(engine_args or {})}
    instance = build_engine(name, args, timeout_s)
    calls = EngineCalls(timeout_s)
    try:
        caps = validation.capabilities(calls(instance.capabilities, "capabilities"))
        check_configs([s.config for s in steps if isinstance(s, Configure)], caps.config_space, str(path))
        result, crashed = replay(instance, caps, steps, "parity" if check == "error" else check, calls=calls)
    except EngineError as exc:  # capabilities() itself failed
        return "ERROR", 3, str(exc)
    finally:
        if session is not None:
            session.hard_exit = calls.abandoned
        if not calls.abandoned:
            calls.close()
            close_engine(instance, timeout_s)
    if check == "error":
        return ("FAILED", 1, f"the engine still fails: {crashed}") if crashed else ("FIXED", 0, "the engine runs this case")
    if crashed is not None and result.status != "fail":  # a crash fails the check only where it says so
        return "ERROR", 3, crashed
    if result.status == "fail":
        return "FAILED", 1, result.failures[0].explanation
    if result.status == "pass":
        return "FIXED", 0, f"{check} passes on this case"
    if result.status == "error":
        return "ERROR", 3, "; ".join(result.notes)
    return "INCONCLUSIVE", 2, "; ".join(result.notes) or "the case no longer exercises the check"


# --------------------------------------------------------------------------- report, engines


def cmd_report(args: argparse.Namespace) -> int:
    from conformance.reanalysis import reanalyse, write_known

    if args.write_known:
        return write_known(Path(args.run_dir), Path(args.write_known))
    return reanalyse(Path(args.run_dir), [c for c in args.checks.split(",") if c.strip()])


def cmd_engines(args: argparse.Namespace) -> int:
    from conformance.registry import known_engines

    for name, target in known_engines().items():
        print(f"{name:14s} {target}")
    return 0


# --------------------------------------------------------------------------- entry points


def dispatch(argv: Sequence[str], session: Session) -> int:
    """Run one command in this process; every failure is a one-line message and an exit code."""
    argv = list(argv)
    if argv and argv[0] in plugin_commands():
        return run_plugin_command(argv[0], argv[1:])
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help and friends
            return 0 if exc.code in (0, None) else ExitCode.USAGE
        if args.command == "run":
            return cmd_run(args, session)
        if args.command == "replay":
            from conformance.registry import parse_engine_args

            word, code, detail = replay_case(args.case, parse_engine_args(args.engine_arg), args.timeout,
                                             args.engine, session)
            print(f"{word}: {detail}")
            return code
        if args.command == "report":
            return cmd_report(args)
        return cmd_engines(args)
    except UsageError as exc:
        print(f"kvparity: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except EngineError as exc:
        print(f"kvparity: engine error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM or SIGHUP in a supervised child (conformance.stopping)
        from conformance import stopping

        stopping.ignore_further()
        print(f"kvparity: interrupted ({stopping.describe(exc)})", file=sys.stderr)
        return stopping.exit_code(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """In-process entry (tests, embedding): never ends the process itself."""
    return dispatch(list(sys.argv[1:] if argv is None else argv), Session())


def console_main() -> None:
    """The `kvparity` console script: supervise `run` and `replay`, run everything else directly."""
    from conformance import lifeline, status, stopping, supervisor

    argv = sys.argv[1:]
    if supervisor.should_supervise(argv):
        raise SystemExit(supervisor.supervise(argv))
    if lifeline.attach():  # a supervised child: it beats for its supervisor and dies with it
        stopping.install()  # SIGTERM and SIGHUP end the work as Ctrl-C does, at the next safe point
    session = Session()
    code = dispatch(argv, session)
    status.tell(exit=code)
    if session.hard_exit:  # a thread is still inside the engine: do not wait for it at shutdown
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    console_main()
