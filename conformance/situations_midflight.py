"""Situations of the request timeline (issue 30): arrivals while others run, aborts at each stage, and
what an aborted request left behind asked for again. Registered into `situations.SITUATIONS` (imported
at the end of conformance/situations.py); relevant only to an engine that declares the part of the
timeline they need (`Capabilities.timeline`), counted from what each result says really happened
(`arrived_at_step`, `ended_at_step`, finish_reason "abort"), never from what was asked.

This module imports nothing of `conformance.situations` (no import cycle): it lists its situations in
`TIMELINE_SITUATIONS`, with the decorator's arguments, and `situations` registers them.
"""

from __future__ import annotations

from conformance.contract import ARRIVALS, Capabilities
from conformance.history import History
from conformance.history_facts import batch_block_size, cache_epochs, lcp, results_of

TIMELINE_SITUATIONS: list[tuple] = []  # (count function, the `situations.situation` keyword arguments)


def situation(**kwargs) -> object:
    def deco(fn):
        TIMELINE_SITUATIONS.append((fn, kwargs))
        return fn
    return deco








def _arrival(caps: Capabilities) -> bool:
    return bool(ARRIVALS & caps.timeline) and caps.prefix_caching


def _abort(caps: Capabilities) -> bool:
    return "abort" in caps.timeline


def _aborted(h: History):
    for b, q, r in results_of(h):
        if r.finish_reason == "abort":
            yield b, q, r


def _running_at(s, step: int) -> bool:
    """Had the request arrived before `step` and not yet ended (its KV still being written)?"""
    return s.arrived_at_step < step and (s.ended_at_step is None or step < s.ended_at_step)


@situation(title="a request arrived while an earlier one sharing a block of its prompt was still running "
                 "(its KV still being computed)", claim="arrival while others run", relevant=_arrival)
def arrival_during_sharer_prefill(h: History) -> int:
    n = 0
    for b in h.batches():
        bs = batch_block_size(h, b)
        ran = [(q, r) for _, q, r in b.pairs() if r.arrived_at_step is not None]
        for q, r in ran:
            n += any(p.identity == q.identity and lcp(p.prompt, q.prompt) >= bs and _running_at(s, r.arrived_at_step)
                     for p, s in ran if p is not q)
    return n


@situation(title="a request aborted during its prefill (no output yet)", claim="abort", relevant=_abort)
def abort_in_prefill(h: History) -> int:
    return sum(not r.output for _, _, r in _aborted(h))


@situation(title="a request aborted while decoding (some output produced)", claim="abort", relevant=_abort)
def abort_in_decode(h: History) -> int:
    return sum(bool(r.output) for _, _, r in _aborted(h))


@situation(title="a request aborted while speculating (drafts proposed for it)", claim="abort with speculation",
           relevant=lambda caps: _abort(caps) and caps.speculation and caps.reports_drafts)
def abort_in_verification(h: History) -> int:
    return sum(bool(r.draft_proposed) for _, _, r in _aborted(h))


def _resent(h: History, same: bool) -> int:
    """Later requests of the cache epoch whose prompt shares a full block with an aborted request's
    prompt + partial output, under the same identity (`same`) or another."""
    n = 0
    for batches in cache_epochs(h):
        aborted: list = []
        for b in batches:
            bs = batch_block_size(h, b)
            for _, q, r in b.pairs():
                n += any((ident == q.identity) == same and lcp(q.prompt, tokens) >= bs for ident, tokens in aborted)
            aborted.extend((q.identity, q.prompt + tuple(r.output)) for _, q, r in b.pairs() if r.finish_reason == "abort")
    return n


@situation(title="an aborted request's prompt sent again (a full block of it) under the same identity",
           claim="abort", relevant=lambda caps: _abort(caps) and caps.prefix_caching)
def aborted_prompt_resent(h: History) -> int:
    return _resent(h, True)


@situation(title="an aborted request's prompt sent again (a full block of it) under another identity",
           claim="abort", relevant=lambda caps: _abort(caps) and caps.prefix_caching and bool(caps.identities))
def aborted_prompt_resent_other_identity(h: History) -> int:
    return _resent(h, False)
