"""Checks on what the engine *reports* and on who may share KV: isolation, prefix-only, accounting,
rollback hygiene (white-box) and the vacuity guard `exercised`.

Reported counts are checked against what the history makes possible: a request can have at most as
many cached tokens as the longest prefix it shares with earlier traffic of the *same identity* since
the last reset (prompts and prompt+output of earlier requests count). More than that means KV came from
somewhere it must not (BUG_CLASSES A) or the count lies (E).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from conformance.contract import Identity, Request, Result
from conformance.checks import (Findings, batch_evicted, check, chunked, context_prose, lcp, occurrences,
                                request_json, vs_baseline)
from conformance.history import BatchRecord, History
from conformance.verdicts import FAIL, INCONCLUSIVE, PASS, CheckResult


def reuse_scan(h: History) -> Iterable[tuple[BatchRecord, int, Request, Result, int, int, list[int]]]:
    """Walk every result with what earlier traffic made cacheable.

    Yields (batch, i, request, result, same, other, other_len) where `same` is the longest prefix shared
    with earlier same-identity traffic in this example's cache epoch and `other` the longest shared with
    traffic of a different identity. Earlier requests of the same batch count (arrival order).
    """
    for ex in h.examples:
        seen: list[tuple[Identity, tuple[int, ...]]] = []
        epoch = None
        for b in ex.batches:
            if b.epoch != epoch:
                seen, epoch = [], b.epoch
            for i, q, r in b.pairs():
                same = max((lcp(q.prompt, s) for ident, s in seen if ident == q.identity), default=0)
                other = max((lcp(q.prompt, s) for ident, s in seen if ident != q.identity), default=0)
                yield b, i, q, r, same, other, []
                seen.append((q.identity, q.prompt))
                seen.append((q.identity, q.prompt + tuple(r.output)))


def _min_poison(h: History) -> int:
    caps = h.capabilities
    return max(1, caps.block_size if caps else 1, caps.min_hit_prompt - 1 if caps else 1)


@check("isolation", title="KV never serves another identity", severity="critical", bug_class="A",
       applies=lambda c: c.reports_cached_tokens or bool(c.identities))
def isolation(h: History) -> CheckResult:
    """Cached tokens <= prefix shared with the same identity; cross-identity poisoning never changes output."""
    f = Findings("isolation")
    threshold = _min_poison(h)
    for b, i, q, r, same, other, _ in reuse_scan(h):
        if r.cached_tokens is not None:
            f.stats["reports_checked"] += 1
            if r.cached_tokens > same:
                leak = r.cached_tokens <= other
                title = ("cached tokens served across identities" if leak
                         else "cached tokens exceed any prefix seen before")
                f.fail(b.example, title,
                       f"Request {q.id} ({q.identity.label()}) reported {r.cached_tokens} cached prompt tokens, but "
                       f"it shares only {same} leading tokens with earlier traffic of its own identity since the "
                       f"last reset" + (f" (and {other} with another identity's traffic: its KV was reused)."
                                        if leak else "; no earlier traffic explains the hit."),
                       {"batch": b.index, "request": request_json(q), "identity": q.identity.label(),
                        "cached_tokens": r.cached_tokens, "shared_same_identity": same,
                        "shared_other_identity": other, "config": b.config},
                       bug_class="A" if leak else "E")
        if other >= threshold and other > same and r.finish_reason != "abort":
            f.stats["poison_attempts"] += 1
            vs_baseline(f, h, b, i, q, r, "output changed after another identity warmed the same prefix",
                        f"Another identity had just sent the same {other} leading tokens; its KV must not serve "
                        f"{q.identity.label()}.")
    exercised = f.stats["reports_checked"] > 0 or f.stats["poison_attempts"] > 0
    return f.result(exercised, "no cached-token report and no cross-identity attempt")


@check("prefix_only", title="a hit never covers the whole prompt", severity="high", bug_class="B",
       applies=lambda c: c.reports_cached_tokens)
def prefix_only(h: History) -> CheckResult:
    """cached <= Lin - 1: the last prompt token is always computed, so a hit never skips generation."""
    f = Findings("prefix_only")
    for b, i, q, r in occurrences(h):
        if r.cached_tokens:
            f.stats["hits"] += 1
            if r.cached_tokens > len(q.prompt) - 1:
                f.fail(b.example, "cache hit covers the last prompt token",
                       f"Request {q.id} reported {r.cached_tokens} cached tokens of a {len(q.prompt)}-token prompt; "
                       f"the last prompt token must always be computed to get fresh logits (else the engine "
                       f"samples stale logits).", {"batch": b.index, "request": request_json(q),
                                                    "cached_tokens": r.cached_tokens, "prompt_len": len(q.prompt)})
    return f.result(f.stats["hits"] > 0, "no prefix hit reported")


def _accounting_problems(q: Request, r: Result, eos: int | None) -> list[tuple[str, str]]:
    out = list(r.output)
    bad: list[tuple[str, str]] = []
    if r.cached_tokens is not None and not 0 <= r.cached_tokens <= len(q.prompt):
        bad.append(("cached tokens out of range", f"cached_tokens={r.cached_tokens} for a {len(q.prompt)}-token prompt"))
    if r.draft_proposed is not None and r.draft_proposed < 0 or r.draft_accepted is not None and r.draft_accepted < 0:
        bad.append(("negative draft counts", f"proposed={r.draft_proposed}, accepted={r.draft_accepted}"))
    if r.draft_proposed is not None and r.draft_accepted is not None and r.draft_accepted > r.draft_proposed:
        bad.append(("more drafts accepted than proposed", f"accepted {r.draft_accepted} > proposed {r.draft_proposed}"))
    if len(out) > q.max_tokens:
        bad.append(("more tokens than max_tokens", f"{len(out)} tokens > max_tokens {q.max_tokens}"))
    terminal = set(q.stop_ids) | ({eos} if eos is not None else set())
    early = [j for j, t in enumerate(out[:-1]) if t in terminal]
    if r.finish_reason != "abort" and early:
        bad.append(("generation continued past a stop/eos token",
                    f"token {out[early[0]]} at position {early[0]} should have ended generation"))
    fr = r.finish_reason
    if fr == "length" and len(out) != q.max_tokens:
        bad.append(("finish_reason 'length' without reaching max_tokens", f"{len(out)} of {q.max_tokens} tokens"))
    elif fr == "stop" and (not out or out[-1] not in q.stop_ids):
        bad.append(("finish_reason 'stop' without a stop token", f"last token {out[-1] if out else None}, stop_ids {list(q.stop_ids)}"))
    elif fr == "eos" and (not out or eos is None or out[-1] != eos):
        bad.append(("finish_reason 'eos' without eos", f"last token {out[-1] if out else None}, eos {eos}"))
    elif fr not in ("length", "stop", "eos", "abort"):
        bad.append(("unknown finish_reason", repr(fr)))
    return bad


@check("accounting", title="reported counts are consistent with outputs", severity="medium", bug_class="E")
def accounting(h: History) -> CheckResult:
    """Reported cached/accepted counts and finish reasons are consistent with outputs and each other."""
    f = Findings("accounting")
    eos = h.capabilities.eos_id if h.capabilities else None
    for b in h.batches():
        for i, q, r in b.pairs():
            f.stats["results"] += 1
            for title, detail in _accounting_problems(q, r, eos):
                f.fail(b.example, title, f"Request {q.id}: {detail} (finish_reason {r.finish_reason!r}, "
                       f"{len(r.output)} output tokens, max_tokens {q.max_tokens}).",
                       {"batch": b.index, "request": request_json(q), "output": list(r.output),
                        "finish_reason": r.finish_reason, "cached_tokens": r.cached_tokens,
                        "draft_proposed": r.draft_proposed, "draft_accepted": r.draft_accepted})
    return f.result(f.stats["results"] > 0, "no results")


# Snapshot keys read by rollback_hygiene (see contract.Introspectable): each is optional; present ones
# must hold their value once a batch has completed.
SNAPSHOT_AT_REST = {"blocks_in_use": 0, "provisional_live": 0, "rejected_in_cache": 0, "refcounts_ok": True}


@check("rollback_hygiene", title="pool returns to its base after every batch", severity="high", bug_class="C",
       applies=lambda c: c.introspection)
def rollback_hygiene(h: History) -> CheckResult:
    """(white-box) No provisional or rejected KV survives a batch; the pool returns to its base. Also
    after a batch the engine failed: a leak often ends in a stall, and its snapshot names the leak."""
    f = Findings("rollback_hygiene")
    for b in h.batches():
        if b.snapshot is None:
            continue
        f.stats["snapshots"] += 1
        problems = pool_problems(b.snapshot)
        if problems:
            f.fail(b.example, "pool not back to base after a batch",
                   f"After batch {b.index} completed ({context_prose(b, b.results[0]) if b.results else ''}): "
                   + "; ".join(problems) + ". Provisional (rejected draft) KV or leaked blocks survive the batch.",
                   {"batch": b.index, "snapshot": dict(b.snapshot), "config": b.config,
                    "requests": [request_json(q) for q in b.requests]})
    for ex in h.examples:
        for fb in ex.failed_batches:
            f.stats["snapshots"] += 1
            problems = pool_problems(fb.snapshot)
            if problems:
                f.fail(fb.example, "pool not back to base after a failed batch",
                       f"Batch {fb.index} ({len(fb.requests)} requests; config {dict(fb.config)}) ended in an engine "
                       f"error ({ex.errors[-1] if ex.errors else 'unknown'}), and the pool is not back to base: "
                       + "; ".join(problems) + ". Blocks that outlive their requests are a leak; a leak ends in "
                       "a stall once nothing more can be allocated.",
                       {"batch": fb.index, "snapshot": dict(fb.snapshot), "config": dict(fb.config),
                        "requests": [request_json(q) for q in fb.requests]})
    return f.result(f.stats["snapshots"] > 0, "introspection claimed but no snapshot recorded")


def pool_problems(snap: Mapping[str, Any]) -> list[str]:
    """What in a snapshot differs from the pool at rest (SNAPSHOT_AT_REST; free + cached = total)."""
    problems = [f"{k}={snap[k]!r} (expected {v!r})" for k, v in SNAPSHOT_AT_REST.items() if k in snap and snap[k] != v]
    if all(k in snap for k in ("free_blocks", "cached_blocks", "total_blocks")):
        if int(snap["free_blocks"]) + int(snap["cached_blocks"]) != int(snap["total_blocks"]):
            problems.append(f"free_blocks {snap['free_blocks']} + cached_blocks {snap['cached_blocks']} != "
                            f"total_blocks {snap['total_blocks']}")
    return problems


def _caching_disabled(config) -> bool:
    return any("prefix" in k.lower() and str(v).lower() in ("false", "0", "off", "none") for k, v in config.items())


@check("exercised", title="the run exercised every claimed capability", severity="medium", bug_class="E",
       scope="run")
def exercised(h: History) -> CheckResult:
    """Vacuity guard and positive control: claimed-but-never-exercised capabilities make the run inconclusive."""
    f = Findings("exercised")
    caps = h.capabilities
    if caps is None:
        return CheckResult("exercised", INCONCLUSIVE, notes=("no capabilities recorded",))
    for b in h.batches():
        f.stats["evictions"] += int(batch_evicted(b))
        for q, r in zip(b.requests, b.results):
            f.stats["results"] += 1
            f.stats["cached_tokens"] += r.cached_tokens or 0
            f.stats["drafts_accepted"] += r.draft_accepted or 0
            f.stats["chunked"] += int(chunked(r))
    threshold = max(1, caps.block_size, caps.min_hit_prompt - 1)
    for b, i, q, r, same, other, _ in reuse_scan(h):
        f.stats["cross_identity_attempts"] += int(other >= threshold and other > same)
    gaps = []
    if caps.prefix_caching and caps.reports_cached_tokens and not f.stats["cached_tokens"]:
        gaps.append("prefix caching claimed but no cached token was ever reported")
    if caps.speculation and caps.reports_drafts and not f.stats["drafts_accepted"]:
        gaps.append("speculation claimed but no draft token was ever accepted")
    if caps.evicts and not f.stats["evictions"]:
        gaps.append("eviction claimed but none observed")
    if caps.chunked_prefill and not f.stats["chunked"]:
        gaps.append("chunked prefill claimed but no prefill was chunked (Result.extra['prefill_chunks'])")
    if caps.identities and not f.stats["cross_identity_attempts"]:
        gaps.append("identities claimed but no identity ever sent another identity's prefix")
    if caps.prefix_caching and caps.reports_cached_tokens:
        _positive_control(f, h)
    for gap in gaps:
        f.note(gap)
    status = FAIL if f.failures else (INCONCLUSIVE if gaps or not f.stats["results"] else PASS)
    return CheckResult("exercised", status, f.failures, f.notes, dict(f.stats))


def config_block_size(config, default: int) -> int:
    """The block size a configuration sets (a knob named like "block_size"), else the declared one:
    `Capabilities.block_size` describes the default configuration, and a prompt that surely hits at
    block size 16 may be shorter than one block of 32."""
    for k, v in config.items():
        if "block_size" in k.lower():
            try:
                return max(default, int(v))
            except (TypeError, ValueError):
                pass
    return default


def _positive_control(f: Findings, h: History) -> None:
    """A same-identity exact repeat of a long-enough prompt, in a later batch of the same cache epoch and
    configuration, with no eviction in between, must report a hit."""
    caps = h.capabilities
    assert caps is not None
    for ex in h.examples:
        seen: dict[tuple, int] = {}
        state = None
        for b in ex.batches:
            evicted = batch_evicted(b)
            if (b.epoch, b.segment) != state or evicted or _caching_disabled(b.config):
                seen, state = {}, (b.epoch, b.segment)
                if evicted or _caching_disabled(b.config):
                    continue
            bs = config_block_size(b.config, caps.block_size)
            for i, q, r in b.pairs():
                key = (q.identity, q.prompt)
                long_enough = len(q.prompt) > max(caps.min_hit_prompt, caps.block_size, bs)
                if key in seen and long_enough and r.cached_tokens == 0:
                    f.stats["positive_control_misses"] += 1
                    f.fail(b.example, "exact repeat reported no cache hit",
                           f"Request {q.id} repeats the {len(q.prompt)}-token prompt of batch {seen[key]} under the "
                           f"same identity and configuration with no reset or eviction in between, yet reported 0 "
                           f"cached tokens: either the prefix cache is not working or its count is not reported.",
                           {"batch": b.index, "earlier_batch": seen[key], "request": request_json(q),
                            "config": b.config})
                elif key in seen and long_enough:
                    f.stats["positive_controls"] += 1
            for q in b.requests:
                seen.setdefault((q.identity, q.prompt), b.index)
