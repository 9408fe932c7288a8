"""Facts of a recorded history that the checks and the parts built on their verdicts agree on: which
results to walk (`occurrences`), what earlier traffic made cacheable (`reuse_scan`), whether a batch
evicted, a prefill was chunked or another identity's prompt could have hit, which reuse mechanisms a
result had in play, which role a knob plays and which block size a configuration sets.

The grouping of failures into root causes, the coverage model (`conformance.situations`), the report's
stories and the minimiser read a history the same way the checks do; stated here once, outside
`conformance.checks`, so none of them reaches into the checks' own helpers (`conformance.checks.common`).
"""

from __future__ import annotations

import functools

from typing import Any, Iterable, Mapping

from conformance.contract import Capabilities, Identity, Request, Result
from conformance.history import BatchRecord, Example, History


def lcp(a: Iterable[int], b: Iterable[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chunked(result: Result) -> bool:
    return (result.prefill_chunks or 0) > 1


def knob_role(caps: Capabilities | None, knob: str) -> str:
    """The claim a difference in `knob` tests, as the engine declared it (validated at the boundary)."""
    return (caps.knob_roles.get(knob) if caps else None) or "schedule"


def mechanisms(b: BatchRecord, r: Result) -> set[str]:
    """Which reuse mechanisms were active for one result, as far as the engine reported them."""
    active = set()
    if r.cached_tokens:
        active.add("cache")
    if r.draft_proposed:
        active.add("spec")
    if chunked(r) or len(b.requests) > 1 or r.preempted:
        active.add("schedule")
    return active


def occurrences(h: History) -> Iterable[tuple[BatchRecord, int, Request, Result]]:
    for b in h.batches():
        for i, q, r in b.pairs():
            if r.finish_reason != "abort":
                yield b, i, q, r


def batch_evicted(b: BatchRecord) -> bool:
    """Did this batch evict? Evidence: a result's `evictions` > 0, or snapshot["evictions"] (a running
    counter) grew since the snapshot before the batch (taken after a reset or the previous batch)."""
    if any((r.evictions or 0) > 0 for r in b.results):
        return True
    after = (b.snapshot or {}).get("evictions")
    return after is not None and b.evictions_before is not None and int(after) > b.evictions_before


def reuse_scan(h: History) -> Iterable[tuple[BatchRecord, int, Request, Result, int, int]]:
    """Walk every result with what earlier traffic made cacheable.

    Yields (batch, i, request, result, same, other) where `same` is the longest prefix shared with
    earlier same-identity traffic in this example's cache epoch and `other` the longest shared with
    traffic of a different identity. Earlier requests of the same batch count (arrival order); for
    `same`, so do the batch's later ones: an engine that serves concurrent requests may take them in
    another order (an HTTP server does), and KV shared within one identity is never a leak.
    """
    for ex in h.examples:
        if ex.reuse is None or ex.reuse[0] != len(ex.batches):
            ex.reuse = (len(ex.batches), list(_reuse_in(ex)))
        yield from ex.reuse[1]


def _reuse_in(ex: Example) -> Iterable[tuple[BatchRecord, int, Request, Result, int, int]]:
    seen: list[tuple[Identity, tuple[int, ...]]] = []
    epoch = None
    for b in ex.batches:
        if b.epoch != epoch:
            seen, epoch = [], b.epoch
        for i, q, r in b.pairs():
            later = [p.prompt for p in b.requests[i + 1:] if p.identity == q.identity]
            same = max([lcp(q.prompt, s) for ident, s in seen if ident == q.identity]
                       + [lcp(q.prompt, s) for s in later], default=0)
            other = max((lcp(q.prompt, s) for ident, s in seen if ident != q.identity), default=0)
            yield b, i, q, r, same, other
            seen.append((q.identity, q.prompt))
            seen.append((q.identity, q.prompt + tuple(r.output)))


def cross_identity_threshold(caps: Capabilities | None) -> int:
    """How many leading tokens another identity must have sent for a request to count as a cross-identity
    attempt: enough that a wrongly shared cache *could* hit (a full block, and the engine's shortest hit)."""
    if caps is None:
        return 1
    return max(1, caps.block_size, caps.min_hit_prompt - 1)


def is_cross_identity_attempt(same: int, other: int, caps: Capabilities | None) -> bool:
    return other >= cross_identity_threshold(caps) and other > same


def caching_disabled(caps: Capabilities | None, config: Mapping[str, Any]) -> bool:
    """Does `config` switch prefix caching off (a value the engine listed among a knob's `prefix_caching_off`)?"""
    if caps is None:
        return False
    return any(k.prefix_caching_off and k.name in config and k.switches_off(config[k.name]) for k in caps.knobs)


def config_block_size(config: Mapping[str, Any], default: int) -> int:
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


def naive_keys(identity, sep: str) -> set[str]:
    """The strings a key that joins the salt and adapter name present by `sep`, with no domain
    separation, makes (extra keys appended only when present, as engines build them)."""
    fields = [f for f in (identity.salt, identity.adapter) if f]
    return {sep.join(fields), sep.join(fields[::-1])}


@functools.lru_cache(maxsize=4096)
def collide(a, b) -> bool:
    """Two identities that one key joining salt and adapter by some one character (or none) confuses.
    Only a character of their own strings can join both into one string, so those (and none) are tried.
    Cached: a stream holds a handful of identities, and coverage asks about every pair of requests."""
    if a == b or a.revision != b.revision:
        return False
    seps = {""} | {c for i in (a, b) for s in (i.salt, i.adapter) if s for c in s}
    return any(naive_keys(a, sep) & naive_keys(b, sep) for sep in seps)


def results_of(h: History) -> Iterable[tuple[BatchRecord, Request, Result]]:
    """Every result of the run with its batch and request."""
    for b in h.batches():
        for _, q, r in b.pairs():
            yield b, q, r


def cache_epochs(h: History) -> Iterable[list[BatchRecord]]:
    """Each example's batches, one cache epoch (reset to reset) at a time: reuse is only possible within one."""
    for ex in h.examples:
        run: list[BatchRecord] = []
        for b in ex.batches:
            if run and b.epoch != run[-1].epoch:
                yield run
                run = []
            run.append(b)
        if run:
            yield run


def batch_block_size(h: History, b: BatchRecord) -> int:
    """The block size a batch ran with (its configuration's, else the engine's declared one)."""
    return config_block_size(b.config, h.capabilities.block_size if h.capabilities else 16)
