"""`kvparity mutate`: a measure of the suite's power that nobody can tune to — mutation testing of the
reference engine's decision code (engine, prefix cache, block pool, scheduler, sequence, drafters).

    kvparity mutate [--sample N] [--sample-seed S] [--mutants NAME,...] [--modules a,b] [--seeds 0,1,2]
                    [--profile ci] [--mode blackbox|whitebox|both] [--max-examples N] [--limit-s S]
                    [--diff-scenarios N] [--diff-seconds S] [--diff-seed S] [--out DIR] [--no-control]
                    [--bar 0.9] [--list]

Mutants come from cosmic-ray's core operators (kvparity/commands/mutate/mutants.py says why cosmic-ray).
Each is run through the suite (`python -m kvparity run`, no shrinking: Hypothesis stops at the first
failing example) black-box (the adapter declares no introspection) and/or white-box, in a subprocess
importing a temporary mutated copy of reference_engine/. A mutant the suite does not kill goes to a
bounded differential search against the unmutated engine (differ.py): equivalent or survivor.
Score = killed / (killed + survivors) per (mode, seed), per module and per kind of mutation.

The unmutated engine is run first with the same seeds (the control): it must pass, or no score means
anything. Writes DIR/README.md, DIR/results.json and DIR/survivors/*.json (default .kvparity/mutation,
untracked; the committed reports/mutation/ is a chosen run). Exit 0 when the control passed and every
score reached --bar, 1 when not, 3 on bad arguments (one line on stderr, before anything runs).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from kvparity.parsing import UsageParser, output_dir, run_command, summary
from kvparity.commands.mutate import differ, report
from kvparity.commands.mutate.mutants import (DECISION_MODULES, EXCLUDED_OPERATORS, Mutant, MutantTree, diff,
                                              enumerate_mutants, sample)
from kvparity.commands.mutate.suite import run_suite_on
from conformance.arguments import positive_int, positive_seconds
from conformance.exit_codes import ExitCode
from conformance.contract import UsageError
from conformance.run_config import PROFILES

DEFAULT_OUT = Path(".kvparity") / "mutation"
MODES = {"blackbox": (True,), "whitebox": (False,), "both": (True, False)}


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers separated by commas") from None


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number between 0 and 1")
    return v


def build_parser() -> UsageParser:
    p = UsageParser(prog="kvparity mutate", description=summary(__doc__))
    p.add_argument("--sample", type=positive_int, default=None,
                   help="mutants to draw, stratified by module (default: every mutant)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the mutant sample")
    p.add_argument("--mutants", default=None,
                   help="comma-separated mutant names, as --list prints them (default: a sample, see --sample)")
    p.add_argument("--modules", default=",".join(DECISION_MODULES), help="decision modules to mutate")
    p.add_argument("--seeds", type=_ints, default="0", help="Hypothesis seeds of the suite runs")
    p.add_argument("--profile", default="ci", choices=list(PROFILES), help="the suite's profile")
    p.add_argument("--mode", default="blackbox", choices=list(MODES),
                   help="blackbox: the adapter declares no introspection; whitebox: as it is")
    p.add_argument("--max-examples", type=positive_int, default=None, help="cap on examples (default: the profile's)")
    p.add_argument("--limit-s", type=positive_seconds, default=600.0,
                   help="per-mutant, per-seed limit on one suite run; past it the mutant is 'unfinished'")
    p.add_argument("--diff-scenarios", type=positive_int, default=60, help="scenarios of the differential search")
    p.add_argument("--diff-seconds", type=positive_seconds, default=120.0, help="time cap of one differential search")
    p.add_argument("--diff-seed", type=int, default=0, help="seed of the differential search's scenarios")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="report folder")
    p.add_argument("--no-control", action="store_true", help="skip the unmutated engine's run (not for a score)")
    p.add_argument("--bar", type=_fraction, default=0.9, help="score every (mode, seed) must reach for exit 0")
    p.add_argument("--list", action="store_true", help="list the selected mutants and exit")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = sorted(set(modules) - set(DECISION_MODULES))
    if unknown or not modules:
        raise UsageError(f"--modules: {', '.join(unknown) or 'none given'}: choose from {', '.join(DECISION_MODULES)}")
    if not args.seeds:
        raise UsageError("--seeds: give at least one seed")
    try:
        population = enumerate_mutants(modules)
    except ImportError as exc:
        raise UsageError(f"cosmic-ray is not installed ({exc}); pip install 'kvparity[mutate]'") from None
    args.population = len(population)
    args.selected = select(population, args.mutants, args.sample, args.sample_seed)
    args.modules = modules
    args.out = output_dir(args.out)
    args.command = " ".join(["kvparity mutate", *map(shlex.quote, argv)])
    return args


def select(population: list[Mutant], names: str | None, n: int | None, seed: int) -> list[Mutant]:
    """The named mutants (each name as --list prints it), or a seeded sample of `n` (all when None)."""
    wanted = [s.strip() for s in (names or "").split(",") if s.strip()]
    if not wanted:
        return sample(population, n, seed)
    by_name = {m.name: m for m in population}
    missing = [w for w in wanted if w not in by_name]
    if missing:
        raise UsageError(f"--mutants: no such mutant {', '.join(missing)} (see kvparity mutate --list)")
    return [by_name[w] for w in wanted]


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=differ.project_root()).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "reference_engine", "adapters", "conformance", "kvparity"],
                               capture_output=True, text=True, cwd=differ.project_root()).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Session:
    """One `kvparity mutate` run: the scratch folder, the differential search's scenarios and the
    unmutated engine's observations of them (computed once per mode, reused for every mutant)."""

    def __init__(self, args: argparse.Namespace, scratch: Path) -> None:
        self.args, self.scratch = args, scratch
        self._reference: dict[bool, tuple[list, list]] = {}

    def suite(self, mutant: Mutant | None, seed: int, blackbox: bool):
        a = self.args
        tag = "control" if mutant is None else mutant.name.replace(":", "_").replace("#", "_")
        with MutantTree(mutant) as src:
            return run_suite_on(src, self.scratch / f"{tag}-{seed}-{int(blackbox)}", profile=a.profile, seed=seed,
                                blackbox=blackbox, max_examples=a.max_examples, limit_s=a.limit_s)

    def reference(self, blackbox: bool) -> tuple[list, list]:
        if blackbox not in self._reference:
            a = self.args
            scenarios = differ.draw_scenarios(a.diff_scenarios, a.diff_seed, a.profile, blackbox)
            with MutantTree(None) as src:
                seen = differ.run_observer(src, differ.engine_args(blackbox), scenarios, 10 * a.diff_seconds,
                                           self.scratch / f"diff-reference-{int(blackbox)}")
            self._reference[blackbox] = (scenarios, seen)
        return self._reference[blackbox]

    def classify(self, mutant: Mutant, blackbox: bool) -> differ.Classification:
        scenarios, seen = self.reference(blackbox)
        with MutantTree(mutant) as src:
            mutated = differ.run_observer(src, differ.engine_args(blackbox), scenarios, self.args.diff_seconds,
                                          self.scratch / f"diff-{mutant.name.replace(':', '_')}-{int(blackbox)}")
        return differ.classify(seen, mutated, scenarios)


def run_mutate(args: argparse.Namespace) -> int:
    if args.list:
        for m in args.selected:
            print(m.name)
        return 0
    start = time.monotonic()
    rows: list[dict[str, Any]] = []
    survivors: dict[str, dict[str, Any]] = {}
    control_ok, control = True, []
    with tempfile.TemporaryDirectory(prefix="kvparity-mutate-") as tmp:
        session = Session(args, Path(tmp))
        for blackbox in MODES[args.mode]:
            mode = "blackbox" if blackbox else "whitebox"
            classified: dict[str, differ.Classification] = {}  # by the engine alone: the same for every seed
            for seed in args.seeds:
                if not args.no_control:
                    c = session.suite(None, seed, blackbox)
                    say(f"control {mode} seed {seed}: {'pass' if c.exit_code == 0 else c.outcome} ({c.seconds:g} s) "
                        f"{c.cause or c.last_line}")
                    control.append(f"{mode} seed {seed}: {'pass' if c.exit_code == 0 else c.outcome} ({c.seconds:g} s)")
                    if c.exit_code != 0:
                        control_ok = False
                        continue
                for i, m in enumerate(args.selected, 1):
                    r = session.suite(m, seed, blackbox)
                    row = {"mutant": m.to_json(), "mode": mode, "seed": seed, "outcome": r.outcome,
                           "exit_code": r.exit_code, "failed_checks": list(r.failed_checks), "examples": r.examples,
                           "seconds": r.seconds, "last_line": r.last_line, "cause": r.cause, "classification": None}
                    if r.outcome == "survived-suite":
                        c = classified.get(m.name) or session.classify(m, blackbox)
                        classified[m.name] = c
                        row["classification"], row["compared"] = c.verdict, c.compared
                        row["differs_in"] = list(c.fields)
                        if c.verdict == "survivor":
                            survivors.setdefault(f"{m.name} [{mode}]", _survivor(m, mode, c))
                    rows.append(row)
                    # written after every mutant: a long run stopped part-way still leaves its report
                    report.write(args.out, _meta(args, control, time.monotonic() - start, partial=True), rows, survivors)
                    say(f"[{i}/{len(args.selected)}] {mode} seed {seed} {m.name}: {r.outcome}"
                        f"{' -> ' + row['classification'] if row['classification'] else ''} ({r.seconds:g} s)")
    meta = _meta(args, control, time.monotonic() - start)
    readme = report.write(args.out, meta, rows, survivors)
    scores = {k: report.score(report.tally(g)) for k, g in report.runs(rows).items()}
    for (mode, seed), s in sorted(scores.items()):
        print(f"{mode} seed {seed}: score {'n/a' if s is None else f'{100 * s:.0f}%'}")
    print(f"report: {readme}")
    if not control_ok:
        print("the unmutated engine did not pass: no score is meaningful", file=sys.stderr)
        return ExitCode.FAIL
    return ExitCode.PASS if all(s is None or s >= args.bar for s in scores.values()) else ExitCode.FAIL


def _survivor(m: Mutant, mode: str, c: differ.Classification) -> dict[str, Any]:
    return {"mutant": m.to_json(), "mode": mode, "diff": diff(m), "scenario": c.scenario, "difference": c.difference,
            "compared": c.compared, "differing": c.differing, "differs_in": list(c.fields),
            "file": f"{m.name.replace(':', '_').replace('#', '_')}-{mode}.json"}


def _meta(args: argparse.Namespace, control: list[str], seconds: float, partial: bool = False) -> dict[str, Any]:
    try:
        cr = metadata.version("cosmic-ray")
    except metadata.PackageNotFoundError:
        cr = "unknown"
    return {"command": args.command, "commit": _commit(), "population": args.population,
            "sampled": len(args.selected), "sample_seed": args.sample_seed, "modules": args.modules,
            "cosmic_ray": cr, "excluded_operators": list(EXCLUDED_OPERATORS), "profile": args.profile,
            "max_examples": args.max_examples, "seeds": args.seeds, "modes": [("blackbox" if b else "whitebox") for b in MODES[args.mode]], "limit_s": args.limit_s,
            "diff_scenarios": args.diff_scenarios, "diff_seconds": args.diff_seconds, "diff_seed": args.diff_seed,
            "control": "; ".join(control) if control else "not run (--no-control)", "seconds": round(seconds, 1),
            "partial": partial}


def main(argv: Sequence[str] | None = None) -> int:
    return run_command("kvparity mutate", parse_args, run_mutate, argv)


if __name__ == "__main__":
    raise SystemExit(main())
