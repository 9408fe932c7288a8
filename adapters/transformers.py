"""kvparity adapter for Hugging Face transformers (CPU), driving the real library on the shipped checkpoints
or on any local checkpoint folder (`model=PATH`; its vocabulary, special ids and context read from it by
adapters.checkpoint_info; `draft=PATH` gives the assisted modes an assistant).

Engine arguments are parsed into the frozen `TransformersArgs` (adapters/transformers_args.py).
Modes (engine argument `mode`; the config space is every mode the installed release has, or the subset
`modes=a,b`; adapters.transformers_versions probes which, from 4.38 on):
  generate        plain `generate`: the engine's own baseline
  assisted        assisted generation with tiny-draft as the assistant (k = `num_assistant_tokens`)
  adversarial     assisted generation with an assistant that always proposes the draft's *least* likely token
  prompt_lookup   n-gram prompt lookup decoding (k = `prompt_lookup_num_tokens`)
  batch           `generate_batch`: continuous batching over a paged cache with block sharing (prefix reuse);
                  a batch with arrivals or aborts mid-flight steps the manager's loop itself
                  (adapters/transformers_timeline.py), declared only when `batch` is the only mode

transformers reports neither prefix hits nor draft acceptance, so the adapter *observes* them by wrapping two
library methods for the duration of a call: `PagedAttentionCache.search_prefix_match` (tokens served from
shared blocks) and `AssistedCandidateGenerator.update_candidate_strategy` (matches per verification).
Top-2 logits come from `output_logits`, and so do the per-position top-k logprobs (`Result.logprobs`,
k = LOGPROBS_K as the reference engine): the raw logits of each output token, log-softmaxed in the dtype
`generate` returns them in (float32: 5.24 upcasts every model's logits, bf16 included), in every mode
whose logits map to output tokens one to one. `batch` mode reports none (`generate_batch` returns no
logits), and a per-verification release whose rows do not cover the output reports none either.

Numerics: `dtype` float64 (default), float32, bfloat16 or float16. The oracle (`oracle=`) is `reference`
(the reference engine's model code on the same checkpoint, in `oracle_dtype` float64 or float32: an
independent ground truth) or `self` (this library's own plain `generate`, one request alone, in the
engine's dtype: for models too big for the reference on a CPU). tau is 0 in float64; otherwise the
declared value below, which `kvparity calibrate` measures and `kvparity run --calibration FILE` replaces.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Mapping, Sequence

import torch

from adapters import checkpoint_info, landmark_search, timeline_driver, transformers_timeline, transformers_versions
from adapters.landmarks import shipped_landmarks
from adapters.engine_args import choice_arg, engine_arguments, parse
from adapters.transformers_args import MODES, TransformersArgs
from adapters.reference_oracle import ReferenceOracle
from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, UsageError
from conformance.knobs import Knob
from reference_engine import checkpoints
from reference_engine.logprobs import LOGPROBS_K, top_logprobs

DRAFT_MODES = ("assisted", "adversarial")
# Declared tau per engine dtype against the float64 reference: the calibrated values committed in
# reports/calibration/ for the shipped family (`kvparity calibrate`), rounded up; re-calibrate for another
# model. float32 was 1e-4 (vLLM/llama.cpp's short-prompt margin error ~1.5e-5) until a calibration reaching
# the context's end measured 1.7e-4 (RoPE angles in float32 at position ~1000); bfloat16 0.2 until the
# same (revisions a and b, long prompts) measured 0.29.
TOLERANCE = {"float64": 0.0, "float32": 2e-4, "bfloat16": 0.3, "float16": 0.03}


class TransformersAdapter:
    """The Engine contract over `transformers.LlamaForCausalLM`."""

    @engine_arguments(TransformersArgs)
    def __init__(self, args: TransformersArgs | None = None, **engine_args: Any):
        """From parsed arguments, or from engine-argument strings (`TransformersAdapter(mode="batch")`)."""
        if args is None:
            args = parse(TransformersArgs, "transformers", engine_args)
        elif engine_args:
            raise UsageError("TransformersAdapter: pass TransformersArgs or engine arguments, not both")
        self.args = args
        try:
            import transformers
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise UsageError("the transformers adapter needs `pip install kvparity[hf]`") from e
        self._tf = transformers
        self.features = transformers_versions.probe(transformers)
        self.dtype_name = args.dtype
        self.dtype = getattr(torch, self.dtype_name)
        # model=PATH: a user's checkpoint, one revision ("a"); else the shipped family (revisions a, b)
        model, draft = args.model, args.draft
        self.model_dir = str(checkpoint_info.read(model).folder) if model else ""
        self.info = checkpoint_info.read(model) if model else checkpoint_info.shipped()
        self.draft_dir = str(checkpoint_info.read(draft).folder) if draft else (
            "" if model else str(checkpoints.CHECKPOINTS / checkpoints.DRAFT))
        self.eos = self.info.eos_id
        released = self.features.modes
        available = tuple(m for m in released if self.draft_dir or m not in DRAFT_MODES)
        self.modes = args.modes or available
        if not self.modes:
            raise UsageError(f"transformers {self.features.version} runs none of {', '.join(MODES)} here")
        if set(self.modes) - set(released):
            raise UsageError(f"modes {', '.join(sorted(set(self.modes) - set(released)))}: transformers "
                             f"{self.features.version} cannot run them (it runs {', '.join(released)})")
        if set(self.modes) - set(available):
            raise UsageError(f"modes {', '.join(sorted(set(self.modes) - set(available)))} need an assistant: "
                             f"engine argument draft=PATH (a checkpoint with the same tokenizer)")
        self.defaults = {"mode": args.mode, "k": args.k, "page_size": args.page_size, "num_blocks": args.num_blocks}
        self.oracle = args.oracle
        self._models: dict[str, Any] = {}
        self._oracle = ReferenceOracle(self.eos, self.model_dir or None, args.oracle_dtype)
        if self.oracle == "reference":
            self._oracle.check_loadable()
        self._timeline = transformers_timeline.supported()
        self.configure({})
        self.landmarks = self._landmarks(args.landmark_budget)

    # -- contract ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Claims cover every mode of `config_space` (the vacuity guard then asks that each claimed
        capability was exercised somewhere in the run). Per result, a count the current mode does not
        observe is None: prefix hits only in `batch` mode, drafts only in the speculative modes."""
        return Capabilities(
            name="transformers",
            version=self._tf.__version__,
            vocab_size=self.info.vocab_size,
            max_context=self.info.max_context,
            eos_id=self.eos,
            block_size=self.config["page_size"],
            prefix_caching="batch" in self.modes,
            reports_cached_tokens="batch" in self.modes,
            speculation=bool({"assisted", "adversarial", "prompt_lookup"} & set(self.modes)),
            reports_drafts=bool({"assisted", "adversarial", "prompt_lookup"} & set(self.modes)),
            top2_logits=True,
            logprobs_k=LOGPROBS_K if set(self.modes) - {"batch"} else 0,
            identities=frozenset() if self.model_dir else frozenset({"revision"}),
            revisions=("a",) if self.model_dir else tuple(sorted(checkpoints.REVISIONS)),
            baseline_mode=True,
            tolerance=TOLERANCE[self.dtype_name],
            oracle=self._oracle.label if self.oracle == "reference" else f"self (generate, {self.dtype_name})",
            # `mode` switches the whole generation path (plain, assisted, lookup, continuous batching),
            # so a difference in it is judged as scheduling, as it was before roles were declared.
            knobs=(Knob("mode", self.modes, "schedule"), Knob("k", (1, 3, 5), "speculation")),
            min_hit_prompt=self.config["page_size"] + 1,
            landmarks=self.landmarks,
            # arrivals and cancellations mid-flight, step by step (adapters/transformers_timeline.py): only
            # continuous batching has steps to place them between, so only a batch-mode-only run declares it
            timeline=frozenset({"arrival", "abort"}) if self.modes == ("batch",) and self._timeline else frozenset(),
        )

    def configure(self, config: Mapping[str, Any]) -> None:
        unknown = set(config) - set(self.defaults)
        if unknown:
            raise UsageError(f"unknown transformers config {sorted(unknown)}; known: {sorted(self.defaults)}")
        merged = {**self.defaults, **config}
        merged["mode"] = choice_arg("mode", merged["mode"], MODES)
        if merged["mode"] not in self.features.modes:
            raise UsageError(f"mode {merged['mode']}: transformers {self.features.version} cannot run it "
                             f"(it runs {', '.join(self.features.modes)})")
        self.config = merged
        self.reset()

    def reset(self) -> None:
        """Drop every model's persistent continuous-batching manager: their paged caches are the only
        reusable KV."""
        for model in self._models.values():
            with contextlib.suppress(Exception):
                model.destroy_cached_continuous_batching_manager()

    def close(self) -> None:
        self.reset()
        self._models.clear()

    def baseline(self, request: Request) -> Baseline:
        """Plain greedy decoding of `request`: the reference model's on the same checkpoint
        (`oracle=reference`), or this library's own plain `generate`, alone, no cache, no assistant
        (`oracle=self`), margins from its own logits."""
        if self.oracle == "reference":
            return self._oracle.baseline(request)
        return self.plain([request])[0]

    def plain(self, requests: Sequence[Request]) -> list[Baseline]:
        """Plain `generate` of `requests` as ONE left-padded batch per revision (one request: the engine's
        own plain mode). `kvparity calibrate` runs the same request alone and in batches of others, at
        every position, to measure how much batch composition alone moves this engine's logits. A model
        holds one set of weights, so requests under different revisions cannot share a forward pass: each
        revision's requests form their own batch, in their order (decoding them all under the first
        one's revision made a calibration mixing revisions measure other weights as "batch noise")."""
        if len({r.stop_ids for r in requests}) != 1:
            raise UsageError("plain(): the requests of one batch must share their stop ids")
        by_revision: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            by_revision.setdefault(r.identity.revision, []).append(i)
        out: dict[int, Baseline] = {}
        for revision, indices in by_revision.items():
            out.update(zip(indices, self._plain_batch([requests[i] for i in indices])))
        return [out[i] for i in range(len(requests))]

    def _plain_batch(self, requests: Sequence[Request]) -> list[Baseline]:
        """Plain `generate` of requests under one revision as one left-padded batch."""
        prompts = [list(r.prompt) for r in requests]
        width = max(len(p) for p in prompts)
        pad = self.info.pad_id if self.info.pad_id is not None else (self.eos or 0)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        longest = max(r.max_tokens for r in requests)
        with torch.no_grad():
            out = self._model(requests[0].identity.revision).generate(
                ids, attention_mask=mask, max_new_tokens=longest, do_sample=False,
                eos_token_id=self._eos_ids(requests[0].stop_ids),
                pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
        baselines = []
        for row, r in enumerate(requests):
            output, margins, runner_up, lps = [], [], [], []
            for step in range(min(r.max_tokens, len(out.logits))):
                values, idx = out.logits[step][row].double().topk(2)
                output.append(int(out.sequences[row, width + step]))
                margins.append(float(values[0] - values[1]))
                runner_up.append(int(idx[1]))
                lps.append(top_logprobs(out.logits[step][row], chosen=output[-1]))
                if self.eos is not None and output[-1] == self.eos or output[-1] in r.stop_ids:
                    break
            baselines.append(Baseline(output, _finish(output, r, self.eos), margins, runner_up, logprobs=lps))
        return baselines

    def run(self, requests: Sequence[Request]) -> list[Result]:
        for r in requests:
            if r.identity.adapter is not None or r.identity.salt is not None:
                raise UsageError("the transformers adapter expresses revisions only (no adapters, no salt)")
        try:
            if self.config["mode"] == "batch":
                return self._run_batch(requests)
            return [self._run_one(r) for r in requests]
        except UsageError:
            raise
        except Exception as e:
            raise EngineError(f"transformers {self.config['mode']}: {type(e).__name__}: {e}".splitlines()[0]) from e

    # -- helpers ----------------------------------------------------------------------------------
    def _landmarks(self, budget: float | None):
        """The shipped family's tables; for model=PATH, those found by the bounded search on it
        (adapters/landmark_search.py, cached per checkpoint digest), run on the oracle's model."""
        budget_s = landmark_search.DEFAULT_BUDGET_S if budget is None else budget
        if not self.model_dir:
            return shipped_landmarks()

        def oracle_model():
            if self.oracle == "reference":
                return landmark_search.reference_logits(self._oracle._model("a", None))
            return landmark_search.hf_logits(self._model("a"))

        skip = [i for i in (self.info.bos_id, self.info.pad_id) if i is not None]
        return landmark_search.discover(self.model_dir, self.info.vocab_size, self.eos, oracle_model,
                                        budget_s, exclude=skip)

    def _model(self, revision: str):
        key = f"target-{revision}"
        if key not in self._models:
            folder = self.model_dir or checkpoints.revision_dir(revision)
            self._models[key] = self._tf.AutoModelForCausalLM.from_pretrained(
                folder, **transformers_versions.load_kwargs(self.features, self.dtype)).eval()
        return self._models[key]

    def _eos_ids(self, stop_ids: Sequence[int]) -> list[int]:
        """Generation stops at the suite's eos (one id) and the request's stop ids, nothing else: a
        generation_config.json naming more eos ids does not apply (the oracle knows one)."""
        return ([] if self.eos is None else [self.eos]) + list(stop_ids)

    def _assistant(self, adversarial: bool):
        key = "adversarial" if adversarial else "draft"
        if key not in self._models:
            model = self._tf.AutoModelForCausalLM.from_pretrained(
                self.draft_dir, **transformers_versions.load_kwargs(self.features, self.dtype)).eval()
            if adversarial:  # propose the draft's least likely token: wrong at every position
                with torch.no_grad():
                    model.lm_head.weight.neg_()
            self._models[key] = model
        return self._models[key]

    def _pad(self) -> int:
        return self.info.pad_id if self.info.pad_id is not None else (self.eos or 0)

    def _run_one(self, r: Request) -> Result:
        mode, k = self.config["mode"], self.config["k"]
        kwargs: dict[str, Any] = {}
        if mode in ("assisted", "adversarial"):
            assistant = self._assistant(mode == "adversarial")
            transformers_versions.configure_assistant(self.features, assistant, k)
            kwargs = dict(assistant_model=assistant)
        elif mode == "prompt_lookup":
            kwargs = dict(prompt_lookup_num_tokens=k)
        ids = torch.tensor([list(r.prompt)])
        counts: dict[str, Any] = {"proposed": 0, "accepted": 0, "verifications": 0, "matches": []}
        start = time.perf_counter()
        with torch.no_grad(), _count_drafts(self._tf, counts):
            out = self._model(r.identity.revision).generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_tokens, do_sample=False,
                eos_token_id=self._eos_ids(r.stop_ids), pad_token_id=self._pad(), output_logits=True,
                return_dict_in_generate=True, **kwargs)
        elapsed = time.perf_counter() - start
        output = out.sequences[0, ids.shape[1]:].tolist()
        rows = transformers_versions.per_token_logits(out.logits, counts["matches"])[: len(output)]
        top2 = []
        for logits in rows:
            values, idx = logits[0].double().topk(2)
            top2.append((int(idx[0]), float(values[0]), int(idx[1]), float(values[1])))
        speculating = mode != "generate"
        return Result(
            request_id=r.id, output=output, finish_reason=_finish(output, r, self.eos),
            draft_proposed=counts["proposed"] if speculating else None,
            draft_accepted=counts["accepted"] if speculating else None,
            top2=tuple(top2), timings={"total_s": elapsed},
            extra={"verifications": counts["verifications"]}, logprobs=_logprobs(rows, output),
        )

    def _run_batch(self, requests: Sequence[Request]) -> list[Result]:
        """One `generate_batch` call per (revision, max_tokens, stop ids) group, arrival order kept.
        The manager persists between calls (`persistent_manager=True`), so blocks shared by earlier
        batches can serve later ones. transformers 5.24 then keeps the *first* call's eos ids for every
        later call (reports/transformers/README.md): the suite's parity check catches it."""
        gc_cls = self._tf.GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        if timeline_driver.has_timeline(requests):
            return self._run_timeline(requests, gc_cls, ContinuousBatchingConfig)
        results: dict[str, Result] = {}
        groups: dict[tuple, list[Request]] = {}
        for r in requests:
            groups.setdefault((r.identity.revision, r.max_tokens, r.stop_ids), []).append(r)
        for (revision, max_tokens, stop_ids), group in groups.items():
            model = self._model(revision)  # each model keeps its own persistent manager (and cache)
            gen = gc_cls(max_new_tokens=max_tokens, do_sample=False, eos_token_id=self._eos_ids(stop_ids),
                         pad_token_id=self._pad())
            cb = self._batching_config(ContinuousBatchingConfig)
            hits: dict[str, int] = {}
            start = time.perf_counter()
            with count_prefix_hits(hits):
                out = model.generate_batch([list(r.prompt) for r in group], generation_config=gen,
                                           continuous_batching_config=cb, progress_bar=False,
                                           persistent_manager=True, warmup=False)
            elapsed = time.perf_counter() - start
            ordered = sorted(out.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[-1]))
            if len(ordered) != len(group):
                raise EngineError(f"generate_batch returned {len(ordered)} results for {len(group)} requests")
            for r, o in zip(group, ordered):
                if o.error:
                    raise EngineError(f"generate_batch request {o.request_id}: {o.error}")
                results[r.id] = Result(request_id=r.id, output=o.generated_tokens,
                                       finish_reason=_finish(o.generated_tokens, r, self.eos),
                                       cached_tokens=hits.get(o.request_id, 0), timings={"batch_s": elapsed})
        return [results[r.id] for r in requests]

    def _batching_config(self, cb_cls: Any) -> Any:
        """The continuous-batching configuration of both batch paths: this run's pages, prefix sharing on."""
        return cb_cls(**transformers_versions.batching_config_kwargs(self.features, self.config["page_size"]),
                      num_blocks=self.config["num_blocks"], max_batch_tokens=64, allow_block_sharing=True)

    def _run_timeline(self, requests: Sequence[Request], gc_cls: Any, cb_cls: Any) -> list[Result]:
        """A batch with arrivals or cancellations mid-flight: one manager loop per revision, stepped here
        (adapters/transformers_timeline.py); max tokens and stop ids go with each request."""
        if not self._timeline:
            raise UsageError(f"transformers {self.features.version}: no mid-flight arrivals or aborts here")
        results: dict[str, Result] = {}
        parts: dict[str, list[Request]] = {}
        for r in requests:
            parts.setdefault(r.identity.revision, []).append(r)
        for revision, part in parts.items():
            model = self._model(revision)
            gen = gc_cls(max_new_tokens=max(r.max_tokens for r in part), do_sample=False,
                         eos_token_id=self._eos_ids(()), pad_token_id=self._pad())
            cb = self._batching_config(cb_cls)
            hits: dict[str, int] = {}
            start = time.perf_counter()
            with count_prefix_hits(hits):
                stepped = transformers_timeline.run_timeline(model, gen, cb, part,
                                                             [self._eos_ids(r.stop_ids) for r in part])
            elapsed = time.perf_counter() - start
            for r, s in zip(part, stepped):
                output = s.output or []
                finish = "abort" if s.aborted else _finish(output, r, self.eos)
                results[r.id] = Result(
                    request_id=r.id, output=output, finish_reason=finish,
                    cached_tokens=hits.get(s.request_id, 0), timings={"batch_s": elapsed},
                    arrived_at_step=s.arrived_at_step, ended_at_step=s.ended_at_step)
        return [results[r.id] for r in requests]


def _logprobs(rows: Sequence[torch.Tensor], output: Sequence[int]) -> tuple | None:
    """Per output token, the top-k (token, logprob) of its `[1, vocab]` logits row plus the token chosen
    there; None unless the rows cover the output exactly (a release recording assisted generation per
    verification maps rows to tokens by the observed acceptances: where they do not add up, no logprobs
    rather than a guess that would pair a token with another position's distribution)."""
    if len(rows) != len(output):
        return None
    return tuple(top_logprobs(row[0], chosen=token) for row, token in zip(rows, output))


def _finish(output: list[int], r: Request, eos: int | None) -> str:
    if output and eos is not None and output[-1] == eos:
        return "eos"
    if output and output[-1] in r.stop_ids:
        return "stop"
    return "length"


@contextlib.contextmanager
def _count_drafts(tf, counts: dict[str, int]):
    """Observe speculation: every candidate generator reports `num_matches` per verification."""
    from transformers.generation import candidate_generator as cg

    patched = []
    for cls in (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator):
        original_get = cls.get_candidates
        original_update = cls.update_candidate_strategy

        def get_candidates(self, input_ids, *a, __orig=original_get, **kw):
            candidates, logits = __orig(self, input_ids, *a, **kw)
            self._kvparity_proposed = candidates.shape[-1] - input_ids.shape[-1]
            return candidates, logits

        def update(self, input_ids, scores, num_matches, *a, __orig=original_update, **kw):
            counts["verifications"] += 1
            counts["proposed"] += getattr(self, "_kvparity_proposed", 0)
            # -1 where a verification had no candidate and the sequence already met a stop criterion
            # (a prompt ending in a stop id): nothing was accepted, and nothing was output
            counts["accepted"] += max(int(num_matches), 0)
            counts["matches"].append(int(num_matches))
            return __orig(self, input_ids, scores, num_matches, *a, **kw)

        patched.append((cls, original_get, original_update))
        cls.get_candidates, cls.update_candidate_strategy = get_candidates, update
    try:
        yield
    finally:
        for cls, g, u in patched:
            cls.get_candidates, cls.update_candidate_strategy = g, u


@contextlib.contextmanager
def count_prefix_hits(hits: dict[str, int]):
    """Observe prefix reuse: the paged cache says how many prompt tokens it matched in shared blocks.

    What the engine serves from them is at most the prompt less its last token: 5.19+ never matches the
    whole prompt, while earlier releases with batch mode return a match of every block (a prompt of whole blocks matches whole)
    and their scheduler then keeps the last token to prefill ("we keep at least 1 token to start
    decoding"). Counting the raw match there reported a hit covering the whole prompt (a false
    prefix_only failure on 5.14.0), so the count is capped the way both schedulers cap it."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    original = PagedAttentionCache.search_prefix_match

    def search(self, request_id, prompt_ids):
        n = original(self, request_id, prompt_ids)
        hits[request_id] = hits.get(request_id, 0) + max(0, min(n, len(prompt_ids) - 1))
        return n

    PagedAttentionCache.search_prefix_match = search
    try:
        yield
    finally:
        PagedAttentionCache.search_prefix_match = original
