"""The Engine contract: the value types every adapter speaks and the one protocol it implements.

Small and black-box first (DESIGN.md "The Engine contract"): an adapter declares what it can do
(`Capabilities`), runs a batch of `Request`s in a given arrival order and returns one `Result` each,
flushes its cache, and can produce the plain-greedy `Baseline` the oracle compares against. White-box
hooks (`snapshot`) are optional and used only when `Capabilities.introspection` says so.

Everything here is frozen and slotted (attrs) so a history can be hashed, compared and replayed.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import attrs
from attrs import field, frozen

from conformance.knobs import _VIEWS, Knob, _knob_tuple, knob_views, knobs_from_maps


def _tuple_of_ints(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(map(int, values))  # every token list of a run passes here: map, not a generator


@frozen
class Identity:
    """Everything the KV of a token depends on besides the tokens before it.

    Two requests may share KV only if their identities are equal *and* their token prefixes are equal.
    `adapter_digest` is the adapter's weights digest: an adapter reloaded in place under the same name
    is a different identity (BUG_CLASSES A, "adapter keyed by name not weights").
    """

    revision: str = "a"
    adapter: str | None = None
    adapter_digest: str | None = None
    salt: str | None = None

    def label(self) -> str:
        parts = [f"rev={self.revision}"]
        if self.adapter is not None:
            parts.append(f"adapter={self.adapter}" + (f"@{self.adapter_digest[:8]}" if self.adapter_digest else ""))
        if self.salt is not None:
            parts.append(f"salt={self.salt}")
        return ",".join(parts)


@frozen
class Request:
    """One generation request. Greedy decoding is implied: kvparity only checks temperature 0."""

    id: str
    prompt: tuple[int, ...] = field(converter=_tuple_of_ints)
    max_tokens: int
    stop_ids: tuple[int, ...] = field(default=(), converter=_tuple_of_ints)
    identity: Identity = field(factory=Identity)
    # The request's timeline (issue 30), drawn only where `Capabilities.timeline` declares it: the engine
    # step at which it is submitted (None: before the first step, like every request of a plain batch),
    # and the number of output tokens after which it is aborted (0: during prefill; None: never).
    arrive_at_step: int | None = None
    abort_after: int | None = None

    def oracle_key(self) -> tuple:
        """What plain greedy decoding depends on: tokens, limits and the weights (not the salt, nor the
        timeline: an aborted request's partial output is judged against the plain decoding of it whole)."""
        return (self.identity.revision, self.identity.adapter, self.identity.adapter_digest,
                self.prompt, self.max_tokens, self.stop_ids)


# "refused": the engine declined the request without running it (no output), because it lies past a
# limit the engine declares (`Capabilities.refuses`); the other requests of the batch go on.
FINISH_REASONS = ("eos", "stop", "length", "abort", "refused")

def _contenders(values: Sequence[Sequence[Sequence[float]]]) -> tuple[tuple[tuple[int, float], ...], ...]:
    return tuple(tuple((int(t), float(g)) for t, g in step) for step in values)


def _logprobs(values: Sequence[Sequence[Sequence[float]]] | None) -> tuple[tuple[tuple[int, float], ...], ...] | None:
    """Per position (token id, logprob) pairs, kept as given (validation judges them, not the converter:
    a malformed answer must reach the boundary as it was, to be named there)."""
    if values is None:
        return None
    try:
        return tuple(tuple((t, g) for t, g in step) for step in values)
    except (TypeError, ValueError):
        return values  # type: ignore[return-value]  # validation.result names what is wrong


# The parts of a request's timeline an engine may honour (`Capabilities.timeline`). "arrival_paced": an
# arrival point a client paces by what it sees of the engine (a server behind HTTP: the request leaves once
# the batch's earlier requests have streamed that many tokens), so it may land a step or two late; where it
# really arrived is what the engine reports, never the point asked for.
TIMELINE = ("arrival", "abort", "arrival_paced")
ARRIVALS = frozenset({"arrival", "arrival_paced"})


@frozen
class Result:
    """What an engine said about one request. `None` means "the engine does not report this".

    Every field a check reads is a typed field here (httpx's lesson: explicit core fields, an open
    mapping only for optional data). `extra` is for humans: it is kept in the history and shown in
    reports, and no check reads it.
    """

    request_id: str
    output: tuple[int, ...] = field(converter=_tuple_of_ints)
    finish_reason: str
    cached_tokens: int | None = None
    draft_proposed: int | None = None
    draft_accepted: int | None = None
    # Per output token: (top1_id, top1_logit, top2_id, top2_logit) where the engine exposes them.
    top2: tuple[tuple[int, float, int, float], ...] | None = None
    timings: Mapping[str, float] = field(factory=dict)
    # Scheduling facts (eviction_safety, schedule_independence, exercised):
    evictions: int | None = None  # blocks (or KV positions) evicted while serving this request
    prefill_chunks: int | None = None  # pieces the uncached prompt was prefilled in; > 1 means chunked
    preempted: bool | None = None  # the request was preempted and resumed
    # Where the request really arrived and ended, in engine steps (engines honouring a timeline): an
    # arrival may come earlier than asked when the engine was idle, and an abort that came too late (the
    # request had finished) is recorded by its real finish_reason, never claimed as "abort".
    arrived_at_step: int | None = None
    ended_at_step: int | None = None
    extra: Mapping[str, Any] = field(factory=dict)
    # Per output position: the engine's top-k (token id, log-probability) pairs, best first, plus the
    # token it chose where that is not among them (`Capabilities.logprobs_k`; logprob_parity reads it).
    logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = field(default=None, converter=_logprobs)




@frozen
class Baseline:
    """Plain greedy decoding of one request: the oracle's answer and, per step, the top-1/top-2 margin.

    `contenders` (optional; () where the producer has none) gives per step the tokens after the top-1
    whose logit is close to it, as (token, top-1 logit minus theirs), best first: a divergence to any of
    them closer than tau is a near-tie too, not only one to the runner-up. The reference baseline records
    up to 4 within 1 logit — enough for a bf16 engine (tau ~0.2) whose top three lie within its noise, and
    nothing at the confident steps that make up most of a history."""

    output: tuple[int, ...] = field(converter=_tuple_of_ints)
    finish_reason: str
    margins: tuple[float, ...] = field(converter=lambda xs: tuple(float(x) for x in xs))
    runner_up: tuple[int, ...] = field(default=(), converter=_tuple_of_ints)
    contenders: tuple[tuple[tuple[int, float], ...], ...] = field(default=(), converter=_contenders)
    # Optional: per step, the top-k (token, log-softmax) of plain decoding in the oracle's precision, best
    # first (() where the producer has none): what logprob_parity compares an engine's logprobs with.
    logprobs: tuple[tuple[tuple[int, float], ...], ...] = field(default=(), converter=_contenders)


def _token_tuples(values: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(_tuple_of_ints(v) for v in values)


@frozen
class EosPath:
    """Plain greedy decoding of `prompt + continuation[:i]` (under `revision`, no adapter) produces
    `continuation[i:]` and then eos, for every i: sending it with i chosen places eos at any output
    position 0..len(continuation) — inside a draft run, as the bonus token, at max_tokens."""

    revision: str
    prompt: tuple[int, ...] = field(converter=_tuple_of_ints)
    continuation: tuple[int, ...] = field(converter=_tuple_of_ints)


@frozen
class NearTie:
    """Plain greedy decoding of `prompt` (under `revision`, no adapter) picks its first token by a
    margin below 1e-4: where an engine's tie handling (or a lower-precision path) shows."""

    revision: str
    prompt: tuple[int, ...] = field(converter=_tuple_of_ints)


@frozen
class Landmarks:
    """Where the engine's model does what a random stream almost never makes it do, found ahead of time
    by the adapter (from its oracle and tokenizer), so the strategies can steer there: eos paths,
    near-ties, and pairs of distinct token-id sequences that decode to the same text (a cache keyed on
    text instead of ids serves one for the other). Empty: the strategies cannot reach those situations,
    and the coverage table says so."""

    eos_paths: tuple[EosPath, ...] = field(default=(), converter=tuple)
    near_ties: tuple[NearTie, ...] = field(default=(), converter=tuple)
    same_text: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = field(
        default=(), converter=lambda pairs: tuple(_token_tuples(p) for p in pairs))
    # Seconds the adapter's search looked for these (adapters/landmark_search.py); None: not searched
    # (shipped tables). A situation left without its landmarks reads "not steered (no landmarks found
    # in N s)" and makes the run inconclusive, unless the user accepted that (`unsteered_accepted`,
    # `kvparity run --accept-unsteered`).
    search_s: float | None = field(default=None, converter=lambda v: None if v is None else float(v))
    unsteered_accepted: bool = field(default=False, converter=bool)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Landmarks":
        d = d or {}
        return cls(tuple(p if isinstance(p, EosPath) else EosPath(**p) for p in d.get("eos_paths", ())),
                   tuple(t if isinstance(t, NearTie) else NearTie(**t) for t in d.get("near_ties", ())),
                   d.get("same_text", ()), d.get("search_s"), d.get("unsteered_accepted", False))


@frozen(init=False)
class Capabilities:
    """What an engine claims. Claims drive both the strategies and the vacuity guard: a claimed
    capability the run never exercised makes the run inconclusive, not a pass."""

    name: str
    vocab_size: int
    max_context: int
    eos_id: int | None = None
    block_size: int = 16
    prefix_caching: bool = False
    reports_cached_tokens: bool = False
    speculation: bool = False
    reports_drafts: bool = False
    chunked_prefill: bool = False
    evicts: bool = False
    top2_logits: bool = False
    # k of the per-position top-k logprobs each Result carries (0: the engine reports none).
    logprobs_k: int = 0
    identities: frozenset[str] = field(default=frozenset(), converter=frozenset)  # {"salt","adapter","revision"}
    revisions: tuple[str, ...] = ("a",)
    adapters: tuple[str, ...] = ()
    introspection: bool = False
    baseline_mode: bool = False
    # Tie tolerance tau: a divergence where the baseline margin is below tau is a near-tie, not a failure.
    tolerance: float = 0.0
    # Engine configurations the strategies may draw from, one `Knob` each (its values, role, which values
    # switch prefix caching off, context limits). The four per-knob maps of earlier versions
    # (`config_space`, `knob_roles`, `prefix_caching_off`, `context_limits`) are read-only views of
    # these, and still accepted as constructor arguments (converted here, see `__init__`).
    knobs: tuple[Knob, ...] = field(default=(), converter=_knob_tuple)
    # The engine answers a request past its declared limits (prompt + max_tokens over `max_context` or
    # the `context_limits` of the configuration in effect) with finish_reason "refused" and goes on with
    # the rest of the batch; the strategies then also send requests one token past each limit, and such
    # a request must be refused or answered exactly (a refusal within the limits is a failure).
    refuses: bool = False
    # Shortest prompt (in tokens) that can produce a prefix hit at all (vLLM CPU: a full block + 1).
    min_hit_prompt: int = 2
    version: str = ""
    landmarks: Landmarks = field(factory=Landmarks, converter=lambda v: v if isinstance(v, Landmarks) else Landmarks.from_json(v))
    # Which oracle judges this run, in words ("reference (float64)", "self (generate, bfloat16)"); the
    # report names it, since a self-judged pass says less than a reference-judged one.
    oracle: str = ""
    # The largest |logprob(engine) - logprob(oracle)| logprob_parity accepts: a calibration's measured
    # epsilon (`kvparity run --calibration`), never declared by an adapter; None: the check is not run.
    logprob_epsilon: float | None = None
    # Which parts of a request's timeline the engine honours (TIMELINE): "arrival" (a request submitted
    # while others run, step-precisely), "abort" (a request stopped after N output tokens) and
    # "arrival_paced" (an arrival a client paces, see TIMELINE). What is not declared is never drawn.
    timeline: frozenset[str] = field(default=frozenset(), converter=frozenset)

    def __init__(self, *args: Any, config_space: Mapping[str, Sequence[Any]] | None = None,
                 knob_roles: Mapping[str, str] | None = None,
                 prefix_caching_off: Mapping[str, Sequence[Any]] | None = None,
                 context_limits: Mapping[str, Mapping[str, int]] | None = None, **kwargs: Any) -> None:
        """The attrs fields, plus the four maps of earlier versions: adapters written against them (and
        `attrs.evolve(caps, config_space=...)`) keep working. A map given replaces that view; the views
        not given are kept from `knobs`, so evolving one map keeps what the others said."""
        legacy = {"config_space": config_space, "knob_roles": knob_roles,
                  "prefix_caching_off": prefix_caching_off, "context_limits": context_limits}
        if any(v is not None for v in legacy.values()):
            before = _knob_tuple(kwargs.get("knobs", ()))
            kept = knob_views(before)
            rebuilt = knobs_from_maps(**{k: kept[k] if v is None else v for k, v in legacy.items()})
            # the maps have no room for a speculation knob's off values: keep what the knobs said
            spec_off = {k.name: k.off for k in before if k.role == "speculation"}
            kwargs["knobs"] = tuple(attrs.evolve(k, off=spec_off[k.name])
                                    if k.role == "speculation" and k.name in spec_off else k for k in rebuilt)
        self.__attrs_init__(*args, **kwargs)

    @property
    def config_space(self) -> Mapping[str, tuple[Any, ...]]:
        """knob -> allowed values (the first is what shrinking goes to)."""
        return _VIEWS["config_space"](self.knobs)

    @property
    def knob_roles(self) -> Mapping[str, str]:
        """knob -> which claim a difference in it tests (one of KNOB_ROLES); knobs without a role left out."""
        return _VIEWS["knob_roles"](self.knobs)

    @property
    def prefix_caching_off(self) -> Mapping[str, tuple[Any, ...]]:
        """knob -> the values that switch prefix caching off; knobs without such values left out."""
        return _VIEWS["prefix_caching_off"](self.knobs)

    @property
    def context_limits(self) -> Mapping[str, Mapping[str, int]]:
        """knob -> {str(value): most tokens per request}, the shape the strategies look values up in."""
        return _VIEWS["context_limits"](self.knobs)

    def context_limit(self, config: Mapping[str, Any] | None = None) -> int:
        """Tokens one request may take under `config`: `max_context`, or less where a knob value lowers it."""
        limits = [self.max_context] + [int(v) for knob, value in (config or {}).items()
                                       if (v := self.context_limits.get(knob, {}).get(str(value))) is not None]
        return min(limits)


@runtime_checkable
class Engine(Protocol):
    """The whole contract. `run` executes one batch: requests are submitted in list order (arrival order)
    and all run to completion together; results come back in the same order."""

    def capabilities(self) -> Capabilities: ...

    def configure(self, config: Mapping[str, Any]) -> None:
        """Switch to one point of `config_space` (may restart the engine). Empty mapping = defaults."""

    def run(self, requests: Sequence[Request]) -> list[Result]: ...

    def reset(self) -> None:
        """Flush every reusable KV (prefix cache, drafter state)."""

    def baseline(self, request: Request) -> Baseline:
        """Plain greedy decoding of `request` (engine's own baseline mode or a reference model)."""

    def close(self) -> None: ...


@runtime_checkable
class Introspectable(Protocol):
    """Optional white-box hook: a JSON-able snapshot of the cache and pool, taken after every batch and
    after every reset when `Capabilities.introspection` is true. Only scalar values are recorded.

    Keys read by the checks (each optional; a present key must hold its at-rest value after a batch):
      "blocks_in_use"     int   blocks referenced by a running sequence            (at rest: 0)
      "provisional_live"  int   provisional (speculative, unverified) blocks/slots (at rest: 0)
      "rejected_in_cache" int   cached blocks holding a rejected draft token       (always 0)
      "refcounts_ok"      bool  the engine's own pool consistency verdict          (always True)
      "free_blocks", "cached_blocks", "total_blocks"  int  at rest free + cached == total
      "evictions"         int   running eviction counter; growth across a batch = eviction observed
    """

    def snapshot(self) -> Mapping[str, Any]: ...


@runtime_checkable
class Decodes(Protocol):
    """Optional hook: token ids -> text with the engine's own tokenizer (special tokens kept visible).

    Conformance imports no tokenizer; a report shows a failure's expected and actual output as text
    only if the adapter can say what the ids mean. The runner asks for the few sequences a report's
    findings show, once, when the run's report is written, and records the text in results.json and
    the witnesses, so a report re-rendered later needs no tokenizer. Never used by a check.
    """

    def decode(self, ids: Sequence[int]) -> str: ...


class EngineError(RuntimeError):
    """The engine crashed, timed out or answered malformed. Always an `error` verdict, never a pass."""


class UsageError(ValueError):
    """Bad user input: unknown engine, bad engine arguments, malformed request. Exit code 3."""


def evolve(obj: Any, **changes: Any) -> Any:
    return attrs.evolve(obj, **changes)
