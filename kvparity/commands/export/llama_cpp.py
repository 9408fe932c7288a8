"""Reproducers for llama.cpp through llama-cpp-python: `Llama(model_path=..., draft_model=...)`,
`Llama.generate` with `LlamaRAMCache` / `LlamaDiskCache` set by `set_cache`, and the cache lookup/save glue
of `Llama._create_completion` — as adapters/llama_cpp.py drives it (one `Llama` per identity, one cache
object shared by all of them unless cache_scope=identity; cached tokens observed as `n_tokens` at the
prompt's first `eval`).

The script reads the f32 GGUF files `kvparity export-gguf` writes (names carry the weights digest, so a
stale export is never picked up); the drafters are the adapter's own classes, embedded by source."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from adapters import llama_cpp as adapter  # imports no llama_cpp at module level
from conformance.contract import Request, UsageError

NEEDS = ("llama-cpp-python (0.3.36) and numpy, and f32 GGUF exports of the shipped checkpoints in --gguf-dir\n"
         "(default $KVPARITY_GGUF_DIR, else ~/.cache/kvparity/gguf; `kvparity export-gguf` writes them)")
HELPERS = (adapter._drafter_base, adapter.GgufDraftModel, adapter.AdversarialDrafter)

DRIVER = r'''
# --- the engine: llama-cpp-python, driven as kvparity's adapters/llama_cpp.py drives it ---
import contextlib
import io
import shutil
import tempfile

import numpy as np


class Driver:
    OPTIONS = [("--gguf-dir", {"default": None, "help": "folder with the f32 GGUF exports (default: "
                               "$KVPARITY_GGUF_DIR, else ~/.cache/kvparity/gguf)"})]

    def __init__(self, params, args):
        import llama_cpp  # noqa: F401 - fail now if it is missing

        self.params = params
        self.dir = args.gguf_dir or os.environ.get("KVPARITY_GGUF_DIR") or os.path.expanduser("~/.cache/kvparity/gguf")
        missing = [f for f in params["files"].values() if not os.path.isfile(os.path.join(self.dir, f))]
        if missing:
            raise FileNotFoundError(f"{', '.join(missing)} not in {self.dir} (run `kvparity export-gguf`, or give --gguf-dir)")
        self.llms, self.caches, self.tmp = {}, {}, None
        self.config = {}
        self.configure(params["config"])

    def path(self, key):
        return os.path.join(self.dir, self.params["files"][key])

    def configure(self, config):
        config = dict(config)
        if config["drafter"] != "none" and config["k"] + 1 > config["n_batch"]:
            raise RuntimeError(f"llama-cpp-python aborts (GGML_ASSERT) when k + 1 = {config['k'] + 1} > n_batch = "
                               f"{config['n_batch']}")
        if config == self.config:
            self.reset()
            return
        self._close_llms()
        self.config, self.caches = config, {}

    def reset(self):
        for llm in self.llms.values():
            llm.reset()
            inner = getattr(llm, "draft_model", None)
            if hasattr(inner, "reset"):
                inner.reset()
        self.caches = {}
        for key, llm in self.llms.items():
            llm.set_cache(self._cache_for(key))

    def close(self):
        self._close_llms()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _close_llms(self):
        for llm in self.llms.values():
            inner = getattr(llm, "draft_model", None)
            if hasattr(inner, "llm"):
                inner.llm.close()
            llm.close()
        self.llms.clear()

    def _cache_for(self, key):
        from llama_cpp import LlamaDiskCache, LlamaRAMCache

        scope = "shared" if self.params["cache_scope"] == "shared" else key
        if scope not in self.caches:
            kind = self.config["cache"]
            cache = None
            if kind == "ram":
                cache = LlamaRAMCache(capacity_bytes=2 << 30)
            elif kind == "disk":
                self.tmp = self.tmp or tempfile.mkdtemp(prefix="reproducer-llama-cache-")
                sub = self.tmp if scope == "shared" else os.path.join(self.tmp, f"{key[0]}-{key[1] or 'base'}")
                cache = LlamaDiskCache(cache_dir=sub, capacity_bytes=2 << 30)
                cache.cache.clear()
            self.caches[scope] = cache
        return self.caches[scope]

    def _llm(self, identity):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        key = (identity["revision"], identity["adapter"])
        if key in self.llms:
            return self.llms[key]
        c, p = self.config, self.params
        drafter = None
        if c["drafter"] == "prompt_lookup":
            drafter = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=c["k"])
        elif c["drafter"] == "draft_model":
            drafter = GgufDraftModel(self.path("draft"), c["k"], p["n_ctx"], p["n_threads"], p["kv_type"], p["seed"])
        elif c["drafter"] == "adversarial":
            drafter = AdversarialDrafter(c["k"], 1024, p["seed"])
        kwargs = {"lora_path": self.path("lora:" + identity["adapter"])} if identity["adapter"] else {}
        llm = Llama(model_path=self.path("rev:" + identity["revision"]), n_ctx=p["n_ctx"], n_batch=c["n_batch"],
                    n_ubatch=c["n_batch"], n_threads=p["n_threads"], n_threads_batch=p["n_threads"],
                    type_k=p["kv_type"], type_v=p["kv_type"], logits_all=True, seed=p["seed"], draft_model=drafter,
                    verbose=False, **kwargs)
        llm.set_cache(self._cache_for(key))
        self.llms[key] = llm
        return llm

    def run(self, requests):
        return [self._run_one(q) for q in requests]  # one sequence at a time, in arrival order

    def _run_one(self, q):
        from llama_cpp import Llama

        llm, prompt = self._llm(q["identity"]), list(q["prompt"])
        prev_ids = [int(t) for t in llm._input_ids.tolist()]
        source = "context"
        if llm.cache:  # the lookup of Llama._create_completion
            try:
                item = llm.cache[prompt]
                if Llama.longest_token_prefix(item.input_ids.tolist(), prompt) > Llama.longest_token_prefix(
                        llm._input_ids.tolist(), prompt):
                    llm.load_state(item)
                    source = "cache"
            except KeyError:
                pass
        observed = []
        orig_eval = llm.eval

        def eval_spy(tokens):  # what is already in context when the prompt is evaluated
            if not observed:
                observed.append(int(llm.n_tokens))
            return orig_eval(tokens)

        llm.eval = eval_spy
        output, finish, stop = [], "length", set(q["stop_ids"])
        try:
            for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
                output.append(int(tok))
                if tok == self.params["eos_id"]:
                    finish = "eos"
                    break
                if tok in stop:
                    finish = "stop"
                    break
                if len(output) >= q["max_tokens"]:
                    break
        finally:
            del llm.eval
        if llm.cache:  # the save of Llama._create_completion
            with contextlib.redirect_stderr(io.StringIO()):
                llm.cache[prompt + output] = llm.save_state()
        cached = observed[0] if observed else 0
        kept = Llama.longest_token_prefix(prev_ids, prompt[:cached]) if source == "context" and cached else 0
        return {"output": output, "finish_reason": finish, "cached_tokens": cached, "draft_proposed": None,
                "draft_accepted": None, "evictions": len(prev_ids) - kept}
'''


def _settings(args: Mapping[str, str]) -> dict[str, Any]:
    import inspect

    from adapters.engine_args import choice_arg, int_arg

    sig = {n: p.default for n, p in inspect.signature(adapter.LlamaCppAdapter.__init__).parameters.items() if n != "self"}
    unknown = set(args) - set(sig)
    if unknown:
        raise UsageError(f"unknown llama_cpp engine argument(s) {sorted(unknown)}; known: {', '.join(sig)}")
    m = {**sig, **args}
    config = {"drafter": choice_arg("drafter", m["drafter"], adapter.DRAFTERS), "k": int_arg("k", m["k"]),
              "n_batch": int_arg("n_batch", m["n_batch"]), "cache": choice_arg("cache", m["cache"], adapter.CACHES)}
    return {"n_ctx": int_arg("n_ctx", m["n_ctx"], 16), "kv_type": adapter.GGML_TYPE[choice_arg("kv_type", m["kv_type"],
            tuple(adapter.GGML_TYPE))], "n_threads": int_arg("n_threads", m["n_threads"]),
            "seed": int_arg("seed", m["seed"], 0), "cache_scope": choice_arg("cache_scope", m["cache_scope"],
                                                                             ("shared", "identity")),
            "lora": choice_arg("lora", m["lora"], ("auto", "off")), "config": config}


def _files(lora: bool) -> dict[str, str]:
    """The GGUF file names `kvparity export-gguf` gives the shipped checkpoints (digest-named)."""
    from adapters.gguf_export import _target
    from reference_engine import checkpoints

    root = checkpoints.CHECKPOINTS
    files = {f"rev:{r}": _target(root / f, root / f / "model.safetensors", Path("."))[1].name
             for r, f in checkpoints.REVISIONS.items()}
    if (root / checkpoints.DRAFT).is_dir():
        files["draft"] = _target(root / checkpoints.DRAFT, root / checkpoints.DRAFT / "model.safetensors", Path("."))[1].name
    if lora:
        for name, f in checkpoints.ADAPTERS.items():
            if (root / f / "adapter_model.safetensors").is_file():
                files[f"lora:{name}"] = _target(root / f, root / f / "adapter_model.safetensors", Path("."))[1].name
    return files


def engine_params(args: Mapping[str, str]) -> dict[str, Any]:
    s = _settings(args)
    return {**{k: v for k, v in s.items() if k != "lora"}, "eos_id": 2, "files": _files(s["lora"] == "auto")}


def config_params(args: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, Any]:
    from adapters.engine_args import choice_arg, int_arg

    merged = {**_settings(args)["config"], **dict(config)}
    unknown = set(merged) - set(adapter.KNOBS)
    if unknown:
        raise UsageError(f"unknown llama_cpp knob(s) {sorted(unknown)}; known: {', '.join(adapter.KNOBS)}")
    return {"drafter": choice_arg("drafter", merged["drafter"], adapter.DRAFTERS), "k": int_arg("k", merged["k"]),
            "n_batch": int_arg("n_batch", merged["n_batch"]), "cache": choice_arg("cache", merged["cache"], adapter.CACHES)}


def check_request(args: Mapping[str, str], request: Request) -> None:
    if request.identity.salt is not None:
        raise UsageError(f"request {request.id}: llama-cpp-python has no tenant salt ({request.identity.label()})")
    if request.identity.adapter is not None and _settings(args)["lora"] != "auto":
        raise UsageError(f"request {request.id}: adapter {request.identity.adapter!r} with lora=off")


def oracle(args: Mapping[str, str], caps: Any):
    from adapters.reference_oracle import ReferenceOracle

    return ReferenceOracle(eos_id=2).baseline, lambda: None
