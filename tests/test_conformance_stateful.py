"""The state machine on the real reference engine: every request it sends fits the configuration in
effect (`Capabilities.context_limits`), ids are never reused, and each session starts from the engine's
defaults whatever an earlier user of the engine left configured."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import initialize, run_state_machine_as_test

from adapters.reference import ReferenceAdapter
from conformance.history import HistoryWriter
from conformance.stateful import session_machine

FAST = settings(max_examples=6, stateful_step_count=6, deadline=None, database=None, derandomize=True,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))


def submitted_ids(writer: HistoryWriter) -> list[str]:
    return [q["id"] for e in writer.events if e["event"] == "submit" for q in e["requests"]]


def test_requests_fit_a_small_pool_and_ids_are_never_reused():
    """Every session starts by switching to the 64-token pool: a prompt drawn for the default 4096-token
    one (up to 183 tokens) is refused there, which ends the run as an engine error."""
    adapter = ReferenceAdapter()
    writer = HistoryWriter(None)
    machine = session_machine(adapter, ["parity", "rollback_hygiene"], writer=writer, timeout_s=60)

    class SmallPool(machine):  # type: ignore[misc, valid-type]
        @initialize()
        def small_pool(self) -> None:
            self.reconfigure({"pool_tokens": 64, "block_size": 16})

    run_state_machine_as_test(SmallPool, settings=FAST)
    ids = submitted_ids(writer)
    assert ids and len(ids) == len(set(ids))


def test_each_session_starts_from_the_defaults_whatever_the_engine_was_left_in():
    """An engine shared with an earlier run (the plugin's stream) may sit in a small pool at another
    block size; the machine's claims and the first session must be those of the defaults."""
    adapter = ReferenceAdapter()
    adapter.configure({"pool_tokens": 64, "block_size": 4})
    writer = HistoryWriter(None)
    machine = session_machine(adapter, ["parity"], writer=writer, timeout_s=60)
    assert adapter.capabilities().block_size == 16 and adapter.config.num_blocks == 4096 // 16
    run_state_machine_as_test(machine, settings=FAST)
    assert submitted_ids(writer)
