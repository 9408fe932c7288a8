"""One scenario against one engine: `ScenarioRunner` executes its steps (resolving conversation
continuations from the engine's own outputs), records every call in the history as it happens and asks
the memoized oracle for baselines; `replay` runs one recorded scenario and applies one check. The whole
run (`conformance.runner.run_suite`) drives this once per Hypothesis example; minimising, `kvparity
replay` and the stateful test drive it directly.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from conformance import stopping, validation
from conformance.analysis import analyse
from conformance.calls import EngineCalls, one_line
from conformance.completion import MarkedScenario
from conformance.contract import Capabilities, Engine, EngineError, Introspectable, Request, Result
from conformance.history import HistoryWriter, parse
from conformance.oracle import Oracle
from conformance.scenario import Configure, Continuation, Reset, Step
from conformance.verdicts import CheckResult


def stop_positions(output: Sequence[int], eos_id: int | None = None) -> list[int]:
    """The positions of `output` where a turn can stop past its position 0 (see `restop_turn`)."""
    return [i for i in range(1, len(output)) if output[i] != eos_id and output[i] != output[i - 1]]


def repeats(context: Sequence[int]) -> set[int]:
    """The positions k where context[k] follows an earlier occurrence of the token before it as it did
    there: where the text repeats itself. Drafts are accepted where text is predictable from its context,
    and what a model predicts from its context is first of all a repeat (an n-gram drafter copies, a
    draft model and a small model loop)."""
    seen: set[tuple[int, int]] = set()
    found = set()
    for k in range(1, len(context)):
        pair = (context[k - 1], context[k])
        if pair in seen:
            found.add(k)
        seen.add(pair)
    return found


def _turn_cut(output: Sequence[int], i: int, max_tokens: int | None) -> int:
    """Where a turn stopping at output[i] resumes: just past that token's previous occurrence, and no
    earlier than its max_tokens reaches back from i."""
    previous = max((k for k in range(i) if output[k] == output[i]), default=-1)
    return max(previous + 1, i - max_tokens + 1 if max_tokens else 0)


def drafted_stops(prompt: Sequence[int], output: Sequence[int], max_tokens: int | None = None,
                  eos_id: int | None = None) -> list[int]:
    """The stop positions (`stop_positions`) whose turn holds a repeat (`repeats`) a draft can cover: past
    the turn's position 0 (the prefill's token), up to and including the stop."""
    at = sorted(k - len(prompt) for k in repeats(tuple(prompt) + tuple(output)) if k > len(prompt))
    return [i for i in stop_positions(output, eos_id)
            if any(_turn_cut(output, i, max_tokens) < k <= i for k in at)]


def restop_turn(output: Sequence[int], j: int, max_tokens: int | None = None,
                eos_id: int | None = None, prompt: Sequence[int] = ()) -> tuple[int, int]:
    """Where a `restop` turn resumes the parent's output and the stop id that ends it: (cut, stop).

    The stop is the parent's token at position i, the latest up to j (else the earliest after it) that
    can fire past position 0 of a turn: not eos (which ends the output on its own) and not a repeat of
    the token just before it. A stop id fires at its first occurrence, and a small model repeats itself,
    so the turn resumes the parent's text just past that token's previous occurrence (0: its prompt
    again), and no earlier than the turn's max_tokens reaches back from i: the stop fires exactly at i,
    with the output before it (and the drafts accepted on it) in the turn. Only an output with no such
    position lets the stop fire early. Positions whose turn holds a repeat of the parent's text
    (`drafted_stops`: `prompt` + `output`) come first: the oracle's output says where a draft run can
    precede a stop, which a drawn position hits only by chance."""
    valid = drafted_stops(prompt, output, max_tokens, eos_id) or stop_positions(output, eos_id)
    if not valid:
        return 0, output[j % len(output)]
    before = [i for i in valid if i <= j]
    i = before[-1] if before else valid[0]
    return _turn_cut(output, i, max_tokens), output[i]


class ScenarioRunner:
    """Executes scenarios against one engine, writing every call to the history as it happens."""

    def __init__(self, engine: Engine, writer: HistoryWriter, oracle: Oracle, caps: Capabilities,
                 timeout_s: float = 300.0, calls: EngineCalls | None = None) -> None:
        self.engine, self.writer, self.oracle, self.caps = engine, writer, oracle, caps
        self.calls = calls or EngineCalls(timeout_s)
        self.introspect = caps.introspection and isinstance(engine, Introspectable)
        self.resolved: dict[str, tuple[Request, Result]] = {}
        self.on_run: Callable[[Sequence[Step]], None] = lambda steps: None  # told each scenario it runs
        self.budget: Callable[[], None] | None = None  # run_suite's shrink budget (conformance.shrink_budget)

    def run(self, steps: Sequence[Step], example: int) -> None:
        """Run one scenario from a cold cache. Raises EngineError after recording an `error` event.
        A completion example (`MarkedScenario`) says so in its `example` event. A stop signal that came
        between examples stops the run here (not in the stream's test function, whose source seeds the
        derandomised stream: an added line there draws another CI stream)."""
        stopping.check()
        if self.budget is not None:
            self.budget()
        self.on_run(steps)
        self.begin(example, **(steps.marks if isinstance(steps, MarkedScenario) else {}))
        for step in steps:
            self.step(step)

    def begin(self, example: int, **marks: Any) -> None:
        """Start an example (or a stateful session): record it and flush the engine's cache."""
        self.writer.append("example", index=example, **marks)
        self.resolved = {}
        self._guarded([], self.reset)

    def step(self, step: Step) -> list[Request]:
        """Execute one step; returns the resolved requests of a batch (empty otherwise)."""
        if isinstance(step, Configure):
            self.writer.append("config", config=dict(step.config))
            self._guarded([], lambda: self.calls(lambda: self.engine.configure(dict(step.config)), "configure"))
            return []
        if isinstance(step, Reset):
            self._guarded([], self.reset)
            return []
        pending = [self.resolve(item, self.resolved) for item in step.items]
        self._guarded(pending, lambda: self.batch(pending, self.resolved))
        return pending

    def _guarded(self, pending: list[Request], action: Callable[[], Any]) -> None:
        """Run an engine action; on any failure record an `error` event (for a failed batch of an
        introspectable engine with a snapshot of its pool; the batch's requests are already recorded by
        its `submit`) and raise EngineError with a one-line cause naming the requests in flight."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - anything unexpected is an engine error with a cause
            cause = one_line(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {one_line(exc)}"
            if pending:
                cause += f" (requests {', '.join(q.id for q in pending)})"
            self.writer.append("error", cause=cause, snapshot=self._snapshot_after_failure(pending))
            raise EngineError(cause) from exc

    def _snapshot(self) -> dict[str, Any] | None:
        """The white-box snapshot's scalars, or None for an engine that is not introspectable."""
        if not self.introspect:
            return None
        return validation.snapshot(self.calls(self.engine.snapshot, "snapshot"))  # type: ignore[attr-defined]

    def _snapshot_after_failure(self, pending: list[Request]) -> dict[str, Any] | None:
        """The pool after a batch the engine failed: a stall is often a leak's last symptom (blocks never
        freed until nothing can be scheduled), and the snapshot says which. None when there is none."""
        if not pending or self.calls.abandoned:  # a hung engine is not asked again
            return None
        try:
            return self._snapshot()
        except Exception:  # noqa: BLE001 - the error being recorded matters more than its snapshot
            return None

    def reset(self) -> None:
        self.calls(self.engine.reset, "reset")
        self.writer.append("reset", snapshot=self._snapshot())

    def resolve(self, item: Request | Continuation, resolved: Mapping[str, tuple[Request, Result]]) -> Request:
        if isinstance(item, Request):
            return item
        parent = resolved.get(item.parent)
        stop_ids = item.stop_ids
        if parent is None:  # parent never ran (e.g. shrunk away): the turn starts a fresh conversation
            prompt = item.extra
        elif item.restop is not None and parent[1].output:  # the parent again, stopping where it went
            parent = self._stoppable(parent, item, resolved)
            cut, stop = restop_turn(parent[1].output, item.restop, item.max_tokens, self.caps.eos_id,
                                    parent[0].prompt)
            prompt, stop_ids = parent[0].prompt + tuple(parent[1].output[:cut]), (stop,)
        else:
            prompt = parent[0].prompt + tuple(parent[1].output) + item.extra
        return Request(item.id, prompt[: item.max_prompt] or item.extra[:1], item.max_tokens, stop_ids,
                       item.identity)

    def _stoppable(self, parent: tuple[Request, Result], turn: Continuation,
                   resolved: Mapping[str, tuple[Request, Result]]) -> tuple[Request, Result]:
        """`parent`, or the latest request of the turn's identity whose output suits a restop turn
        better: first one with a stop a draft run can precede (`drafted_stops`), else one with any
        position a stop can fire at past 0 (an output that ended at once, on eos or its own stop, or
        repeats one token has none). Which outputs do is known only once they ran."""
        eos = self.caps.eos_id
        candidates = [parent] + [p for p in reversed(list(resolved.values())) if p[0].identity == turn.identity]
        for suits in (lambda p: drafted_stops(p[0].prompt, p[1].output, turn.max_tokens, eos),
                      lambda p: stop_positions(p[1].output, eos)):
            found = next((p for p in candidates if suits(p)), None)
            if found is not None:
                return found
        return parent

    def batch(self, requests: list[Request], resolved: dict[str, tuple[Request, Result]]) -> None:
        """Record the requests, then call the engine: the request that kills an engine is in the history."""
        self.writer.append("submit", requests=requests)
        raw = self.calls(lambda: self.engine.run(list(requests)), "run")
        results = validation.results(requests, raw, self.caps)
        self.writer.append("batch", results=results, snapshot=self._snapshot())
        for q, r in zip(requests, results):
            resolved[q.id] = (q, r)
        for q, r in zip(requests, results):
            if r.finish_reason != "refused" and self.oracle.missing(q):  # computed on the engine-call thread, recorded from this one
                b = self.calls(lambda q=q: validation.baseline(q, self.engine.baseline(q), self.caps), "baseline")
                self.oracle.store(q, b)


def replay(engine: Engine, caps: Capabilities, steps: Sequence[Step], check: str,
           timeout_s: float = 300.0, calls: EngineCalls | None = None) -> tuple[CheckResult, str | None]:
    """Run `steps` once on `engine` (one example, from a cold cache) and apply `check` to what was
    recorded. Returns the check's result and the engine error that cut the run short, if one did: a
    crash decides nothing by itself, but what was recorded before it (a failed batch's snapshot) may."""
    writer = HistoryWriter(None)
    writer.append("run_start", engine="replay", engine_args={}, capabilities=caps)
    oracle = Oracle(engine.baseline, lambda key, b: writer.append("baseline", key=key, baseline=b))
    crashed = None
    own = calls is None
    calls = calls or EngineCalls(timeout_s)
    try:
        ScenarioRunner(engine, writer, oracle, caps, calls=calls).run(list(steps), 0)
    except EngineError as exc:
        crashed = str(exc)
    finally:
        if own:
            calls.close()
    writer.append("run_end", examples=1)
    return analyse(parse(writer.events), [check]).checks[check], crashed
