"""A FAKE engine, for testing the conformance suite's own logic — not an inference engine.

`FakeDictEngine` implements the Engine contract with a deterministic next-token function (a hash of the
last few tokens and the adapter) and a toy block-granular prefix cache kept in a dict. Its `bug` knob
injects the mechanisms of BUG_CLASSES.md, so the tests can show that the suite catches each one and
passes the clean engine. Constructed like any adapter: `FakeDictEngine(**{"bug": "salt_leak"})`.
"""

from __future__ import annotations

import functools
import math
import time
import zlib
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from conformance.contract import Baseline, Capabilities, EosPath, Landmarks, Request, Result
from conformance.knobs import Knob

BUGS = ("none", "salt_leak", "adapter_leak", "overreport", "phantom", "wrong_after_hit", "spec_wrong",
        "spec_overaccept", "chunk_wrong", "leak_blocks", "no_report", "near_tie", "full_hit", "crash", "hang",
        "malformed", "stop_ignored")
EOS = 3


class FakeDictEngine:
    """A fake, for testing the suite's own logic. Bugs are opt-in via `bug=`."""

    def __init__(self, bug: str = "none", tolerance: str = "0", block_size: str = "4", hang_s: str = "5") -> None:
        if bug not in BUGS:
            raise ValueError(f"unknown bug {bug!r}; choose from {', '.join(BUGS)}")
        self.bug, self.tolerance, self.block = bug, float(tolerance), int(block_size)
        self.hang_s = float(hang_s)
        self.config: dict[str, Any] = {}
        self.cache: OrderedDict[tuple, str | None] = OrderedDict()
        self.evictions = 0
        self.batches = 0

    # --------------------------------------------------------------- the "model"

    def _step(self, adapter: str | None, ctx: Sequence[int]) -> tuple[int, float, int]:
        """(token, margin to runner-up, runner-up) for the next position."""
        h = zlib.crc32(repr((adapter, tuple(ctx[-3:]), len(ctx) % 5)).encode())
        tok = EOS if h % 29 == 0 else 4 + h % 60
        runner_up = 4 + (tok + 1) % 60
        return tok, ((h >> 8) % 40) / 10, runner_up

    def _generate(self, q: Request, adapter: str | None) -> tuple[list[int], str, list[float], list[int]]:
        ctx, out, margins, runners = list(q.prompt), [], [], []
        reason = "length"
        for _ in range(q.max_tokens):
            tok, margin, ru = self._step(adapter, ctx)
            out.append(tok), margins.append(margin), runners.append(ru), ctx.append(tok)
            if tok in q.stop_ids and self.bug != "stop_ignored":
                reason = "stop"
                break
            if tok == EOS:
                reason = "eos"
                break
        return out, reason, margins, runners

    # --------------------------------------------------------------- the contract

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="fake-dict", vocab_size=64, max_context=256, eos_id=EOS, block_size=self.block,
            prefix_caching=True, reports_cached_tokens=True, speculation=True, reports_drafts=True,
            chunked_prefill=True, evicts=True, identities={"salt", "adapter"}, adapters=("lora1",),
            introspection=True, tolerance=self.tolerance, min_hit_prompt=self.block + 1, version="fake-1",
            knobs=(Knob("spec_k", (0, 2), "speculation", off=(0,)), Knob("chunk", (0, 8), "schedule"),
                   Knob("cache_blocks", (256, 6), "cache")),
            landmarks=fake_landmarks())

    def configure(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.cache.clear()  # a "restart"

    def reset(self) -> None:
        self.cache.clear()

    def close(self) -> None:
        pass

    def baseline(self, request: Request) -> Baseline:
        out, reason, margins, runners = self._generate(request, request.identity.adapter)
        return Baseline(out, reason, margins, runners)

    def snapshot(self) -> Mapping[str, Any]:
        cap = int(self.config.get("cache_blocks", 256))
        return {"blocks_in_use": self.batches if self.bug == "leak_blocks" else 0, "provisional_live": 0,
                "refcounts_ok": True, "free_blocks": cap - len(self.cache), "cached_blocks": len(self.cache),
                "total_blocks": cap, "evictions": self.evictions}

    def _key(self, q: Request, prefix: tuple[int, ...]) -> tuple:
        i = q.identity
        salt = None if self.bug == "salt_leak" else i.salt
        adapter = None if self.bug == "adapter_leak" else i.adapter
        return (i.revision, adapter, i.adapter_digest, salt, prefix)

    def run(self, requests: Sequence[Request]) -> list[Result]:
        if self.bug == "crash":
            raise RuntimeError("fake engine crashed: CUDA error: an illegal memory access\nsecond line")
        if self.bug == "hang":
            time.sleep(self.hang_s)
        self.batches += 1
        results = [self._one(q) for q in requests]
        return results[:-1] if self.bug == "malformed" else results

    def _one(self, q: Request) -> Result:
        b, n = self.block, len(q.prompt)
        cached, owner = 0, q.identity.adapter
        for end in range(b, n, b):  # block-aligned, never the last prompt token
            key = self._key(q, q.prompt[:end])
            if key not in self.cache:
                break
            cached, owner = end, self.cache[key]
            self.cache.move_to_end(key)
        out, reason, margins, runners = self._generate(q, owner if cached else q.identity.adapter)
        if self.bug == "wrong_after_hit" and cached:
            out[0] = 4 + (out[0] + 7) % 60
        if self.bug == "near_tie":
            # Numerics noise, not a reuse bug: on ANY request (cached or not), the first position whose
            # margin is small comes out as the runner-up. Firing on every request keeps the near-tie
            # test independent of what a seed happens to generate (cache hits or not).
            tie = next((i for i, m in enumerate(margins) if m < 1.0), None)
            if tie is not None:
                out[tie] = runners[tie]  # never EOS; what follows is past the divergence, not compared
        k = int(self.config.get("spec_k", 0))
        proposed = accepted = None
        if k:
            proposed, accepted = k * len(out), (k * len(out)) // 2
            if self.bug == "spec_overaccept":
                accepted = proposed + 1
            if self.bug == "spec_wrong" and len(out) > 2:
                out[2] = 4 + (out[2] + 5) % 60
        chunks = None
        chunk = int(self.config.get("chunk", 0))
        if chunk and n - cached > chunk:
            chunks = math.ceil((n - cached) / chunk)
            if self.bug == "chunk_wrong":
                out[-1] = 4 + (out[-1] + 3) % 60
        before = self.evictions
        full = q.prompt + tuple(out)
        for end in range(b, len(full) + 1, b):
            key = self._key(q, full[:end])
            if key not in self.cache:
                self.cache[key] = q.identity.adapter
                if len(self.cache) > int(self.config.get("cache_blocks", 256)):
                    self.cache.popitem(last=False)
                    self.evictions += 1
        evictions = self.evictions - before if self.evictions > before else None
        reported = cached
        if self.bug == "overreport" and cached:
            reported = min(cached + b, n - 1)  # one phantom block
        if self.bug == "phantom" and n > 1:
            reported = max(cached, min(n - 1, b))
        if self.bug == "full_hit" and cached:
            reported = n
        if self.bug == "no_report":
            reported = 0
        return Result(q.id, out, reason, cached_tokens=reported, draft_proposed=proposed, draft_accepted=accepted,
                      evictions=evictions, prefill_chunks=chunks)


@functools.cache
def fake_landmarks() -> Landmarks:
    """The fake model's own landmarks, found the way adapters/landmark_search.py finds a real model's
    (greedy decoding that reaches eos, cut before it): eos paths of one and two tokens; and a same-text
    pair declared as if a tokenizer had one (the fake has no text). Without them its eos and same-text
    situations would be "not steered" and every clean run inconclusive (issue 28.3)."""
    step = FakeDictEngine._step
    paths = []
    for a in range(4, 64):
        for b in range(4, 64):
            t = step(None, None, [a, b])[0]
            u = step(None, None, [a, b, t])[0]
            if t != EOS and u == EOS:
                paths.append(EosPath("a", (a, b), (t,)))
            if len(paths) == 3:
                return Landmarks(eos_paths=tuple(paths), same_text=(((50,), (51, 52)),))
    return Landmarks(same_text=(((50,), (51, 52)),))
