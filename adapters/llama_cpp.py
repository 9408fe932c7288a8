"""kvparity adapter for llama.cpp through llama-cpp-python (token-level API: `Llama.generate`).

What it drives (all real llama-cpp-python code paths, f32 GGUF exported by adapters.gguf_export):

* **In-context prefix reuse** - `Llama.generate` keeps the longest common prefix of its current context
  and the new prompt (re-evaluating the last prompt token, or sampling straight from live logits when
  the whole prompt is already in context). llama-cpp-python reports no cached-token count; this adapter
  *observes* it: `cached_tokens` is `n_tokens` (KV positions already in the context) at the first
  `eval` of the request, i.e. exactly the positions the engine did not recompute.
  `extra["cached_source"]` says where they came from: "context", "ram" / "disk" (a state loaded from
  the cache) or "none".
* **LlamaRAMCache / LlamaDiskCache** (`cache=ram|disk`) - the lookup/save glue of
  `Llama._create_completion` (`cache[prompt]` -> longest-prefix key -> `load_state` when it beats the
  live context; `cache[prompt + completion] = save_state()` afterwards), mirrored line for line
  because `create_completion` works on text. ONE cache object serves every identity, as in
  llama-cpp-python's server, where every model configured with `cache_type=disk` opens the same default
  directory. The cache key is the token list alone.
* **Speculation** via `Llama(draft_model=...)`: `prompt_lookup` (`LlamaPromptLookupDecoding`),
  `draft_model` (a `LlamaDraftModel` running the tiny-draft GGUF greedily in its own llama.cpp context),
  and `adversarial` (proposes tokens the target is unlikely to pick - verification must reject them).
  llama-cpp-python reports no draft statistics: proposals are counted by wrapping the drafter and
  acceptance is derived from the committed output (`extra["draft_counts"] = "adapter-observed"`).
* **Single-slot context = eviction**: the context holds one sequence, so each request drops whatever of
  the previous context it does not share (`Result.evictions`: KV positions dropped, observed); hence
  `evicts=True`.
* **Chunked prefill**: `n_batch` (and `n_ubatch`) smaller than the prompt makes `eval` decode it in
  chunks.
* **Identities**: revision a / b (one `Llama` per identity, separate contexts) and, when the GGUF LoRA
  loads, the LoRA adapters (`lora_path`), again one context each. No tenant salt: llama-cpp-python
  has no such notion.

Engine arguments (strings, parsed into the frozen `LlamaCppArgs`, adapters/llama_cpp_args.py): gguf_dir, n_ctx, n_batch, kv_type (f32|f16), drafter, k, cache, cache_dir,
cache_scope (shared: one cache object for all identities, as llama-cpp-python's server shares its disk
cache directory | identity: one per identity, the workaround), tolerance, n_threads, seed, lora (auto|off),
logits_all (on: every position's logits are kept, so Result.top2 is reported | off: llama-cpp-python's own
default, where speculative decoding must keep the rows it samples by itself), vary (comma list of the knobs
the suite may vary, default all of drafter, k, n_batch, cache; the others stay at their engine argument, as
the vLLM adapter's `vary`). Numerics: llama.cpp computes in
f32 (KV f32 by default here); the oracle is the reference model in float64, so a small tolerance is declared
(see TOLERANCE).

Releases: 0.2.38 (the first with speculative decoding) to current. What differs between them (constructor
keywords, GGUF LoRA, close()) is probed in adapters/llama_cpp_versions.py, and what a release cannot do is not
claimed in capabilities().
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pathlib
import shutil
import tempfile
import time
from typing import Any, Mapping, Sequence

import numpy as np

from adapters import llama_cpp_versions as versions
from adapters.engine_args import choice_arg, engine_arguments, int_arg, parse
from adapters.llama_cpp_args import CACHES, DRAFTERS, GGML_TYPE, KNOBS, LlamaCppArgs
from adapters.landmarks import shipped_landmarks
from adapters.reference_oracle import ReferenceOracle
from conformance.contract import Baseline, Capabilities, EngineError, Identity, Request, Result, UsageError
from conformance.knobs import Knob

# Tie tolerance tau, in logits. Measured (tests/test_adapter_llama_cpp.py, reports/llama_cpp/README.md):
# |llama.cpp f32 logit - reference float64 logit| stays below 1.4e-5 over 2 x 50 prompts x 24 steps, so a
# top-1/top-2 margin below 1e-4 (7x that) is the only place f32 rounding can legitimately flip an argmax.
TOLERANCE = 1e-4
CONFIG_SPACE = {
    "drafter": DRAFTERS,
    "k": (4, 1, 8),
    # 9: prompts are decoded in chunks of 9, and a draft round (k + 1 <= 9 tokens) still fits one chunk -
    # with k + 1 > n_batch llama-cpp-python 0.3.36 aborts the process (finding F3, see _check_config).
    "n_batch": (512, 9),
    "cache": ("none", "ram", "disk"),
}
KNOB_ROLES = {"drafter": "speculation", "k": "speculation", "n_batch": "schedule", "cache": "cache"}



def _import_llama_cpp():
    """(llama_cpp, its llama_speculative module or None before 0.2.38)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"llama_cpp adapter needs llama-cpp-python (pip install 'kvparity[llamacpp]'): {exc}") from exc
    try:
        from llama_cpp import llama_speculative
    except ImportError:
        llama_speculative = None
    return llama_cpp, llama_speculative


def _drafter_base():
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel
        return LlamaDraftModel
    except ImportError:  # keeps this module importable without llama_cpp (classes below are only built lazily)
        return object



LOGPROBS_K = 5  # top-k log-probabilities per output position (Result.logprobs), as the reference engine's


def top_logprobs(row: "np.ndarray", chosen: int, k: int = LOGPROBS_K) -> tuple[tuple[int, float], ...]:
    """One position's log-softmax top-k, best first, with the chosen token added where it is not among
    them: computed in float64 from the float32 logits llama.cpp kept."""
    row = np.asarray(row, dtype=np.float64)
    shifted = row - row.max()
    logz = math.log(float(np.exp(shifted).sum()))
    best = np.argsort(-row, kind="stable")[:k]
    ids = [int(i) for i in best] + ([int(chosen)] if int(chosen) not in {int(i) for i in best} else [])
    return tuple(sorted(((i, float(shifted[i] - logz)) for i in ids), key=lambda p: -p[1]))

class CountingDrafter(_drafter_base()):  # type: ignore[misc]
    """Wraps any drafter; records (context length, proposed tokens) for every call."""

    def __init__(self, inner, k: int):
        self.inner = inner
        self.k = k
        self.calls: list[tuple[int, tuple[int, ...]]] = []

    def __call__(self, input_ids, /, **kwargs):
        out = np.asarray(self.inner(input_ids, **kwargs), dtype=np.intc)[: self.k]
        self.calls.append((int(len(input_ids)), tuple(int(t) for t in out)))
        return out


class GgufDraftModel(_drafter_base()):  # type: ignore[misc]
    """A draft model for `Llama(draft_model=...)`: greedy k tokens from a second (small) GGUF model in its
    own llama.cpp context, reusing that context's prefix across calls."""

    def __init__(self, model_path: str, k: int, n_ctx: int, n_threads: int, type_kv: int, seed: int,
                 features: versions.Features):
        import llama_cpp
        from llama_cpp import Llama

        self.k = k
        with versions.constructing(features, llama_cpp, kv=type_kv):
            self.llm = Llama(model_path=model_path, n_ctx=n_ctx, n_batch=512, n_threads=n_threads, seed=seed,
                             verbose=False, **versions.llama_kwargs(features, n_batch=512, kv=type_kv))

    def __call__(self, input_ids, /, **kwargs):
        out: list[int] = []
        budget = min(self.k, self.llm.n_ctx() - len(input_ids))
        if budget <= 0:
            return np.array([], dtype=np.intc)
        for tok in self.llm.generate([int(t) for t in input_ids], temp=0.0, top_k=1, repeat_penalty=1.0):
            out.append(int(tok))
            if len(out) >= budget:
                break
        return np.array(out, dtype=np.intc)

    def reset(self) -> None:
        self.llm.reset()


class AdversarialDrafter(_drafter_base()):  # type: ignore[misc]
    """Proposes k tokens drawn from a fixed-seed RNG, seeded by the context: nearly always wrong, so
    every round exercises rejection and KV rollback."""

    def __init__(self, k: int, vocab: int, seed: int = 0):
        self.k, self.vocab, self.seed = k, vocab, seed

    def __call__(self, input_ids, /, **kwargs):
        rng = np.random.default_rng([self.seed, len(input_ids), int(input_ids[-1]) if len(input_ids) else 0])
        return rng.integers(3, self.vocab, size=self.k).astype(np.intc)


def _accepted(prompt_len: int, output: Sequence[int], calls: Sequence[tuple[int, tuple[int, ...]]]) -> tuple[int, int]:
    """(proposed, accepted) for one request: a proposal made at context length L predicts absolute
    positions L, L+1, ...; it is accepted up to the first token that differs from the committed output."""
    proposed = accepted = 0
    for length, toks in calls:
        proposed += len(toks)
        j = length - prompt_len  # output index the first proposed token predicts
        for t in toks:
            if 0 <= j < len(output) and output[j] == t:
                accepted += 1
                j += 1
            else:
                break
    return proposed, accepted


class LlamaCppAdapter:
    @engine_arguments(LlamaCppArgs)
    def __init__(self, args: LlamaCppArgs | None = None, **engine_args: Any):
        """From parsed arguments, or from engine-argument strings (`LlamaCppAdapter(drafter="adversarial")`)."""
        if args is None:
            args = parse(LlamaCppArgs, "llama_cpp", engine_args)
        elif engine_args:
            raise UsageError("LlamaCppAdapter: pass LlamaCppArgs or engine arguments, not both")
        self.args = args
        self._llama_cpp, speculative = _import_llama_cpp()
        self.features = versions.probe(self._llama_cpp, speculative)
        from adapters import gguf_export
        from reference_engine import checkpoints

        self._ckpt = checkpoints
        self.n_ctx, self.kv_type, self.n_threads, self.seed = args.n_ctx, args.kv_type, args.n_threads, args.seed
        self.tolerance = TOLERANCE if args.tolerance is None else args.tolerance
        # on: every position's logits are kept (Result.top2 is read from them). off: llama-cpp-python's default,
        # where the engine itself must keep the rows speculative decoding samples from.
        self.logits_all = args.logits_all
        self.vary = args.vary
        self._defaults = args.knob_defaults()
        self._cache_dir_arg = args.cache_dir
        # shared: ONE LlamaRAMCache/LlamaDiskCache for every identity (what llama-cpp-python's server does:
        # every model with cache_type=disk opens the same default directory). identity: one cache per
        # identity (the workaround), so the rest of the suite can be judged without the known leak.
        self.cache_scope = args.cache_scope
        lora_mode, gguf_dir = args.lora, args.gguf_dir
        # Export (idempotent, digest-named) every shipped checkpoint this adapter can use.
        out_dir = pathlib.Path(gguf_dir) if gguf_dir else None
        self.paths: dict[str, str] = {}
        for rev, folder in checkpoints.REVISIONS.items():
            self.paths[f"rev:{rev}"] = str(gguf_export.export_gguf(folder, out_dir))
        if (checkpoints.CHECKPOINTS / checkpoints.DRAFT).is_dir():
            self.paths["draft"] = str(gguf_export.export_gguf(checkpoints.DRAFT, out_dir))
        self.adapters: tuple[str, ...] = ()
        if lora_mode == "auto" and not self.features.gguf_lora:
            self.lora_error = (f"llama-cpp-python {self.features.version} loads LoRA only from pre-GGUF ggla files "
                               f"(no {' / '.join(versions.GGUF_LORA_INIT)})")
        elif lora_mode == "auto":
            for name, folder in checkpoints.ADAPTERS.items():
                if (checkpoints.CHECKPOINTS / folder).is_dir():
                    self.paths[f"lora:{name}"] = str(gguf_export.export_gguf(folder, out_dir))
            self.adapters = tuple(n for n in checkpoints.ADAPTERS if f"lora:{n}" in self.paths)
        self._llms: dict[tuple[str, str | None], Any] = {}
        self._oracle = ReferenceOracle(eos_id=2)
        self._caches: dict[Any, Any] = {}
        self._tmp_cache_dir: str | None = None
        self.config: dict[str, Any] = {}
        try:
            self.configure({})
            if self.adapters:  # LoRA is optional: keep it only if llama.cpp accepts our GGUF adapters
                try:
                    for name in self.adapters:
                        self._llm(Identity(revision="a", adapter=name))
                except Exception as exc:  # noqa: BLE001
                    self.lora_error = f"{type(exc).__name__}: {exc}"
                    self.adapters = ()
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"llama.cpp failed to start: {type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------ contract

    def capabilities(self) -> Capabilities:
        idents = {"revision"} | ({"adapter"} if self.adapters else set())
        return Capabilities(
            name="llama_cpp", vocab_size=1024, max_context=self.n_ctx, eos_id=2, block_size=16,
            prefix_caching=True, reports_cached_tokens=True, speculation=self.features.speculative,
            reports_drafts=self.features.speculative, chunked_prefill=True, evicts=True,
            top2_logits=self.logits_all, logprobs_k=LOGPROBS_K if self.logits_all else 0, identities=frozenset(idents),
            revisions=("a", "b"), adapters=self.adapters, introspection=False, baseline_mode=False,
            tolerance=self.tolerance, min_hit_prompt=2,
            knobs=tuple(Knob(k, values, KNOB_ROLES[k], ("none",) if k == "drafter" else ())
                        for k, values in self._config_space().items()),
            version=self.version(), landmarks=shipped_landmarks(),  # it serves the shipped family
        )

    def _config_space(self) -> dict[str, tuple]:
        space = dict(CONFIG_SPACE)
        if not self.features.speculative:
            space["drafter"] = ("none",)
        elif "draft" not in self.paths:
            space["drafter"] = tuple(d for d in DRAFTERS if d != "draft_model")
        # the default (the engine arguments) first: Hypothesis shrinks towards it
        for knob, default in self._defaults.items():
            v = self._parse_knob(knob, default)
            space[knob] = (v, *[x for x in space[knob] if x != v])
        return {k: v for k, v in space.items() if k in self.vary}

    def version(self) -> str:
        return f"llama-cpp-python {self.features.version}"

    def _parse_knob(self, knob: str, value: Any) -> Any:
        if knob == "drafter":
            return choice_arg("drafter", value, DRAFTERS)
        if knob == "cache":
            return choice_arg("cache", value, CACHES)
        if knob in ("k", "n_batch"):
            return int_arg(knob, value)
        raise UsageError(f"unknown llama_cpp knob {knob!r}; known: {', '.join(KNOBS)}")

    def configure(self, config: Mapping[str, Any]) -> None:
        merged = {**self._defaults, **dict(config or {})}
        unknown = set(merged) - set(KNOBS)
        if unknown:
            raise UsageError(f"unknown llama_cpp knob(s) {sorted(unknown)}; known: {', '.join(KNOBS)}")
        new = {k: self._parse_knob(k, v) for k, v in merged.items()}
        if new["drafter"] == "draft_model" and "draft" not in self.paths:
            raise UsageError("drafter=draft_model needs the tiny-draft checkpoint")
        if new["drafter"] != "none" and not self.features.speculative:
            raise UsageError(f"llama-cpp-python {self.features.version} has no speculative decoding (llama_speculative)")
        self._check_config(new)
        if new == self.config:  # every example starts with a configure: keep the loaded models, flush their state
            self.reset()
            return
        self._close_llms()
        self.config = new
        self._caches = {}

    @staticmethod
    def _check_config(c: Mapping[str, Any]) -> None:
        """Refuse, as an engine error, a configuration llama-cpp-python 0.3.36 would answer by killing the
        process: with a drafter, `generate` evals k + 1 tokens; `eval` splits them into n_batch chunks, and
        sampling a position of an earlier chunk reads logits llama.cpp no longer holds:
        GGML_ASSERT(logits != nullptr) in llama-sampler.cpp, SIGABRT (reports/llama_cpp, finding F3)."""
        if c["drafter"] != "none" and c["k"] + 1 > c["n_batch"]:
            raise EngineError(f"llama-cpp-python aborts (GGML_ASSERT logits != nullptr) when a draft round "
                              f"k + 1 = {c['k'] + 1} exceeds n_batch = {c['n_batch']}; refused before it kills "
                              f"the process (reports/llama_cpp/README.md, F3)")

    def reset(self) -> None:
        for llm in self._llms.values():
            llm.reset()
            dm = getattr(llm, "draft_model", None)
            inner = getattr(dm, "inner", None)
            if hasattr(inner, "reset"):
                inner.reset()
        self._caches = {}
        for key, llm in self._llms.items():
            llm.set_cache(self._cache_for(key))

    def close(self) -> None:
        self._close_llms()
        self._caches = {}
        if self._tmp_cache_dir:
            shutil.rmtree(self._tmp_cache_dir, ignore_errors=True)
            self._tmp_cache_dir = None

    def baseline(self, request: Request) -> Baseline:
        return self._oracle.baseline(request)

    def run(self, requests: Sequence[Request]) -> list[Result]:
        # llama-cpp-python serves one sequence at a time: a batch runs in arrival order.
        return [self._run_one(r) for r in requests]

    # ------------------------------------------------------------------ internals

    def _cache_for(self, key: tuple[str, str | None]):
        scope = "shared" if self.cache_scope == "shared" else key
        if scope not in self._caches:
            sub = None if scope == "shared" else f"{key[0]}-{key[1] or 'base'}"
            self._caches[scope] = self._new_cache(self.config.get("cache", "none"), sub)
        return self._caches[scope]

    def _new_cache(self, kind: str, sub: str | None = None):
        from llama_cpp import LlamaDiskCache, LlamaRAMCache

        if kind == "ram":
            return LlamaRAMCache(capacity_bytes=2 << 30)
        if kind == "disk":
            if self._cache_dir_arg:
                d = self._cache_dir_arg
            else:
                if not self._tmp_cache_dir:
                    self._tmp_cache_dir = tempfile.mkdtemp(prefix="kvparity-llama-cache-")
                d = self._tmp_cache_dir
            if sub:
                d = os.path.join(d, sub)
            cache = LlamaDiskCache(cache_dir=d, capacity_bytes=2 << 30)
            cache.cache.clear()
            return cache
        return None

    def _close_llms(self) -> None:
        for llm in self._llms.values():
            try:
                dm = getattr(llm, "draft_model", None)
                inner = getattr(dm, "inner", None)
                if hasattr(inner, "llm"):
                    versions.close(self.features, inner.llm)
                versions.close(self.features, llm)
            except Exception:  # noqa: BLE001
                pass
        self._llms.clear()

    def _llm(self, identity: Identity):
        key = (identity.revision, identity.adapter)
        if key in self._llms:
            return self._llms[key]
        if f"rev:{identity.revision}" not in self.paths:
            raise UsageError(f"unknown revision {identity.revision!r}")
        if identity.adapter is not None and identity.adapter not in self.adapters:
            raise UsageError(f"unknown or unloadable adapter {identity.adapter!r}")
        from llama_cpp import Llama

        c = self.config
        kv = GGML_TYPE[self.kv_type]
        drafter = None
        if c["drafter"] == "prompt_lookup":
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            drafter = CountingDrafter(LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=c["k"]), c["k"])
        elif c["drafter"] == "draft_model":
            drafter = CountingDrafter(GgufDraftModel(self.paths["draft"], c["k"], self.n_ctx, self.n_threads, kv,
                                                     self.seed, self.features), c["k"])
        elif c["drafter"] == "adversarial":
            drafter = CountingDrafter(AdversarialDrafter(c["k"], 1024, self.seed), c["k"])
        kwargs: dict[str, Any] = {}
        if identity.adapter is not None:
            kwargs["lora_path"] = self.paths[f"lora:{identity.adapter}"]
        kwargs.update(versions.llama_kwargs(self.features, n_batch=c["n_batch"], kv=kv))
        with versions.constructing(self.features, self._llama_cpp, kv=kv):
            llm = Llama(model_path=self.paths[f"rev:{identity.revision}"], n_ctx=self.n_ctx, n_batch=c["n_batch"],
                        n_threads=self.n_threads, n_threads_batch=self.n_threads, logits_all=self.logits_all,
                        seed=self.seed, draft_model=drafter, verbose=False, **kwargs)
        llm.set_cache(self._cache_for(key))
        self._llms[key] = llm
        return llm

    def _run_one(self, req: Request) -> Result:
        from llama_cpp import Llama

        if len(req.prompt) + req.max_tokens > self.n_ctx:
            raise UsageError(f"request {req.id}: prompt + max_tokens exceeds n_ctx={self.n_ctx}")
        try:
            llm = self._llm(req.identity)
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"llama.cpp failed to load {req.identity.label()}: {exc}") from exc
        prompt = list(req.prompt)
        prev_ids = [int(t) for t in llm._input_ids.tolist()]  # the single context slot before this request
        source = "context"
        t0 = time.perf_counter()
        try:
            # --- LlamaRAMCache / LlamaDiskCache lookup, exactly as Llama._create_completion does it
            if llm.cache:
                try:
                    item = llm.cache[prompt]
                    cache_prefix = Llama.longest_token_prefix(item.input_ids.tolist(), prompt)
                    eval_prefix = Llama.longest_token_prefix(llm._input_ids.tolist(), prompt)
                    if cache_prefix > eval_prefix:
                        llm.load_state(item)
                        source = self.config["cache"]
                except KeyError:
                    pass
            observed: list[int] = []
            orig_eval = llm.eval

            def eval_spy(tokens, _orig=orig_eval):
                if not observed:  # the prompt's eval: what is already in context, and how it is chunked
                    observed.append(int(llm.n_tokens))
                    observed.append(-(-len(tokens) // llm.n_batch) if len(tokens) else 0)
                return _orig(tokens)

            llm.eval = eval_spy
            drafter = getattr(llm, "draft_model", None)
            if drafter is not None:
                drafter.calls.clear()
            output: list[int] = []
            finish = "length"
            stop = frozenset(req.stop_ids)
            try:
                for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                    tok = int(tok)
                    output.append(tok)
                    if tok == 2:
                        finish = "eos"
                        break
                    if tok in stop:
                        finish = "stop"
                        break
                    if len(output) >= req.max_tokens:
                        break
            finally:
                del llm.eval
            elapsed = time.perf_counter() - t0
            # top-1/top-2 of the logits each output token was sampled from, and their log-softmax top-k
            # (kept only with logits_all)
            top2 = [] if self.logits_all else None
            topk = [] if self.logits_all else None
            for j in range(len(output) if self.logits_all else 0):
                row = np.asarray(llm.scores[len(prompt) - 1 + j], dtype=np.float64)
                i1, i2 = np.argpartition(-row, 1)[:2]
                if row[i2] > row[i1]:
                    i1, i2 = i2, i1
                top2.append((int(i1), float(row[i1]), int(i2), float(row[i2])))
                topk.append(top_logprobs(row, output[j]))
            if llm.cache:
                with contextlib.redirect_stderr(io.StringIO()):  # LlamaDiskCache prints on every save
                    llm.cache[prompt + output] = llm.save_state()
        except (UsageError, EngineError):
            raise
        except Exception as exc:  # noqa: BLE001
            raise EngineError(f"llama.cpp failed on request {req.id}: {type(exc).__name__}: {exc}") from exc
        cached = observed[0] if observed else 0
        if cached == 0:
            source = "none"
        # llama-cpp-python keeps ONE sequence in context: whatever of the previous context this request did
        # not reuse is dropped (a state loaded from the RAM/disk cache replaces the context wholesale).
        kept = Llama.longest_token_prefix(prev_ids, prompt[:cached]) if source == "context" else 0
        evicted = len(prev_ids) - kept
        proposed = accepted = None
        if drafter is not None:
            proposed, accepted = _accepted(len(prompt), output, drafter.calls)
        return Result(
            request_id=req.id, output=tuple(output), finish_reason=finish, cached_tokens=cached,
            draft_proposed=proposed, draft_accepted=accepted, top2=None if top2 is None else tuple(top2),
            logprobs=None if topk is None else tuple(topk),
            timings={"wall_s": elapsed}, evictions=evicted, prefill_chunks=observed[1] if observed else 0,
            extra={"cached_source": source, "prompt_tokens": len(prompt), "cached_count": "observed (n_tokens at first eval)",
                   **({"draft_counts": "adapter-observed"} if drafter is not None else {}),
                   "config": dict(self.config)},
        )
