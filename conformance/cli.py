"""`kvparity` command line: run, replay, report, engines.

Exit codes (DESIGN.md): 0 pass, 1 fail, 2 inconclusive, 3 error or usage/config problem. Every error
path prints one line saying why.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from conformance.contract import EngineError, UsageError

EXIT_USAGE = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvparity", description="Does an engine's KV reuse change what it says?")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the suite against an engine")
    run.add_argument("--engine", required=True, help="adapter name (see `kvparity engines`) or module:Class")
    run.add_argument("--engine-arg", action="append", default=[], metavar="K=V", help="adapter argument (repeatable)")
    run.add_argument("--profile", default="dev", choices=["dev", "ci", "nightly"])
    run.add_argument("--checks", default="", help="comma-separated check names (default: all)")
    run.add_argument("--report-dir", default="reports")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--max-examples", type=int, default=None, help="override the profile's example count")
    run.add_argument("--timeout", type=float, default=300.0, help="seconds per engine call before it counts as hung")
    run.add_argument("--no-shrink", action="store_true", help="report the first failing example unshrunk (faster)")
    run.add_argument("--minimise", action="store_true",
                     help="after the run, minimise one witness per failed check on fresh engines (<case>.min.json); "
                          "each replay builds an engine, so this is for engines that start fast")

    replay = sub.add_parser("replay", help="re-run a recorded failure: FIXED / FAILED / ERROR")
    replay.add_argument("case", help="path to a witness JSON file from a report's witnesses/ folder")
    replay.add_argument("--engine-arg", action="append", default=[], metavar="K=V", help="override an adapter argument")
    replay.add_argument("--timeout", type=float, default=300.0)

    report = sub.add_parser("report", help="re-analyse a stored run directory (its history.jsonl)")
    report.add_argument("run_dir")
    report.add_argument("--checks", default="")

    sub.add_parser("engines", help="list the registered engine adapters")
    for name, target in plugin_commands().items():
        sub.add_parser(name, help=f"plugin command ({target}); see `kvparity {name} --help`", add_help=False)
    return p


def plugin_commands() -> dict[str, str]:
    """Subcommands contributed through the entry-point group `kvparity.commands` (bench, fault-zoo,
    export-gguf live beside the engines they drive, so conformance never imports an engine)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="kvparity.commands")}


def run_plugin_command(name: str, argv: Sequence[str]) -> int:
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="kvparity.commands") if ep.name == name]
    return int(ep.load()(list(argv)) or 0)


def cmd_run(args: argparse.Namespace) -> int:
    from conformance.registry import load_engine, parse_engine_args
    from conformance.runner import profile_settings, run_suite
    from conformance.analysis import select_checks

    engine_args = parse_engine_args(args.engine_arg)
    checks = select_checks([c for c in args.checks.split(",") if c.strip()])
    profile_settings(args.profile)
    engine = load_engine(args.engine, engine_args)
    try:
        outcome = run_suite(engine, engine_name=args.engine, engine_args=engine_args, profile=args.profile,
                            checks=checks, report_dir=args.report_dir, seed=args.seed,
                            max_examples=args.max_examples, timeout_s=args.timeout, shrink=not args.no_shrink)
    finally:
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - closing must not mask the verdict
            pass
    a = outcome.analysis
    for name, r in a.checks.items():
        print(f"{name:22s} {r.status}" + (f"  ({r.notes[0]})" if r.notes and r.status != "pass" else ""))
    for e in a.errors:
        print(f"ERROR: {e}")
    minimised: dict[str, str] = {}
    for f in a.failures:
        witness = outcome.run_dir / "witnesses" / (f.case_id + ".json")
        print(f"FAIL [{f.check}] {f.title} ({f.case_id}): kvparity replay {witness}")
        if args.minimise and f.check not in minimised and witness.is_file():
            minimised[f.check] = line = minimise_line(witness, lambda: load_engine(args.engine, engine_args),
                                                      args.timeout)
            print(f"  minimised: {line}")
    if minimised:  # the report was written before minimising: add what it found
        with open(outcome.run_dir / "report.md", "a") as md:
            md.write("\n## Minimised witnesses (`--minimise`)\n\n"
                     + "".join(f"- `{check}`: {line}\n" for check, line in minimised.items()))
    print(f"{a.verdict.upper()}: {outcome.examples} examples, near-ties {a.near_ties}, report {outcome.run_dir}")
    return outcome.exit_code


def minimise_line(witness: Path, new_engine, timeout_s: float) -> str:
    """Minimise one witness file; say in one line what came of it."""
    from conformance.minimise import minimise_witness_file, size
    from conformance.strategies import step_from_json

    small = minimise_witness_file(witness, new_engine, timeout_s=timeout_s)
    if small is None:
        return "nothing smaller still fails"
    before, after = (size([step_from_json(s) for s in json.loads(p.read_text())["steps"]]) for p in (witness, small))
    return (f"kvparity replay {small} (prompt tokens, requests, steps: {after[0]}, {after[1]}, {after[2]}; "
            f"the run's witness: {before[0]}, {before[1]}, {before[2]})")


def replay_case(path: str | Path, engine_args: dict[str, str] | None = None,
                timeout_s: float = 300.0) -> tuple[str, int, str]:
    """Re-run a witness's steps against a fresh engine and re-check its check.

    Returns (word, exit code, one-line detail): FIXED 0, FAILED 1, INCONCLUSIVE 2, ERROR 3.
    """
    from conformance.registry import load_engine
    from conformance.runner import call_with_timeout, replay
    from conformance.strategies import step_from_json

    try:
        data = json.loads(Path(path).read_text())
        name, check, steps = data["engine"], data["check"], [step_from_json(s) for s in data["steps"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"not a kvparity witness file: {path} ({exc})") from exc
    args = {**data.get("engine_args", {}), **(engine_args or {})}
    engine = load_engine(name, args)
    try:
        caps = call_with_timeout(engine.capabilities, timeout_s, "capabilities")
        result, crashed = replay(engine, caps, steps, check, timeout_s)
    except EngineError as exc:  # capabilities() itself failed
        return "ERROR", 3, str(exc)
    finally:
        try:
            engine.close()
        except Exception:  # noqa: BLE001
            pass
    if crashed is not None and result.status != "fail":  # a crash fails the check only where it says so
        return "ERROR", 3, crashed
    if result.status == "fail":
        return "FAILED", 1, result.failures[0].explanation
    if result.status == "pass":
        return "FIXED", 0, f"{check} passes on this case"
    if result.status == "error":
        return "ERROR", 3, "; ".join(result.notes)
    return "INCONCLUSIVE", 2, "; ".join(result.notes) or "the case no longer exercises the check"


def cmd_report(args: argparse.Namespace) -> int:
    from conformance.analysis import analyse
    from conformance.history import load
    from conformance.report import write_report

    run_dir = Path(args.run_dir)
    history_path = run_dir / "history.jsonl"
    if not history_path.is_file():
        raise UsageError(f"no history.jsonl in {run_dir}")
    history = load(history_path)
    checks = [c for c in args.checks.split(",") if c.strip()] or history.meta.get("checks") or None
    analysis = analyse(history, checks)
    write_report(run_dir, history, analysis)
    for name, r in analysis.checks.items():
        print(f"{name:22s} {r.status}")
    print(f"{analysis.verdict.upper()}: re-analysed {len(history.examples)} examples from {history_path}")
    return analysis.exit_code


def cmd_engines(args: argparse.Namespace) -> int:
    from conformance.registry import known_engines

    for name, target in known_engines().items():
        print(f"{name:14s} {target}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in plugin_commands():
        return run_plugin_command(argv[0], argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is ours to number
        return 0 if exc.code == 0 else EXIT_USAGE
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "replay":
            from conformance.registry import parse_engine_args

            word, code, detail = replay_case(args.case, parse_engine_args(args.engine_arg), args.timeout)
            print(f"{word}: {detail}")
            return code
        if args.command == "report":
            return cmd_report(args)
        return cmd_engines(args)
    except UsageError as exc:
        print(f"kvparity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EngineError as exc:
        print(f"kvparity: engine error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
