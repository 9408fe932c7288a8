"""The `midflight` step kind (issue 30): a batch whose requests arrive while others run and are aborted
part way, then the aborted prompts sent again.

The bugs this reaches live in the gap between *scheduled* and *written*: KV of an aborted request
published to the prefix cache (SGLang 28374), a block registered when scheduled and not rolled back when
its request is aborted before the write (vLLM 43569), a shared block's reference dropped twice on the
abort path. Each shows only if (1) a request is aborted while some of its blocks are partly written —
during a multi-step prefill, or with its last block full of tokens whose KV is not written yet — and
(2) a later request is served those blocks: a sharer arriving a step later, or the same prompt (or its
continuation) sent again, under the same identity; under another, nothing may be served at all.

So the batch is drawn around one leader prompt (from the pool half the time: a prefix the cache already
holds, so members share cached blocks too): the leader first, sharers of its prefix arriving at steps drawn from the leader's life (0 .. its
max_tokens + 1), each with an abort point drawn from its whole domain, 0 .. max_tokens, weighted at the
boundaries (twice as often as the rest) — 0 (during prefill), max_tokens - 1 (one token short), and the point where prompt + output
fills a block exactly (the last block full of tokens, its last slot not yet written). Half the time a
scheduling knob is switched first (chunk size, token budget: whatever the engine declares with role
"schedule"), so prefills take several steps and an abort can land inside one.
"""

from __future__ import annotations

import functools

from attrs import evolve
from hypothesis import strategies as st

from conformance.contract import ARRIVALS, Request
from conformance.domains import max_tokens, sampled, stop_ids, token_lists, token_suffixes
from conformance.scenario import Continuation, renamed
from conformance.stream import Stream

def applies(s: Stream) -> bool:
    return bool(s.caps.timeline) and s.max_batch > 1


def _reschedule(s: Stream) -> None:
    """Another value of one scheduling knob (a chunk size, a token budget), the others as configured."""
    knobs = sorted(k for k, role in s.caps.knob_roles.items() if role == "schedule" and len(s.caps.config_space[k]) > 1)
    if not knobs or not s.draw(st.booleans()):
        return
    knob = s.draw(sampled(knobs))
    others = [v for v in s.caps.config_space[knob] if str(v) != str(s.current.get(knob, s.caps.config_space[knob][0]))]
    s.configure({**s.current, knob: s.draw(sampled(others))})


def abort_edges(bs: int, prompt_len: int, budget: int) -> list[int]:
    """The boundary abort points: 0 (during prefill), max_tokens - 1 (one token short) and the output
    length at which prompt + output ends on a block edge (where one falls within max_tokens)."""
    fill = (-prompt_len) % bs
    return sorted({0, max(0, budget - 1)} | ({fill} if fill < budget else set()))


@functools.lru_cache(maxsize=1024)
def abort_points(bs: int, prompt_len: int, budget: int) -> st.SearchStrategy[int | None]:
    """An abort point from the whole domain 0 .. max_tokens (max_tokens: too late, the request has
    finished), the boundaries first; None (not aborted) now and then. Built once per (block size,
    prompt length, max_tokens), as `domains.sampled` is: Hypothesis validates a strategy afresh the first
    time it is drawn, and a fresh one per request was half the strategies validated in a CI run."""
    edges = abort_edges(bs, prompt_len, budget)
    return st.one_of(sampled(edges), st.integers(0, budget), sampled(edges), st.none())


@functools.lru_cache(maxsize=1024)
def arrival_points(end: int) -> st.SearchStrategy[int | None]:
    """An arrival step from the life of a leader of max_tokens `end`, derived from it rather than fixed:
    0 .. end + 1 (it prefills and then commits at least a token a step, so by end + 1 it has ended), the
    boundaries first — with it, one step in (its prefill just done), its last step, just after it —
    and None (before the first step) now and then. Built once per `end` (see `abort_points`)."""
    edges = sorted({0, 1, end, end + 1})
    return st.one_of(sampled(edges), st.integers(0, end + 1), st.none())


def _timed(s: Stream, r: Request, leader: Request) -> Request:
    caps = s.caps
    arrive = s.draw(arrival_points(leader.max_tokens)) if ARRIVALS & caps.timeline else None
    abort = s.draw(abort_points(s.bs, len(r.prompt), r.max_tokens)) if "abort" in caps.timeline else None
    return evolve(r, arrive_at_step=arrive, abort_after=abort)


def _leader(s: Stream) -> Request:
    pool = s.requests_in_pool()
    if pool and s.draw(st.booleans()):
        base = s.draw(sampled(pool))
        return Request(s.next_id(), base.prompt[:s.top], s.draw(max_tokens(s.caps)), base.stop_ids, base.identity)
    return s.fresh_request()


def _sharer(s: Stream, leader: Request) -> Request:
    """A prompt sharing a drawn prefix of the leader's (at least a block where it has one), same identity."""
    n = len(leader.prompt)
    cut = s.draw(st.integers(min(n, s.bs + 1), n)) if n > 1 else n
    suffix = s.draw(token_suffixes(s.caps, 0, s.bs))
    prompt = (leader.prompt[:cut] + suffix)[:s.top] or leader.prompt[:1]
    return Request(s.next_id(), prompt, s.draw(max_tokens(s.caps)), s.draw(stop_ids(s.caps)), leader.identity)


def midflight(s: Stream) -> tuple:
    """The timed batch (added here), then the resend batch (returned): each request given an abort point
    sent again plainly — the same prompt under its identity, and under another where there is one, and
    as the next turn of a conversation (prompt + its partial output + new tokens)."""
    _reschedule(s)
    leader = _leader(s)
    members = [leader] + [_sharer(s, leader) for _ in range(s.draw(st.integers(1, s.max_batch - 1)))]
    timed = [_timed(s, r, leader) for r in members]
    timed[0] = evolve(timed[0], arrive_at_step=None)  # something runs from the first step
    s.add_batch(tuple(timed))
    aborted = [r for r in timed if r.abort_after is not None] or timed[:1]
    victim = s.draw(sampled(aborted))
    again: list = [Continuation(s.next_id(), victim.id, s.draw(token_lists(s.caps, s.draw(st.integers(1, s.bs)))),
                                s.draw(max_tokens(s.caps)), (), victim.identity, s.top)]
    others = [i for i in s.identities if i != leader.identity]
    if others:  # always: a coin here left the cross-identity resend to how Hypothesis read one boolean
        again.append(evolve(renamed(aborted[0], s.next_id(), s.top), identity=s.draw(sampled(others))))
    again += [renamed(r, s.next_id(), s.top) for r in aborted]
    return tuple(again[:s.max_batch])
