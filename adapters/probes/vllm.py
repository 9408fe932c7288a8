"""Direct probes of vLLM's KV reuse, each reproducible with one command (needs vLLM installed):

  python -m adapters.probes.vllm tolerance [--n 60]   float32 vLLM vs float64 baseline: margin error, flips
  python -m adapters.probes.vllm salt                 does cache_salt isolate? (and salt "upper" vs LoRA "upper")
  python -m adapters.probes.vllm lora                 does a LoRA request reuse base-model prefix blocks?
  python -m adapters.probes.vllm lora-reload          in-place adapter reload (same name and path, new weights)
  python -m adapters.probes.vllm lora-pair            the minimal case: one base + one LoRA request in a batch
  python -m adapters.probes.vllm lora-poison          ... and the wrong KV it writes is reused from the prefix cache
  python -m adapters.probes.vllm lora-batch           base + LoRA requests in one batch, with/without chunking
  python -m adapters.probes.vllm features [--n 40]    parity under prefix caching / chunked prefill / ngram / draft
  python -m adapters.probes.vllm all

Each prints its figures and a JSON line (`RESULT {...}`), and exits 1 if it found a violation, 0 if not.
The engine is started once per configuration (in a spawned process: this module has a __main__ guard).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from adapters.reference_oracle import ReferenceOracle
from adapters.vllm import EOS, LORA_IDS, prepare_environment, speculative_config, top2_from_logprobs
from conformance.contract import Baseline, Identity, Request

TAU = 1e-3


def prompts(n: int, seed: int = 0, lo: int = 20, hi: int = 150) -> list[list[int]]:
    """Random token prompts over a small alphabet plus tokenized corpus text (natural continuations)."""
    rng = random.Random(seed)
    out = []
    try:
        import gzip

        from reference_engine import checkpoints
        tok = checkpoints.load_tokenizer()
        text = gzip.open(Path(checkpoints.__file__).parent / "training" / "corpus.txt.gz", "rt").read()
        ids = tok.encode(text[:200000]).ids
    except Exception:  # noqa: BLE001
        ids = []
    for i in range(n):
        length = rng.randint(lo, hi)
        if ids and i % 2:
            start = rng.randrange(0, max(1, len(ids) - length))
            out.append([t for t in ids[start:start + length] if t != EOS] or [5])
        else:
            out.append([rng.randint(4, 51) for _ in range(length)])
    return out


@functools.lru_cache(maxsize=None)
def _oracle() -> ReferenceOracle:
    return ReferenceOracle(EOS)  # one set of loaded reference models for every probe of a run


class Baselines:
    """Plain greedy decoding by the reference model (the adapters' ReferenceOracle), memoised per request:
    several probes ask for the same baselines again."""

    def __init__(self) -> None:
        self.memo: dict[tuple, Baseline] = {}

    def __call__(self, prompt, max_tokens, stop_ids=(), revision="a", adapter=None) -> Baseline:
        key = (tuple(prompt), max_tokens, tuple(stop_ids), revision, adapter)
        if key not in self.memo:
            request = Request("probe", tuple(prompt), max_tokens, tuple(stop_ids), Identity(revision, adapter))
            self.memo[key] = _oracle().baseline(request)
        return self.memo[key]


def compare(base, got: list[int], tau: float = TAU) -> tuple[str, int | None, float | None]:
    for i, (e, g) in enumerate(zip(base.output, got)):
        if e != g:
            m = base.margins[i]
            return ("near_tie" if m < tau and g == base.runner_up[i] else "diverge"), i, m
    if len(base.output) != len(got):
        i = min(len(base.output), len(got))
        return "diverge", i, base.margins[i] if i < len(base.margins) else None
    return "equal", None, None


DTYPE = "float32"  # --dtype: the engine's weights and KV (the oracle stays float64)


def make_llm(**overrides):
    prepare_environment()
    from vllm import LLM

    from reference_engine import checkpoints
    kw = dict(model=str(checkpoints.revision_dir("a")), dtype=DTYPE, enforce_eager=True, block_size=32,
              enable_prefix_caching=True, max_model_len=1024, seed=0, disable_log_stats=False, max_logprobs=2)
    kw.update(overrides)
    t = time.monotonic()
    llm = LLM(**kw)
    print(f"# engine up in {time.monotonic() - t:.0f}s: dtype={kw['dtype']}, {', '.join(f'{k}={v}' for k, v in overrides.items()) or 'defaults'}",
          flush=True)
    return llm


def gen(llm, items, max_tokens=24, logprobs=None, lora=None, stop_ids=()):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, detokenize=False,
                        stop_token_ids=list(stop_ids))
    outs = llm.generate(items, sp, use_tqdm=False, lora_request=lora)
    return outs


def lora_req(name, path=None, int_id=None, inplace=False):
    from vllm.lora.request import LoRARequest

    from reference_engine import checkpoints
    return LoRARequest(name, int_id or LORA_IDS.get(name, 9), str(path or checkpoints.adapter_dir(name)),
                       load_inplace=inplace)


def report(name: str, ok: bool, **figures) -> bool:
    print("RESULT " + json.dumps({"probe": name, "violation": not ok, **figures}, sort_keys=True), flush=True)
    return ok


# --------------------------------------------------------------------------- probes


def probe_tolerance(n: int = 60, max_tokens: int = 32) -> bool:
    """Margin error of float32 vLLM vs the float64 baseline, with prefix caching off (a cold, plain run)."""
    llm = make_llm(enable_prefix_caching=False)
    base = Baselines()
    ps = prompts(n, seed=1)
    outs = gen(llm, [{"prompt_token_ids": p} for p in ps], max_tokens, logprobs=2)
    errs, kinds, flips = [], {"equal": 0, "near_tie": 0, "diverge": 0}, []
    min_margin = float("inf")
    for p, o in zip(ps, outs):
        b = base(p, max_tokens)
        got = list(o.outputs[0].token_ids)
        kind, pos, margin = compare(b, got)
        kinds[kind] += 1
        if kind != "equal":
            flips.append({"prompt_len": len(p), "position": pos, "baseline_margin": margin})
        top2 = top2_from_logprobs(o.outputs[0].logprobs) or ()
        upto = len(top2) if pos is None else pos + 1
        for i in range(min(upto, len(top2), len(b.margins))):
            t1, v1, t2, v2 = top2[i]
            if t1 == b.output[i] and t2 == b.runner_up[i]:
                errs.append(abs((v1 - v2) - b.margins[i]))
        min_margin = min(min_margin, min(b.margins))
    errs.sort()
    figures = dict(prompts=n, max_tokens=max_tokens, outcomes=kinds, flips=flips[:10],
                   margin_error_max=errs[-1] if errs else None,
                   margin_error_p99=errs[int(0.99 * (len(errs) - 1))] if errs else None,
                   margin_error_median=errs[len(errs) // 2] if errs else None, positions_compared=len(errs),
                   smallest_baseline_margin=min_margin, tau=TAU)
    print(json.dumps(figures, indent=1))
    return report("tolerance", kinds["diverge"] == 0, **figures)


def have_lora() -> bool:
    from reference_engine import checkpoints

    return (checkpoints.adapter_dir("upper") / "adapter_model.safetensors").exists()


def probe_salt() -> bool:
    """Warm a prompt under salt A; then same tokens under salt B, no salt, and (if LoRA works) salt 'upper' vs
    LoRA 'upper' (domain separation of extra keys, vLLM 44701). Cross-identity cached tokens must be 0."""
    lora = have_lora()
    llm = make_llm(enable_lora=True, max_lora_rank=8, max_loras=2) if lora else make_llm()
    base = Baselines()
    p = prompts(1, seed=7, lo=100, hi=100)[0]
    rows = {}

    def run(label, salt=None, lora=None):
        item = {"prompt_token_ids": p}
        if salt:
            item["cache_salt"] = salt
        o = gen(llm, [item], 16, lora=lora)[0]
        rows[label] = {"cached": o.num_cached_tokens, "output": list(o.outputs[0].token_ids), "lora": lora is not None}
        return rows[label]

    run("warm salt=A", salt="A")
    run("salt=A again", salt="A")
    run("salt=B", salt="B")
    run("no salt", salt=None)
    run("no salt again", salt=None)
    run("salt=upper (no LoRA)", salt="upper")
    if lora:
        run("LoRA upper (no salt)", lora=lora_req("upper"))
        run("LoRA upper + salt=upper", salt="upper", lora=lora_req("upper"))
    leaks = [k for k in ("salt=B", "no salt", "salt=upper (no LoRA)", "LoRA upper (no salt)", "LoRA upper + salt=upper")
             if k in rows and rows[k]["cached"]]
    positive = rows["salt=A again"]["cached"] > 0 and rows["no salt again"]["cached"] > 0
    exp_base = list(base(p, 16).output)
    exp_upper = list(base(p, 16, adapter="upper").output) if lora else None
    wrong = [k for k, v in rows.items() if v["output"] != (exp_upper if v["lora"] else exp_base)]
    for k, v in rows.items():
        print(f"{k:28s} cached={v['cached']:4d} output==baseline: {k not in wrong}")
    return report("salt", not leaks and not wrong, prompt_len=len(p), cross_identity_hits=leaks,
                  positive_control=positive, wrong_outputs=wrong,
                  cached={k: v["cached"] for k, v in rows.items()})


def probe_lora() -> bool:
    """Base model warms a prefix; LoRA requests with the same tokens must not reuse it, and vice versa."""
    llm = make_llm(enable_lora=True, max_lora_rank=8, max_loras=2)
    base = Baselines()
    p = prompts(1, seed=11, lo=130, hi=130)[0]
    rows = []
    for label, lora in (("base warm", None), ("lora upper", "upper"), ("lora rot13", "rot13"),
                        ("lora upper again", "upper"), ("base again", None)):
        o = gen(llm, [{"prompt_token_ids": p}], 16, lora=lora_req(lora) if lora else None)[0]
        got = list(o.outputs[0].token_ids)
        kind, pos, margin = compare(base(p, 16, adapter=lora), got)
        rows.append({"step": label, "cached": o.num_cached_tokens, "vs_baseline": kind})
        print(f"{label:18s} cached={o.num_cached_tokens:4d} vs baseline: {kind}")
    leak = any(r["cached"] for r in rows[1:3])
    wrong = [r["step"] for r in rows if r["vs_baseline"] == "diverge"]
    positive = rows[3]["cached"] > 0 and rows[4]["cached"] > 0
    return report("lora", not leak and not wrong, rows=rows, positive_control=positive)


def probe_lora_reload() -> bool:
    """Adapter reloaded in place: same lora_name, lora_int_id and lora_path, new weights on disk
    (load_inplace=True). vLLM keys adapter KV by (name, path); if the prompt's prefix blocks are reused,
    the new adapter's answer is computed on the old adapter's KV (BUG_CLASSES A, vLLM 30931/42125)."""
    from reference_engine import checkpoints

    llm = make_llm(enable_lora=True, max_lora_rank=8, max_loras=2)
    base = Baselines()
    tmp = Path(tempfile.mkdtemp(prefix="kvparity-lora-"))
    try:
        slot = tmp / "adapter"
        shutil.copytree(checkpoints.adapter_dir("upper"), slot)
        ps = prompts(6, seed=13, lo=96, hi=140)
        first = gen(llm, [{"prompt_token_ids": p} for p in ps], 16, lora=lora_req("tenant-adapter", slot, 7))
        for f in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copy(checkpoints.adapter_dir("rot13") / f, slot / f)
        second = gen(llm, [{"prompt_token_ids": p} for p in ps], 16,
                     lora=lora_req("tenant-adapter", slot, 7, inplace=True))
        # control: the same new weights under a fresh path, nothing cached for it
        fresh = tmp / "fresh"
        shutil.copytree(checkpoints.adapter_dir("rot13"), fresh)
        control = gen(llm, [{"prompt_token_ids": p} for p in ps], 16, lora=lora_req("tenant-adapter-2", fresh, 8))
        rows = []
        for p, a, b, c in zip(ps, first, second, control):
            exp_upper = list(base(p, 16, adapter="upper").output)
            exp_rot = base(p, 16, adapter="rot13")
            got = list(b.outputs[0].token_ids)
            kind, pos, margin = compare(exp_rot, got)
            rows.append({"prompt_len": len(p), "cached_after_reload": b.num_cached_tokens,
                         "first_eq_upper": list(a.outputs[0].token_ids) == exp_upper,
                         "after_reload_vs_rot13": kind, "position": pos, "margin": margin,
                         "after_reload_eq_upper": got == exp_upper,
                         "control_eq_rot13": list(c.outputs[0].token_ids) == list(exp_rot.output),
                         "control_cached": c.num_cached_tokens})
        for r in rows:
            print(r)
        stale_hits = sum(1 for r in rows if r["cached_after_reload"])
        wrong = sum(1 for r in rows if r["after_reload_vs_rot13"] == "diverge")
        return report("lora-reload", stale_hits == 0 and wrong == 0, prompts=len(rows),
                      stale_prefix_hits=stale_hits, outputs_wrong_after_reload=wrong, rows=rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def probe_features(n: int = 40, max_tokens: int = 24) -> bool:
    """Parity vs the float64 baseline (tau-aware) for each feature alone, one engine per configuration.
    Every prompt is sent twice (cold, then warm) so prefix hits are exercised."""
    from reference_engine import checkpoints

    base = Baselines()
    ps = prompts(n, seed=3, lo=33, hi=200)
    configs = {
        "prefix_cache": {},
        "chunked_prefill_32": {"max_num_batched_tokens": 32, "enable_chunked_prefill": True},
        "ngram_k3": {"speculative_config": speculative_config("ngram", 3, "")},
    }
    if (checkpoints.CHECKPOINTS / checkpoints.DRAFT / "model.safetensors").exists():
        configs["draft_k3"] = {"speculative_config": speculative_config(
            "draft", 3, str(checkpoints.CHECKPOINTS / checkpoints.DRAFT))}
    summary, ok = {}, True
    for name, kw in configs.items():
        try:
            llm = make_llm(**kw)
        except Exception as exc:  # noqa: BLE001
            summary[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            print(name, summary[name])
            continue
        counts = {"equal": 0, "near_tie": 0, "diverge": 0}
        cached = 0
        bad = []
        for rnd in ("cold", "warm"):
            # a batch of 8 at a time: batching is exercised too
            for i in range(0, n, 8):
                chunk = ps[i:i + 8]
                outs = gen(llm, [{"prompt_token_ids": p} for p in chunk], max_tokens)
                for p, o in zip(chunk, outs):
                    kind, pos, margin = compare(base(p, max_tokens), list(o.outputs[0].token_ids))
                    counts[kind] += 1
                    cached += o.num_cached_tokens or 0
                    if kind == "diverge":
                        bad.append({"round": rnd, "prompt_len": len(p), "position": pos, "margin": margin,
                                    "cached": o.num_cached_tokens, "prompt": p})
        from adapters.vllm import metric_totals
        m = metric_totals(llm.get_metrics())
        summary[name] = {"results": counts, "cached_tokens": cached,
                         "drafts_proposed": m.get("vllm:spec_decode_num_draft_tokens"),
                         "drafts_accepted": m.get("vllm:spec_decode_num_accepted_tokens"),
                         "divergences": bad[:5]}
        print(name, json.dumps({k: v for k, v in summary[name].items() if k != "divergences"}), flush=True)
        ok = ok and not bad
        llm.llm_engine.engine_core.shutdown()
        del llm
    return report("features", ok, prompts=n, max_tokens=max_tokens, tau=TAU, summary=summary)


def probe_lora_batch(n: int = 12) -> bool:
    """Base-model and LoRA requests in one batch: is every request decoded with its own weights? Runs the
    same mixed batches with the whole batch fitting one step (budget 4096) and with chunked prefill
    (budget 64, so the scheduler mixes prefill chunks and decodes of different adapters in one step)."""
    base = Baselines()
    rng = random.Random(5)
    batches = []
    for i in range(n):
        items = [(tuple([4]), None, 1), (tuple(rng.randint(4, 51) for _ in range(97)), "rot13", 16),
                 (tuple(rng.randint(4, 51) for _ in range(rng.choice((33, 64, 128)))), "upper", 8),
                 (tuple(rng.randint(4, 51) for _ in range(rng.randint(1, 40))), None, 8)]
        rng.shuffle(items)
        batches.append(items)
    summary, ok = {}, True
    for name, kw in (("budget_64", {"max_num_batched_tokens": 64, "enable_chunked_prefill": True}),
                     ("budget_default", {})):
        llm = make_llm(enable_lora=True, max_lora_rank=8, max_loras=2, max_num_seqs=8, **kw)
        counts = {"equal": 0, "near_tie": 0, "diverge": 0}
        bad = []
        for items in batches:
            from vllm import SamplingParams
            sps = [SamplingParams(temperature=0.0, max_tokens=m, detokenize=False) for _, _, m in items]
            outs = llm.generate([{"prompt_token_ids": list(p)} for p, _, _ in items], sps, use_tqdm=False,
                                lora_request=[lora_req(a) if a else None for _, a, _ in items])
            for (p, a, m), o in zip(items, outs):
                got = list(o.outputs[0].token_ids)
                kind, pos, margin = compare(base(list(p), m, adapter=a), got)
                counts[kind] += 1
                if kind == "diverge":
                    other = {x: list(base(list(p), m, adapter=x).output) for x in (None, "upper", "rot13") if x != a}
                    bad.append({"adapter": a, "prompt_len": len(p), "position": pos, "margin": margin, "got": got,
                                "expected": list(base(list(p), m, adapter=a).output),
                                "got_equals_adapter": [str(x) for x, v in other.items() if v == got]})
        by_adapter = {}
        for b in bad:
            by_adapter[str(b["adapter"])] = by_adapter.get(str(b["adapter"]), 0) + 1
        summary[name] = {"results": counts, "divergences": bad[:6], "divergent": len(bad),
                         "divergent_by_adapter": by_adapter}
        print(name, json.dumps({"results": counts, "divergent_by_adapter": summary[name]["divergent_by_adapter"]}),
              flush=True)
        for b in bad[:6]:
            print("   ", b)
        ok = ok and not bad
        llm.llm_engine.engine_core.shutdown()
        del llm
    return report("lora-batch", ok, batches=n, summary=summary)


def probe_lora_pair() -> bool:
    """The minimal cases: single batches, no chunking, no prefix caching, mixing the base model (1-token
    prompt [4], max_tokens 1; plain decoding gives 32, margin 0.92; under upper 201, under rot13 4) with
    LoRA requests on 97/33-token prompts. Each variant is one `generate` call; the base request's answer
    and whether each LoRA request matched its own plain decoding are printed."""
    from vllm import SamplingParams

    base = Baselines()
    rng = random.Random(5)
    long = [rng.randint(4, 51) for _ in range(97)]
    mid = [rng.randint(4, 51) for _ in range(33)]
    llm = make_llm(enable_lora=True, max_lora_rank=8, max_loras=2, max_num_seqs=8, enable_prefix_caching=False)
    variants = {
        "base alone": [("base", [4], None, 1)],
        "base + rot13": [("base", [4], None, 1), ("rot13", long, "rot13", 16)],
        "base + upper": [("base", [4], None, 1), ("upper", mid, "upper", 8)],
        "base + rot13 + upper": [("base", [4], None, 1), ("rot13", long, "rot13", 16), ("upper", mid, "upper", 8)],
        "rot13 + upper + base": [("rot13", long, "rot13", 16), ("upper", mid, "upper", 8), ("base", [4], None, 1)],
        "base alone again": [("base", [4], None, 1)],
        "base + rot13 (again)": [("base", [4], None, 1), ("rot13", long, "rot13", 16)],
    }
    exp = {a: list(base([4], 1, adapter=a).output) for a in (None, "upper", "rot13")}
    rows, ok = {}, True
    for name, items in variants.items():
        sps = [SamplingParams(temperature=0.0, max_tokens=m, detokenize=False) for _, _, _, m in items]
        outs = llm.generate([{"prompt_token_ids": p} for _, p, _, _ in items], sps, use_tqdm=False,
                            lora_request=[lora_req(a) if a else None for _, _, a, _ in items])
        row = {}
        for (label, p, a, m), o in zip(items, outs):
            got = list(o.outputs[0].token_ids)
            right = got == list(base(p, m, adapter=a).output)
            row[label] = got if label == "base" else right
            ok = ok and right
        rows[name] = row
        print(f"{name:24s} {row}", flush=True)
    print(f"plain decoding of [4]: base {exp[None]}, upper {exp['upper']}, rot13 {exp['rot13']}")
    return report("lora-pair", ok, rows=rows, expected=exp[None], under_upper=exp["upper"], under_rot13=exp["rot13"])


def probe_lora_poison() -> bool:
    """Does the mis-applied adapter also poison the base model's prefix cache? A 70-token base prompt P is
    prefilled in a batch with an upper and a rot13 request; then P is sent alone (it reuses the two
    cached blocks), then alone again after reset_prefix_cache (fresh KV)."""
    from vllm import SamplingParams

    base = Baselines()
    rng = random.Random(9)
    P = [rng.randint(4, 51) for _ in range(70)]
    long = [rng.randint(4, 51) for _ in range(97)]
    mid = [rng.randint(4, 51) for _ in range(33)]
    llm = make_llm(enable_lora=True, max_lora_rank=8, max_loras=2, max_num_seqs=8)
    exp = list(base(P, 8).output)
    sps = [SamplingParams(temperature=0.0, max_tokens=m, detokenize=False) for m in (8, 16, 8)]
    outs = llm.generate([{"prompt_token_ids": P}, {"prompt_token_ids": long}, {"prompt_token_ids": mid}], sps,
                        use_tqdm=False, lora_request=[None, lora_req("rot13"), lora_req("upper")])
    mixed = list(outs[0].outputs[0].token_ids)
    warm = gen(llm, [{"prompt_token_ids": P}], 8)[0]
    llm.reset_prefix_cache()
    cold = gen(llm, [{"prompt_token_ids": P}], 8)[0]
    rows = {"P in mixed batch": {"output": mixed, "cached": outs[0].num_cached_tokens},
            "P alone, warm cache": {"output": list(warm.outputs[0].token_ids), "cached": warm.num_cached_tokens},
            "P alone after reset": {"output": list(cold.outputs[0].token_ids), "cached": cold.num_cached_tokens}}
    for k, v in rows.items():
        print(f"{k:22s} cached={v['cached']:3d} output={v['output']} == plain decoding: {v['output'] == exp}")
    print(f"plain decoding of P (base): {exp}")
    ok = all(v["output"] == exp for v in rows.values())
    return report("lora-poison", ok, rows=rows, expected=exp,
                  poisoned_cache=rows["P alone, warm cache"]["output"] != exp and rows["P alone after reset"]["output"] == exp)


PROBES = {"tolerance": probe_tolerance, "salt": probe_salt, "lora": probe_lora, "lora-reload": probe_lora_reload,
          "lora-batch": probe_lora_batch, "lora-pair": probe_lora_pair, "lora-poison": probe_lora_poison,
          "features": probe_features}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapters.probes.vllm", description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=[*PROBES, "all"])
    ap.add_argument("--n", type=int, default=None, help="number of prompts (tolerance, features)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the engine's dtype (lora-pair in bfloat16: the finding at margins far above bf16 noise)")
    args = ap.parse_args(argv)
    global DTYPE
    DTYPE = args.dtype
    names = list(PROBES) if args.probe == "all" else [args.probe]
    ok = True
    for name in names:
        fn = PROBES[name]
        kwargs = {"n": args.n} if args.n and name in ("tolerance", "features", "lora-batch") else {}
        ok = fn(**kwargs) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
