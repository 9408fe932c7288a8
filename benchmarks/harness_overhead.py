"""Harness overhead: how much of a run's wall time is the suite, not the engine.

    python benchmarks/harness_overhead.py [--engine reference] [--profile ci] [--cprofile N]

Runs the suite once, in this process, against a freshly built engine and prints the run's wall time,
the time spent inside engine calls (measured on the engine-call thread around each call: `run`,
`baseline`, `reset`, `configure`, `snapshot`, `capabilities`), and their ratio — 1.0 would be a harness
that costs nothing. Goal: <= 1.05 on the reference engine's CI profile (issue 32; issue 12's was 1.15).
`--cprofile N` also prints the N most expensive functions of the harness (cProfile, cumulative), which is
how to see where the rest goes. One run on a shared machine: compare the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys

import torch

from instant_engine import drawing_alone  # benchmarks/ is on the path: this script's own folder
from timed_run import timed_run

GOAL = 1.05  # issue 32: a harness that keeps up with a GPU engine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--engine", default="reference", help="registered engine adapter")
    ap.add_argument("--profile", default="ci", help="suite profile")
    ap.add_argument("--cprofile", type=int, default=0, help="print the N most expensive functions (0: none)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from conformance.engines import load_engine

    engine = load_engine(args.engine)
    profiler = cProfile.Profile() if args.cprofile else None
    run = timed_run(engine, profiler=profiler, engine_name=args.engine, profile=args.profile)
    outcome, wall, main_cpu, engine_s = run.outcome, run.wall_s, run.thread_cpu_s, run.engine_s
    engine.close()
    print(f"engine {args.engine}, profile {args.profile}: {outcome.verdict.upper()}, {outcome.examples} examples")
    print(f"wall {wall:.2f} s, inside engine calls {engine_s:.2f} s, harness {wall - engine_s:.2f} s "
          f"(of which the harness's own thread used {main_cpu:.2f} s of CPU; the rest is waiting between calls)")
    ratio = wall / engine_s
    print(f"overhead ratio (wall / engine) {ratio:.3f}: issue 32's goal <= {GOAL}, "
          f"{'met' if ratio <= GOAL else 'not met'}")
    _, _, _, draw_cpu = drawing_alone(outcome.history.capabilities, args.profile)
    print(f"the stream drawn alone (benchmarks/instant_engine.py): {draw_cpu:.2f} s of CPU, so no harness that "
          f"draws it this way goes below a ratio of {1 + draw_cpu / engine_s:.3f} on this engine")
    if profiler:
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(args.cprofile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
