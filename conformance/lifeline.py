"""The lifeline between a supervised `kvparity` child and its supervisor (`conformance.supervisor`).

Two things the supervisor cannot learn from `wait()`:

- Whether the child still answers. A thread in the child writes one byte to a pipe every
  `BEAT_INTERVAL_S`. A Python thread needs the GIL to run, so the heartbeat stops exactly when the child
  cannot act on its own `--timeout` either: an engine call holding the GIL in C (a pybind11 call without
  `gil_scoped_release`; `EngineCalls` waits on the main thread, which never gets the GIL back to notice),
  a process stopped by SIGSTOP, a deadlock in the interpreter. The supervisor kills what stops beating.
- Whether the supervisor is still there. The child asks Linux for SIGKILL when its parent dies
  (`PR_SET_PDEATHSIG`, prctl through ctypes), so `kill -9` of the supervisor takes the child with it
  instead of leaving it to drive the engine on and write a PASS folder. SIGKILL, not a signal the child
  could handle: a child that holds the GIL could not handle one, and nobody is left to read its verdict
  (its history stays on disk; `kvparity report` re-analyses it as `error`). Where prctl is missing
  (not Linux), the heartbeat thread sees the broken pipe and kills the child's process group itself.

A campaign's shards (`kvparity run` processes, each itself a supervisor) get SIGTERM when the process
that started them dies (`stop_with`), so each still ends its run with a report.

The child is started in its own session by the supervisor, so "the child's process group" is the child
and whatever it forked; servers it starts have their own lifetime guard (`adapters.openai_http.leash`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from conformance.exit_codes import ExitCode

HEARTBEAT_ENV = "KVPARITY_HEARTBEAT_FD"
SUPERVISOR_ENV = "KVPARITY_SUPERVISOR_PID"
PARENT_ENV = "KVPARITY_STOP_WITH_PID"  # a campaign's shard: the process whose death stops it (`stop_with`)
BEAT_INTERVAL_S = 0.5
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when the thread that forked it ends (False elsewhere).
    Only reliable where that parent is single-threaded or forks from a thread that lives as long as it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_with(pid: int) -> dict[str, str]:
    """The environment entry that asks a `kvparity` process started by `pid` (a campaign starting a shard)
    to be stopped when `pid` dies: see `stop_with_parent`."""
    return {PARENT_ENV: str(pid)}


def stop_with_parent() -> None:
    """First thing in a process started with `stop_with(pid)`: ask Linux for SIGTERM when that parent dies.
    SIGTERM, not SIGKILL: a campaign's shard is itself a supervisor (`kvparity run`), which ends its run
    with an INTERRUPTED report on SIGTERM, instead of driving the engine on, orphaned, when the campaign
    (or the Ray worker that ran it) was killed outright. Done here, after exec, rather than in a
    `preexec_fn` (unsafe in a threaded parent such as a Ray worker). A parent already gone by now: the
    same SIGTERM, sent by this process to itself."""
    text = os.environ.pop(PARENT_ENV, None)  # not passed on to what this process starts
    if text is None or not text.isdigit():
        return
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != int(text):
        os.kill(os.getpid(), signal.SIGTERM)


def attach() -> bool:
    """Child side, called first thing in a supervised child: die with the supervisor, start the
    heartbeat. False (nothing done) when this process was not started by a supervisor."""
    fd_text, parent_text = os.environ.pop(HEARTBEAT_ENV, None), os.environ.pop(SUPERVISOR_ENV, None)
    if fd_text is None or parent_text is None:
        return False
    fd, parent = int(fd_text), int(parent_text)
    os.set_inheritable(fd, False)  # the servers and workers this child starts do not beat for it
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the supervisor died before the request took effect
        _end_group()
    threading.Thread(target=_beat, args=(fd, parent), name="kvparity-heartbeat", daemon=True).start()
    return True


def _beat(fd: int, parent: int) -> None:
    while True:
        try:
            os.write(fd, b".")
        except OSError:  # the supervisor's end is closed: it is gone
            _end_group()
        if os.getppid() != parent:
            _end_group()
        time.sleep(BEAT_INTERVAL_S)


def _end_group() -> None:
    """The supervisor is gone and nobody will read this run's verdict: end the child and what it forked."""
    try:
        if os.getpgid(0) == os.getpid():  # a group of its own, as the supervisor starts it
            os.killpg(os.getpid(), signal.SIGKILL)
    finally:
        os._exit(ExitCode.ERROR)
