"""Coverage completion: after the stream, steer to every relevant situation it has not reached.

Why: a short run (the dev profile's 12 examples) left reaching a rare situation to chance — chunked
prefill of a block two requests of one batch share, eos inside an accepted draft run — and a correct
engine's run then ended inconclusive in some seeds. Failing closed is right (a run that did not exercise
a claim proved nothing); leaving it to chance is not. So when the stream ends with a relevant situation
unreached, the run adds a bounded number of *completion examples*, recorded and checked like every other
example, that go after what is missing. An engine that cannot reach a situation (it claims chunked prefill
and never chunks) still ends inconclusive, and the history says how many completion examples tried.

Nothing here is written for one situation. A completion example tries every *arm* — each step kind of
`step_kinds.STEP_KINDS`, each closing tail (`TAILS`) and each steering tail (`STEERING`) — and the
situation counter (the oracle of coverage, `conformance.situations`) says what they reached:

- Parameters known to produce it go first. Each batch of the history is credited with the situations it
  added (the count over its example up to it, minus the count before it). A knob value earns the credit
  of the batches run under it for the situations that share the missing one's claim ("chunked prefill",
  "speculation", ...): a value under which prefills were chunked ranks first when a chunked situation is
  missing. Values never run come next, then the rest. Each arm draws its configuration from these ranked
  lists with `sampled_from`, so the first completion example (Hypothesis runs the simplest one first)
  takes the best-ranked configuration, and later ones vary it.
- An arm that sends fresh traffic starts a cache epoch of its own (a configure, then a reset), so what
  it shares within a batch has not been sent before; an arm that reuses earlier traffic (a resend, a
  conversation turn) runs on right after the arm before it.
- After each example the counter is asked again: which situations are still missing, and for each one
  just reached, which arm's batch added it under which configuration (written to the history's
  `completion` event and the report). Completion stops when none is missing, or after
  `COMPLETION_EXAMPLES` examples.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterator, Mapping, Sequence

from attrs import field, frozen
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from conformance.contract import Capabilities
from conformance.domains import sampled
from conformance.history import BatchRecord, Example, History, HistoryWriter
from conformance.situations import SITUATIONS, missing
from conformance.scenario import Batch, Reset, Step
from conformance.steering import STEERING, TAILS
from conformance.step_kinds import STEP_KINDS, draw_step
from conformance.stream import StepKind, Stream

COMPLETION_EXAMPLES = 8  # completion examples at most, for all missing situations together (a correct
# reference engine needed at most 6 in 50 plugin runs; each reaches a missing situation in ~4 of 5 draws)

# --------------------------------------------------------------------------- the arms


def arms() -> list[StepKind]:
    """Every way the strategies have of drawing a step: the step kinds that send requests (as steps), the
    closing tails and the steering tails (as tails: they append their own steps)."""
    out = [StepKind(name, _as_step(name), kind.applies) for name, kind in STEP_KINDS.items()
           if name not in ("configure", "reset")]
    out += [StepKind(f"tail:{t.name}", t.build, t.applies) for t in TAILS]
    out += [StepKind(f"steer:{t.name}", t.build, t.applies) for t, _ in STEERING]
    return out


def _as_step(name: str):
    def build(s: Stream) -> None:
        draw_step(s, name)
    return build


# --------------------------------------------------------------------------- the counter's attribution


def targets(history: History) -> list[str]:
    """The relevant situations the history never reached, in registry order."""
    return [c.name for c in missing(history)]


def related(name: str, caps: Capabilities) -> list[str]:
    """`name` and the relevant situations that share its claim: the evidence about what produces it."""
    claim = SITUATIONS[name].claim
    return [n for n, s in SITUATIONS.items() if n == name or (s.claim == claim and s.relevant(caps))]


def increments(history: History, names: Sequence[str], examples: Sequence[Example] | None = None
               ) -> Iterator[tuple[BatchRecord, dict[str, int]]]:
    """Each batch with the occurrences of `names` it added: the count over its example up to and with
    it, minus the count up to it. Situations count within an example (a cache epoch never spans two),
    so the increments of an example's batches sum to its count."""
    for ex in (history.examples if examples is None else examples):
        before = dict.fromkeys(names, 0)
        for j, b in enumerate(ex.batches):
            view = history.only(Example(ex.index, ex.batches[:j + 1]))
            now = {n: int(SITUATIONS[n].count(view)) for n in names}
            yield b, {n: now[n] - before[n] for n in names if now[n] > before[n]}
            before = now


def knob_value(config: Mapping[str, Any], knob: str, values: Sequence[Any]) -> str:
    """The knob's value in `config` as a string; an unconfigured knob is at its first (default) value."""
    return str(config.get(knob, values[0]))


def ranked_values(history: History, wanted: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """Per knob of the engine's config space, its values best first: by the credit they earned for the
    situations related to `wanted` (each wanted situation's evidence weighing as much as another's),
    then values never run, then the rest in declared order."""
    caps = history.capabilities
    assert caps is not None
    space = {k: tuple(v) for k, v in sorted(caps.config_space.items()) if v}
    credit: dict[tuple[str, str], float] = defaultdict(float)
    tried: dict[tuple[str, str], int] = defaultdict(int)
    evidence = {w: related(w, caps) for w in wanted}
    names = sorted({n for ns in evidence.values() for n in ns})
    per_target: dict[str, dict[tuple[str, str], int]] = {w: defaultdict(int) for w in wanted}
    for b, added in increments(history, names):
        for knob, values in space.items():
            key = (knob, knob_value(b.config, knob, values))
            tried[key] += 1
            for w, ns in evidence.items():
                per_target[w][key] += sum(added.get(n, 0) for n in ns)
    for w, got in per_target.items():
        top = max(got.values(), default=0)
        for key, n in got.items():
            if top:
                credit[key] += n / top
    return {knob: tuple(sorted(values, key=lambda v, k=knob: (-credit[(k, str(v))], bool(tried[(k, str(v))]),
                                                               values.index(v))))
            for knob, values in space.items()}


# --------------------------------------------------------------------------- the completion examples


@frozen
class CompletionScenario:
    """A completion example's steps and, for each batch step, the arm that drew it."""

    steps: tuple[Step, ...] = field(converter=tuple)
    arms: tuple[str, ...] = field(converter=tuple)


@st.composite
def completion_scenarios(draw: st.DrawFn, caps: Capabilities, ranked: Mapping[str, Sequence[Any]],
                         max_batch: int = 4) -> CompletionScenario:
    """Every arm once, each fresh-traffic arm in a cache epoch of its own under a configuration drawn
    from `ranked` (the first value of each knob is the simplest draw), each reusing arm after it."""
    s = Stream(draw, caps, max_batch, id_prefix="c")
    origins: list[str] = []
    fresh = {a.name for a in arms() if a.applies(s)}  # applies before any traffic: sends its own
    for arm in arms():
        if arm.name in fresh:
            if ranked:
                s.configure({k: draw(sampled(tuple(v))) for k, v in ranked.items()})
            s.steps.append(Reset())
        if not arm.applies(s):
            continue
        before = len(s.steps)
        arm.build(s)
        origins += [arm.name] * sum(isinstance(step, Batch) for step in s.steps[before:])
    return CompletionScenario(s.steps, origins)


def reached_by(history: History, example: Example, arms_of_batches: Sequence[str], names: Sequence[str]
               ) -> dict[str, dict[str, Any]]:
    """For each of `names` the example reached: the first batch that added it, its arm and configuration."""
    out: dict[str, dict[str, Any]] = {}
    for b, added in increments(history, names, [example]):
        for n in added:
            if n not in out:
                arm = arms_of_batches[b.index] if b.index < len(arms_of_batches) else None
                out[n] = {"example": example.index, "batch": b.index, "arm": arm, "config": dict(b.config)}
    return out


@frozen
class MarkedScenario:
    """Steps to run as one example whose `example` event carries `marks` (a completion example's)."""

    steps: tuple[Step, ...] = field(converter=tuple)
    marks: Mapping[str, Any] = field(factory=dict)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)


class Completion:
    """The bookkeeping of one run's completion: what was missing, what each example reached, and the
    `completion` event's fields."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.targets = targets(history)
        self.remaining = list(self.targets)
        self.reached: dict[str, dict[str, Any]] = {}
        self.examples = 0

    def strategy(self, max_batch: int = 4) -> st.SearchStrategy[CompletionScenario]:
        caps = self.history.capabilities
        assert caps is not None
        return completion_scenarios(caps, ranked_values(self.history, self.targets), max_batch)

    def mark(self, scenario: CompletionScenario) -> dict[str, Any]:
        """The `example` event's `completion` field: what it goes after, and each batch's arm."""
        return {"targets": list(self.remaining), "arms": list(scenario.arms)}

    def observe(self, scenario: CompletionScenario) -> bool:
        """After a completion example ran: record what it reached; True when nothing is missing."""
        self.examples += 1
        example = self.history.examples[-1]
        found = reached_by(self.history, example, scenario.arms, self.remaining)
        self.reached.update(found)
        self.remaining = [n for n in self.remaining if n not in found]
        return not self.remaining

    def event(self) -> dict[str, Any]:
        return {"targets": self.targets, "examples": self.examples, "reached": self.reached,
                "unreached": list(self.remaining)}


# --------------------------------------------------------------------------- the driver


class _Complete(BaseException):
    """Stops the completion's Hypothesis test at once: every situation it went after is reached."""


def complete(history: History, check_example: Callable[..., None], run_phase: Callable[[Callable[[], None]], None],
             writer: HistoryWriter, base: settings, seed: int | None) -> None:
    """When the stream left a relevant situation unreached, up to COMPLETION_EXAMPLES more examples go
    after it, each run and checked like the stream's (`check_example`: the stream's own test function,
    which raises on a failure so Hypothesis shrinks it) and marked as completion in its `example` event;
    a `completion` event then says what was reached, by which arm and configuration, and what was not.
    A run that reached everything gets nothing added. `run_phase` runs a Hypothesis test the way the
    stream's is run (what it raises recorded the same way). No example database: completion is a
    function of this run's history."""
    done = Completion(history)
    if not done.targets:
        return

    @settings(base, database=None, max_examples=COMPLETION_EXAMPLES,
              phases=tuple(p for p in base.phases if p in (Phase.generate, Phase.shrink)))
    @given(done.strategy())
    def completion_example(scenario: CompletionScenario) -> None:
        try:
            check_example(MarkedScenario(scenario.steps, {"completion": done.mark(scenario)}))
        finally:
            finished = done.observe(scenario)
        if finished:
            raise _Complete

    test = hypothesis_seed(seed)(completion_example) if seed is not None else completion_example

    def until_complete() -> None:
        try:
            test()
        except _Complete:
            pass

    try:
        run_phase(until_complete)
    finally:
        writer.append("completion", **done.event())
