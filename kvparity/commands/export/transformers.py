"""Reproducers for Hugging Face transformers: `AutoModelForCausalLM.generate` (plain, assisted with tiny-draft
or an always-wrong assistant, prompt lookup) and `generate_batch` (continuous batching with block sharing
and a persistent manager), configured as adapters/transformers.py configures them.

transformers reports no prefix hits; like the adapter, the script observes them by wrapping
`PagedAttentionCache.search_prefix_match` for the duration of a `generate_batch` call (the only change it
makes to the library, and only an observation). Draft acceptance is not observed (the adapter's counts
only feed the accounting check, which then has nothing to compare)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Mapping

from conformance.contract import Request, UsageError

NEEDS = "transformers (5.x) and torch, and the shipped checkpoints (tiny-target-a/-b, tiny-draft)"

DRIVER = r'''
# --- the engine: transformers, configured as kvparity's adapters/transformers.py configures it ---
class Driver:
    OPTIONS = [("--checkpoints", {"default": None, "help": "folder holding tiny-target-a, tiny-target-b and "
                                  "tiny-draft (default: the plan's, relative to this script)"})]

    def __init__(self, params, args):
        import torch
        import transformers

        self.torch, self.tf, self.params = torch, transformers, params
        self.folder = args.checkpoints or beside_script(params["checkpoints"])
        self.dtype = getattr(torch, params["dtype"])
        self.models = {}
        self.configure(params["config"])

    def configure(self, config):
        self.config = dict(config)
        self.reset()

    def reset(self):
        """Drop every model's persistent continuous-batching manager: their paged caches are the only
        reusable KV."""
        for model in self.models.values():
            try:
                model.destroy_cached_continuous_batching_manager()
            except Exception:  # noqa: BLE001 - a model that never built one
                pass

    def close(self):
        self.reset()
        self.models.clear()

    def _load(self, key, folder):
        if key not in self.models:
            self.models[key] = self.tf.AutoModelForCausalLM.from_pretrained(
                os.path.join(self.folder, folder), dtype=self.dtype).eval()
        return self.models[key]

    def _assistant(self, adversarial):
        key = "adversarial" if adversarial else "draft"
        if key not in self.models:
            model = self.tf.AutoModelForCausalLM.from_pretrained(
                os.path.join(self.folder, self.params["draft"]), dtype=self.dtype).eval()
            if adversarial:  # propose the draft's least likely token: wrong at every position
                with self.torch.no_grad():
                    model.lm_head.weight.neg_()
            self.models[key] = model
        return self.models[key]

    def _finish(self, output, q):
        if output and output[-1] == self.params["eos_id"]:
            return "eos"
        if output and output[-1] in q["stop_ids"]:
            return "stop"
        return "length"

    def run(self, requests):
        if self.config["mode"] == "batch":
            return self._run_batch(requests)
        return [self._run_one(q) for q in requests]

    def _run_one(self, q):
        mode, k = self.config["mode"], self.config["k"]
        kwargs = {}
        if mode in ("assisted", "adversarial"):
            kwargs = dict(assistant_model=self._assistant(mode == "adversarial"), num_assistant_tokens=k,
                          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        elif mode == "prompt_lookup":
            kwargs = dict(prompt_lookup_num_tokens=k)
        ids = self.torch.tensor([list(q["prompt"])])
        model = self._load("target-" + q["identity"]["revision"], self.params["revisions"][q["identity"]["revision"]])
        with self.torch.no_grad():
            out = model.generate(ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=q["max_tokens"],
                                 do_sample=False, eos_token_id=[self.params["eos_id"], *q["stop_ids"]],
                                 pad_token_id=self.params["pad_id"], output_logits=True, return_dict_in_generate=True, **kwargs)
        output = out.sequences[0, ids.shape[1]:].tolist()
        return {"output": output, "finish_reason": self._finish(output, q), "cached_tokens": None,
                "draft_proposed": None, "draft_accepted": None, "evictions": None}

    def _run_batch(self, requests):
        """One `generate_batch` call per (revision, max_tokens, stop ids) group, arrival order kept; the
        manager persists between calls (`persistent_manager=True`), so blocks shared by earlier batches can
        serve later ones."""
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
        from transformers.generation.continuous_batching.cache import PagedAttentionCache

        results, groups = {}, {}
        for q in requests:
            groups.setdefault((q["identity"]["revision"], q["max_tokens"], tuple(q["stop_ids"])), []).append(q)
        for (revision, max_tokens, stop_ids), group in groups.items():
            model = self._load("target-" + revision, self.params["revisions"][revision])
            gen = self.tf.GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                                           eos_token_id=[self.params["eos_id"], *stop_ids],
                                           pad_token_id=self.params["pad_id"])
            cb = ContinuousBatchingConfig(page_size=self.config["page_size"], num_blocks=self.config["num_blocks"],
                                          max_batch_tokens=64, allow_block_sharing=True)
            hits = {}
            original = PagedAttentionCache.search_prefix_match

            def search(cache, request_id, prompt_ids):  # observe: prompt tokens served from shared blocks
                n = original(cache, request_id, prompt_ids)
                hits[request_id] = hits.get(request_id, 0) + n
                return n

            PagedAttentionCache.search_prefix_match = search
            try:
                out = model.generate_batch([list(q["prompt"]) for q in group], generation_config=gen,
                                           continuous_batching_config=cb, progress_bar=False,
                                           persistent_manager=True, warmup=False)
            finally:
                PagedAttentionCache.search_prefix_match = original
            ordered = sorted(out.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[-1]))
            if len(ordered) != len(group):
                raise RuntimeError(f"generate_batch returned {len(ordered)} results for {len(group)} requests")
            for q, o in zip(group, ordered):
                if o.error:
                    raise RuntimeError(f"generate_batch request {o.request_id}: {o.error}")
                results[q["id"]] = {"output": list(o.generated_tokens),
                                    "finish_reason": self._finish(list(o.generated_tokens), q),
                                    "cached_tokens": hits.get(o.request_id, 0), "draft_proposed": None,
                                    "draft_accepted": None, "evictions": None}
        return [results[q["id"]] for q in requests]
'''

@functools.lru_cache(maxsize=4)
def _adapter(items: tuple[tuple[str, str], ...]):
    """The adapter itself, built once per export (it loads no model until asked): its parsed defaults,
    eos and pad ids, and its oracle are exactly what its runs used."""
    from adapters.transformers import TransformersAdapter

    args = dict(items)
    if args.get("model") or args.get("draft"):
        raise UsageError("model= / draft= are not exported: the reproducer runs the shipped checkpoints")
    try:
        return TransformersAdapter(**args)
    except TypeError as exc:
        raise UsageError(f"transformers engine arguments {args}: {exc}") from None


def _of(args: Mapping[str, str]):
    return _adapter(tuple(sorted(args.items())))


def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
    from reference_engine import checkpoints

    a = _of(args)
    pad = a.info.pad_id if a.info.pad_id is not None else (a.eos or 0)
    return {"dtype": a.dtype_name, "config": dict(a.defaults), "eos_id": a.eos, "pad_id": pad,
            "revisions": dict(checkpoints.REVISIONS), "draft": checkpoints.DRAFT}


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """What `TransformersAdapter.configure` makes of a step's knobs."""
    from adapters.engine_args import choice_arg, int_arg
    from adapters.transformers import MODES

    d = dict(_of(args).defaults)
    unknown = set(config) - set(d)
    if unknown:
        raise UsageError(f"unknown transformers config {sorted(unknown)}; known: {sorted(d)}")
    merged = {**d, **config}
    merged["mode"] = choice_arg("mode", merged["mode"], MODES)
    merged["k"] = int_arg("k", merged["k"])
    return merged


def check_request(args: Mapping[str, str], request: Request) -> None:
    if request.identity.adapter is not None or request.identity.salt is not None:
        raise UsageError(f"request {request.id} ({request.identity.label()}): transformers expresses revisions "
                         f"only (no adapters, no salt)")


def oracle(args: Mapping[str, str], caps: Any):
    """The adapter's own oracle (`oracle=reference`: the reference model's greedy decoding on the same
    checkpoint; `oracle=self`: plain `generate`), as its run had it."""
    return _of(args).baseline, lambda: None


def locate(out: Path) -> dict[str, Any]:
    """Where the script finds the checkpoints: relative to itself, so a committed reproducer keeps working
    in any clone."""
    from reference_engine import checkpoints

    return {"checkpoints": os.path.relpath(checkpoints.CHECKPOINTS, Path(out).resolve().parent)}
