#!/usr/bin/env python3
"""Standalone reproducer: kvparity witness parity-79a90c248c.json (parity — output differs from plain greedy decoding) on openai_http.

Exported by `kvparity export reports/openai_http-vllm/20261130-141329/witnesses/parity-79a90c248c.json`. It does not import kvparity: it needs
only the Python standard library, and the server running (--base-url).
Witness engine arguments: {"serve": "vllm"}. Steps (from a cold cache):
  1. reset (flush the prefix cache)
  2. batch 0: r0: 64-token prompt, max_tokens 1, stop [38], salt tenant-a -> expected [55]; r1: 32-token prompt, max_tokens 1, stop [4], adapter upper, salt upper -> expected [45]; r2: 32-token prompt, max_tokens 1, stop [6] -> expected [265]; r3: 32-token prompt, max_tokens 1, stop [47] -> expected [265]
  3. batch 1: r4: 32-token prompt, max_tokens 1, stop [29] -> expected [265]

Run:  python reproducers/openai_http-vllm/parity-79a90c248c.py   (--help lists its options)
Exit: 0 every output equals plain greedy decoding and every claim held; 1 the engine still
misbehaves (one line: the claim, the request, the first divergent position, expected vs got);
3 the case could not be run.

The witness's run started the server itself; start it the same way (from the root of a kvparity
checkout, for the checkpoints), then run this script with --base-url http://127.0.0.1:8000:
  VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_SERVER_DEV_MODE=1 \
  python -m vllm.entrypoints.openai.api_server --model reference_engine/checkpoints/tiny-target-a --served-model-name kvparity --host 127.0.0.1 --port 8000 --dtype float32 --enforce-eager --block-size 32 --enable-prefix-caching --enable-prompt-tokens-details --max-model-len 1024 --max-logprobs 2 --seed 0 --disable-uvicorn-access-log --enable-lora --max-lora-rank 8 --max-loras 2 --lora-modules upper=reference_engine/checkpoints/lora-upper rot13=reference_engine/checkpoints/lora-rot13
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

# --- the engine: an OpenAI-compatible /v1/completions server, spoken to as kvparity's adapters/openai_http does ---
import threading
import time
import urllib.error
import urllib.request


class Driver:
    OPTIONS = [("--base-url", {"default": None, "help": "the server, e.g. http://127.0.0.1:8000 (default: the "
                               "witness's, if it attached to one)"}),
               ("--model", {"default": None, "help": "the served base model name (default: the witness's, else "
                            "the first of /v1/models)"})]

    def __init__(self, params, args):
        self.params = params
        self.base = (args.base_url or params["base_url"] or "").rstrip("/")
        if not self.base:
            raise ValueError("give the server with --base-url URL")
        self.model = args.model or params["model"] or self._call("GET", "/v1/models")["data"][0]["id"]
        self.epoch = 0

    def _call(self, method, path, body=None, raw=False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.params["timeout"]) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:200]}") from None
        return text if raw else json.loads(text)

    def configure(self, config):
        if config:
            raise ValueError(f"a server has no configuration steps (got {config}); start it with other arguments")

    def reset(self):
        if self.params["reset"] == "endpoint":
            self._call("POST", "/reset_prefix_cache", raw=True)
        elif self.params["reset"] == "salt":
            self.epoch += 1

    def close(self):
        pass

    def _body(self, q):
        body = {"model": self.model, "max_tokens": q["max_tokens"], "temperature": 0.0, "stream": False,
                "prompt": list(q["prompt"]), "stop_token_ids": list(q["stop_ids"]), "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        if self.params["logprobs"]:
            body["logprobs"] = 2
        ident = q["identity"]
        if ident["adapter"] is not None:
            body["model"] = ident["adapter"]
        if self.params["salt"]:
            salt = ident["salt"]
            if self.params["reset"] == "salt":
                salt = f"kvp{self.epoch}-{salt or ''}"
            if salt is not None:
                body["cache_salt"] = salt
        body.update(self.params["extra_body"])
        return body

    def _one(self, q, box, i):
        try:
            data = self._call("POST", "/v1/completions", self._body(q))
            choice = data["choices"][0]
            ids = choice.get("token_ids")
            if ids is None:
                raise RuntimeError(f"request {q['id']}: the completion carries no token_ids")
            output, reason = normalise_finish([int(t) for t in ids], choice.get("finish_reason"),
                                              choice.get("stop_reason"), q["stop_ids"], self.params["eos_id"],
                                              q["max_tokens"])
            details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            box[i] = {"output": output, "finish_reason": reason, "cached_tokens": cached, "draft_proposed": None,
                      "draft_accepted": None, "evictions": None}
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box[i] = exc

    def run(self, requests):
        box, threads = [None] * len(requests), []
        for i, q in enumerate(requests):  # arrival order: all in flight together, 10 ms apart
            t = threading.Thread(target=self._one, args=(q, box, i), daemon=True)
            t.start()
            threads.append(t)
            time.sleep(0.01)
        for t in threads:
            t.join(self.params["timeout"] + 5)
        for q, item in zip(requests, box):
            if item is None:
                raise RuntimeError(f"request {q['id']}: no answer within {self.params['timeout']:g}s")
            if isinstance(item, BaseException):
                raise item
        return box


# --- the witness: steps, requests (token ids, identities) and the oracle's expected outputs ---
PLAN = load_plan(r'''
{
 "format": 1,
 "description": "Standalone reproducer of kvparity witness parity-79a90c248c.json (parity) on openai_http.",
 "witness": {
  "file": "parity-79a90c248c.json",
  "engine": "openai_http",
  "engine_args": {
   "serve": "vllm"
  },
  "check": "parity",
  "case_id": "parity-79a90c248c",
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
   "step": "batch",
   "index": 0,
   "epoch": 2,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r0",
     "prompt": [35, 48, 15, 25, 47, 21, 22, 6, 17, 24, 31, 11, 9, 16, 26, 10, 49, 4, 38, 9, 18, 48, 41, 34, 40, 25, 20, 23, 51, 25, 49, 37, 15, 8, 44, 18, 30, 4, 8, 25, 21, 26, 49, 8, 38, 9, 46, 33, 15, 36, 11, 43, 37, 30, 9, 34, 16, 26, 30, 24, 32, 32, 28, 44],
     "max_tokens": 1,
     "stop_ids": [38],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": "tenant-a"
     },
     "expected": {
      "output": [55],
      "finish_reason": "length",
      "margins": [0.07342784549750192],
      "runner_up": [350]
     }
    },
    {
     "id": "r1",
     "prompt": [35, 48, 15, 25, 47, 21, 22, 6, 17, 24, 31, 11, 9, 16, 26, 10, 49, 4, 38, 9, 18, 48, 41, 34, 40, 25, 20, 23, 51, 25, 49, 37],
     "max_tokens": 1,
     "stop_ids": [4],
     "identity": {
      "revision": "a",
      "adapter": "upper",
      "adapter_digest": null,
      "salt": "upper"
     },
     "expected": {
      "output": [45],
      "finish_reason": "length",
      "margins": [1.424296147551205],
      "runner_up": [43]
     }
    },
    {
     "id": "r2",
     "prompt": [35, 48, 15, 25, 47, 21, 22, 6, 17, 24, 31, 11, 9, 16, 26, 10, 49, 4, 38, 9, 18, 48, 41, 34, 40, 25, 20, 23, 51, 25, 49, 37],
     "max_tokens": 1,
     "stop_ids": [6],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [265],
      "finish_reason": "length",
      "margins": [0.38058140722892464],
      "runner_up": [49]
     }
    },
    {
     "id": "r3",
     "prompt": [35, 48, 15, 25, 47, 21, 22, 6, 17, 24, 31, 11, 9, 16, 26, 10, 49, 4, 38, 9, 18, 48, 41, 34, 40, 25, 20, 23, 51, 25, 49, 37],
     "max_tokens": 1,
     "stop_ids": [47],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [265],
      "finish_reason": "length",
      "margins": [0.38058140722892464],
      "runner_up": [49]
     }
    }
   ]
  },
  {
   "step": "batch",
   "index": 1,
   "epoch": 2,
   "segment": 0,
   "hit_floor": 33,
   "caching_off": false,
   "requests": [
    {
     "id": "r4",
     "prompt": [35, 48, 15, 25, 47, 21, 22, 6, 17, 24, 31, 11, 9, 16, 26, 10, 49, 4, 38, 9, 18, 48, 41, 34, 40, 25, 20, 23, 51, 25, 49, 37],
     "max_tokens": 1,
     "stop_ids": [29],
     "identity": {
      "revision": "a",
      "adapter": null,
      "adapter_digest": null,
      "salt": null
     },
     "expected": {
      "output": [265],
      "finish_reason": "length",
      "margins": [0.38058140722892464],
      "runner_up": [49]
     }
    }
   ]
  }
 ],
 "engine": {
  "base_url": null,
  "model": "kvparity",
  "salt": true,
  "reset": "endpoint",
  "timeout": 120.0,
  "logprobs": true,
  "extra_body": {},
  "eos_id": 2
 }
}
''')


if __name__ == "__main__":
    sys.exit(main(PLAN, Driver))
