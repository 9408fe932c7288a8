"""How a long run's memory grows with its examples (issue 32: campaigns of hours on one shard).

    python benchmarks/run_memory.py [--examples 200 1000] [--seed 1]

A run keeps every example's history in memory (the checks, coverage and the report read it whole), so
its resident memory grows with the examples it ran. Each size runs in a fresh process against the suite's
instant FAKE engine (tests/fake_engine.py: nearly all the memory is the harness's own) with the dev
profile and a fixed seed, and prints its resident memory after the run; the growth between two sizes,
per 1,000 examples, is what a long campaign pays. One process at a time: compare within one run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ONE_RUN = """
import sys, tempfile
sys.path.insert(0, "tests")
from fake_engine import FakeDictEngine
from conformance.runner import run_suite
from conformance.run_config import RunConfig

def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

before = resident_mb()
with tempfile.TemporaryDirectory() as out:
    outcome = run_suite(FakeDictEngine(), RunConfig(engine_name="fake", profile="dev", max_examples={n},
                                                    seed={seed}, report_dir=out, database_dir=out))
print(outcome.verdict, outcome.examples, before, resident_mb())
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, nargs="+", default=[200, 1000], help="run sizes, smallest first")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    sizes: list[tuple[int, float]] = []
    for n in args.examples:
        out = subprocess.run([sys.executable, "-c", ONE_RUN.format(n=n, seed=args.seed)], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
        verdict, examples, before, after = out[0], int(out[1]), float(out[2]), float(out[3])
        sizes.append((examples, after))
        print(f"{examples} examples ({verdict}): resident {after:.0f} MB after the run "
              f"({after - before:.0f} MB more than before it)")
    for (n0, m0), (n1, m1) in zip(sizes, sizes[1:]):
        print(f"{n0} -> {n1} examples: {(m1 - m0) / (n1 - n0) * 1000:.0f} MB per 1,000 examples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
