"""Supervision: a run whose process dies, hangs or is stopped is still an `error`, with a report — never
an exit code of 0, and never a process left running.

An engine can end the process it runs in: `os._exit(0)` in an adapter, `GGML_ASSERT` aborting llama.cpp,
the OOM killer. No `finally` runs then, and the exit code is whatever the engine chose — 0 reads as a
pass to a CI job. So the `kvparity` console script runs `run` and `replay` in a child process and waits.
The child tells the parent, through a small status file, where its run folder is, its verdict and its
exit code; a child that ends without saying its exit code died during the run. The parent then reads the
history the child left (every request is recorded before the engine sees it), analyses it — the checks
still run, for information — writes the report with how the process ended, prints the verdict and exits
3 (or 1 if a failure was already recorded).

The parent also answers for a child that stops answering. The child beats on a pipe from a thread
(`conformance.lifeline`); a thread cannot beat while an engine call holds the GIL or while the process
is stopped (SIGSTOP), which are exactly the cases the child's own `--timeout` cannot end. No beat for
`--timeout` + `HEARTBEAT_MARGIN_S`: the parent kills the child's process group and reports `error` from
the history the child left, as for a child that died.

Stop signals. The child runs in a session of its own (so its process group can be killed without the
parent), so the parent forwards what reaches it: Ctrl-C (SIGINT), SIGTERM (a CI cancel, `docker stop`)
and SIGHUP (a closed terminal). The child ends the work as for Ctrl-C (`conformance.stopping`): its
INTERRUPTED report, the engine closed, exit 128 + the signal (130, 143, 129), which the parent passes on.
A child still there `STOP_GRACE_S` after the first stop signal is killed with its process group and
reported by the parent, still with exit 128 + the signal. Whether the signal reaches the parent alone
or its whole process group, the child sees it once. The parent's own death (SIGKILL included) takes the
child with it (`PR_SET_PDEATHSIG`, see `conformance.lifeline`); servers started for the run die with it
too (`adapters.openai_http.leash`).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from conformance import lifeline, stopping
from conformance.arguments import DEFAULT_TIMEOUT_S, positive_seconds
from conformance.exit_codes import ExitCode
from conformance.status import STATUS_ENV, read_status

SUPERVISED = ("run", "replay")
HEARTBEAT_MARGIN_S = 5.0  # beyond the run's --timeout: scheduling delays on a loaded machine, not an engine's time
FIRST_BEAT_S = 30.0  # the child's interpreter start and first imports, before its heartbeat thread runs
STOP_GRACE_S = 5.0  # a stop signal's report and the engine's close, before the child is killed
POLL_S = 0.25


def should_supervise(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0] in SUPERVISED and STATUS_ENV not in os.environ and "-h" not in argv \
        and "--help" not in argv


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {stopping.signal_name(-returncode)}"
    return f"exited with code {returncode}"


class _Lenient(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def heartbeat_limit(argv: Sequence[str]) -> float:
    """Seconds without a heartbeat before the child counts as hung: its `--timeout` plus a margin. An
    unreadable --timeout gets the default; the child refuses it with its own one-line usage error."""
    parser = _Lenient(add_help=False)
    parser.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT_S)
    try:
        timeout_s = parser.parse_known_args(list(argv[1:]))[0].timeout
    except ValueError:
        timeout_s = DEFAULT_TIMEOUT_S
    return timeout_s + HEARTBEAT_MARGIN_S


def supervise(argv: Sequence[str]) -> int:
    """Parent side: run `python -m kvparity ARGV` as a child and answer for it if it dies or hangs."""
    returncode, status, killed, first_signal = _supervised(argv, "kvparity", None, heartbeat_limit(argv))
    if "exit" in status:
        return int(status["exit"])
    return _answer_for_dead_child(argv[0], returncode, status, killed, first_signal)


def _supervised(argv: Sequence[str], module: str, stdout: Any, limit_s: float) -> tuple[int, dict[str, Any], str | None, int | None]:
    """Run `python -m MODULE ARGV` in a session of its own, with a status file and a heartbeat pipe;
    forward stop signals and kill it when it stops beating for `limit_s`. Returns (its return code, what
    it told, how it was killed or None, the first stop signal that reached this process or None)."""
    fd, status_path = tempfile.mkstemp(prefix="kvparity-status-", suffix=".jsonl")
    os.close(fd)
    beats, beat_end = os.pipe()
    env = {**os.environ, STATUS_ENV: status_path, lifeline.HEARTBEAT_ENV: str(beat_end),
           lifeline.SUPERVISOR_ENV: str(os.getpid()),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the child imports what we can
    signals = stopping.StopSignals()
    try:
        try:
            child = subprocess.Popen([sys.executable, "-m", module, *argv], env=env, pass_fds=(beat_end,),
                                     start_new_session=True, stdout=stdout,
                                     stderr=None if stdout is None else subprocess.STDOUT)
        finally:
            os.close(beat_end)  # the child holds its own copy: the pipe's writer end is the child's alone
        returncode, killed = _watch(child, beats, limit_s, signals)
        status = read_status(status_path)
    finally:
        signals.restore()
        os.close(beats)
        try:
            os.unlink(status_path)
        except OSError:
            pass
    return returncode, status, killed, signals.first


def _watch(child: subprocess.Popen, beats: int, limit_s: float, signals: stopping.StopSignals) -> tuple[int, str | None]:
    """Wait for the child, forwarding stop signals. Kill its process group when it has not beaten for
    `limit_s`, or is still there `STOP_GRACE_S` after the first stop signal. Returns (its return code,
    how it was killed, or None when it ended by itself)."""
    last_beat, allowance, stop_by = time.monotonic(), max(limit_s, FIRST_BEAT_S), None
    pipe_open = True
    while child.poll() is None:
        for s in signals.take():
            try:
                child.send_signal(s)
            except OSError:
                pass
            stop_by = stop_by or time.monotonic() + STOP_GRACE_S
        now = time.monotonic()
        if stop_by is not None and now >= stop_by:
            name = stopping.signal_name(signals.first or signal.SIGTERM)
            return _kill_group(child), f"did not end within {STOP_GRACE_S:g}s of {name} and was killed"
        if now - last_beat > allowance:
            return _kill_group(child), (f"stopped answering for {now - last_beat:.0f}s (no heartbeat: an engine "
                                        f"call holding the GIL, or a stopped process) and was killed")
        if not pipe_open:
            time.sleep(POLL_S)
        elif select.select([beats], [], [], POLL_S)[0]:
            pipe_open = bool(os.read(beats, 4096))
            if pipe_open:
                last_beat, allowance = time.monotonic(), limit_s
    return child.returncode, None


def _kill_group(child: subprocess.Popen) -> int:
    """SIGKILL the child's process group (the child leads it: it runs in a session of its own)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return child.wait()


def _answer_for_dead_child(command: str, returncode: int, status: dict[str, Any], killed: str | None = None,
                           stopped_by: int | None = None) -> int:
    """The child ended without telling its exit code: say how, report what it recorded, choose the exit.
    After a stop signal the exit is 128 + that signal whatever the report says (the work was stopped)."""
    how = killed or how_it_ended(returncode)
    stop_code = stopping.exit_code_of(stopped_by) if stopped_by is not None else None
    told = int(status["verdict"]) if "verdict" in status else None
    if told is not None and told in stopping.interrupted_codes():  # interrupted: its report already says so
        print(f"ERROR: the {command} process {how} after it was interrupted", flush=True)
        return stop_code if stop_code is not None else told
    if told is not None:  # it died after its verdict: the report files must say error, not what it told
        cause = f"the {command} process {how} after its verdict"
    elif status.get("closing"):  # it died inside the engine's close(), before its report
        cause = f"the {command} process {how} while closing the engine"
    else:
        cause = f"the {command} process {how} before it finished"
    run_dir = status.get("run_dir")
    if command != "run" or not run_dir or not (Path(run_dir) / "history.jsonl").is_file():
        print(f"ERROR: {cause}", flush=True)
        return stop_code if stop_code is not None else ExitCode.ERROR
    stopped = None if stopped_by is None else f"{stopping.signal_name(stopped_by)}; {cause}"
    code = _report_dead_run(Path(run_dir), cause, stopped)
    return stop_code if stop_code is not None else code


def _report_dead_run(run_dir: Path, cause: str, stopped: str | None = None) -> int:
    """Analyse what the dead run recorded and write its report, saying how the process ended (and, for
    a run stopped by a signal, that it was interrupted: the report then says INTERRUPTED)."""
    from conformance import known
    from conformance.analysis import analyse
    from conformance.history import NotAHistory, load
    from conformance.report import print_summary, write_report

    try:
        history = load(run_dir / "history.jsonl")
    except (NotAHistory, OSError, ValueError) as exc:
        print(f"ERROR: {cause}; its history cannot be read ({exc})", flush=True)
        return ExitCode.ERROR
    history.errors.append(cause)
    if stopped is not None and history.interrupted is None:
        history.interrupted = stopped
    analysis = known.apply(history, analyse(history, history.meta.get("checks") or None))  # its --known, too
    try:
        write_report(run_dir, history, analysis, process=cause)
    except OSError as exc:
        print(f"ERROR: cannot write the report in {run_dir}: {exc}")
        return ExitCode.ERROR
    print_summary(analysis, run_dir, history.meta.get("engine"))
    print(f"{analysis.verdict.upper()}: {len(history.examples)} examples recorded, report {run_dir}", flush=True)
    return analysis.exit_code


# --------------------------------------------------------------------------- for other supervisors


def run_child(argv: Sequence[str], module: str = "kvparity", stdout: Any = None,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, dict[str, Any]]:
    """Run `python -m MODULE ARGV` as a supervised child, for a caller that answers for it in its own
    process (the pytest plugin): the same heartbeat deadline (`timeout_s` + the margin), stop signals and
    session as `supervise`. Returns its return code and what it told; `killed` is added to what it told
    when the deadline or a stop signal's grace ran out. `stdout` takes the child's stdout and stderr
    together (None: this process's)."""
    returncode, status, killed, _ = _supervised(argv, module, stdout, timeout_s + HEARTBEAT_MARGIN_S)
    return returncode, ({**status, "killed": killed} if killed else status)


def answer_for_dead_run(returncode: int, status: dict[str, Any]) -> int:
    """What `supervise` answers for a `run` child that ended without telling its exit code: the report of
    what it recorded, written with how the process ended, and exit 3 (1 if a failure was recorded)."""
    return _answer_for_dead_child("run", returncode, status, status.get("killed"))
