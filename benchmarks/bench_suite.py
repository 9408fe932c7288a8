"""How long the CI profile takes: `kvparity run --profile ci` against the reference engine (bar: <= 3 min
on 2 cores) and the transformers adapter, each in a fresh process, wall and CPU time.

    python benchmarks/bench_suite.py [--engines reference,transformers] [--seed 0]

Prints one row per engine: verdict, examples, wall seconds, CPU seconds. The machine is shared: the CPU
time is the steadier figure.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time


def run_once(engine: str, seed: int, report_dir: str) -> tuple[int, float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvparity", "run", "--engine", engine, "--profile", "ci",
                           "--seed", str(seed), "--report-dir", report_dir], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    return proc.returncode, wall, cpu, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", default="reference,transformers")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'engine':14s} {'exit':>4s} {'wall s':>8s} {'cpu s':>8s}  summary")
    with tempfile.TemporaryDirectory() as out:
        for engine in args.engines.split(","):
            code, wall, cpu, summary = run_once(engine, args.seed, out)
            print(f"{engine:14s} {code:4d} {wall:8.1f} {cpu:8.1f}  {summary}")


if __name__ == "__main__":
    main()
