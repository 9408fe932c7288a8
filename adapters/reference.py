"""kvparity adapter for the reference engine (reference_engine/): the ground truth and worked example.

Every engine knob is an engine argument (strings, as a command line gives them; parsed into the frozen
`ReferenceArgs`, which the adapter also takes as is):
  ReferenceAdapter(block_size="16", num_blocks="256", prefix_cache="true", drafter="oracle", k="4",
                   chunk_size="none", token_budget="4096", max_batch="64", pool_tokens="none")
(`pool_tokens`, when set, sizes the pool in tokens instead: num_blocks = pool_tokens / block_size.)
and `configure` switches between points of `config_space` (a fresh engine each time, so no KV crosses
configurations). The engine computes in float64 and declares tolerance 0: any divergence is a bug.

Identities: conformance's Identity(revision, adapter, adapter_digest, salt) maps to the engine's
Identity(revision, adapter, salt). An `adapter_digest` that names other known weights than the
adapter's current ones (full digest or a prefix of >= 8) rebinds the name to those weights first — an
in-place adapter reload, which must invalidate that adapter's cached KV (`ModelRegistry.bind_adapter`;
each adapter has a registry of its own, so a reload never leaks into another adapter).
`capabilities().adapters` lists every (name, weights) binding as "name@digest", so the strategies
exercise reloads.

Claims (`capabilities`) describe the whole `config_space`, not only the current configuration: the
strategies configure every example from that space, so speculation and chunked prefill are exercised
(and the vacuity guard must ask for accepted drafts and chunked prefills) even when the defaults have
them off.

`fault=NAME` (or `fault=A+B`, several at once) builds every engine of this adapter with that fault of the fault zoo planted
(reference_engine/faults.py `build_engine`); without it the engine is built from the normal classes.

`introspection=off` makes the adapter declare no introspection (no `snapshot` is taken, no white-box
check applies): the suite then sees only what any engine shows. `kvparity mutate` measures the suite's
power that way (black-box) as well as with introspection (white-box, the default).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import torch

import attrs
from attrs import field, frozen

from adapters.engine_args import int_arg, parse, to_bool, to_choice, to_int
from adapters.landmarks import shipped_landmarks
from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, UsageError
from conformance.knobs import Knob
from reference_engine.timeline import Timed, run_timeline
from reference_engine.baseline import greedy
from reference_engine.config import DRAFTER_NAMES, EngineConfig
from reference_engine.engine import Engine
from reference_engine.engine import Request as EngineRequest
from reference_engine.errors import (ContextOverflowError, PoolExhaustedError, ReferenceEngineError,
                                     UnknownAdapterError)
from reference_engine.faults import build_engine, fault_names
from reference_engine.logprobs import LOGPROBS_K
from reference_engine.model_registry import ModelRegistry
from reference_engine.sequence import Identity as EngineIdentity
from reference_engine.weights import Weights

KNOBS = ("block_size", "num_blocks", "prefix_cache", "drafter", "k", "chunk_size", "token_budget", "max_batch",
         "pool_tokens")
DEFAULTS = {"block_size": "16", "num_blocks": "256", "prefix_cache": "true", "drafter": "none", "k": "4",
            "chunk_size": "none", "token_budget": "4096", "max_batch": "64", "pool_tokens": "none"}
# What the strategies may vary, each knob stated once (the first value is what shrinking goes to: the
# declared default).
POOLS = (4096, 64, 256)
KNOB_TABLE = (
    Knob("block_size", (16, 4, 32), "cache"),
    # The pool in tokens, not blocks, so that its size means the same at every block size. 256 evicts
    # (and preempts) under a flood of long prompts; 64 under two or three short requests, which is what
    # makes an eviction witness small (so it comes before 256: shrinking prefers earlier values). A
    # request cannot be longer than its pool (its context limit).
    Knob("pool_tokens", POOLS, "cache", context_limits={v: v for v in POOLS}),
    Knob("drafter", ("none", "oracle", "adversarial", "draft", "ngram"), "speculation", off=("none",)),
    Knob("k", (3, 1, 5), "speculation"),
    Knob("chunk_size", ("none", 13, 16), "schedule"),
    Knob("token_budget", (4096, 24), "schedule"),
)
CONFIG_SPACE = {k.name: k.values for k in KNOB_TABLE}


def _chunk_size(value: Any, f: attrs.Attribute) -> int | None:
    """A chunk size, or None (no chunking) for "none", "off", "" and "0"."""
    return int_arg(f.name, None if str(value) == "0" else value, allow_none=True)


def _fault(value: Any) -> str | None:
    """A fault of the zoo (or several joined by "+"), or None."""
    fault = None if value is None or str(value).lower() in ("", "none", "off") else str(value)
    if fault is not None:
        try:
            fault_names(fault)
        except KeyError as exc:
            raise UsageError(f"fault={fault!r}: {exc.args[0]}") from None
    return fault


@frozen
class ReferenceArgs:
    """The reference adapter's engine arguments, parsed once: each field converts the command line's
    string (`--engine-arg k=v`) and a bad one is a UsageError naming it. `pool_tokens`, when set, sizes
    the pool in tokens instead of `num_blocks`. `fault` and `introspection` are the adapter's own; the
    rest are the engine's knobs (`KNOBS`), which `configure` overrides per configuration."""

    block_size: int = field(default=16, converter=to_int())
    num_blocks: int = field(default=256, converter=to_int())
    prefix_cache: bool = field(default=True, converter=to_bool())
    drafter: str = field(default="none", converter=to_choice(("none", *DRAFTER_NAMES)))
    k: int = field(default=4, converter=to_int())
    chunk_size: int | None = field(default=None, converter=attrs.Converter(_chunk_size, takes_field=True))
    token_budget: int = field(default=4096, converter=to_int())
    max_batch: int = field(default=64, converter=to_int())
    pool_tokens: int | None = field(default=None, converter=to_int(allow_none=True))
    fault: str | None = field(default=None, converter=_fault)
    introspection: bool = field(default=True, converter=to_bool())

    def engine_config(self) -> EngineConfig:
        num_blocks = -(-self.pool_tokens // self.block_size) if self.pool_tokens else self.num_blocks
        return EngineConfig(block_size=self.block_size, num_blocks=num_blocks, enable_prefix_cache=self.prefix_cache,
                            drafter=self.drafter, k=self.k, chunk_size=self.chunk_size,
                            token_budget=self.token_budget, max_batch=self.max_batch)

    def with_knobs(self, knobs: Mapping[str, Any]) -> "ReferenceArgs":
        """These arguments with some engine knobs changed (a configuration); other names are a UsageError."""
        unknown = set(knobs) - set(KNOBS)
        if unknown:
            raise UsageError(f"unknown reference engine argument(s) {sorted(unknown)}; known: {', '.join(KNOBS)}")
        return attrs.evolve(self, **knobs)


# The one process-wide object of this adapter, and why it is safe to share: `Weights` maps what
# weights *are* (a revision; an adapter's weights digest) to the loaded model, so an entry never
# changes once loaded and no adapter can observe another's use of it. It is what makes reconfiguring,
# and building many adapters (minimising a witness builds hundreds), cost no reloads. What does change
# — which weights an adapter name is bound to — belongs to each adapter's own registry
# (`shared_registry`), so an in-place reload in one adapter never leaks into another.
@functools.cache
def shared_weights() -> Weights:
    """The process's loaded models (float64, the engine's dtype), loaded on first use. Also sets the
    process to one torch thread, once: the shipped models' matrices are 128 x 384, and an intra-op
    thread pool's wake-ups cost more than splitting them saves (the CI profile on 2 cores: 88 s with
    torch's default of 2 threads, 71 s with one). This adapter serves only the shipped models."""
    torch.set_num_threads(1)
    return Weights(torch.float64)


@functools.cache
def shared_tokenizer():
    """The shipped tokenizer.json (tokenizers), loaded on first use: only a report's text needs it."""
    from reference_engine.checkpoints import load_tokenizer

    return load_tokenizer()


def shared_registry() -> ModelRegistry:
    """A registry with bindings of its own (the shipped adapters) over the process's loaded models."""
    return ModelRegistry(weights=shared_weights())


def engine_config(knobs: Mapping[str, Any]) -> EngineConfig:
    """The engine configuration for knob strings (the defaults for those not given); `kvparity serve`
    builds its engine from the same arguments."""
    return ReferenceArgs().with_knobs(knobs).engine_config()


class ReferenceAdapter:
    """The Engine contract (conformance/contract.py) over reference_engine.Engine; introspectable."""

    def __init__(self, args: ReferenceArgs | None = None, **engine_args: Any) -> None:
        """From parsed arguments, or from engine-argument strings (`ReferenceAdapter(k="2")`)."""
        if args is None:
            args = parse(ReferenceArgs, "reference", engine_args)
        elif engine_args:
            raise UsageError("ReferenceAdapter: pass ReferenceArgs or engine arguments, not both")
        self.args = args
        self.fault, self.introspection = args.fault, args.introspection
        self.registry = shared_registry()
        self.engine: Engine | None = None
        self.configure({})

    # -- contract ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        c, mc = self.config, self.registry.config()
        drafters = {c.drafter, *map(str, CONFIG_SPACE.get("drafter", ()))}
        chunks = {c.chunk_size, *(v for v in CONFIG_SPACE.get("chunk_size", ()) if str(v).lower() != "none")}
        budgets = {c.token_budget, *CONFIG_SPACE.get("token_budget", ())}
        longest = mc.max_position_embeddings
        return Capabilities(
            name="reference", version="0.1.0", vocab_size=mc.vocab_size, max_context=mc.max_position_embeddings,
            eos_id=mc.eos_token_id, block_size=c.block_size,
            prefix_caching=c.enable_prefix_cache, reports_cached_tokens=True,
            # what some point of config_space can do (the strategies draw every example's config from it)
            speculation=bool(drafters - {"none"}), reports_drafts=True,
            chunked_prefill=any(ch is not None for ch in chunks) or min(budgets) < longest,
            evicts=c.enable_prefix_cache,
            top2_logits=False, logprobs_k=LOGPROBS_K, identities=frozenset({"salt", "adapter", "revision"}),
            revisions=self.registry.revisions(),
            adapters=tuple(f"{name}@{digest}" for name in sorted(self.registry.adapters())
                           for digest in sorted(self.registry.known_weights())),
            introspection=self.introspection, baseline_mode=True, tolerance=0.0, refuses=True,
            oracle="reference baseline (plain greedy decoding, float64, same weights)",
            knobs=KNOB_TABLE, min_hit_prompt=c.block_size + 1, landmarks=shipped_landmarks(),
            timeline=frozenset({"arrival", "abort"}))

    def configure(self, config: Mapping[str, Any]) -> None:
        self.config = self.args.with_knobs({k: str(v) for k, v in config.items()}).engine_config()
        try:
            self.engine = build_engine(self.config, self.registry, self.fault)
        except ValueError as e:
            raise UsageError(str(e)) from e

    def reset(self) -> None:
        self.engine.flush()

    def close(self) -> None:
        self.engine = None

    def baseline(self, request: Request) -> Baseline:
        """Plain greedy decoding on the very same float64 weights the engine uses."""
        try:
            run = self.registry.greedy_run(self._identity(request.identity), request.prompt)
            g = greedy(run.model, request.prompt, request.max_tokens, request.stop_ids, run=run)
        except ReferenceEngineError as e:
            raise UsageError(f"request {request.id}: {e}") from e
        return Baseline(g.output, g.finish_reason, g.margins, g.runner_up, g.contenders, g.logprobs)

    def run(self, requests: Sequence[Request]) -> list[Result]:
        """One batch. A request past the engine's limits (the model's context, or more blocks than the
        whole pool) is refused on its own — finish_reason "refused", the engine's reason in `extra` — and
        the others run: the engine checks each request before it queues any."""
        try:
            batch = [EngineRequest(r.id, r.prompt, r.max_tokens, r.stop_ids, self._identity(r.identity))
                     for r in requests]
            refused = {}
            for r in batch:
                try:
                    self.engine.check_request(r.request_id, r.prompt, r.max_tokens, r.identity)
                except (ContextOverflowError, PoolExhaustedError) as e:
                    refused[r.request_id] = Result(r.request_id, (), "refused", extra={"refusal": str(e)})
            kept = [(q, r) for q, r in zip(requests, batch) if r.request_id not in refused]
            ran = iter(self._run(kept) if kept else ())
            return [refused.get(r.request_id) or next(ran) for r in batch]
        except (ReferenceEngineError, PoolExhaustedError) as e:
            raise UsageError(f"{type(e).__name__}: {e}") from e
        except UsageError:
            raise
        except Exception as e:
            raise EngineError(f"reference engine: {type(e).__name__}: {e}") from e

    def _run(self, kept: list[tuple[Request, EngineRequest]]) -> list[Result]:
        """A plain batch through `generate`; one with a timeline (an arrival step or an abort point)
        step by step along it (reference_engine/timeline.py), each result saying where it arrived and
        ended."""
        if all(q.arrive_at_step is None and q.abort_after is None for q, _ in kept):
            return [self._result(rep) for rep in self.engine.generate([r for _, r in kept])]
        ended = run_timeline(self.engine, [Timed(r, q.arrive_at_step, q.abort_after) for q, r in kept])
        return [attrs.evolve(self._result(e.report), arrived_at_step=e.arrived_at_step, ended_at_step=e.ended_at_step)
                for e in ended]

    def snapshot(self) -> Mapping[str, Any]:
        return self.engine.snapshot()

    def decode(self, ids: Sequence[int]) -> str:
        """The optional `Decodes` hook: the shipped tokenizer (every checkpoint shares it)."""
        return shared_tokenizer().decode(list(ids), skip_special_tokens=False)

    # -- helpers ----------------------------------------------------------------------------------
    def _identity(self, identity) -> EngineIdentity:
        adapter = identity.adapter
        if adapter is not None and identity.adapter_digest:
            self._bind_adapter(adapter, identity.adapter_digest)
        return EngineIdentity(identity.revision, adapter, identity.salt)

    def _bind_adapter(self, name: str, digest: str) -> None:
        """An identity naming other weights than the adapter's current ones: an in-place reload."""
        try:
            self.registry.bind_adapter(name, digest)
        except UnknownAdapterError as e:
            raise UsageError(f"adapter {name!r} with weights digest {digest!r}: no such shipped weights") from e

    @staticmethod
    def _result(rep) -> Result:
        extra = {
            "prompt_tokens": rep.prompt_tokens, "preemptions": rep.preemptions,
            "provisional_allocated": rep.provisional_allocated, "provisional_freed": rep.provisional_freed,
            "proposed_per_position": list(rep.proposed_per_position),
            "accepted_per_position": list(rep.accepted_per_position),
            "verification_steps": rep.verification_steps, "target_forwards": rep.target_forwards,
            "draft_forwards": rep.draft_forwards, "ttft_cost": rep.ttft_cost, "tpot_cost": rep.tpot_cost,
        }
        timings = {k: v for k, v in (("ttft_s", rep.ttft_s), ("tpot_s", rep.tpot_s)) if v is not None}
        return Result(rep.request_id, rep.output, rep.finish_reason, cached_tokens=rep.cached_tokens,
                      draft_proposed=rep.draft_proposed, draft_accepted=rep.draft_accepted,
                      timings=timings, evictions=rep.evictions, prefill_chunks=rep.prefill_chunks,
                      preempted=rep.preemptions > 0, extra=extra, logprobs=rep.logprobs)
