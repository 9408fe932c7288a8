"""How often the CI profile reaches each situation (conformance/situations.py), per seed, on the reference
engine: the figures behind "every situation counted >= 5 times in seeds 0, 1, 2".

    python benchmarks/situations_by_seed.py [--seeds 0,1,2] [--profile ci] [--histories DIR ...]

Runs `kvparity run --engine reference --profile ci --seed S` per seed (or reads existing run folders
given with --histories) and prints one Markdown table: situation | relevant | count per seed, with the
run's wall time and verdict.
"""

from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.history_files import load_history
from conformance.situations import coverage


def run(seed: int, profile: str, out: Path) -> tuple[Path, float, int]:
    t0 = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "kvparity", "run", "--engine", "reference", "--profile", profile,
                            "--seed", str(seed), "--report-dir", str(out), "-q"], stdout=subprocess.DEVNULL)
    return Path(sorted(glob.glob(str(out / "*" / "*" / "history.jsonl")))[-1]), time.perf_counter() - t0, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--histories", nargs="*", help="history.jsonl (or .jsonl.gz) files to read instead of running")
    args = ap.parse_args()
    columns = []
    if args.histories:
        columns = [(Path(p).parent.name, Path(p), None, None) for p in args.histories]
    else:
        tmp = Path(tempfile.mkdtemp(prefix="kvparity-situations-"))
        for seed in (int(s) for s in args.seeds.split(",")):
            path, wall, code = run(seed, args.profile, tmp / f"seed{seed}")
            columns.append((f"seed {seed}", path, wall, code))
    tables = [(name, {c.name: c for c in coverage(load_history(path))}, wall, code) for name, path, wall, code in columns]
    names = list(tables[0][1])
    print("| situation | relevant | " + " | ".join(t[0] for t in tables) + " |")
    print("|---|---|" + "---|" * len(tables))
    for n in names:
        rel = tables[0][1][n].relevant
        print(f"| `{n}` | {'yes' if rel else 'no'} | " + " | ".join(str(t[1][n].count) for t in tables) + " |")
    if not args.histories:
        print("| wall (s) / exit | | " + " | ".join(f"{t[2]:.0f} / {t[3]}" for t in tables) + " |")


if __name__ == "__main__":
    main()
