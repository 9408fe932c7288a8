"""The suite as pytest tests, collected by `pytest --pyargs conformance --kvparity-engine NAME`.

One test per check reads the shared run (`kvparity_outcome`). An inconclusive check proved nothing, so
it must not show as passed: it fails, with the reason, unless `--kvparity-allow-inconclusive` makes it
a skip (as `kvparity run` exits 2 for it, never 0). The state machine runs the same checks as
invariants over a live session.

The state-machine test comes first: under pytest-xdist's load scheduling the first tests go to one
worker and the next ones to another, so the state machine starts on one worker while the stream run
(which the first per-check test starts) goes on in parallel on another.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.checks import CHECKS


def machine_examples(max_examples: int) -> int:
    """State-machine runs for a stream of `max_examples`: a quarter of them, at least 5 — but never
    more than asked for, so `--kvparity-max-examples 1` stays a quick run."""
    return min(max_examples, max(5, max_examples // 4))


def test_engine_session_state_machine(kvparity_engine: Any, kvparity_options: dict[str, Any]) -> None:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from conformance.runner import profile_settings
    from conformance.stateful import session_machine

    o = kvparity_options
    base = profile_settings(o["profile"])
    machine = session_machine(kvparity_engine, o["checks"], timeout_s=o["timeout_s"])
    examples = machine_examples(o["max_examples"] or base.max_examples)
    run_state_machine_as_test(machine, settings=settings(base, max_examples=examples, stateful_step_count=8,
                                                         database=None))


@pytest.mark.parametrize("check", list(CHECKS))
def test_check(kvparity_outcome: Any, kvparity_options: dict[str, Any], check: str) -> None:
    result = kvparity_outcome.analysis.checks.get(check)
    if result is None:
        pytest.skip(f"{check} not selected")
    for error in kvparity_outcome.analysis.errors:
        pytest.fail(f"engine error: {error}", pytrace=False)
    if result.status == "fail":
        lines = [f"{f.title} ({f.case_id}): {f.explanation}\n  replay: kvparity replay "
                 f"{kvparity_outcome.run_dir / 'witnesses' / (f.case_id + '.json')}" for f in result.failures]
        pytest.fail("\n".join(lines), pytrace=False)
    if result.status == "error":
        pytest.fail("; ".join(result.notes), pytrace=False)
    if result.status == "inconclusive":
        reason = f"inconclusive: {'; '.join(result.notes)}"
        if kvparity_options["allow_inconclusive"]:
            pytest.skip(reason)
        pytest.fail(f"{reason} (it proved nothing; --kvparity-allow-inconclusive reports it as skipped)",
                    pytrace=False)
    if result.status == "skip":
        pytest.skip(f"skip: {'; '.join(result.notes)}")
