"""Direct llama-cpp-python probes behind the findings in reports/llama_cpp/README.md (no kvparity runner).

  python -m adapters.probes.llama_cpp cache-cross-revision [--disk] [--n 50]
      Two Llama objects (revision a, revision b of the same architecture) share ONE LlamaRAMCache /
      LlamaDiskCache, as every model configured with cache_type=disk in llama_cpp.server shares the
      default directory .cache/llama_cache. Only llama-cpp-python's own `create_completion` is used
      (token-id prompts, temperature 0). For each prompt P: revision a completes P, then revision b
      completes P + [11]. Counted: how often b's text differs from b's text with no cache.
  python -m adapters.probes.llama_cpp server-disk-cache
      The same through llama_cpp.server itself: serve revision a with --cache true --cache_type disk,
      send a text prompt, stop; serve revision b from the same working directory (a weight update /
      model swap), send the prompt plus a suffix; compare with revision b served with no cache.
  python -m adapters.probes.llama_cpp spec-crash
      Speculative decoding (`Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))`) in a child
      process per case: (F2) default logits_all, n_ctx 1024 > n_batch 512, a 600-token prompt -> ValueError
      in Llama.eval (the scores buffer is sized from the constructor's logits_all=False, n_batch rows,
      although draft_model forces logits for every token); (F3) logits_all=True, n_batch 8 < k + 1 ->
      GGML_ASSERT(logits != nullptr) in llama-sampler.cpp and SIGABRT. Controls with n_batch 512.
  python -m adapters.probes.llama_cpp server-text-parity [--n 50]
      llama_cpp.server through adapters/openai_http/ (serve=llama_cpp, text prompts): held-out prompts,
      16 tokens each, compared with the reference baseline of the tokens the server actually receives
      (encode(decode(prompt)) with the shipped tokenizer; llama.cpp's tokenizer on our GGUF equals it),
      once as a plain OpenAI request and once adding llama-cpp-python's `repeat_penalty: 1.0` (F5).
      Also counts prompts whose token ids do not survive decode -> encode (text is not token-exact).
  python -m adapters.probes.llama_cpp spec-logits-all [--n 50]
      `Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4))` with the constructor's default
      logits_all=False, greedy, vs the float64 reference; then the same with logits_all=True. On 0.2.38/0.2.39
      the context computes logits for the last token of each eval only, and `sample(idx)` reads the
      never-written rows of the scores buffer for the draft positions (fixed in 0.2.40 by forcing
      logits_all=True whenever a draft model is given). Works on every release from 0.2.38 on.
  python -m adapters.probes.llama_cpp f16-kv [--n 50]
      Greedy divergences of llama.cpp with f16 KV (type_k=type_v=1) vs the float64 reference, with the
      baseline margin at each divergence (f32 KV for comparison).

Prints one JSON object of figures. Needs llama-cpp-python and gguf (pip install 'kvparity[llamacpp]').
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from adapters.gguf_export import export_gguf
from adapters.openai_http import free_port
from reference_engine import checkpoints
from reference_engine.baseline import greedy
from reference_engine.training.measure import prompts


def _llama(rev: str, kv: int = 0, **kw):
    """A Llama on revision `rev` with KV type `kv`, through adapters/llama_cpp_versions (0.2.3x has no
    type_k/type_v keywords and silently swallows them)."""
    import llama_cpp
    from llama_cpp import Llama

    from adapters import llama_cpp_versions as versions

    try:
        from llama_cpp import llama_speculative
    except ImportError:
        llama_speculative = None
    features = versions.probe(llama_cpp, llama_speculative)
    args = dict(n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False, seed=0)
    args.update(kw)
    args.update(versions.llama_kwargs(features, n_batch=int(args.get("n_batch", 512)), kv=kv))
    with versions.constructing(features, llama_cpp, kv=kv):
        return Llama(model_path=str(export_gguf(checkpoints.REVISIONS[rev])), **args)


def _complete(llm, prompt, n=16) -> str:
    with contextlib.redirect_stderr(io.StringIO()):  # LlamaDiskCache prints on every save
        out = llm.create_completion(list(prompt), max_tokens=n, temperature=0.0, top_k=1, repeat_penalty=1.0)
    return out["choices"][0]["text"]


def cache_cross_revision(n: int, disk: bool) -> dict:
    from llama_cpp import LlamaDiskCache, LlamaRAMCache

    batch = prompts(n)
    fresh_b = _llama("b")
    expected = []
    for p in batch:
        fresh_b.reset()
        expected.append(_complete(fresh_b, p + [11]))
    del fresh_b  # 0.2.3x-0.2.40 have no Llama.close(); dropping the last reference frees it on every release
    tmp = tempfile.mkdtemp(prefix="llama-cache-")
    cache = LlamaDiskCache(cache_dir=tmp) if disk else LlamaRAMCache()
    a, b = _llama("a"), _llama("b")
    a.set_cache(cache)
    b.set_cache(cache)
    changed = []
    for i, p in enumerate(batch):
        _complete(a, p)
        got = _complete(b, p + [11])
        if got != expected[i]:
            changed.append({"prompt_index": i, "expected": expected[i], "got": got})
    return {"probe": "cache-cross-revision", "cache": "LlamaDiskCache" if disk else "LlamaRAMCache",
            "prompts": n, "outputs_changed": len(changed), "examples": changed[:3]}


def _serve_and_complete(rev: str, cwd: str, cache: bool, texts: list[str]) -> list[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(export_gguf(checkpoints.REVISIONS[rev])),
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--type_k", "0", "--type_v", "0",
           "--n_threads", "1"]
    if cache:
        cmd += ["--cache", "true", "--cache_type", "disk"]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("llama_cpp.server did not start")
                time.sleep(0.5)
        outs = []
        for t in texts:
            body = json.dumps({"prompt": t, "max_tokens": 16, "temperature": 0.0, "top_k": 1,
                               "repeat_penalty": 1.0}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            outs.append(json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"])
        return outs
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def server_disk_cache(n: int) -> dict:
    tok = checkpoints.load_tokenizer()
    batch = [tok.decode(p) for p in prompts(n)]
    suffixed = [t + " the" for t in batch]
    clean = tempfile.mkdtemp(prefix="srv-clean-")
    expected = _serve_and_complete("b", clean, False, suffixed)
    # control: revision b with its own disk cache (same suffixed prompts, after the unsuffixed ones)
    own = tempfile.mkdtemp(prefix="srv-own-")
    _serve_and_complete("b", own, True, batch)
    control = _serve_and_complete("b", own, True, suffixed)
    shared = tempfile.mkdtemp(prefix="srv-shared-")
    _serve_and_complete("a", shared, True, batch)          # revision a fills .cache/llama_cache
    got = _serve_and_complete("b", shared, True, suffixed)  # revision b, same working directory
    changed = [{"prompt_index": i, "expected": e, "got": g} for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    control_changed = sum(e != c for e, c in zip(expected, control))
    return {"probe": "server-disk-cache", "prompts": n, "outputs_changed": len(changed),
            "control_own_cache_changed": control_changed, "examples": changed[:3]}


def kv_dtype(n: int) -> dict:
    model = checkpoints.load_target("a")
    res = {}
    for name, t in (("f32", 0), ("f16", 1)):
        llm = _llama("a", kv=t)
        div = []
        for i, p in enumerate(prompts(n)):
            base = greedy(model, p, 24, eos_id=2)
            llm.reset()
            out = []
            for tok in llm.generate(list(p), temp=0.0, top_k=1, repeat_penalty=1.0):
                out.append(int(tok))
                if tok == 2 or len(out) >= 24:
                    break
            pos = next((j for j, (x, y) in enumerate(zip(base.output, out)) if x != y), None)
            if pos is not None:
                div.append({"prompt_index": i, "position": pos, "baseline_margin": round(base.margins[pos], 6),
                            "engine_took_runner_up": base.runner_up[pos] == out[pos]})
        res[name] = {"prompts": n, "divergent": len(div), "divergences": div}
    return {"probe": "kv-dtype", **res}


def spec_logits_all(n: int) -> dict:
    """Prompt-lookup speculative decoding, default logits_all (False) vs True, against the reference."""
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    model = checkpoints.load_target("a")
    batch = prompts(n)
    bases = [greedy(model, p, 24, eos_id=2) for p in batch]
    out = {"probe": "spec-logits-all", "engine": f"llama-cpp-python {llama_cpp.__version__}", "prompts": n}
    for label, logits_all in (("default_logits_all_false", False), ("logits_all_true", True)):
        llm = _llama("a", n_ctx=256, logits_all=logits_all, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4))
        div = []
        for i, (p, base) in enumerate(zip(batch, bases)):
            llm.reset()
            got = []
            for tok in llm.generate(list(p), temp=0.0, top_k=1, repeat_penalty=1.0):
                got.append(int(tok))
                if tok == 2 or len(got) >= 24:
                    break
            pos = next((j for j, (x, y) in enumerate(zip(base.output, got)) if x != y), None)
            if pos is not None and not (base.margins[pos] < 1e-4 and base.runner_up[pos] == got[pos]):
                div.append({"prompt_index": i, "position": pos, "expected": base.output[pos], "got": got[pos],
                            "baseline_margin": round(base.margins[pos], 4)})
        out[label] = {"divergent": len(div), "first": div[:3]}
    return out


_SPEC_CHILD = """
import sys
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
nb, la, nctx, plen, path = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llm = Llama(model_path=path, n_ctx=nctx, n_batch=nb, n_threads=1, verbose=False, logits_all=la,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))
prompt = ([5, 6, 7, 8, 9] * 200)[:plen]
out = []
for t in llm.generate(prompt, temp=0.0, top_k=1):
    out.append(t)
    if len(out) >= 20:
        break
print("generated", len(out))
"""


def spec_crash() -> dict:
    path = str(export_gguf(checkpoints.REVISIONS["a"]))
    cases = {"F2 default logits_all, prompt 600 > n_batch 512": ("512", "0", "1024", "600"),
             "F2 control, prompt 400 <= n_batch 512": ("512", "0", "1024", "400"),
             "F3 logits_all=True, n_batch 8 < k+1 = 11": ("8", "1", "256", "30"),
             "F3 control, n_batch 512": ("512", "1", "256", "30")}
    out = {}
    for name, args in cases.items():
        p = subprocess.run([sys.executable, "-c", _SPEC_CHILD, *args, path], capture_output=True, text=True,
                           timeout=120)
        lines = (p.stdout + p.stderr).splitlines()
        why = next((ln.strip() for ln in lines if "GGML_ASSERT" in ln or "Error:" in ln or ln.startswith("generated")),
                   lines[-1] if lines else "")
        out[name] = {"returncode": p.returncode, "outcome": why[-160:]}
    return {"probe": "spec-crash", "cases": out}


def server_text_parity(n: int) -> dict:
    from adapters.openai_http import OpenAIHttpAdapter
    from conformance.contract import Request
    from conformance.oracle import compare

    tok = checkpoints.load_tokenizer()
    engine = OpenAIHttpAdapter(serve="llama_cpp", gguf=str(export_gguf(checkpoints.REVISIONS["a"])),
                               prompt_mode="text")
    try:
        batch = prompts(n)
        stable = [p for p in batch if tok.encode(tok.decode(p)).ids == list(p)]
        reqs = [Request(f"t{i}", tok.encode(tok.decode(p)).ids, 16) for i, p in enumerate(batch)]
        tau = engine.capabilities().tolerance
        out = {"probe": "server-text-parity", "engine": engine.capabilities().version, "prompts": n,
               "prompts_token_exact_after_text_roundtrip": len(stable)}
        plain_body = engine._body
        # pass 1: what any OpenAI client sends (temperature 0); pass 2: plus llama-cpp-python's own
        # `repeat_penalty: 1.0` - its server defaults repeat_penalty to 1.1 and applies it at temperature 0.
        for label, extra in (("openai_body", {}), ("with_repeat_penalty_1", {"repeat_penalty": 1.0})):
            engine._body = lambda *a, _x=extra: {**plain_body(*a), **_x}
            results = [engine.run([q])[0] for q in reqs]
            kinds = [compare(engine.baseline(q), r.output, r.finish_reason, tau).kind for q, r in zip(reqs, results)]
            out[label] = {"equal": kinds.count("equal"), "near_tie": kinds.count("near_tie"),
                          "diverge": kinds.count("diverge"), "finish_differs": kinds.count("finish")}
        out["cached_tokens_reported"] = any(r.cached_tokens is not None for r in results)
        return out
    finally:
        engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m adapters.probes.llama_cpp", description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=["cache-cross-revision", "server-disk-cache", "spec-crash", "server-text-parity",
                                      "spec-logits-all", "f16-kv"])
    ap.add_argument("--disk", action="store_true")
    ap.add_argument("--n", type=int, default=None)
    a = ap.parse_args()
    if a.probe == "cache-cross-revision":
        out = cache_cross_revision(a.n or 50, a.disk)
    elif a.probe == "server-disk-cache":
        out = server_disk_cache(a.n or 10)
    elif a.probe == "server-text-parity":
        out = server_text_parity(a.n or 50)
    elif a.probe == "spec-crash":
        out = spec_crash()
    elif a.probe == "spec-logits-all":
        out = spec_logits_all(a.n or 50)
    else:
        out = kv_dtype(a.n or 50)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
