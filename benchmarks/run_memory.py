"""How a long run's memory grows with its examples, and a merge's with the examples it joins (issue 32:
campaigns of hours).

    python benchmarks/run_memory.py [--examples 200 1000] [--seed 1]

A run keeps every example's history in memory (the checks, coverage and the report read it whole), so
its resident memory grows with the examples it ran. Each size runs in a fresh process against the suite's
instant FAKE engine (tests/fake_engine.py: nearly all the memory is the harness's own) with the dev
profile and a fixed seed, and prints its resident memory after the run; the growth between two sizes,
per 1,000 examples, is what a long campaign pays. Then the same runs, as shards 1/2 and 2/2 of one
campaign, are merged (`kvparity merge`, a fresh process each) and the merge's peak resident memory is
printed: a campaign's merge reads every shard's history at once. One process at a time: compare within
one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ONE_RUN = """
import sys, tempfile
sys.path.insert(0, "tests")
from fake_engine import FakeDictEngine
from conformance.runner import run_suite
from conformance.run_config import RunConfig
from conformance.shards import parse_shard

def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

before = resident_mb()
with tempfile.TemporaryDirectory() as out:
    outcome = run_suite(FakeDictEngine(), RunConfig(engine_name="fake", profile="dev", max_examples={n},
                                                    seed={seed}, report_dir=out, database_dir=out,
                                                    run_dir={run_dir!r}, shard=parse_shard({shard!r})))
print(outcome.verdict, outcome.examples, before, resident_mb())
"""

ONE_MERGE = """
import resource, sys
from kvparity import cli
code = cli.main(["merge", *sys.argv[2:], "--out", sys.argv[1]])
print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, nargs="+", default=[200, 1000], help="run sizes, smallest first")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    runs: list[tuple[int, float]] = []
    merges: list[tuple[int, float]] = []
    for n in args.examples:
        with tempfile.TemporaryDirectory() as tmp:
            shards = [f"{tmp}/shard-{i}" for i in (1, 2)]
            for i, run_dir in enumerate(shards, start=1):
                verdict, examples, before, after = python(ONE_RUN.format(n=n, seed=args.seed, run_dir=run_dir,
                                                                           shard=f"{i}/2"))
                if i == 1:
                    runs.append((int(examples), float(after)))
                    print(f"{examples} examples ({verdict}, shard 1/2): resident {float(after):.0f} MB after the run "
                          f"({float(after) - float(before):.0f} MB more than before it)")
            code, peak = python(ONE_MERGE, f"{tmp}/merged", *shards)[-2:]
            total = sum(int(json.loads(Path(d, "results.json").read_text())["examples"]) for d in shards)
            merges.append((total, float(peak)))
            print(f"merge of 2 shards, {total} examples (exit {code}): peak resident {float(peak):.0f} MB")
    for what, sizes in (("run", runs), ("merge", merges)):
        for (n0, m0), (n1, m1) in zip(sizes, sizes[1:]):
            print(f"{what}: {n0} -> {n1} examples: {(m1 - m0) / (n1 - n0) * 1000:.0f} MB per 1,000 examples")
    return 0


def python(code: str, *args: str) -> list[str]:
    """Run `code` in a fresh interpreter at the repository's root; its last line of output, split."""
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[-1].split()


if __name__ == "__main__":
    raise SystemExit(main())
