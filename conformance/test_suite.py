"""The suite as pytest tests, collected by `pytest --pyargs conformance --kvparity-engine NAME`.

One test per check reads the shared run (`kvparity_outcome`); an inconclusive check is skipped with
the reason (it proved nothing, so it must not show as passed). The state machine runs the same checks
as invariants over a live session.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.checks import CHECKS


@pytest.mark.parametrize("check", list(CHECKS))
def test_check(kvparity_outcome: Any, check: str) -> None:
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
    if result.status in ("inconclusive", "skip"):
        pytest.skip(f"{result.status}: {'; '.join(result.notes)}")


def test_engine_session_state_machine(kvparity_engine: Any, kvparity_options: dict[str, Any]) -> None:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from conformance.runner import profile_settings
    from conformance.stateful import session_machine

    base = profile_settings(kvparity_options["profile"])
    machine = session_machine(kvparity_engine, kvparity_options["checks"])
    run_state_machine_as_test(machine, settings=settings(base, max_examples=max(5, base.max_examples // 4),
                                                         stateful_step_count=8, database=None))
