"""Stop signals: SIGTERM and SIGHUP end a run the way Ctrl-C does.

A CI job that is cancelled, `docker stop`, a closed terminal: each sends a signal that, left at its
default, ends the process on the spot — no report, an engine left running, or (with the supervisor) a
child that drives the engine on and writes a PASS folder nobody asked for. In a supervised `kvparity`
child, SIGTERM and SIGHUP therefore raise `Stopped`, a `KeyboardInterrupt`: every path that already
turns Ctrl-C into an INTERRUPTED report (history kept, verdict `error`, the engine closed) does the same
for them, with the signal named in the history's `interrupted` cause.

Exit codes follow the shell's 128 + signal number, so a CI log reads the way it was stopped: 130 for
SIGINT (Ctrl-C, as before), 143 for SIGTERM, 129 for SIGHUP. A signal whose disposition was "ignore"
when the process started (`nohup` ignores SIGHUP, a shell's background job SIGINT) stays ignored.
"""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_INTERRUPTED = 130


class Stopped(KeyboardInterrupt):
    """A stop signal other than SIGINT, raised on the main thread where Ctrl-C would be."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal_name(signum))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(exc: BaseException) -> int:
    """128 + the signal that stopped the work: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + exc.signum if isinstance(exc, Stopped) else EXIT_INTERRUPTED


def exit_code_of(signum: int) -> int:
    return 128 + signum


def interrupted_codes() -> frozenset[int]:
    """Exit codes that mean "stopped by a signal" (the supervisor passes them on as they are)."""
    return frozenset(128 + s for s in STOP_SIGNALS)


def describe(exc: BaseException) -> str:
    """How the user stopped the work, for the history's `interrupted` cause."""
    return signal_name(exc.signum) if isinstance(exc, Stopped) else "Ctrl-C"


def _raise_stopped(signum: int, frame: Any) -> None:
    """The first stop signal raises; later ones are ignored so they cannot cut the report being written."""
    ignore_further()
    raise Stopped(signum)


def ignore_further() -> None:
    """After the first stop the work is over: a second Ctrl-C, SIGTERM or SIGHUP must not cut the report
    being written. SIGTERM and SIGHUP are ignored only where `install` made them raise (an embedding
    program keeps its own handlers). Main thread only, as Python's signal module requires."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is _raise_stopped:
            signal.signal(s, signal.SIG_IGN)


def install() -> None:
    """Make SIGTERM and SIGHUP raise `Stopped` in this process (main thread only; ignored ones stay so)."""
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _raise_stopped)
