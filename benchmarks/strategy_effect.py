"""What a change to the strategies did to the suite's power: the mutation score and the 5-seed fault zoo,
this tree beside another commit's, in one table.

    python benchmarks/strategy_effect.py [--base HEAD~1] [--zoo-seeds 0,1,2,3,4] [--mutants 40]
                                         [--sample-seed 1] [--mutation-seeds 0] [--module kvparity]

Not a test (it takes tens of minutes): the figures docs/power.md keeps. Two measures, because either alone
can be tuned to: the zoo is faults the same hands wrote, the mutation score is mutants nobody chose
(cosmic-ray's, sampled by seed). `--base` is checked out into a temporary git worktree and both trees run
the same commands one after the other (`fault-zoo --no-shrink`, `mutate --sample`), each with its own
PYTHONPATH, so the only difference is the code. Ratios within one run are what to read: this machine is
shared and noisy, so wall times are printed but never compared across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ZOO_LINE = re.compile(r"caught in (\d+)/(\d+) seeds: \*\*(\d+)/(\d+)\*\*; median of the per-fault medians of "
                      r"examples to first failure: \*\*([\d.]+|n/a)\*\*")


def run(tree: Path, module: str, args: list[str], log: Path) -> float:
    """`python -m <module> ARGS` with `tree` first on the path; returns the wall time."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    with log.open("w") as out:
        subprocess.run([sys.executable, "-m", module, *args], cwd=tree, env=env, stdout=out,
                       stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - t0


def zoo_figures(report: Path) -> dict[str, str]:
    """From the zoo's Markdown: faults caught in every seed, and the median examples to first failure."""
    match = ZOO_LINE.search(report.read_text()) if report.exists() else None
    if not match:
        return {"zoo caught (all seeds)": "no report", "zoo median examples": "-"}
    return {"zoo caught (all seeds)": f"{match.group(3)}/{match.group(4)}", "zoo median examples": match.group(5)}


def mutation_figures(results: Path) -> dict[str, str]:
    """From `kvparity mutate`'s results.json: killed / (killed + survivors), per (mode, seed)."""
    if not results.exists():
        return {"mutation score": "no results"}
    rows = json.loads(results.read_text())["rows"]
    out = {}
    for key in sorted({(r["mode"], r["seed"]) for r in rows}):
        mine = [r for r in rows if (r["mode"], r["seed"]) == key]
        killed = sum(1 for r in mine if str(r["outcome"]).startswith("killed"))
        survivors = sum(1 for r in mine if r.get("classification") == "survivor")
        equivalent = sum(1 for r in mine if r.get("classification") == "equivalent")
        score = f"{killed / (killed + survivors):.0%}" if killed + survivors else "n/a"
        out[f"mutation score ({key[0]}, seed {key[1]})"] = (f"{score} ({killed} killed, {survivors} survivors, "
                                                             f"{equivalent} equivalent)")
    return out


def measure(tree: Path, work: Path, a: argparse.Namespace) -> dict[str, str]:
    work.mkdir(parents=True, exist_ok=True)
    zoo = work / "fault-zoo.md"
    t_zoo = run(tree, a.module, ["fault-zoo", "--no-shrink", "--seeds", a.zoo_seeds, "--out", str(zoo)], work / "zoo.log")
    t_mut = run(tree, a.module, ["mutate", "--sample", str(a.mutants), "--sample-seed", str(a.sample_seed),
                                 "--seeds", a.mutation_seeds, "--profile", "ci", "--mode", "blackbox",
                                 "--limit-s", "300", "--diff-scenarios", "30", "--diff-seconds", "60",
                                 "--no-control", "--out", str(work / "mutation")], work / "mutate.log")
    return {**zoo_figures(zoo), **mutation_figures(work / "mutation" / "results.json"),
            "wall time (zoo, mutation)": f"{t_zoo:.0f} s, {t_mut:.0f} s"}


def checkout(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="HEAD~1", help="the commit to compare with")
    p.add_argument("--zoo-seeds", default="0,1,2,3,4")
    p.add_argument("--mutants", type=int, default=40, help="mutants sampled (stratified by module)")
    p.add_argument("--sample-seed", type=int, default=1, help="seed of the mutant sample")
    p.add_argument("--mutation-seeds", default="0", help="Hypothesis seeds of the suite runs on each mutant")
    p.add_argument("--module", default="kvparity", help="the command's module (`python -m MODULE`)")
    a = p.parse_args(argv)
    base_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.base], capture_output=True,
                              text=True, check=True).stdout.strip()
    head_rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kvparity-strategy-effect-") as tmp:
        base_tree = checkout(a.base, Path(tmp) / "base")
        try:
            figures = {f"base {base_rev}": measure(base_tree, Path(tmp) / "base-out", a),
                       f"this tree ({head_rev}+)": measure(REPO, Path(tmp) / "head-out", a)}
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False)
    rows = sorted({k for f in figures.values() for k in f})
    cols = list(figures)
    print(f"| measure | {' | '.join(cols)} |\n|---|{'---|' * len(cols)}")
    for row in rows:
        print(f"| {row} | {' | '.join(figures[c].get(row, '-') for c in cols)} |")
    print(f"\nzoo: --no-shrink, seeds {a.zoo_seeds}; mutation: {a.mutants} mutants (sample seed {a.sample_seed}), "
          f"black-box, CI profile, seeds {a.mutation_seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
