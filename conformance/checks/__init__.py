"""The checks (DESIGN.md "Checks"): each is a pure function history -> CheckResult, registered by name
with a title, a severity and a bug class from BUG_CLASSES.md. A check never talks to an engine.

Most checks are example-scoped: they see one Hypothesis example (so a failure can shrink and replay on
its own). `exercised` is run-scoped: vacuity is a property of the whole run, not of one example.

This package is a facade (pytest's shape): the registry lives in `registry`, the checks in modules by
what they are about — `output` (parity and the independence claims), `logprobs` (parity below the argmax), `cache` (isolation, prefix-only,
accounting), `hygiene` (white-box rollback), `coverage` (the vacuity guard) — and importing this
package registers them all, in the order users see them.
"""

from __future__ import annotations

from conformance.checks.registry import CHECKS, CheckSpec, CheckRecorder, check, run_check
from conformance.checks import output, logprobs, cache, hygiene, coverage, midflight  # noqa: E402,F401  (registers the checks)

__all__ = ["CHECKS", "CheckSpec", "CheckRecorder", "check", "run_check"]
