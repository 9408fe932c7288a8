"""A cap on the time Hypothesis spends shrinking a failure (`--max-shrink-seconds`).

Hypothesis has no public setting for it: its own cap is a private module constant (300 s per failure),
and patching that is a bet on its internals. A dev run that finds a failure at example 3 could shrink
for minutes. So the cap lives here: once an example has failed (Hypothesis generates no more after a
failure: every later example is the shrinker's), the run's next examples check a deadline before they
start, and past it `ShrinkTimeUp` ends the Hypothesis test at once. It is a BaseException, like
Ctrl-C, so Hypothesis does not take it for a new bug to shrink; the failures already recorded in the
history stay, and the analysis reports the smallest of them, as it would after a full shrink. Checked
between examples, never inside one: no example is cut in half, and no engine call is abandoned.
"""

from __future__ import annotations

import time
from typing import Callable


class ShrinkTimeUp(BaseException):
    """Ends the Hypothesis test: the shrink budget is spent (the witness so far stands)."""


class ShrinkBudget:
    """Called before every example; raises ShrinkTimeUp once `seconds` have passed since the first
    example that found a failure (`failed()` turned true). `seconds` None: no cap."""

    def __init__(self, seconds: float | None, failed: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.failed, self.clock = seconds, failed, clock
        self.since: float | None = None
        self.spent = False

    def restart(self) -> None:
        """A new round of the hunt (conformance.hunt): its own failure gets its own `seconds` (`spent`
        stays true once any round was cut: the report says shrinking was capped)."""
        self.since = None

    def __call__(self) -> None:
        if self.seconds is None or not self.failed():
            return
        now = self.clock()
        if self.since is None:
            self.since = now
        if now - self.since >= self.seconds:
            self.spent = True
            raise ShrinkTimeUp(f"shrinking stopped after {self.seconds:g} s (--max-shrink-seconds)")


class ShrinkTally:
    """What a report must not call "examples": the examples Hypothesis ran while shrinking a failure
    (`steps`, plus each shrunk witness run once more at the end) — a 12-example dev run is not "313
    examples" — and the examples the shrink cap stopped before they began (`cut`: counted by the
    stream's test, never recorded, so the run's example count leaves them out)."""

    def __init__(self) -> None:
        self.steps = self.cut = 0

    def example(self, shrinking: bool) -> None:
        """One example begins; `shrinking`: its round already found a failure (Hypothesis is shrinking)."""
        self.steps += shrinking

    def take_cut(self) -> int:
        """The examples cut since the last call (a round of the hunt ends: its count is corrected before
        the next round numbers its examples on)."""
        cut, self.cut = self.cut, 0
        return cut

    def guard(self, budget: Callable[[], None]) -> Callable[[], None]:
        """`budget`, counting the examples it stops before they begin."""
        def check() -> None:
            try:
                budget()
            except ShrinkTimeUp:
                self.cut += 1
                raise
        return check
