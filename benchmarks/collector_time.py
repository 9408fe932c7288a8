"""How much of a run Python's garbage collector takes, with the run's heap frozen (conformance/heap.py) and
without, in fresh processes taking turns.

    python benchmarks/collector_time.py [--engine reference] [--engine-arg K=V ...] [--profile ci]
                                        [--max-examples N] [--pairs 2]

Each run is its own process (the heap a run finds is a process's: imports, the engine, its model), timed
by `gc.callbacks` around every collection the process makes during `run_suite` — those its history sets
off and those the engine asks for itself (transformers' continuous batching collects at the end of every
`generate_batch`: `--engine transformers --engine-arg modes=batch --max-examples 10`). Prints per run the
collections of each generation and their seconds, the run's CPU, and the time outside engine calls; then
the median per mode. One shared machine: read the two modes of one invocation side by side.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(args: argparse.Namespace) -> dict:
    """One run in this process; `args.one` is `frozen` (as `kvparity run` runs it) or `plain` (as `run_suite`
    alone does)."""
    sys.path.insert(0, str(ROOT / "tests"))  # the FAKE engine, if asked for
    from conformance.engines import load_engine, parse_engine_args
    from timed_run import timed_run  # benchmarks/ is on the path: this script's own folder

    if args.engine == "fake":
        from fake_engine import FakeDictEngine  # the suite's FAKE engine, for measuring the suite itself

        engine = FakeDictEngine()
    else:
        import torch

        torch.set_num_threads(1)
        engine = load_engine(args.engine, parse_engine_args(args.engine_arg))
    spent = {g: [0, 0.0] for g in range(3)}
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[info["generation"]][0] += 1
            spent[info["generation"]][1] += time.perf_counter() - started[0]

    gc.callbacks.append(timed)
    run = timed_run(engine, freeze=args.one == "frozen", engine_name=args.engine,
                    engine_args=parse_engine_args(args.engine_arg), profile=args.profile,
                    max_examples=args.max_examples)
    gc.callbacks.remove(timed)
    return {"mode": args.one, "verdict": str(run.outcome.verdict), "examples": run.outcome.examples,
            "cpu_s": run.cpu_s, "outside_engine_s": run.wall_s - run.engine_s,
            "collections": {g: n for g, (n, _) in spent.items()}, "gc_s": {g: s for g, (_, s) in spent.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--engine", default="reference", help="registered engine adapter, or fake (tests/fake_engine.py)")
    ap.add_argument("--engine-arg", action="append", default=[], help="engine argument K=V (repeatable)")
    ap.add_argument("--profile", default="ci", help="suite profile")
    ap.add_argument("--max-examples", type=int, default=None, help="examples per run (default: the profile's)")
    ap.add_argument("--pairs", type=int, default=2, help="runs per mode, taking turns")
    ap.add_argument("--one", choices=("frozen", "plain"), help=argparse.SUPPRESS)  # a child: one run, one JSON line
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args)))
        return 0
    rows: dict[str, list[dict]] = {"frozen": [], "plain": []}
    for k in range(args.pairs):
        for mode in ("frozen", "plain") if k % 2 == 0 else ("plain", "frozen"):
            child = [sys.executable, __file__, "--one", mode, "--engine", args.engine, "--profile", args.profile,
                     *[a for kv in args.engine_arg for a in ("--engine-arg", kv)],
                     *(["--max-examples", str(args.max_examples)] if args.max_examples else [])]
            done = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                print(f"{mode}: the run failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
                return 1
            row = json.loads(lines[-1])
            rows[mode].append(row)
            gc_s = sum(row["gc_s"].values())
            full = row["collections"]["2"]
            print(f"{mode:6} {row['verdict']}, {row['examples']} examples: CPU {row['cpu_s']:.2f} s, collections "
                  f"{gc_s:.3f} s ({gc_s / row['cpu_s']:.1%}; full ones {full}, "
                  f"{1000 * row['gc_s']['2'] / max(1, full):.0f} ms each), outside engine calls "
                  f"{row['outside_engine_s']:.2f} s")
    for mode, runs in rows.items():
        print(f"median, {mode}: collections {statistics.median(sum(r['gc_s'].values()) for r in runs):.3f} s, "
              f"outside engine calls {statistics.median(r['outside_engine_s'] for r in runs):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
