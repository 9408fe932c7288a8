"""How often `kvparity run` passes on the reference engine: the twin of plugin_steadiness.py for the CLI.

    python benchmarks/run_steadiness.py [--seeds 0-19] [--runs 0] [--profile dev] [--engine reference]
                                        [--engine-arg K=V ...]

Not a test (20 runs take minutes): the reference engine is the ground truth, so anything short of N/N
PASS is a bug in the suite or the engine, and this script is how it is measured. Runs `--seed S` for each
seed of `--seeds` (a range "0-19" or a list "0,4,7"), then `--runs` more without a seed (a random stream
each, as a developer's run sees), one fresh subprocess at a time, each in a temporary directory of its
own (its own example database and report dir). Per run it prints the verdict, the wall time, what
coverage completion went after and reached (the history's `completion` event), and for a run that did
not pass, the relevant situations it left unreached.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERDICTS = {0: "PASS", 1: "FAIL", 2: "INCONCLUSIVE", 3: "ERROR", 130: "INTERRUPTED"}


def seed_list(text: str) -> list[int]:
    """"0-19" -> 0..19; "0,4,7" -> those; "" -> none."""
    if not text:
        return []
    if "-" in text and "," not in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def run_command(engine: str, args: list[str], profile: str, seed: int | None, report_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "kvparity", "run", "--engine", engine, "--profile", profile,
           "--report-dir", str(report_dir), "-q"]
    for a in args:
        cmd += ["--engine-arg", a]
    return cmd + (["--seed", str(seed)] if seed is not None else [])


def completion_of(history: Path) -> tuple[dict | None, list[str]]:
    """The history's `completion` event (None when completion had nothing to do) and the relevant
    situations the whole run left unreached."""
    from conformance.history import load
    from conformance.situations import missing

    done = None
    for line in history.read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] == "completion":
            done = ev
    return done, [c.name for c in missing(load(history))]


def one_run(engine: str, args: list[str], profile: str, seed: int | None, timeout_s: float
            ) -> tuple[int, float, dict | None, list[str], str]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="kvparity-run-steadiness-") as cwd:
        started = time.monotonic()
        try:
            done = subprocess.run(run_command(engine, args, profile, seed, Path(cwd) / "runs"), cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -1, time.monotonic() - started, None, [], f"timed out after {timeout_s:g}s"
        wall = time.monotonic() - started
        histories = glob.glob(str(Path(cwd) / "runs" / "*" / "*" / "history.jsonl"))
        output = (done.stdout + done.stderr).strip().splitlines()
        last = output[-1] if output else ""
        if not histories:
            return done.returncode, wall, None, [], last
        completion, unreached = completion_of(Path(histories[0]))
        return done.returncode, wall, completion, unreached, last


def describe(completion: dict | None) -> str:
    if completion is None:
        return "no completion needed"
    reached = ", ".join(f"{n} (ex {h['example']}, {h['arm']})" for n, h in completion["reached"].items())
    text = f"completion: {completion['examples']} example(s), went after {', '.join(completion['targets'])}"
    text += f"; reached {reached}" if reached else ""
    return text + (f"; NOT reached {', '.join(completion['unreached'])}" if completion["unreached"] else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-19", help='seeds to run with --seed ("0-19" or "0,4,7"; "" for none)')
    parser.add_argument("--runs", type=int, default=0, help="more runs without a seed (a random stream each)")
    parser.add_argument("--profile", default="dev", choices=["dev", "ci", "nightly"])
    parser.add_argument("--engine", default="reference")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="K=V")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it counts as failed")
    args = parser.parse_args(argv)
    plan: list[int | None] = [*seed_list(args.seeds), *([None] * args.runs)]
    passed, failed, completed = 0, [], 0
    for i, seed in enumerate(plan):
        code, wall, completion, unreached, last = one_run(args.engine, args.engine_arg, args.profile, seed,
                                                          args.timeout)
        label = f"seed {seed}" if seed is not None else f"random stream {i - len(seed_list(args.seeds)) + 1}"
        print(f"{label}: {VERDICTS.get(code, f'exit {code}')} in {wall:.1f}s; {describe(completion)}", flush=True)
        completed += completion is not None
        if code == 0:
            passed += 1
        else:
            failed.append(label)
            print(f"    {last}" + (f"\n    unreached: {', '.join(unreached)}" if unreached else ""), flush=True)
    print(f"\npassed {passed} / {len(plan)}; completion ran in {completed}; not passed: {', '.join(failed) or 'none'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
