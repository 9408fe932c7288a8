"""How many steps of each kind a run drew: the per-run table `kvparity run` prints (issue 31's
"Hypothesis statistics or an equivalent"), so a reader sees what the stream exercised — were there
resends, floods, reloads at all? — without the pytest plugin's statistics.

A context variable, set by the run around its Hypothesis tests, so concurrent runs (threads, the
plugin) never mix their counts and drawing outside a run counts nothing. Counting draws nothing: the
stream is unchanged. Draws while shrinking count too (the shrinker replays the strategies): the table
is what was drawn, not what the final witness holds.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from typing import Iterator

_COUNTS: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("kvparity_step_counts", default=None)


def count(kind: str) -> None:
    """One step of `kind` drawn (a kind that did not apply is counted as the batch drawn instead)."""
    counts = _COUNTS.get()
    if counts is not None:
        counts[kind] += 1


@contextlib.contextmanager
def counting(counts: Counter) -> Iterator[Counter]:
    token = _COUNTS.set(counts)
    try:
        yield counts
    finally:
        _COUNTS.reset(token)


def table(counts: Counter) -> str:
    """One line: the kinds, most drawn first."""
    if not counts:
        return "step kinds drawn: none"
    return "step kinds drawn: " + ", ".join(f"{k} {n}" for k, n in counts.most_common())
