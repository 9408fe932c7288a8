"""Stop signals: SIGTERM and SIGHUP end a run the way Ctrl-C does.

A CI job that is cancelled, `docker stop`, a closed terminal: each sends a signal that, left at its
default, ends the process on the spot — no report, an engine left running, or (with the supervisor) a
child that drives the engine on and writes a PASS folder nobody asked for. In a supervised `kvparity`
child, SIGTERM and SIGHUP (and SIGINT, for the same reason) are therefore recorded, and the next safe
point — the wait for an engine call (polled every `POLL_S`), the start of an example, the end of the
run before `run_end` — raises `Stopped`, a `KeyboardInterrupt`: every path that already turns Ctrl-C
into an INTERRUPTED report (history kept, verdict `error`, the engine closed) does the same for them,
with the signal named in the history's `interrupted` cause. A stop that arrives while the engine is
being built takes effect at the first engine call; the supervisor kills a child that has not ended
`STOP_GRACE_S` after the signal (conformance.supervisor).

Exit codes follow the shell's 128 + signal number, so a CI log reads the way it was stopped: 130 for
SIGINT (Ctrl-C, as before), 143 for SIGTERM, 129 for SIGHUP. A signal whose disposition was "ignore"
when the process started (`nohup` ignores SIGHUP, a shell's background job SIGINT) stays ignored.
"""

from __future__ import annotations

import signal
from typing import Any

from conformance.exit_codes import ExitCode

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.1


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
    return 128 + exc.signum if isinstance(exc, Stopped) else ExitCode.INTERRUPTED


def exit_code_of(signum: int) -> int:
    return 128 + signum


def interrupted_codes() -> frozenset[int]:
    """Exit codes that mean "stopped by a signal" (the supervisor passes them on as they are)."""
    return frozenset(128 + s for s in STOP_SIGNALS)


def describe(exc: BaseException) -> str:
    """How the user stopped the work, for the history's `interrupted` cause."""
    return signal_name(exc.signum) if isinstance(exc, Stopped) and exc.signum != signal.SIGINT else "Ctrl-C"


class _State:
    """Process-wide, as signal dispositions are: the first stop signal, and whether the work took it."""

    requested: int | None = None
    acknowledged = False


_state = _State()

def _request(signum: int, frame: Any) -> None:
    """The handler records; it does not raise. A handler that raises does so wherever the main thread
    happens to be — inside a gc callback (Hypothesis installs one) or a `__del__` the exception is
    printed as "Exception ignored" and lost, and the run goes on. `check()` raises at a safe point."""
    if _state.requested is None:
        _state.requested = signum


def requested() -> int | None:
    return _state.requested


def check() -> None:
    """At a safe point (between examples, while waiting for an engine call): raise `Stopped` if a stop
    signal arrived and the work has not yet taken it."""
    if _state.requested is not None and not _state.acknowledged:
        raise Stopped(_state.requested)


def ignore_further() -> None:
    """The work has taken the stop (it is writing its report): a second Ctrl-C must not cut the report,
    and `check()` stops raising. Main thread only, as Python's signal module requires."""
    import threading

    _state.acknowledged = True
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def install() -> None:
    """Record SIGINT, SIGTERM and SIGHUP for `check()` in this process (main thread only; ignored ones
    stay so). SIGINT too: a Ctrl-C raised wherever the main thread is can be lost the same way."""
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _request)


class StopSignals:
    """The stop signals that reach a process that waits on others (a supervisor, a campaign), recorded by a
    handler and acted on by its wait loop, from construction until `restore`. A signal ignored when the
    process started (nohup, a background job) stays ignored. Unlike `install`, nothing process-wide is
    left behind: the handlers in place before come back (one not set from Python, such as a Ray driver's,
    cannot be put back, and is left as SIG_DFL)."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.first: int | None = None
        self._previous: dict[int, Any] = {}
        for s in STOP_SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:
                self._previous[s] = signal.signal(s, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)
        self.first = signum if self.first is None else self.first

    def take(self) -> list[int]:
        taken, self.pending = self.pending, []
        return taken

    def restore(self) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
