#!/usr/bin/env python3
"""Standalone reproducer: kvparity witness isolation-a92c06de03.json (isolation — cached tokens served across identities) on llama_cpp.

Exported by `kvparity export reports/llama_cpp/shared-cache/witnesses/isolation-a92c06de03.json`. It does not import kvparity: it needs
llama-cpp-python (0.3.36) and numpy, and f32 GGUF exports of the shipped checkpoints in --gguf-dir
(default $KVPARITY_GGUF_DIR, else ~/.cache/kvparity/gguf; `kvparity export-gguf` writes them).
Witness engine arguments: {}. Steps (from a cold cache):
  1. reset (flush the prefix cache)
  2. configure drafter=draft_model, k=4, n_batch=9, cache=ram
  3. batch 0: r0: 193-token prompt, max_tokens 4, stop [23, 15] -> expected [11, 201, 5, 201]; r1: 127-token prompt, max_tokens 2, adapter rot13 -> expected [50, 40]; r2: 95-token prompt, max_tokens 2 -> expected [20, 18]; r3: 127-token prompt, max_tokens 2, adapter upper -> expected [55, 39]
  4. batch 1: r4: 199-token prompt, max_tokens 1, stop [22] -> expected [80]

Run:  python reproducers/llama_cpp/isolation-a92c06de03.py   (--help lists its options)
Exit: 0 every output equals plain greedy decoding and every claim held; 1 the engine still
misbehaves (one line: the claim, the request, the first divergent position, expected vs got);
3 the case could not be run.
"""

from __future__ import annotations  # the embedded helpers' type hints stay unevaluated

# --- the checker shared by every reproducer (kvparity kvparity/commands/export/runtime.py) ---
import argparse
import json
import os
import sys

# The step fields and claim names are the plan's (kvparity/commands/export/plan.py writes them).
OUTPUT_CHECKS = ("parity", "history_independence", "spec_independence", "schedule_independence",
                 "eviction_safety")


def label(identity):
    """kvparity's identity label: rev=a,adapter=upper@62ba2cf3,salt=tenant-a."""
    parts = ["rev=" + str(identity.get("revision"))]
    if identity.get("adapter") is not None:
        digest = identity.get("adapter_digest")
        parts.append("adapter=" + identity["adapter"] + ("@" + digest[:8] if digest else ""))
    if identity.get("salt") is not None:
        parts.append("salt=" + identity["salt"])
    return ",".join(parts)


def identity_key(identity):
    return (identity.get("revision"), identity.get("adapter"), identity.get("adapter_digest"),
            identity.get("salt"))


def lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _at(seq, i):
    return seq[i] if 0 <= i < len(seq) else None


def compare(expected, output, finish_reason, tau):
    """(kind, detail) of an output against the embedded baseline: "equal", "near_tie" or "diverge"."""
    pos = first_difference(expected["output"], output)
    if pos is None:
        if finish_reason != expected["finish_reason"]:
            return "diverge", (f"same tokens {list(output)}, finish_reason {finish_reason!r} instead of "
                               f"{expected['finish_reason']!r}")
        return "equal", ""
    want, got = _at(expected["output"], pos), _at(output, pos)
    margin = _at(expected.get("margins") or [], pos)
    runner_up = _at(expected.get("runner_up") or [], pos)
    shown = "n/a" if margin is None else f"{margin:.4g}"
    detail = (f"first divergent position {pos}: expected {'<end>' if want is None else want}, got "
              f"{'<end>' if got is None else got} (baseline margin {shown}); expected "
              f"{list(expected['output'])} ({expected['finish_reason']}), got {list(output)} ({finish_reason})")
    if want is not None and got is not None and margin is not None and margin < tau and runner_up in (None, got):
        return "near_tie", detail
    return "diverge", detail


def accounting_problems(q, r, eos):
    """What conformance.checks.cache.accounting finds wrong with one result (same rules, plain dicts)."""
    out, cached = list(r["output"]), r.get("cached_tokens")
    proposed, accepted, fr = r.get("draft_proposed"), r.get("draft_accepted"), r["finish_reason"]
    bad = []
    if cached is not None and not 0 <= cached <= len(q["prompt"]):
        bad.append(f"cached_tokens={cached} for a {len(q['prompt'])}-token prompt")
    if proposed is not None and proposed < 0 or accepted is not None and accepted < 0:
        bad.append(f"negative draft counts: proposed={proposed}, accepted={accepted}")
    if proposed is not None and accepted is not None and accepted > proposed:
        bad.append(f"more drafts accepted than proposed: {accepted} > {proposed}")
    if len(out) > q["max_tokens"]:
        bad.append(f"{len(out)} tokens > max_tokens {q['max_tokens']}")
    terminal = set(q["stop_ids"]) | ({eos} if eos is not None else set())
    early = [j for j, t in enumerate(out[:-1]) if t in terminal]
    if fr != "abort" and early:
        bad.append(f"generation continued past stop/eos token {out[early[0]]} at position {early[0]}")
    if fr == "length" and len(out) != q["max_tokens"]:
        bad.append(f"finish_reason 'length' after {len(out)} of {q['max_tokens']} tokens")
    elif fr == "stop" and (not out or out[-1] not in q["stop_ids"]):
        bad.append(f"finish_reason 'stop' without a stop token (last token {out[-1] if out else None})")
    elif fr == "eos" and (not out or eos is None or out[-1] != eos):
        bad.append(f"finish_reason 'eos' without eos (last token {out[-1] if out else None})")
    elif fr not in ("length", "stop", "eos", "abort"):
        bad.append(f"unknown finish_reason {fr!r}")
    return bad


class Checker:
    """Walks the steps once, recording every claim a result breaks (claim name, one-line text)."""

    def __init__(self, plan):
        self.plan = plan
        self.violations = []
        self.near_ties = []
        self.counts = {"requests": 0, "cached_reports": 0, "hits": 0, "positive_controls": 0, "snapshots": 0}
        self.seen = []  # (identity key, tokens) of this cache epoch: what same-identity reuse may cover
        self.repeats = {}  # (identity key, prompt) -> batch index, for the positive control
        self.state = None  # (epoch, segment) the repeats belong to
        self.evictions = None  # snapshot["evictions"] as last seen

    def violate(self, claim, q, batch, text):
        where = f"request {q['id']} (batch {batch['index']}, {label(q['identity'])}, {len(q['prompt'])} prompt tokens)"
        self.violations.append((claim, f"[{claim}] {where}: {text}"))

    def reset(self, snapshot):
        self.seen = []
        self._saw_evictions(snapshot)

    def configured(self):
        self.evictions = None  # a configure may restart the engine, and its eviction counter with it

    def _saw_evictions(self, snapshot):
        if snapshot and snapshot.get("evictions") is not None:
            self.evictions = int(snapshot["evictions"])

    def batch(self, batch, results, snapshot):
        plan, tau, eos = self.plan, self.plan["tolerance"], self.plan["eos_id"]
        evicted = any((r.get("evictions") or 0) > 0 for r in results) or (
            snapshot is not None and snapshot.get("evictions") is not None and self.evictions is not None
            and int(snapshot["evictions"]) > self.evictions)
        control = plan["positive_control"]
        state = (batch["epoch"], batch["segment"])
        skip_control = evicted or batch["caching_off"]
        if state != self.state or skip_control:
            self.repeats, self.state = {}, state
        for q, r in zip(batch["requests"], results):
            self.counts["requests"] += 1
            ident = identity_key(q["identity"])
            prompt, cached = list(q["prompt"]), r.get("cached_tokens")
            same = max((lcp(prompt, s) for i, s in self.seen if i == ident), default=0)
            other = max((lcp(prompt, s) for i, s in self.seen if i != ident), default=0)
            for problem in accounting_problems(q, r, eos):
                self.violate("accounting", q, batch, problem)
            if cached is not None:
                self.counts["cached_reports"] += 1
                self.counts["hits"] += int(cached > 0)
                if cached > len(prompt) - 1 and cached > 0:
                    self.violate("prefix_only", q, batch, f"reported {cached} cached tokens of a {len(prompt)}-token "
                                 f"prompt; the last prompt token must always be computed")
                if cached > same:
                    whose = (f" (and {other} with another identity's traffic: its KV was reused)" if cached <= other
                             else "; no earlier traffic explains the hit")
                    self.violate("isolation", q, batch, f"reported {cached} cached prompt tokens, but it shares only "
                                 f"{same} leading tokens with earlier traffic of its own identity since the last "
                                 f"reset{whose}")
            if r["finish_reason"] != "abort":
                kind, detail = compare(q["expected"], list(r["output"]), r["finish_reason"], tau)
                if kind == "near_tie":
                    self.near_ties.append(f"request {q['id']}: {detail}")
                elif kind == "diverge":
                    self.violate("parity", q, batch, detail)
            if control and not skip_control:
                key = (ident, tuple(prompt))
                if key in self.repeats and len(prompt) > batch["hit_floor"]:
                    if cached == 0:
                        self.violate("exercised", q, batch, f"repeats the {len(prompt)}-token prompt of batch "
                                     f"{self.repeats[key]} (same identity and configuration, no reset or eviction "
                                     f"in between), yet reported 0 cached tokens")
                    else:
                        self.counts["positive_controls"] += 1
            self.seen.append((ident, prompt))
            self.seen.append((ident, prompt + list(r["output"])))
        if control and not skip_control:
            for q in batch["requests"]:
                self.repeats.setdefault((identity_key(q["identity"]), tuple(q["prompt"])), batch["index"])
        if snapshot is not None:
            self.counts["snapshots"] += 1
            problems = [f"{k}={snapshot[k]!r} (expected {v!r})" for k, v in plan["at_rest"].items()
                        if k in snapshot and snapshot[k] != v]
            if all(k in snapshot for k in ("free_blocks", "cached_blocks", "total_blocks")) and \
                    int(snapshot["free_blocks"]) + int(snapshot["cached_blocks"]) != int(snapshot["total_blocks"]):
                problems.append(f"free_blocks {snapshot['free_blocks']} + cached_blocks {snapshot['cached_blocks']} "
                                f"!= total_blocks {snapshot['total_blocks']}")
            if problems:
                self.violations.append(("rollback_hygiene", f"[rollback_hygiene] after batch {batch['index']}: the "
                                        f"pool is not back at rest: " + "; ".join(problems)))
        self._saw_evictions(snapshot)

    def headline(self):
        """The violation to print: the witness's own claim first, else the first one seen."""
        check = self.plan["witness"]["check"]
        claim = "parity" if check in OUTPUT_CHECKS else check
        chosen = next((text for c, text in self.violations if c == claim), self.violations[0][1])
        more = len(self.violations) - 1
        return chosen + (f" (+{more} more violation{'s' * (more > 1)})" if more else "")


def _snapshot(engine):
    snap = getattr(engine, "snapshot", None)
    if snap is None:
        return None
    return {k: v for k, v in snap().items() if v is None or isinstance(v, (bool, int, float, str))}


def run(plan, engine):
    """Run every step once on `engine`; returns the Checker with what it saw."""
    checker = Checker(plan)
    engine.reset()  # every example starts from a flushed cache
    checker.reset(_snapshot(engine))
    for step in plan["steps"]:
        if step["step"] == "configure":
            engine.configure(step["config"])
            checker.configured()
        elif step["step"] == "reset":
            engine.reset()
            checker.reset(_snapshot(engine))
        else:
            results = engine.run(step["requests"])
            if len(results) != len(step["requests"]):
                raise RuntimeError(f"{len(results)} results for {len(step['requests'])} requests")
            checker.batch(step, results, _snapshot(engine))
    return checker


def summary(checker):
    c = checker.counts
    bits = [f"{c['requests']} requests in {sum(s['step'] == 'batch' for s in checker.plan['steps'])} batches: "
            f"every output equals plain greedy decoding"]
    if c["cached_reports"]:
        bits.append(f"{c['cached_reports']} cached-token reports within bounds ({c['hits']} hits)")
    else:
        bits.append("no cached-token count reported, so the cached-token bounds were not exercised")
    if c["positive_controls"]:
        bits.append(f"{c['positive_controls']} exact repeats hit")
    if c["snapshots"]:
        bits.append(f"the pool was at rest after {c['snapshots']} snapshots")
    if checker.near_ties:
        bits.append(f"{len(checker.near_ties)} near-tie(s) excused below tolerance {checker.plan['tolerance']:g}: "
                    + checker.near_ties[0])
    return "; ".join(bits)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a bad option is "could not run" (3), not argparse's 2
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(3)


def main(plan, driver_cls, argv=None):
    """The script's entry point: 0 every claim held, 1 the engine still misbehaves (one line saying
    where), 3 the case could not be run (the engine failed to start or raised)."""
    parser = _Parser(description=plan["description"])
    for flag, kwargs in getattr(driver_cls, "OPTIONS", ()):
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args(argv)
    engine = None
    try:
        engine = driver_cls(plan["engine"], args)
        checker = run(plan, engine)
    except Exception as exc:  # noqa: BLE001 - a crash is never a pass
        cause = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        if plan["witness"]["check"] == "error":
            print(f"FAILED [error] the engine still fails on this case: {cause}")
            return 1
        print(f"ERROR the case could not be run: {cause}")
        return 3
    finally:
        if engine is not None:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - the verdict is already decided
                pass
    if checker.violations:
        print("FAILED " + checker.headline())
        return 1
    print("PASSED " + summary(checker))
    return 0


def beside_script(relative):
    """A path given relative to the reproducer's own folder (how a plan names the checkpoints)."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), relative))


def load_plan(text):
    """The embedded plan: JSON, read with json.loads (never evaluated)."""
    return json.loads(text)


# --- the adapter's own helpers, embedded by source ---
from typing import Any, Mapping, Sequence  # noqa: F401 (not every helper uses each)


def _drafter_base():
    try:
        from llama_cpp.llama_speculative import LlamaDraftModel
        return LlamaDraftModel
    except ImportError:  # keeps this module importable without llama_cpp (classes below are only built lazily)
        return object


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


# --- the witness: steps, requests (token ids, identities) and the oracle's expected outputs ---
PLAN = load_plan(r'''
{
 "format": 1,
 "description": "Standalone reproducer of kvparity witness isolation-a92c06de03.json (isolation) on llama_cpp.",
 "witness": {
  "file": "isolation-a92c06de03.json",
  "engine": "llama_cpp",
  "engine_args": {},
  "check": "isolation",
  "case_id": "isolation-a92c06de03",
  "title": "cached tokens served across identities"
 },
 "tolerance": 0.0001,
 "eos_id": 2,
 "positive_control": true,
 "at_rest": {
  "blocks_in_use": 0,
  "provisional_live": 0,
  "rejected_in_cache": 0,
  "refcounts_ok": true
 },
 "steps": [
  {
   "step": "reset"
  },
  {
   "step": "configure",
   "config": {
    "drafter": "draft_model",
    "k": 4,
    "n_batch": 9,
    "cache": "ram"
   }
  },
  {
   "step": "batch",
   "index": 0,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 16,
   "caching_off": false,
   "requests": [
    {
     "id": "r0",
     "prompt": [34, 51, 9, 38, 48, 43, 18, 46, 28, 5, 42, 12, 37, 21, 28, 29, 27, 6, 51, 22, 28, 40, 45, 28, 31, 16, 49, 41, 46, 42, 30, 6, 31, 28, 21, 29, 33, 5, 12, 45, 42, 16, 36, 4, 40, 9, 20, 11, 12, 38, 19, 5, 24, 9, 28, 33, 4, 11, 11, 36, 14, 42, 14, 36, 13, 35, 27, 45, 4, 19, 41, 14, 44, 20, 36, 51, 38, 12, 14, 32, 21, 17, 32, 46, 30, 5, 45, 43, 33, 22, 14, 16, 31, 25, 41, 4, 8, 46, 15, 24, 12, 39, 47, 50, 18, 26, 35, 4, 18, 25, 7, 50, 9, 33, 30, 35, 29, 15, 17, 25, 34, 22, 19, 44, 18, 30, 32, 4, 7, 7, 34, 42, 45, 28, 7, 12, 51, 19, 28, 18, 10, 5, 47, 47, 39, 12, 11, 36, 7, 42, 29, 25, 20, 5, 24, 6, 10, 16, 23, 33, 4, 28, 25, 39, 27, 14, 30, 48, 35, 7, 46, 40, 18, 44, 37, 32, 47, 31, 16, 31, 6, 38, 28, 39, 51, 34, 47, 10, 44, 37, 48, 22, 24],
     "max_tokens": 4,
     "stop_ids": [23, 15],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [11, 201, 5, 201],
      "finish_reason": "length",
      "margins": [0.683738402284634, 0.41828702409917895, 0.23790946177157757, 1.248074424760528],
      "runner_up": [22, 265, 201, 223]
     }
    },
    {
     "id": "r1",
     "prompt": [25, 41, 5, 24, 4, 38, 49, 5, 29, 22, 24, 14, 27, 17, 16, 41, 50, 27, 40, 22, 9, 9, 30, 40, 10, 31, 28, 29, 25, 18, 41, 27, 22, 4, 32, 43, 51, 44, 39, 18, 33, 21, 22, 23, 32, 47, 27, 34, 34, 34, 48, 44, 43, 20, 37, 30, 43, 26, 28, 24, 35, 28, 37, 37, 14, 46, 7, 29, 28, 12, 38, 16, 15, 12, 45, 14, 37, 5, 33, 24, 41, 34, 50, 47, 33, 29, 10, 21, 15, 38, 9, 10, 12, 32, 14, 37, 50, 20, 9, 8, 27, 12, 43, 31, 38, 32, 51, 42, 19, 31, 23, 40, 47, 10, 6, 10, 44, 5, 44, 17, 8, 34, 36, 35, 34, 34, 6],
     "max_tokens": 2,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [50, 40],
      "finish_reason": "length",
      "margins": [0.7685066262950642, 0.06481553618766256],
      "runner_up": [9, 52]
     }
    },
    {
     "id": "r2",
     "prompt": [16, 11, 45, 6, 43, 21, 5, 25, 22, 46, 29, 42, 5, 39, 10, 42, 18, 15, 19, 41, 32, 35, 51, 44, 29, 43, 11, 29, 20, 6, 35, 18, 19, 28, 11, 19, 7, 27, 48, 43, 48, 10, 31, 41, 39, 49, 23, 51, 12, 36, 47, 23, 6, 30, 9, 34, 7, 44, 12, 5, 44, 17, 32, 46, 36, 49, 38, 51, 13, 40, 27, 46, 32, 44, 13, 37, 9, 46, 50, 31, 29, 43, 23, 18, 28, 30, 11, 51, 31, 23, 46, 47, 44, 26, 21],
     "max_tokens": 2,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [20, 18],
      "finish_reason": "length",
      "margins": [0.8905235701476428, 0.24696093697981247],
      "runner_up": [21, 19]
     }
    },
    {
     "id": "r3",
     "prompt": [34, 51, 9, 38, 48, 43, 18, 46, 28, 5, 42, 12, 37, 21, 28, 29, 27, 6, 51, 22, 28, 40, 45, 28, 31, 16, 49, 41, 46, 42, 30, 6, 31, 28, 21, 29, 33, 5, 12, 45, 42, 16, 36, 4, 40, 9, 20, 11, 12, 38, 19, 5, 24, 9, 28, 33, 4, 11, 11, 36, 14, 42, 14, 37, 41, 38, 50, 8, 50, 5, 27, 23, 44, 33, 30, 20, 50, 30, 36, 16, 27, 45, 36, 22, 18, 47, 44, 22, 13, 23, 51, 27, 30, 40, 27, 51, 48, 16, 25, 44, 17, 23, 13, 32, 29, 11, 17, 16, 21, 20, 12, 37, 6, 37, 42, 19, 19, 10, 8, 37, 36, 13, 46, 4, 18, 8, 36],
     "max_tokens": 2,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [55, 39],
      "finish_reason": "length",
      "margins": [0.6180934921518375, 0.7690644169897389],
      "runner_up": [35, 43]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 1,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 16,
   "caching_off": false,
   "requests": [
    {
     "id": "r4",
     "prompt": [34, 51, 9, 38, 48, 43, 18, 46, 28, 5, 42, 12, 37, 21, 28, 29, 27, 6, 51, 22, 28, 40, 45, 28, 31, 16, 49, 41, 46, 42, 30, 6, 31, 28, 21, 29, 33, 5, 12, 45, 42, 16, 36, 4, 40, 9, 20, 11, 12, 38, 19, 5, 24, 9, 28, 33, 4, 11, 11, 36, 14, 42, 14, 36, 13, 35, 27, 45, 4, 19, 41, 14, 44, 20, 36, 51, 38, 12, 14, 32, 21, 17, 32, 46, 30, 5, 45, 43, 33, 22, 14, 16, 31, 25, 41, 4, 8, 46, 15, 24, 12, 39, 47, 50, 18, 26, 35, 4, 18, 25, 7, 50, 9, 33, 30, 35, 29, 15, 17, 25, 34, 22, 19, 44, 18, 30, 32, 4, 7, 7, 34, 42, 45, 28, 7, 12, 51, 19, 28, 18, 10, 5, 47, 47, 39, 12, 11, 36, 7, 42, 29, 25, 20, 5, 24, 6, 10, 16, 23, 33, 4, 28, 25, 39, 27, 14, 30, 48, 35, 7, 46, 40, 18, 44, 37, 32, 47, 31, 16, 31, 6, 38, 28, 39, 51, 34, 47, 10, 44, 37, 48, 22, 24, 11, 201, 5, 201, 17, 16],
     "max_tokens": 1,
     "stop_ids": [22],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [80],
      "finish_reason": "length",
      "margins": [0.3640822644924988],
      "runner_up": [73]
     }
    }
   ]
  }
 ],
 "engine": {
  "n_ctx": 1024,
  "kv_type": 0,
  "n_threads": 1,
  "seed": 0,
  "cache_scope": "shared",
  "config": {
   "drafter": "none",
   "k": 4,
   "n_batch": 512,
   "cache": "none"
  },
  "eos_id": 2,
  "files": {
   "rev:a": "tiny-target-a-f06817fe2f2e-f32.gguf",
   "rev:b": "tiny-target-b-fb7d4b0f0812-f32.gguf",
   "draft": "tiny-draft-a156202f9eba-f32.gguf",
   "lora:upper": "lora-upper-62ba2cf303dd-f32.gguf",
   "lora:rot13": "lora-rot13-c59ba687972f-f32.gguf"
  }
 }
}
''')


if __name__ == "__main__":
    sys.exit(main(PLAN, Driver))
