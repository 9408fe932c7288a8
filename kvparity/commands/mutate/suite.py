"""Running the conformance suite on one mutant: `python -m kvparity run` in a subprocess whose
PYTHONPATH puts the mutant's reference_engine/ first, in a scratch folder of its own (its Hypothesis
example database starts empty, so no mutant replays another's failure), without shrinking: Hypothesis
stops generating at the first failing example when shrinking is off, so a killed mutant costs only the
examples up to its first failure.

Black-box: the reference adapter with `introspection=off` (no snapshot, no white-box check: only what
any engine shows). White-box: the adapter as it is (introspectable).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from attrs import frozen

from kvparity.commands.mutate.differ import engine_args, project_root
from kvparity.commands.mutate.process import end_group

# exit code of `kvparity run` -> what it means for a mutant
OUTCOMES = {0: "survived-suite", 1: "killed", 2: "killed-inconclusive", 3: "killed-crash"}
_CHECK_LINE = re.compile(r"^([a-z_]+)\s+fail\b", re.M)
_CAUSE = re.compile(r"^(FAIL \[.*|ERROR: (?!\d+ examples).*)$", re.M)  # the first failure or engine error
_EXAMPLES = re.compile(r"(\d+) examples")


@frozen
class SuiteRun:
    """One run of the suite: `outcome` is one of OUTCOMES' values, or "unfinished" when it ran past the
    per-mutant limit (neither killed nor survived: left out of the score and reported)."""

    outcome: str
    exit_code: int | None
    seconds: float
    failed_checks: tuple[str, ...] = ()
    examples: int | None = None
    last_line: str = ""
    cause: str = ""  # the first failure's line, or the engine error that ended the run


def suite_command(profile: str, seed: int, blackbox: bool, report_dir: Path, max_examples: int | None,
                  call_timeout_s: float) -> list[str]:
    cmd = [sys.executable, "-m", "kvparity", "run", "--engine", "reference", "--profile", profile,
           "--exitfirst", "--seed", str(seed), "--report-dir", str(report_dir), "-q",
           "--timeout", str(call_timeout_s)]
    for k, v in engine_args(blackbox).items():
        cmd += ["--engine-arg", f"{k}={v}"]
    if max_examples is not None:
        cmd += ["--max-examples", str(max_examples)]
    return cmd


def run_suite_on(src: Path, workdir: Path, *, profile: str, seed: int, blackbox: bool,
                 max_examples: int | None, limit_s: float, call_timeout_s: float = 30.0) -> SuiteRun:
    """The suite's verdict on the reference engine imported from `src` (a materialised mutant)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(project_root())])}
    cmd = suite_command(profile, seed, blackbox, workdir / "reports", max_examples, call_timeout_s)
    start = time.monotonic()
    # A session of its own: `kvparity run` supervises its run in a child process, and a run past the limit
    # is ended with all of its processes, none left behind.
    proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        end_group(proc)
        return SuiteRun("unfinished", None, round(time.monotonic() - start, 1), last_line=f"over {limit_s:g} s")
    except BaseException:  # Ctrl-C reaches this process only (the run has a session of its own)
        end_group(proc)
        raise
    seconds = round(time.monotonic() - start, 1)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    examples = _EXAMPLES.findall(text)
    cause = _CAUSE.search(text)
    return SuiteRun(OUTCOMES.get(proc.returncode, "killed-crash"), proc.returncode, seconds,
                    tuple(sorted(set(_CHECK_LINE.findall(text)))), int(examples[-1]) if examples else None,
                    lines[-1][:300] if lines else "", cause.group(1)[:300] if cause else "")

