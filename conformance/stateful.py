"""A Hypothesis `RuleBasedStateMachine` over one engine session, with the checks as invariants.

Where `strategies.scenarios` draws a whole stream up front, the state machine lets Hypothesis steer a
live session, one step at a time: each rule is one of the step kinds of `strategies.STEP_KINDS` (a fresh
batch, a resend, a conversation turn, a stop that surely fires, poisoning by another identity, earlier
prompts' blocks spliced, a flood, a flush and resend, a reconfiguration, a reset), drawn by the same
builder over the same `Stream` as `scenarios`, under the same precondition. After every rule the session's
history so far is checked; a failure shrinks to a short program Hypothesis prints as replayable Python.

An engine error (a crash, a call past its timeout, a malformed answer) stops the machine at once as
`EngineBroken`, which Hypothesis does not catch: shrinking against an engine that hung would call it
again and again (a timeout each), and a one-off failure that does not come back when replayed would be
reported as Hypothesis' "flaky" error instead of the engine's one-line cause.

Abort is not part of the Engine contract (requests run to completion within `run`), so there is no
abort rule; an engine whose results say `finish_reason="abort"` is still handled by every check.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conformance.analysis import example_verdicts, failures_of, select_checks
from conformance.calls import EngineCalls
from conformance.contract import Capabilities, Engine, EngineError
from conformance.history import HistoryBuilder, HistoryWriter
from conformance.oracle import Oracle
from conformance.runner import ConformanceFailure
from conformance.scenario_runner import ScenarioRunner
from conformance.scenario import Configure
from conformance.step_kinds import STEP_KINDS, draw_step
from conformance.stream import Stream


class EngineBroken(BaseException):
    """The engine failed a call during the machine: the run is over, with this one-line cause. A
    BaseException, so Hypothesis neither shrinks nor replays against the broken engine."""


def default_capabilities(engine: Engine, timeout_s: float = 300.0) -> Capabilities:
    """The engine's claims in its default configuration. An engine reused from an earlier run (the
    plugin's stream run shares it) may be left at any point of its config_space, and claims such as
    the block size follow the configuration: reading them there would make what the machine draws
    depend on what ran before it. The configure (which may restart an engine) is bounded by
    `timeout_s` like every call of a session; `capabilities` is a plain getter, called directly."""
    caps = engine.capabilities()
    if not caps.config_space:
        return caps
    calls = EngineCalls(timeout_s)
    try:
        ScenarioRunner(engine, HistoryWriter(None), Oracle(engine.baseline), caps, calls=calls).step(Configure({}))
    finally:
        calls.close()
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
    sessions = itertools.count()
    calls = EngineCalls(timeout_s)  # one engine-call thread for every session of the machine
    # The configuration the engine is in now, shared by every session (None: unknown, after a failed
    # configure), so a session that starts where the last one left off skips a needless restart.
    engine_config: dict[str, Any] = {"current": {}}

    class EngineSession(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.runner = ScenarioRunner(engine, writer, oracle, caps, calls=calls)
            # This session's History, complete as it grows: the run's claims, the baselines memoized
            # across sessions, and the events written from here on.
            self.builder = HistoryBuilder(caps, oracle.cache)
            writer.sink = self._record  # the writer's own list keeps every session's events too
            self.session = next(sessions)
            self._engine(lambda: self.runner.begin(self.session))
            self.config: dict[str, Any] = {}
            if caps.config_space and engine_config["current"] != {}:
                self._configure({})
            self.stream: Stream | None = None

        def _record(self, event: dict[str, Any]) -> None:
            writer.events.append(event)
            self.builder.feed(event)

        @initialize(data=st.data())
        def start(self, data: st.DataObject) -> None:
            """The session's stream: its shared roots are drawn here. Ids are unique in the whole run, not
            only in this session: ids drawn for a batch the engine refused are never reused."""
            self.stream = Stream(data.draw, caps, max_batch=3, id_prefix=f"s{self.session}-")
            self.stream.assume(self.config)

        def reconfigure(self, config: dict[str, Any]) -> None:
            """Put the session in `config` (a subclass's own `@initialize` may, e.g. to start in a small
            pool); what is drawn from then on fits it."""
            self.config = dict(config)
            self._configure(self.config)
            if self.stream is not None:
                self.stream.assume(self.config)

        def _configure(self, config: dict[str, Any]) -> None:
            engine_config["current"] = None
            self._engine(lambda: self.runner.step(Configure(config)))
            engine_config["current"] = dict(config)

        def step(self, kind: str, data: st.DataObject) -> None:
            """Draw one step of `kind` onto the stream and run what it appended (a Configure, a Reset, a
            Batch) on the engine, in order."""
            s = self.stream
            assert s is not None
            s.draw = data.draw
            mark = len(s.steps)
            draw_step(s, kind)
            for step in s.steps[mark:]:
                if isinstance(step, Configure):
                    self.config = dict(step.config)
                    self._configure(self.config)
                else:
                    self._engine(lambda step=step: self.runner.step(step))

        @staticmethod
        def _engine(action: Any) -> None:
            """Run one step of the session on the engine; an engine error ends the machine (EngineBroken)."""
            try:
                action()
            except EngineError as exc:
                raise EngineBroken(str(exc)) from exc

        @invariant()
        def checks_hold(self) -> None:
            history = self.builder.history
            if history.examples:
                failures = failures_of(example_verdicts(history, history.examples[-1], names))
                if failures:
                    raise ConformanceFailure(failures)

    for kind in STEP_KINDS.values():
        setattr(EngineSession, kind.name, _kind_rule(kind.name))
    EngineSession.calls = calls  # type: ignore[attr-defined]  # whether a call was abandoned (hung)
    EngineSession.__name__ = EngineSession.__qualname__ = f"EngineSession_{caps.name.replace('-', '_')}"
    return EngineSession


def _kind_rule(name: str):
    """The rule for one step kind, under that kind's precondition."""

    @precondition(lambda self: self.stream is not None and STEP_KINDS[name].applies(self.stream))
    @rule(data=st.data())
    def kind_rule(self, data: st.DataObject) -> None:
        self.step(name, data)

    kind_rule.__name__ = name
    kind_rule.__doc__ = f"A `{name}` step (strategies.STEP_KINDS)."
    return kind_rule
