"""kvparity adapter for Hugging Face transformers (CPU), driving the real library on the shipped checkpoints.

Modes (engine argument `mode`; the config space is every mode, or the subset `modes=a,b`):
  generate        plain `generate`: the engine's own baseline
  assisted        assisted generation with tiny-draft as the assistant (k = `num_assistant_tokens`)
  adversarial     assisted generation with an assistant that always proposes the draft's *least* likely token
  prompt_lookup   n-gram prompt lookup decoding (k = `prompt_lookup_num_tokens`)
  batch           `generate_batch`: continuous batching over a paged cache with block sharing (prefix reuse)

transformers reports neither prefix hits nor draft acceptance, so the adapter *observes* them by wrapping two
library methods for the duration of a call: `PagedAttentionCache.search_prefix_match` (tokens served from
shared blocks) and `AssistedCandidateGenerator.update_candidate_strategy` (matches per verification).
Top-2 logits come from `output_logits`. Both sides compute in float64 by default (`dtype=float32` is
available), so the tolerance tau is 0 unless float32 is chosen.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Mapping, Sequence

import torch

from adapters.engine_args import choice_arg, int_arg, list_arg
from adapters.reference_oracle import ReferenceOracle
from conformance.contract import Baseline, Capabilities, EngineError, Request, Result, UsageError
from reference_engine import checkpoints

MODES = ("generate", "assisted", "adversarial", "prompt_lookup", "batch")
FLOAT32_TOLERANCE = 1e-4



class TransformersAdapter:
    """The Engine contract over `transformers.LlamaForCausalLM`."""

    def __init__(self, mode: str = "generate", k: str | int = 3, page_size: str | int = 16,
                 num_blocks: str | int = 64, dtype: str = "float64", modes: str = ",".join(MODES)):
        try:
            import transformers
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise UsageError("the transformers adapter needs `pip install kvparity[hf]`") from e
        self._tf = transformers
        self.dtype = getattr(torch, choice_arg("dtype", dtype, ("float64", "float32")))
        self.modes = tuple(list_arg(modes))
        if not self.modes or set(self.modes) - set(MODES):
            raise UsageError(f"engine argument modes={modes!r}: a comma-separated subset of {', '.join(MODES)}")
        self.defaults = {"mode": mode, "k": int_arg("k", k), "page_size": int_arg("page_size", page_size),
                         "num_blocks": int_arg("num_blocks", num_blocks, lo=4)}
        self._models: dict[str, Any] = {}
        self._oracle = ReferenceOracle()
        self.configure({})

    # -- contract ---------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Claims cover every mode of `config_space` (the vacuity guard then asks that each claimed
        capability was exercised somewhere in the run). Per result, a count the current mode does not
        observe is None: prefix hits only in `batch` mode, drafts only in the speculative modes."""
        return Capabilities(
            name="transformers",
            version=self._tf.__version__,
            vocab_size=1024,
            max_context=1024,
            eos_id=2,
            block_size=self.config["page_size"],
            prefix_caching="batch" in self.modes,
            reports_cached_tokens="batch" in self.modes,
            speculation=bool({"assisted", "adversarial", "prompt_lookup"} & set(self.modes)),
            reports_drafts=bool({"assisted", "adversarial", "prompt_lookup"} & set(self.modes)),
            top2_logits=True,
            identities=frozenset({"revision"}),
            revisions=tuple(sorted(checkpoints.REVISIONS)),
            baseline_mode=True,
            tolerance=0.0 if self.dtype == torch.float64 else FLOAT32_TOLERANCE,
            config_space={"mode": self.modes, "k": (1, 3, 5)},
            # `mode` switches the whole generation path (plain, assisted, lookup, continuous batching),
            # so a difference in it is judged as scheduling, as it was before roles were declared.
            knob_roles={"mode": "schedule", "k": "speculation"},
            min_hit_prompt=self.config["page_size"] + 1,
        )

    def configure(self, config: Mapping[str, Any]) -> None:
        unknown = set(config) - set(self.defaults)
        if unknown:
            raise UsageError(f"unknown transformers config {sorted(unknown)}; known: {sorted(self.defaults)}")
        merged = {**self.defaults, **config}
        merged["mode"] = choice_arg("mode", merged["mode"], MODES)
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
        """The reference model's plain greedy decoding in float64 on the same checkpoint."""
        return self._oracle.baseline(request)

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
    def _model(self, revision: str):
        key = f"target-{revision}"
        if key not in self._models:
            self._models[key] = self._tf.LlamaForCausalLM.from_pretrained(
                checkpoints.revision_dir(revision), dtype=self.dtype).eval()
        return self._models[key]

    def _assistant(self, adversarial: bool):
        key = "adversarial" if adversarial else "draft"
        if key not in self._models:
            model = self._tf.LlamaForCausalLM.from_pretrained(
                checkpoints.CHECKPOINTS / checkpoints.DRAFT, dtype=self.dtype).eval()
            if adversarial:  # propose the draft's least likely token: wrong at every position
                with torch.no_grad():
                    model.lm_head.weight.neg_()
            self._models[key] = model
        return self._models[key]

    def _run_one(self, r: Request) -> Result:
        mode, k = self.config["mode"], self.config["k"]
        kwargs: dict[str, Any] = {}
        if mode in ("assisted", "adversarial"):
            kwargs = dict(assistant_model=self._assistant(mode == "adversarial"), num_assistant_tokens=k,
                          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        elif mode == "prompt_lookup":
            kwargs = dict(prompt_lookup_num_tokens=k)
        ids = torch.tensor([list(r.prompt)])
        counts = {"proposed": 0, "accepted": 0, "verifications": 0}
        start = time.perf_counter()
        with torch.no_grad(), _count_drafts(self._tf, counts):
            out = self._model(r.identity.revision).generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_tokens, do_sample=False,
                eos_token_id=[2, *r.stop_ids], pad_token_id=0, output_logits=True,
                return_dict_in_generate=True, **kwargs)
        elapsed = time.perf_counter() - start
        output = out.sequences[0, ids.shape[1]:].tolist()
        top2 = []
        for logits in out.logits[: len(output)]:
            values, idx = logits[0].double().topk(2)
            top2.append((int(idx[0]), float(values[0]), int(idx[1]), float(values[1])))
        speculating = mode != "generate"
        return Result(
            request_id=r.id, output=output, finish_reason=_finish(output, r),
            draft_proposed=counts["proposed"] if speculating else None,
            draft_accepted=counts["accepted"] if speculating else None,
            top2=tuple(top2), timings={"total_s": elapsed},
            extra={"verifications": counts["verifications"]},
        )

    def _run_batch(self, requests: Sequence[Request]) -> list[Result]:
        """One `generate_batch` call per (revision, max_tokens, stop ids) group, arrival order kept.
        The manager persists between calls (`persistent_manager=True`), so blocks shared by earlier
        batches can serve later ones. transformers 5.24 then keeps the *first* call's eos ids for every
        later call (reports/transformers/README.md): the suite's parity check catches it."""
        gc_cls = self._tf.GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        results: dict[str, Result] = {}
        groups: dict[tuple, list[Request]] = {}
        for r in requests:
            groups.setdefault((r.identity.revision, r.max_tokens, r.stop_ids), []).append(r)
        for (revision, max_tokens, stop_ids), group in groups.items():
            model = self._model(revision)  # each model keeps its own persistent manager (and cache)
            gen = gc_cls(max_new_tokens=max_tokens, do_sample=False, eos_token_id=[2, *stop_ids], pad_token_id=0)
            cb = ContinuousBatchingConfig(page_size=self.config["page_size"], num_blocks=self.config["num_blocks"],
                                          max_batch_tokens=64, allow_block_sharing=True)
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
                                       finish_reason=_finish(o.generated_tokens, r),
                                       cached_tokens=hits.get(o.request_id, 0), timings={"batch_s": elapsed})
        return [results[r.id] for r in requests]


def _finish(output: list[int], r: Request) -> str:
    if output and output[-1] == 2:
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
            counts["accepted"] += int(num_matches)
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
    """Observe prefix reuse: the paged cache says how many prompt tokens it served from shared blocks."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    original = PagedAttentionCache.search_prefix_match

    def search(self, request_id, prompt_ids):
        n = original(self, request_id, prompt_ids)
        hits[request_id] = hits.get(request_id, 0) + n
        return n

    PagedAttentionCache.search_prefix_match = search
    try:
        yield
    finally:
        PagedAttentionCache.search_prefix_match = original
