"""Ending a subprocess of `kvparity mutate` together with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess


def end_group(proc: subprocess.Popen) -> None:
    """Kill `proc` and every process of its session (it was started with `start_new_session`):
    `kvparity run` supervises its run in a child process, and none may be left behind."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.communicate()
