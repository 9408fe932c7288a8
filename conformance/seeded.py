"""Hypothesis draws that depend on the seed alone.

Hypothesis (6.131 and later) draws about one choice in twenty from constants it finds in the source of
the *local* modules loaded in the process: test files, a user's adapter, and kvparity's own modules as a
run imports them lazily. A seed then names a stream only together with the process's import history.
Measured: seed 0 run twice in one process drew two different streams (the second after the first had
imported the report modules), and a two-example run reached a situation with only its own test module
loaded and missed it with the whole test suite collected beside it. So within a kvparity run the local
pool is empty; Hypothesis' global constants (its own boundary values) stay. Hypothesis has no setting
for this: where its internals differ from what is patched here, nothing is changed.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

_lock = threading.Lock()
_depth = 0  # runs inside the context now
_original: Callable[[], Any] | None = None  # Hypothesis' own, while patched


@contextlib.contextmanager
def seed_only() -> Iterator[None]:
    """Within: no local constants in Hypothesis' draws. Re-entrant and thread-safe (runs may nest or run
    side by side in one process); the original is restored when the last one leaves."""
    global _depth, _original
    try:
        from hypothesis.internal.conjecture import providers

        cache, empty = providers.CONSTANTS_CACHE, providers.Constants()
        providers._get_local_constants  # noqa: B018 - present in the Hypothesis this patches
    except (ImportError, AttributeError):  # another Hypothesis: nothing known to switch off
        yield
        return
    with _lock:
        if _depth == 0:
            _original, providers._get_local_constants = providers._get_local_constants, lambda: empty
            cache.cache.clear()  # permitted constants cached with the local pool of before
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                providers._get_local_constants, _original = _original, None
                cache.cache.clear()
