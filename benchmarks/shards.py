"""1 shard vs 2 shards: wall time of one campaign's examples on this machine's cores (issue 32 item 6).

    python benchmarks/shards.py [--engine reference] [--profile ci] [--examples 100] [--repeats 1]
                                [--engine-arg K=V ...]

Not a test (minutes on a loaded machine). Two measurements, each through `kvparity campaign` (local
processes, so the harness, the engine and the merge are all in the time), each in a temporary folder of
its own (its own example database):

- *same work*: `--examples` examples as 1 shard, then as 2 shards of half as many each, in parallel: the
  speed-up is 1-shard time / 2-shard time (ideal 2.0 on 2 idle cores);
- *same time per shard*: 2 shards of `--examples` each: n machines together run n times the examples
  of one, so examples per second should double.

Run it at rest: on a machine other work is using, the second core is not free and the speed-up says so.
Each shard pays a fixed start and the merge re-judges every example, so the speed-up grows with the
campaign: `--examples 1000` (a nightly campaign's size) is the figure docs/running.md quotes.
The shards of a ci campaign run a fixed stream each (conformance.shards), but coverage completion adds
examples where a shard left a situation unreached, so the example counts are printed beside the times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def campaign(shards: int, examples: int, args: argparse.Namespace) -> tuple[float, int, int]:
    """(wall seconds, exit code, examples run) of one `kvparity campaign`."""
    with tempfile.TemporaryDirectory(prefix="kvparity-shards-") as tmp:
        run_args = ["--engine", args.engine, "--profile", args.profile, "--max-examples", str(examples),
                    "--no-shrink", "--database", str(Path(tmp) / "db")]
        for pair in args.engine_arg:
            run_args += ["--engine-arg", pair]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kvparity", "campaign", "--shards", str(shards), "--jobs",
                               str(shards), "--out", str(Path(tmp) / "out"), *run_args],
                              cwd=REPO, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        results = Path(tmp) / "out" / "results.json"
        ran = json.loads(results.read_text())["examples"] if results.is_file() else 0
    if proc.returncode not in (0, 1, 2):
        print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
    return wall, proc.returncode, ran


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", default="reference")
    p.add_argument("--engine-arg", action="append", default=[])
    p.add_argument("--profile", default="ci")
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    print(f"cores: {os.cpu_count()}; engine {args.engine}, profile {args.profile}, {args.examples} examples")
    for r in range(args.repeats):
        one, code1, ran1 = campaign(1, args.examples, args)
        two, code2, ran2 = campaign(2, max(1, args.examples // 2), args)
        both, code3, ran3 = campaign(2, args.examples, args)
        print(f"[{r + 1}] same work:  1 shard {one:6.1f} s ({ran1} examples, exit {code1}); "
              f"2 shards {two:6.1f} s ({ran2} examples, exit {code2}); speed-up {one / two:.2f}x")
        print(f"[{r + 1}] same budget per shard: 2 shards x {args.examples} in {both:6.1f} s ({ran3} examples, "
              f"exit {code3}): {ran3 / both:.1f} examples/s vs {ran1 / one:.1f} with 1 shard "
              f"({(ran3 / both) / (ran1 / one):.2f}x)")


if __name__ == "__main__":
    main()
