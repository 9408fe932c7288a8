#!/usr/bin/env python3
"""Standalone reproducer: kvparity witness exercised-0379084d2b.json (exercised — exact repeat reported no cache hit) on transformers.

Exported by `kvparity export reports/transformers/20261130-145852/witnesses/exercised-0379084d2b.json`. It does not import kvparity: it needs
transformers (5.x) and torch, and the shipped checkpoints (tiny-target-a/-b, tiny-draft).
Witness engine arguments: {}. Steps (from a cold cache):
  1. reset (flush the prefix cache)
  2. configure mode=batch, k=1, page_size=16, num_blocks=64
  3. batch 0: r0: 21-token prompt, max_tokens 1 -> expected [55]; r1: 1-token prompt, max_tokens 1 -> expected [287]
  4. batch 1: r2: 21-token prompt, max_tokens 2, stop [55] -> expected [55]
  5. batch 2: r3: 21-token prompt, max_tokens 1 -> expected [55]

Run:  python reproducers/transformers/exercised-0379084d2b.py   (--help lists its options)
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


# --- the witness: steps, requests (token ids, identities) and the oracle's expected outputs ---
PLAN = load_plan(r'''
{
 "format": 1,
 "description": "Standalone reproducer of kvparity witness exercised-0379084d2b.json (exercised) on transformers.",
 "witness": {
  "file": "exercised-0379084d2b.json",
  "engine": "transformers",
  "engine_args": {},
  "check": "exercised",
  "case_id": "exercised-0379084d2b",
  "title": "exact repeat reported no cache hit"
 },
 "tolerance": 0.0,
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
    "mode": "batch",
    "k": 1,
    "page_size": 16,
    "num_blocks": 64
   }
  },
  {
   "step": "batch",
   "index": 0,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 17,
   "caching_off": false,
   "requests": [
    {
     "id": "r0",
     "prompt": [28, 30, 6, 20, 36, 35, 29, 23, 34, 26, 41, 17, 36, 12, 22, 12, 10, 43, 20, 38, 49],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [55],
      "finish_reason": "length",
      "margins": [0.5448943313209895],
      "runner_up": [50]
     }
    },
    {
     "id": "r1",
     "prompt": [28],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [287],
      "finish_reason": "length",
      "margins": [0.8197720979220584],
      "runner_up": [265]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 1,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 17,
   "caching_off": false,
   "requests": [
    {
     "id": "r2",
     "prompt": [28, 30, 6, 20, 36, 35, 29, 23, 34, 26, 41, 17, 36, 12, 22, 12, 10, 43, 20, 38, 49],
     "max_tokens": 2,
     "stop_ids": [55],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [55],
      "finish_reason": "stop",
      "margins": [0.5448943313209895],
      "runner_up": [50]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 2,
   "epoch": 2,
   "segment": 1,
   "hit_floor": 17,
   "caching_off": false,
   "requests": [
    {
     "id": "r3",
     "prompt": [28, 30, 6, 20, 36, 35, 29, 23, 34, 26, 41, 17, 36, 12, 22, 12, 10, 43, 20, 38, 49],
     "max_tokens": 1,
     "stop_ids": [],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [55],
      "finish_reason": "length",
      "margins": [0.5448943313209895],
      "runner_up": [50]
     }
    }
   ]
  }
 ],
 "engine": {
  "dtype": "float64",
  "config": {
   "mode": "generate",
   "k": 3,
   "page_size": 16,
   "num_blocks": 64
  },
  "eos_id": 2,
  "pad_id": 0,
  "revisions": {
   "a": "tiny-target-a",
   "b": "tiny-target-b"
  },
  "draft": "tiny-draft",
  "checkpoints": "../../reference_engine/checkpoints"
 }
}
''')


if __name__ == "__main__":
    sys.exit(main(PLAN, Driver))
