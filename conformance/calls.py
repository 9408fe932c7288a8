"""Bounded engine calls: every call into an engine ends within its time limit, or the run ends.

A gate is worth what its PASS is worth, and a hung engine never answers "fail". Two mechanisms, because
Python cannot interrupt a thread stuck in C:

- `EngineCalls` runs the calls of a run (capabilities, configure, run, reset, baseline, snapshot) on one
  long-lived daemon thread and waits for each with a timeout. A call past it is abandoned with its thread:
  the engine is no longer trustworthy, so the run stops with an `error`. One thread for every call, so an
  engine sees all its calls from the same thread.
- `watchdog` bounds what must run on the main thread (building an engine — some install signal handlers,
  which only the main thread may — and closing it): if the block has not finished in time, the watchdog
  says why in one line, runs the caller's last words (recording the error) and ends the process with
  exit code 3, the only exit that is still honest.

Each run owns its own `EngineCalls`; nothing here is module-level state.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterator, TypeVar

from conformance import stopping
from conformance.contract import EngineError, UsageError
from conformance.exit_codes import ExitCode
from conformance.status import tell

T = TypeVar("T")


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters): causes are one line."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:300]


class EngineCalls:
    """Runs engine calls on a worker thread with a per-call timeout.

    `abandoned` becomes true when a call hung: its thread is left behind (it may still be inside the
    engine), which is why a process that abandoned one should end with `os._exit` once its report is
    written rather than wait for interpreter shutdown to meet a thread still inside torch.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.abandoned = False
        self.busy_s = 0.0  # time spent inside the engine (benchmarks/harness_overhead.py divides by it)
        self._jobs: queue.SimpleQueue | None = None

    def _start(self) -> queue.SimpleQueue:
        jobs: queue.SimpleQueue = queue.SimpleQueue()  # C primitives (SimpleQueue, a bare lock per call):
        # the handoff is paid twice per engine call, and Queue and Event cost 50 us of Python for it
        threading.Thread(target=self._loop, args=(jobs,), name="kvparity-engine-call", daemon=True).start()
        return jobs

    def close(self) -> None:
        """Let the worker thread end (it is idle between calls; an abandoned one is left as it is)."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None

    @staticmethod
    def _loop(jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            fn, box, done = job
            started = time.perf_counter()
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
            box["busy_s"] = time.perf_counter() - started
            done.release()

    def __call__(self, fn: Callable[[], T], what: str) -> T:
        """Run `fn`; a hang past the timeout or any exception becomes an `EngineError` naming `what`.
        `UsageError` passes through: it is the user's input, not the engine, that is wrong."""
        if self._jobs is None:
            self._jobs = self._start()
        box: dict[str, Any] = {}
        done = threading.Lock()
        done.acquire()  # released by the worker when the call returns
        stopping.check()
        self._jobs.put((fn, box, done))
        deadline = time.monotonic() + self.timeout_s
        while not done.acquire(timeout=max(0.0, min(stopping.POLL_S, deadline - time.monotonic()))):
            stopping.check()  # a SIGTERM / SIGHUP ends the run here, at a safe point (conformance.stopping)
            if time.monotonic() >= deadline:
                self._jobs, self.abandoned = None, True
                raise EngineError(f"{what} timed out after {self.timeout_s:g}s")
        self.busy_s += box["busy_s"]
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, (EngineError, UsageError)):
                raise exc
            raise EngineError(f"{what} raised {type(exc).__name__}: {one_line(exc)}") from exc
        return box["value"]


@contextlib.contextmanager
def watchdog(timeout_s: float, what: str, last_words: Callable[[str], None] | None = None) -> Iterator[None]:
    """Bound a block that runs on the main thread. Past `timeout_s`, print `kvparity: engine error: <what>
    timed out`, call `last_words(cause)` (e.g. record it in the history) and end the process with exit 3."""

    def expire() -> None:
        cause = f"{what} timed out after {timeout_s:g}s"
        with contextlib.suppress(BaseException):
            if last_words is not None:
                last_words(cause)
        with contextlib.suppress(BaseException):
            print(f"kvparity: engine error: {cause}", file=sys.stderr, flush=True)
            sys.stdout.flush()
        with contextlib.suppress(BaseException):
            tell(exit=ExitCode.ERROR)  # a deliberate exit, already explained: the supervisor passes it on
        os._exit(ExitCode.ERROR)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
