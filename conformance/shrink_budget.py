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

    def __call__(self) -> None:
        if self.seconds is None or not self.failed():
            return
        now = self.clock()
        if self.since is None:
            self.since = now
        if now - self.since >= self.seconds:
            self.spent = True
            raise ShrinkTimeUp(f"shrinking stopped after {self.seconds:g} s (--max-shrink-seconds)")
