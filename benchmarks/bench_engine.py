"""Reference engine speed, on the shipped checkpoints (run: python benchmarks/bench_engine.py).

(a) batched throughput: the reference engine (float64, paged KV, continuous batching) vs transformers
    `LlamaForCausalLM.generate` on the same checkpoint folder and the same padded batch;
(b) speculative speedup at batch 1, with the tiny draft model and with n-gram prompt lookup, next to the
    prediction (1 - a^(k+1)) / ((1 - a)(k c + 1)) from the measured acceptance a and cost ratio c
    (c = draft forward time / target forward time for one token; 0 for n-gram lookup).
Prompts are held-out source text from the training corpus, tokenized with the shipped tokenizer.
"""

from __future__ import annotations

import argparse
import time

import torch

from reference_engine import checkpoints
from reference_engine.engine import Engine, EngineConfig, Request
from reference_engine.model import DenseKV
from reference_engine.model_registry import ModelRegistry


def prompts(n: int, length: int) -> list[tuple[int, ...]]:
    from reference_engine.training import corpus

    tok = checkpoints.load_tokenizer()
    text = "\n".join(corpus.texts("heldout") if hasattr(corpus, "texts") else [])
    ids = tok.encode(text).ids
    step = max(1, (len(ids) - length) // max(1, n))
    return [tuple(ids[i * step:i * step + length]) for i in range(n)]


def engine_throughput(registry, ps, max_tokens, config: EngineConfig) -> tuple[float, int, float]:
    engine = Engine(config, registry)
    engine.generate([Request("warm", ps[0], 4)])
    t = time.perf_counter()
    reports = engine.generate([Request(f"r{i}", p, max_tokens) for i, p in enumerate(ps)])
    dt = time.perf_counter() - t
    n = sum(len(r.output) for r in reports)
    return n / dt, n, dt


def hf_throughput(ps, max_tokens, dtype) -> tuple[float, int, float]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(checkpoints.revision_dir("a")), dtype=dtype).eval()
    width = max(len(p) for p in ps)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in ps])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
    with torch.no_grad():
        model.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=4, do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
        dt = time.perf_counter() - t
    new = out[:, width:]
    eos = model.config.eos_token_id
    n = 0
    for row in new.tolist():  # count up to and including eos, as the engine does
        n += (row.index(eos) + 1) if eos in row else len(row)
    return n / dt, n, dt


def forward_time(model, tokens: int = 64, reps: int = 200) -> float:
    """Seconds per single-token decode forward at context `tokens`."""
    kv = DenseKV(model.config, model.dtype)
    model(torch.arange(3, 3 + tokens), torch.arange(tokens), kv)
    t = time.perf_counter()
    for i in range(reps):
        model(torch.tensor([5]), torch.tensor([tokens + i]), kv)
    return (time.perf_counter() - t) / reps


def predicted(alpha: float, k: int, c: float) -> float:
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def spec(registry, ps, max_tokens, drafter: str, k: int, c: float) -> dict:
    base = Engine(EngineConfig(drafter="none", enable_prefix_cache=False), registry)
    fast = Engine(EngineConfig(drafter=drafter, k=k, enable_prefix_cache=False), registry)
    t_base = t_fast = 0.0
    proposed = accepted = tokens = 0
    for i, p in enumerate(ps):
        for engine, which in ((base, "base"), (fast, "fast")):
            t = time.perf_counter()
            [rep] = engine.generate([Request(f"{which}{i}", p, max_tokens)])
            dt = time.perf_counter() - t
            if which == "base":
                t_base += dt
                tokens += len(rep.output)
            else:
                t_fast += dt
                proposed += rep.draft_proposed
                accepted += rep.draft_accepted
    alpha = accepted / proposed if proposed else 0.0
    return {"drafter": drafter, "k": k, "alpha": alpha, "c": c, "speedup": t_base / t_fast,
            "predicted": predicted(alpha, k, c), "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--spec-prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    registry = ModelRegistry()
    ps = prompts(args.batch, args.prompt_len)
    print(f"torch {torch.__version__}, {args.threads} thread(s); batch {args.batch}, prompt {args.prompt_len} tokens, "
          f"max_tokens {args.max_tokens}")
    eng = engine_throughput(registry, ps, args.max_tokens, EngineConfig())
    print(f"(a) reference engine (float64, batched):  {eng[0]:8.1f} tok/s  ({eng[1]} tokens in {eng[2]:.2f}s)")
    for dtype in (torch.float64, torch.float32):
        hf = hf_throughput(ps, args.max_tokens, dtype)
        print(f"    transformers generate ({str(dtype)[6:]}, padded batch): {hf[0]:8.1f} tok/s  ({hf[1]} tokens in "
              f"{hf[2]:.2f}s)  -> engine/transformers = {eng[0] / hf[0]:.2f}x")
    sp = prompts(args.spec_prompts, args.prompt_len)
    target = registry.model(__import__("reference_engine.sequence", fromlist=["Identity"]).Identity())
    results = [spec(registry, sp, args.max_tokens, "ngram", args.k, 0.0)]
    if (checkpoints.CHECKPOINTS / checkpoints.DRAFT / "model.safetensors").exists():
        c = forward_time(registry.draft()) / forward_time(target)
        results.insert(0, spec(registry, sp, args.max_tokens, "draft", args.k, c))
    else:
        print("    (tiny-draft not trained yet: draft-model row skipped)")
    print(f"(b) speculative decoding at batch 1, k={args.k}, {len(sp)} prompts:")
    for r in results:
        print(f"    {r['drafter']:6s} alpha={r['alpha']:.3f} c={r['c']:.3f}  measured speedup {r['speedup']:.2f}x  "
              f"predicted {r['predicted']:.2f}x")


if __name__ == "__main__":
    main()
