"""The suite as pytest tests, collected by `pytest --pyargs conformance --kvparity-engine NAME`.

One test per check reads the shared run (`kvparity_outcome`). An inconclusive check proved nothing, so
it must not show as passed: it fails, with the reason, unless `--kvparity-allow-inconclusive` makes it
a skip (as `kvparity run` exits 2 for it, never 0). The state machine runs the same checks as
invariants over a live session. Both run the engine in child processes (`conformance.plugin_runs`).

The state-machine test comes first: under pytest-xdist's load scheduling the first tests go to one
worker and the next ones to another, so the state machine starts on one worker while the stream run
(which the first per-check test starts) goes on in parallel on another.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.checks import CHECKS


def test_engine_session_state_machine(kvparity_options: dict[str, Any]) -> None:
    """The machine runs in a child process of its own (`conformance.machine_run`), supervised: an engine
    that ends its process or hangs fails this test instead of ending the session or passing it."""
    from conformance.pytest_plugin import run_machine

    run_machine(kvparity_options)


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
