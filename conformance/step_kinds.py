"""The kinds of step a stream is drawn from: fresh batches, resends, conversations, poisoning, splices,
floods, flushes, and the steps that go where the engine's landmarks say a rare situation is."""

from __future__ import annotations

from attrs import evolve
from hypothesis import strategies as st

from conformance import step_counts
from conformance.contract import EosPath, Identity, Request
from conformance.domains import (ONE_CHARACTER, adapter_bindings, max_tokens, nearest_by_input, sampled, stop_ids,
                                 token_lists, token_suffixes)
from conformance.midflight_steps import applies as midflight_applies, midflight
from conformance.scenario import MAX_NEW, Continuation, Reset, renamed
from conformance.stream import StepKind, Stream


def _batch(s: Stream) -> tuple:
    return tuple(s.fresh_request() for _ in range(s.draw(st.integers(1, s.max_batch))))


def _resend(s: Stream) -> tuple:
    order = s.draw(st.permutations(s.pick_from_pool()))
    return tuple(renamed(p, s.next_id(), s.fit(p)) for p in order)


def _continue(s: Stream) -> tuple:
    parent = s.draw(sampled(s.pool))
    extra = s.draw(token_suffixes(s.caps, 1, s.caps.block_size + 1))
    return (Continuation(s.next_id(), parent.id, extra, s.draw(max_tokens(s.caps)), s.draw(stop_ids(s.caps)),
                         parent.identity, s.top),)


def runs_on(item: Request | Continuation) -> bool:
    """Nothing but eos or the length limit ends its output, and that limit leaves more than one token."""
    return not item.stop_ids and item.max_tokens > 1 and getattr(item, "restop", None) is None


def _restop(s: Stream) -> tuple:
    # A stop past position 0 of the parent's output, where a draft run can carry it (a stop at position
    # 0 is the prefill's token, never a draft's; random stop ids fire there already), its ends weighted:
    # the first draft position and the last the parent reached. Each turn's parent is one whose output
    # ran on (no stop of its own, room for more than one token) where there is one, and its max_tokens
    # 2 or more (the ends weighted); the turn resumes the parent's text as far as it must to reach the
    # stop (`scenario_runner.restop_turn`). A batch of them, of any size the stream allows.
    parents = sampled([p for p in s.pool if runs_on(p)] or s.pool)

    def turn(parent: Request | Continuation) -> Continuation:
        return Continuation(s.next_id(), parent.id, s.draw(token_lists(s.caps, 1)), s.draw(_TURN_BUDGET), (),
                            parent.identity, s.top, restop=s.draw(_STOP_AT))
    return tuple(turn(s.draw(parents)) for _ in range(s.draw(st.integers(1, s.max_batch))))


_STOP_AT = st.one_of(st.sampled_from((1, MAX_NEW)), st.integers(1, MAX_NEW))
_TURN_BUDGET = st.one_of(st.sampled_from((2, MAX_NEW)), st.integers(2, MAX_NEW))


def _poison(s: Stream) -> tuple:
    # Half the time the nearest other identity (one input changed: a key that drops exactly that input
    # collides), else any other one.
    victim = s.draw(sampled(s.requests_in_pool()))
    others = [i for i in s.identities if i != victim.identity]
    near = nearest_by_input(victim.identity, others)
    if near and s.draw(st.booleans()):
        other = s.draw(sampled(sorted(near)).flatmap(lambda k: sampled(near[k])))
    else:
        other = s.draw(sampled(others))
    # Often the very same prompt (one tenant's exact request under another's identity).
    suffix = s.draw(st.one_of(st.just(()), token_suffixes(s.caps, 1, s.caps.block_size)))
    return (Request(s.next_id(), (victim.prompt + suffix)[:s.top], victim.max_tokens, victim.stop_ids, other),)


def _spliceable(s: Stream) -> list[Request]:
    return [p for p in s.requests_in_pool() if len(p.prompt) > s.bs]


def _splice(s: Stream) -> tuple:
    # Whole blocks of earlier prompts recombined: one to three pieces, each a run of blocks cut at the
    # block size in effect from a prompt of one identity, joined, then new tokens (so the last piece can
    # be served). Every block was sent before, most of them now after another prefix or at another position:
    # a shifted tail, a block repeated, two prompts' heads joined. Only a key chained to its parent tells
    # them apart, and only KV computed at its own positions serves them. Shrinks to a resend plus a token.
    bs = s.bs
    first = s.draw(sampled(_spliceable(s)))
    same = [p for p in _spliceable(s) if p.identity == first.identity]
    prompt: tuple = ()
    for i in range(s.draw(st.integers(1, 3))):
        p = first if i == 0 else s.draw(sampled(same))
        blocks = len(p.prompt) // bs
        start = s.draw(st.integers(0, blocks - 1))
        prompt += p.prompt[start * bs:(start + s.draw(st.integers(1, blocks - start))) * bs]
    suffix = s.draw(token_suffixes(s.caps, 1, bs))
    return (Request(s.next_id(), (prompt + suffix)[:s.top], first.max_tokens, first.stop_ids, first.identity),)


def _flood(s: Stream) -> tuple:
    # Memory pressure: a full batch of long, unrelated prompts, so a small pool must evict (and preempt) —
    # eviction and reuse of evicted blocks are where refcount bugs show (BUG_CLASSES D). Drawn only where
    # it can press (`can_flood`).
    n = s.draw(st.integers(max(1, s.top // 2), s.top))
    return tuple(Request(s.next_id(), s.draw(token_lists(s.caps, n)), s.draw(max_tokens(s.caps)), (), s.draw(s.ident))
                 for _ in range(s.max_batch))


def can_flood(s: Stream) -> bool:
    """Whether a flood can exhaust the pool in effect. A pool holds at least one request of the longest
    context it allows, so a flood that fits in that context evicts nothing: it is then only four long
    prompts, the most expensive step of the CI profile (a third of a second each, speculating), and a
    plain batch is drawn instead."""
    return s.max_batch * (s.top + MAX_NEW) > s.caps.context_limit(s.current)


def _flush_resend(s: Stream, keep: int | None = None, max_new: int = MAX_NEW) -> tuple:
    # The same traffic again after a flush: nothing may be reported cached that the flush dropped
    # (lmdeploy 4917: counts reported after they stopped being valid), and outputs must not depend on
    # the warm cache being gone. `keep`, `max_new`: prompts cut to that many tokens, outputs capped.
    s.steps.append(Reset())
    top = min(s.top, keep or s.top)
    return tuple(evolve(renamed(p, s.next_id(), top), max_tokens=min(p.max_tokens, max_new))
                 for p in s.pick_from_pool())


# -- steering: steps that reach what random prompts almost never do ------------------------------------
# The engine's landmarks (Capabilities.landmarks: eos paths, near-ties, same-text pairs, found by its
# adapter from the model and tokenizer) say where a rare situation is; these steps go there.


def landmark_revisions(s: Stream) -> set[str]:
    return {i.revision for i in s.identities}


def _landmark_identity(s: Stream, revision: str) -> Identity:
    """The landmark's own weights (no adapter: it was found on the base model), any salt."""
    salts = sorted({i.salt for i in s.identities}, key=lambda x: (x is not None, x or ""))
    return Identity(revision=revision, salt=s.draw(sampled(salts)))


def _eos_paths(s: Stream) -> list[EosPath]:
    # Longest continuation first: Hypothesis favours the first element, and eos deep in a window is
    # the rare case (eos at position 0 comes from the prefill, never from a draft).
    revs = landmark_revisions(s)
    return sorted((p for p in s.caps.landmarks.eos_paths
                   if p.revision in revs and len(p.prompt) + len(p.continuation) <= s.top),
                  key=lambda p: -len(p.continuation))


def _eos(s: Stream, path: EosPath | None = None, at: int | None = None) -> tuple:
    # eos at output position `at` of a known eos path: inside a draft run, as the bonus token, as the
    # last token max_tokens allows, or just past it (then the request ends on length one token short).
    # Often a second offset of the same path in the next batch: it shares the first's prompt, so it
    # meets eos on a warm cache. `path` and `at` given: that one placement (the bonus tail's), always
    # sent twice, the second time on the first's cache, with room past eos (so only eos can end it).
    path = path or s.draw(sampled(_eos_paths(s)))
    ident = _landmark_identity(s, path.revision)
    items, given = [], at is not None
    for _ in range(2 if given else s.draw(st.integers(1, 2))):
        at = len(path.continuation) - s.draw(st.integers(0, len(path.continuation))) if at is None else at  # deepest first
        prompt = path.prompt + path.continuation[:len(path.continuation) - at]
        budget = s.draw(st.integers(at + 2, MAX_NEW) if given else
                        st.one_of(st.integers(at + 1, MAX_NEW), sampled((at + 1, max(1, at)))))
        items.append(Request(s.next_id(), prompt, budget, s.draw(stop_ids(s.caps)), ident))
    for warm in items[:-1]:
        s.add_batch((warm,))
    return items[-1:]


def _near_tie(s: Stream) -> tuple:
    revs = landmark_revisions(s)
    tie = s.draw(sampled([t for t in s.caps.landmarks.near_ties if t.revision in revs and len(t.prompt) <= s.top]))
    tied = Request(s.next_id(), tie.prompt, s.draw(max_tokens(s.caps)), (), _landmark_identity(s, tie.revision))
    s.add_batch((tied,))  # cold, then again warm: the tie decided on the prefill path and on the cache-hit path
    return (renamed(tied, s.next_id(), s.top),)


def hit_block_size(s: Stream, n: int) -> None:
    """Switch to a block size under which a prompt of `n` tokens can be served from the cache (one full
    block before its last token), where the one in effect is too large and the engine has another."""
    sizes = [v for v in s.caps.config_space.get("block_size", ()) if int(v) < n]
    if n <= s.bs and sizes:
        s.configure({**s.current, "block_size": sizes[0]})


def _near_ties_tail(s: Stream) -> None:
    # Every near-tie landmark, each cold then warm: which ties a lower-precision path flips depends on
    # the path (TF32 logits flip one of the shipped target's two ties, not the other), so one drawn tie
    # left a seed without a flip; and under a block size as long as the tie's prompt nothing is cached.
    revs = landmark_revisions(s)
    ties = [t for t in s.caps.landmarks.near_ties if t.revision in revs and len(t.prompt) <= s.top]
    hit_block_size(s, min(len(t.prompt) for t in ties))
    cold = tuple(Request(s.next_id(), t.prompt, 1, (), _landmark_identity(s, t.revision))  # the tie is its first token
                 for t in ties if len(t.prompt) <= s.top)
    s.add_batch(cold)
    s.add_batch(tuple(renamed(r, s.next_id(), s.top) for r in cold))


def _respell(s: Stream) -> None:
    # One text in two spellings, one batch after the other: the first warms the cache, the second must
    # not be served its KV (a cache keyed on text, or an engine that re-tokenises, confuses them).
    # Half the time two pairs swapped the opposite ways, so both spellings have as many tokens (and
    # every block the same text and token count: a block key built from text collides then too).
    pairs = s.caps.landmarks.same_text
    one, other = s.draw(sampled(pairs))
    if s.draw(st.booleans()):
        one2, other2 = s.draw(sampled(pairs))
        one, other = one + other2, other + one2
    elif s.draw(st.booleans()):
        one, other = other, one
    base = s.fresh_request()
    room = min(s.top - max(len(one), len(other)), 2 * s.bs + 1)
    prompt = base.prompt[:max(0, room)]
    cut = s.draw(st.integers(0, len(prompt)))
    if len(one) == len(other) <= s.bs and room > s.bs:
        # Both spellings inside the first block, and a full block before the prompt's last token: every
        # block then has one text in both and the first is reusable — where a text-keyed cache hits.
        prompt = (prompt + base.prompt * (s.bs + 1))[:max(len(prompt), s.bs + 1 - len(one))]
        cut = s.draw(st.integers(0, s.bs - len(one)))
    for spelling in (one, other):
        s.add_batch((Request(s.next_id(), prompt[:cut] + spelling + prompt[cut:], base.max_tokens, base.stop_ids,
                             base.identity),))


def colliding_pair(s: Stream) -> tuple[Identity, Identity]:
    """Two distinct identities whose salt and adapter name give one string when joined without domain
    separation (`salt + sep + adapter` vs salt alone): a key built that way serves one the other's KV.
    The salt is one in play and the separator any one character or none (drawn, not listed)."""
    named = [(n, d) for n, d in adapter_bindings(s.caps) if n]
    name, digest = s.draw(sampled(named))
    sep = s.draw(ONE_CHARACTER)
    stem = s.draw(sampled(sorted({i.salt for i in s.identities if i.salt})))
    revision = s.draw(sampled(sorted(landmark_revisions(s))))
    fused = Identity(revision=revision, salt=s.draw(sampled((stem + sep + name, name + sep + stem))))
    split = Identity(revision=revision, adapter=name, adapter_digest=digest, salt=stem)
    return (fused, split) if s.draw(st.booleans()) else (split, fused)


def _collide(s: Stream) -> None:
    first, second = colliding_pair(s)
    pool = s.requests_in_pool()
    base = s.draw(sampled(pool)) if pool and s.draw(st.booleans()) else s.fresh_request()
    prompt = base.prompt[:min(s.top, 2 * s.bs + 1)]
    for ident in (first, second):
        s.add_batch((Request(s.next_id(), prompt, base.max_tokens, base.stop_ids, ident),))


def _reloadable(s: Stream) -> list[Request]:
    digests = {}
    for name, digest in adapter_bindings(s.caps):
        digests.setdefault(name, set()).add(digest)
    return [p for p in s.requests_in_pool() if p.identity.adapter and len(digests.get(p.identity.adapter, ())) > 1]


def _reload(s: Stream) -> tuple:
    # The adapter reloaded in place (same name, other weights), then the same prompt: the KV of the old
    # weights must not serve it (BUG_CLASSES A).
    victim = s.draw(sampled(_reloadable(s)))
    name = victim.identity.adapter
    other = s.draw(sampled(sorted(d for n, d in adapter_bindings(s.caps)
                                          if n == name and d != victim.identity.adapter_digest)))
    return (Request(s.next_id(), victim.prompt[:s.top], victim.max_tokens, victim.stop_ids,
                    evolve(victim.identity, adapter_digest=other)),)


def _sharers(s: Stream) -> tuple:
    # Requests that share a prefix nobody sent yet, in one batch: its blocks are being computed in the
    # very step another member wants them (under chunked prefill, over several steps).
    bs = s.bs
    top = max(2, s.top - bs)
    root = s.draw(token_suffixes(s.caps, min(bs + 1, top), min(top, 2 * bs + 1)))
    ident = s.draw(s.ident)
    return tuple(Request(s.next_id(), (root + s.draw(token_lists(s.caps, s.draw(st.integers(1, max(1, bs // 2))))))[:s.top],
                         s.draw(max_tokens(s.caps)), s.draw(stop_ids(s.caps)), ident)
                 for _ in range(s.draw(st.integers(2, s.max_batch))))


def _configure(s: Stream) -> None:
    s.configure()


def _reset(s: Stream) -> None:
    s.steps.append(Reset())

STEP_KINDS: dict[str, StepKind] = {k.name: k for k in (
    StepKind("batch", _batch),
    StepKind("resend", _resend, lambda s: bool(s.pool)),
    StepKind("continue", _continue, lambda s: bool(s.pool)),
    StepKind("restop", _restop, lambda s: bool(s.pool)),
    StepKind("poison", _poison, lambda s: bool(s.requests_in_pool()) and len(s.identities) > 1),
    StepKind("splice", _splice, lambda s: bool(_spliceable(s))),
    StepKind("flood", _flood, can_flood),
    StepKind("flush_resend", _flush_resend, lambda s: bool(s.pool)),
    StepKind("configure", _configure, lambda s: bool(s.caps.config_space)),
    StepKind("eos", _eos, lambda s: s.caps.eos_id is not None and bool(_eos_paths(s))),
    StepKind("near_tie", _near_tie, lambda s: any(t.revision in landmark_revisions(s) and len(t.prompt) <= s.top
                                                  for t in s.caps.landmarks.near_ties)),
    StepKind("respell", _respell, lambda s: bool(s.caps.landmarks.same_text) and s.top > 2),
    StepKind("collide", _collide, lambda s: {"salt", "adapter"} <= s.caps.identities
             and any(n for n, _ in adapter_bindings(s.caps))),
    StepKind("reload", _reload, lambda s: bool(_reloadable(s))),
    StepKind("sharers", _sharers, lambda s: s.max_batch > 1),
    StepKind("reset", _reset),
    StepKind("midflight", midflight, midflight_applies),
)}

# Weighted by repetition: reuse (resend / continue / poison) is where the bugs are. "batch" comes first
# because Hypothesis shrinks towards the first element; a kind that does not apply yet draws a batch.
KINDS = ("batch", "resend", "continue", "poison", "resend", "configure", "batch", "resend", "continue", "reset",
         "splice", "poison", "flood", "flush_resend", "splice", "flood", "restop", "midflight", "midflight",
         "midflight")


def draw_step(s: Stream, name: str) -> None:
    """Draw one step of kind `name` (a batch where it does not apply) onto `s.steps`."""
    kind = STEP_KINDS[name]
    if not kind.applies(s):
        kind = STEP_KINDS["batch"]
    step_counts.count(kind.name)
    items = kind.build(s)
    if items is not None:
        s.add_batch(items)
