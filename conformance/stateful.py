"""A Hypothesis `RuleBasedStateMachine` over one engine session, with the checks as invariants.

Where `strategies.scenarios` draws a whole stream up front, the state machine lets Hypothesis steer a
live session: submit requests, continue a conversation (a `Bundle` of earlier turns, whose outputs the
engine just produced), resend in another grouping, switch identity (poisoning: the new identity sends
a prefix another one warmed), flush, reconfigure. After every rule the session's history so far is
checked; a failure shrinks to a short program Hypothesis prints as replayable Python.

Abort is not part of the Engine contract (requests run to completion within `run`), so there is no
abort rule; an engine whose results say `finish_reason="abort"` is still handled by every check.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, precondition, rule

from conformance.analysis import example_failures, select_checks
from conformance.contract import Capabilities, Engine, Request
from conformance.history import HistoryWriter, parse
from conformance.oracle import Oracle
from conformance.runner import ConformanceFailure, ScenarioRunner
from conformance.strategies import (Batch, Configure, Continuation, Reset, all_identities, configs,
                                    max_prompt_len, max_tokens, prompt_lengths, renamed, stop_ids, token_lists)


def default_capabilities(engine: Engine, timeout_s: float = 300.0) -> Capabilities:
    """The engine's claims in its default configuration. An engine reused from an earlier run (the
    plugin's stream run shares it) may be left at any point of its config_space, and claims such as
    the block size follow the configuration: reading them there would make what the machine draws
    depend on what ran before it. The configure (which may restart an engine) is bounded by
    `timeout_s` like every call of a session; `capabilities` is a plain getter, called directly."""
    caps = engine.capabilities()
    if not caps.config_space:
        return caps
    ScenarioRunner(engine, HistoryWriter(None), Oracle(engine.baseline), caps, timeout_s).step(Configure({}))
    return engine.capabilities()


def session_machine(engine: Engine, checks: Sequence[str] | None = None, writer: HistoryWriter | None = None,
                    timeout_s: float = 300.0) -> type[RuleBasedStateMachine]:
    """Build a state-machine class bound to `engine` (Hypothesis instantiates it once per run).

    `writer` lets a caller keep the session histories on disk; by default they stay in memory.
    Every session starts in the engine's default configuration, and every request it sends fits the
    configuration in effect (`Capabilities.context_limits`: a `configure` to a small KV pool lowers
    the longest prompt), so a refusal is the engine's doing, never the machine's.
    """
    caps = default_capabilities(engine, timeout_s)
    names = select_checks(checks)
    writer = writer or HistoryWriter(None)
    oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
    identities = all_identities(caps)
    sessions = itertools.count()
    # The configuration the engine is in now, shared by every session (None: unknown, after a failed
    # configure), so a session that starts where the last one left off skips a needless restart.
    engine_config: dict[str, Any] = {"current": {}}

    class EngineSession(RuleBasedStateMachine):
        turns = Bundle("turns")

        def __init__(self) -> None:
            super().__init__()
            self.runner = ScenarioRunner(engine, writer, oracle, caps, timeout_s)
            self.start = len(writer.events)
            self.session = next(sessions)
            self.runner.begin(self.session)
            self.config: dict[str, Any] = {}
            if caps.config_space and engine_config["current"] != self.config:
                self._configure(self.config)
            self.identity = identities[0]
            self.items: dict[str, Any] = {}
            self.ids = itertools.count()

        @property
        def top(self) -> int:
            """The longest prompt that leaves room for any max_tokens under the current configuration."""
            return max_prompt_len(caps, self.config)

        def _new_id(self) -> str:
            """Unique in the whole run, not only in this session: ids drawn for a batch the engine refused
            are never reused, and an engine that kept a refused batch's requests live (a non-atomic
            submission) is not then also blamed for a duplicate id in the next session."""
            return f"s{self.session}-{next(self.ids)}"

        def _configure(self, config: dict[str, Any]) -> None:
            engine_config["current"] = None
            self.runner.step(Configure(config))
            engine_config["current"] = dict(config)

        def _batch(self, items: Sequence[Any]) -> list[str]:
            self.runner.step(Batch(items))
            for item in items:
                self.items[item.id] = item
            return [item.id for item in items]

        @rule(target=turns, data=st.data(), n=st.integers(1, 3))
        def submit(self, data: st.DataObject, n: int):
            """Fresh requests under the current identity."""
            items = []
            for _ in range(n):
                prompt = data.draw(prompt_lengths(caps, self.top).flatmap(lambda k: token_lists(caps, k)))
                items.append(Request(self._new_id(), prompt, data.draw(max_tokens(caps)),
                                     data.draw(stop_ids(caps)), self.identity))
            return multiple(*self._batch(items))

        @rule(target=turns, parent=turns, data=st.data())
        def continue_conversation(self, parent: str, data: st.DataObject):
            """Next turn: the parent's prompt + its output + new tokens, under the parent's identity, cut to
            what the current configuration holds."""
            extra = data.draw(st.integers(1, caps.block_size + 1).flatmap(lambda k: token_lists(caps, k)))
            src = self.items[parent]
            turn = Continuation(self._new_id(), parent, extra, data.draw(max_tokens(caps)), (),
                                src.identity, self.top)
            return multiple(*self._batch([turn]))

        @rule(target=turns, picked=st.lists(turns, min_size=1, max_size=3, unique=True))
        def resend(self, picked: list[str]):
            """The same requests again, under the *current* identity, in the drawn order, cut to what the
            current configuration holds (they may have been sent under a larger one)."""
            from attrs import evolve

            items = [evolve(renamed(self.items[p], self._new_id(), self.top), identity=self.identity)
                     for p in picked]
            return multiple(*self._batch(items))

        @precondition(lambda self: len(identities) > 1)
        @rule(index=st.integers(0, 64))
        def switch_identity(self, index: int) -> None:
            self.identity = identities[index % len(identities)]

        @rule()
        def flush(self) -> None:
            self.runner.step(Reset())

        @precondition(lambda self: bool(caps.config_space))
        @rule(config=configs(caps))
        def configure(self, config: dict) -> None:
            self.config = dict(config)
            self._configure(self.config)

        @invariant()
        def checks_hold(self) -> None:
            h = parse(writer.events[self.start:])
            h.capabilities, h.baselines = caps, oracle.cache
            failures = example_failures(h, names)
            if failures:
                raise ConformanceFailure(failures)

    EngineSession.__name__ = EngineSession.__qualname__ = f"EngineSession_{caps.name.replace('-', '_')}"
    return EngineSession
