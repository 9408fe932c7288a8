"""How often the pytest plugin is green on the reference engine: run it N times, count, show failures.

    python benchmarks/plugin_steadiness.py [--runs 50] [--profile dev] [--seeds] [-- extra pytest args]

Not a test (a count over 50 runs takes minutes, and a timed test of it would be flaky itself): the
reference engine is the ground truth, so anything short of N/N green is a bug in the suite or the
engine, and this script is how it is measured.

Each run is a fresh subprocess in its own temporary directory (its own `.hypothesis` example database,
report dir and pytest cache), so no run replays another's examples and every run draws a fresh stream.
By default no `--kvparity-seed` is given: in the dev profile Hypothesis then seeds each run at random,
which is what a CI job sees. `--seeds` passes `--kvparity-seed i` to run i instead, so a failure seen
here can be reproduced with that seed (the state machine is not seeded by it; it draws at random).
Each run's line says what coverage completion did (conformance/completion.py): nothing, or which
situations the stream left unreached and which completion example reached each. `run_steadiness.py` is
the same count for `kvparity run`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def pytest_command(profile: str, seed: int | None, extra: list[str]) -> list[str]:
    """The plugin run, as a CI job would type it (xdist off unless `extra` turns it on)."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--kvparity-engine", "reference",
           "--kvparity-profile", profile, "-q", "-p", "no:randomly", "-n", "0"]
    if seed is not None:
        cmd += ["--kvparity-seed", str(seed)]
    return cmd + extra


def failure_lines(output: str) -> list[str]:
    """What a person reads first: pytest's short summary lines, else the last lines of output."""
    lines = [l for l in output.splitlines() if l.startswith(("FAILED", "ERROR"))]
    return lines or output.strip().splitlines()[-3:]


def completion_line(cwd: str) -> str:
    """What coverage completion did in the run under `cwd` (its history's `completion` event), in words."""
    from run_steadiness import completion_of, describe

    histories = sorted((Path(cwd) / ".kvparity").glob("runs/*/*/history.jsonl"))
    return describe(completion_of(histories[0])[0]) if histories else "no history"


def one_run(index: int, profile: str, seeds: bool, extra: list[str], timeout_s: float,
            keep: Path | None = None) -> tuple[int, str, float, str]:
    """(pytest exit code, its output, seconds, what coverage completion did) of run `index`, in a
    temporary directory of its own; a failed run's report directories are copied to `keep`/run-<index + 1>
    first (the history says why)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix=f"kvparity-steadiness-{index}-") as cwd:
        started = time.monotonic()
        try:
            done = subprocess.run(pytest_command(profile, index if seeds else None, extra) + ["--rootdir", cwd],
                                  cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0 and keep is not None and (Path(cwd) / ".kvparity").is_dir():
                shutil.copytree(Path(cwd) / ".kvparity", keep / f"run-{index + 1}", dirs_exist_ok=True)
            return done.returncode, done.stdout + done.stderr, time.monotonic() - started, completion_line(cwd)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return -1, out + f"\nERROR run timed out after {timeout_s:g}s", time.monotonic() - started, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--profile", default="dev", choices=["dev", "ci", "nightly"])
    parser.add_argument("--seeds", action="store_true", help="pass --kvparity-seed i to run i")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run before it counts as failed")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep each failed run's output (DIR/run-<i>.txt) and report dir (DIR/run-<i>/)")
    parser.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    passed, failed, completed = 0, [], 0
    for i in range(args.runs):
        code, output, seconds, completion = one_run(i, args.profile, args.seeds, args.extra, args.timeout, args.keep)
        status = "passed" if code == 0 else f"FAILED (exit {code})"
        completed += completion.startswith("completion:")
        print(f"run {i + 1}/{args.runs}: {status} in {seconds:.1f}s; {completion}", flush=True)
        if code == 0:
            passed += 1
            continue
        failed.append((i, code, failure_lines(output)))
        for line in failed[-1][2]:
            print(f"    {line}", flush=True)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / f"run-{i + 1}.txt").write_text(output)
    print(f"\npassed {passed} / {args.runs}, failed {len(failed)}; coverage completion ran in {completed}")
    for i, code, lines in failed:
        print(f"  run {i + 1} (exit {code}{f', seed {i}' if args.seeds else ''}):")
        for line in lines:
            print(f"    {line}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
