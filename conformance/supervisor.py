"""Supervision: a run whose process dies is still an `error`, with a report — never an exit code of 0.

An engine can end the process it runs in: `os._exit(0)` in an adapter, `GGML_ASSERT` aborting llama.cpp,
the OOM killer. No `finally` runs then, and the exit code is whatever the engine chose — 0 reads as a
pass to a CI job. So the `kvparity` console script runs `run` and `replay` in a child process and waits.
The child tells the parent, through a small status file, where its run folder is, its verdict and its
exit code; a child that ends without saying its exit code died during the run. The parent then reads the
history the child left (every request is recorded before the engine sees it), analyses it — the checks
still run, for information — writes the report with how the process ended, prints the verdict and exits
3 (or 1 if a failure was already recorded).

Ctrl-C reaches both processes (one process group); the child writes its interrupted report and exits
130, and the parent passes that on. A SIGINT sent to the parent alone is forwarded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from conformance.status import STATUS_ENV, read_status

SUPERVISED = ("run", "replay")
EXIT_ERROR = 3


def should_supervise(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] in SUPERVISED and STATUS_ENV not in os.environ and "-h" not in argv \
        and "--help" not in argv


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def supervise(argv: Sequence[str]) -> int:
    """Parent side: run `python -m conformance ARGV` as a child and answer for it if it dies."""
    fd, status_path = tempfile.mkstemp(prefix="kvparity-status-", suffix=".jsonl")
    os.close(fd)
    env = {**os.environ, STATUS_ENV: status_path,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the child imports what we can
    try:
        child = subprocess.Popen([sys.executable, "-m", "conformance", *argv], env=env)
        returncode = _wait(child)
        status = read_status(status_path)
    finally:
        try:
            os.unlink(status_path)
        except OSError:
            pass
    if "exit" in status:
        return int(status["exit"])
    return _answer_for_dead_child(argv[0], returncode, status)


def _wait(child: subprocess.Popen) -> int:
    forwarded = False
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            if not forwarded and child.poll() is None:
                forwarded = True
                try:
                    child.send_signal(signal.SIGINT)
                except OSError:
                    pass


def _answer_for_dead_child(command: str, returncode: int, status: dict[str, Any]) -> int:
    how = how_it_ended(returncode)
    if "verdict" in status and int(status["verdict"]) == 130:  # interrupted: its report already says so
        print(f"ERROR: the {command} process {how} after it was interrupted", flush=True)
        return 130
    if "verdict" in status:  # it died after its verdict: the report files must say error, not what it told
        cause = f"the {command} process {how} after its verdict"
    elif status.get("closing"):  # it died inside the engine's close(), before its report
        cause = f"the {command} process {how} while closing the engine"
    else:
        cause = f"the {command} process {how} before it finished"
    run_dir = status.get("run_dir")
    if command != "run" or not run_dir or not (Path(run_dir) / "history.jsonl").is_file():
        print(f"ERROR: {cause}", flush=True)
        return EXIT_ERROR
    return _report_dead_run(Path(run_dir), cause)


def _report_dead_run(run_dir: Path, cause: str) -> int:
    """Analyse what the dead run recorded and write its report, saying how the process ended."""
    from conformance import known
    from conformance.analysis import analyse
    from conformance.history import NotAHistory, load
    from conformance.report import print_summary, write_report

    try:
        history = load(run_dir / "history.jsonl")
    except (NotAHistory, OSError, ValueError) as exc:
        print(f"ERROR: {cause}; its history cannot be read ({exc})", flush=True)
        return EXIT_ERROR
    history.errors.append(cause)
    analysis = known.apply(history, analyse(history, history.meta.get("checks") or None))  # its --known, too
    try:
        write_report(run_dir, history, analysis, process=cause)
    except OSError as exc:
        print(f"ERROR: cannot write the report in {run_dir}: {exc}")
        return EXIT_ERROR
    print_summary(analysis, run_dir, history.meta.get("engine"))
    print(f"{analysis.verdict.upper()}: {len(history.examples)} examples recorded, report {run_dir}", flush=True)
    return analysis.exit_code
