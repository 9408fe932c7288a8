"""Progress of a long run: examples done of the target, failing checks so far, elapsed time and engine
calls per second.

A nightly run against vLLM takes an hour; one that prints nothing until it ends cannot be told from
one that hangs. On a terminal the progress is one live line, rewritten in place (at most a few times a
second); in a log (CI, a pipe) it is a plain line every `every` examples, a line when a check first
fails, and a last line at the end — a log is read afterwards, and carriage returns would garble it.
Past the target (Hypothesis shrinking a failure, hundreds of examples) a log line comes only when the
count doubles, so a run's log holds about ten lines, a line per failing check and a handful more.
`kvparity run -q` turns it off. It writes to stderr, so stdout stays the verdict and the summary.

Engine calls are counted from the history's own events (every configure, reset, run, baseline and
snapshot is recorded), so progress needs no hook in the engine-call machinery.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterable, Mapping, TextIO

# History events that record one engine call each; a `snapshot` inside a batch or reset is one more.
_CALL_EVENTS = ("config", "reset", "batch", "baseline", "error")
_TTY_INTERVAL_S = 0.25


class Progress:
    def __init__(self, stream: TextIO | None = None, tty: bool | None = None, every: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.every = every
        self.clock = clock
        self.target = 0
        self.done = 0
        self.calls = 0
        self.failing: list[str] = []
        self.started = clock()
        self._last_draw = -1e9
        self._drawn = False
        self._printed_at: int | None = None

    def start(self, target: int) -> None:
        """The run begins; `target` is the profile's (or --max-examples') example count."""
        self.target = max(int(target), 0)
        self.started = self.clock()
        if self.every is None:
            self.every = max(1, -(-self.target // 10))  # at most ten lines up to the target

    def event(self, ev: Mapping[str, Any]) -> None:
        """Count the engine calls a history event records (the history writer's sink)."""
        kind = ev.get("event")
        if kind in _CALL_EVENTS:
            self.calls += 1
            if ev.get("snapshot") is not None:
                self.calls += 1

    def example(self, done: int, failing: Iterable[str] = ()) -> None:
        """An example finished; `failing`: the checks that failed in it."""
        self.done = done
        new = [c for c in dict.fromkeys(failing) if c not in self.failing]
        self.failing += new
        if self.tty:
            now = self.clock()
            if new or now - self._last_draw >= _TTY_INTERVAL_S:
                self._last_draw = now
                self.stream.write("\r\x1b[K" + self.line())
                self.stream.flush()
                self._drawn = True
        elif new or self._due(done):
            self._print()

    def _due(self, done: int) -> bool:
        """A log line every `every` examples up to the target; past it (shrinking) at each doubling."""
        if self.target and done > self.target:
            return done % self.target == 0 and (done // self.target) & (done // self.target - 1) == 0
        return bool(self.every) and done % self.every == 0

    def on_event(self, event: Mapping[str, Any]) -> None:
        """A run handler (conformance.run_handlers): each history event moves the line."""
        self.event(event)

    def on_end(self, outcome: Any) -> None:
        """A run handler: the line is already finished when the run's verdict is known."""

    def finish(self) -> None:
        """The run ended: the last state, on a line of its own."""
        if self.tty:
            self.stream.write(("\r\x1b[K" if self._drawn else "") + self.line() + "\n")
            self.stream.flush()
        elif self._printed_at != self.done:  # not the line just printed again
            self._print()

    def _print(self) -> None:
        self._printed_at = self.done
        self.stream.write(self.line() + "\n")
        self.stream.flush()

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 0.0)
        rate = self.calls / elapsed if elapsed > 0 else 0.0
        if self.failing and self.done > self.target:
            examples = f"{self.done} examples (target {self.target}; shrinking)"
        else:
            examples = f"{self.done}/{self.target} examples"
        fails = (f"{len(self.failing)} failing check{'s' if len(self.failing) != 1 else ''} "
                 f"({', '.join(self.failing)})" if self.failing else "no failure")
        return (f"kvparity: {examples}, {fails}, {_clock(elapsed)} elapsed, {self.calls} engine calls "
                f"({rate:.1f}/s)")


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
