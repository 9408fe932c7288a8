"""Closing steps drawn in a share of the scenarios: what a short run must exercise (a speculation pair, a
cross-identity attempt, an eviction) and the situations a random stream almost never produces."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from attrs import evolve
from hypothesis import strategies as st

from conformance.contract import Request
from conformance.domains import nearest_by_input, sampled, token_lists
from conformance.scenario import renamed
from conformance.step_kinds import (STEP_KINDS, _eos, _eos_paths, _flood, _flush_resend, _near_ties_tail)
from conformance.stream import StepKind, Stream


def smallest_pool(s: Stream) -> dict[str, Any] | None:
    """The configuration in effect with its KV pool switched to the smallest the engine declares (the
    knob value with the lowest `context_limits`), or None where it declares none or is already there."""
    caps = s.caps
    limited = [(int(limit), knob, value) for knob, values in caps.context_limits.items()
               for value in caps.config_space.get(knob, ()) if (limit := values.get(str(value))) is not None]
    if not limited:
        return None
    _, knob, value = min(limited, key=lambda t: t[0])
    return None if str(s.current.get(knob)) == str(value) else {**s.current, knob: value}


def _respec_tail(s: Stream) -> None:
    # Earlier requests again under another speculation setting, all else unchanged: the direct test of
    # spec_independence (BUG_CLASSES C), which configure-then-resend makes only by chance.
    s.respeculate()
    s.add_batch(tuple(renamed(p, s.next_id(), s.fit(p)) for p in s.pick_from_pool()))


def _cross_identity_tail(s: Stream) -> None:
    # An earlier prompt sent again as it was (a hit, and a cached-token count), then under every
    # identity one input away: another revision, salt and adapter in one batch, the same adapter
    # reloaded in a batch of its own. A key that drops any one input serves one of them the victim's
    # KV, and a count memoised by prompt is reported for it (lmdeploy 4917). A random poisoning
    # changes the revision in about one scenario in sixteen, and one seed of five never did. The
    # prompt is cut to one block and a token, the shortest that a hit can serve.
    bs = s.bs
    victims = [p for p in s.requests_in_pool() if bs < len(p.prompt) <= s.top]
    if victims:
        victim = s.draw(sampled(victims))
    else:
        base = s.fresh_request()
        victim = evolve(base, prompt=(base.prompt + s.draw(token_lists(s.caps, bs + 1)))[:bs + 1])
        s.add_batch((victim,))
    prompt = victim.prompt[:bs + 1]
    s.add_batch((Request(s.next_id(), prompt, 1, victim.stop_ids, victim.identity),))
    near = nearest_by_input(victim.identity, [i for i in s.identities if i != victim.identity])
    others = [s.draw(sampled(near[which])) for which in ("revision", "salt", "adapter") if which in near]
    if others:
        s.add_batch(tuple(Request(s.next_id(), prompt, 1, victim.stop_ids, other) for other in others))
    if "reload" in near:  # a batch of its own: an adapter name has one binding per batch
        s.add_batch((Request(s.next_id(), prompt, 1, victim.stop_ids, s.draw(sampled(near["reload"]))),))


def _flush_tail(s: Stream) -> None:
    # The flush_resend step, its prompts cut to two blocks and a token and at most two new tokens: a
    # count or KV that outlives the flush shows on the first blocks and the first token, and resending
    # whole 200-token prompts cost a tenth of the CI profile.
    s.add_batch(_flush_resend(s, keep=2 * s.bs + 1, max_new=2))


def _pressure_tail(s: Stream) -> None:
    # A flood in the smallest pool the engine declares: in a large pool a flood evicts nothing, and
    # eviction and reuse of evicted blocks are where refcount bugs show (BUG_CLASSES D).
    small = smallest_pool(s)
    if small is not None:
        s.configure(small)
    s.add_batch(_flood(s))


def speculating(s: Stream) -> dict[str, Any]:
    """The configuration in effect with every speculation knob off its first value (the default, which
    is usually "off")."""
    return {**s.current, **{k: s.draw(sampled(tuple(s.caps.config_space[k])[1:])) for k in s.spec}}


def speculation_sweep(s: Stream, fixed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Configurations that between them put every speculation knob at each of its values past the
    first (knobs stepped together, so as many as the longest list), each with `fixed` on top."""
    on = {k: tuple(s.caps.config_space[k])[1:] for k in s.spec}
    on = {k: v for k, v in on.items() if v}
    n = max((len(v) for v in on.values()), default=0)
    return [{**s.current, **{k: v[i % len(v)] for k, v in on.items()}, **fixed} for i in range(n)]


def scheduling(s: Stream) -> dict[str, Any]:
    """The configuration in effect with every schedule knob (chunk size, token budget) off its first value."""
    knobs = [k for k, v in sorted(s.caps.config_space.items())
             if s.caps.knob_roles.get(k) == "schedule" and len(tuple(v)) > 1]
    return {**s.current, **{k: s.draw(sampled(tuple(s.caps.config_space[k])[1:])) for k in knobs}}


def _switched(s: Stream, switch: Callable[[Stream], dict[str, Any]], kind: StepKind) -> None:
    """`kind`, half the time after switching the configuration with `switch` (when that changes it)."""
    if s.caps.config_space and s.draw(st.booleans()):
        config = switch(s)
        if config != s.current:
            s.configure(config)
    if kind.applies(s):
        _as_tail(kind)(s)


def window_knob(s: Stream) -> str | None:
    """The speculation knob that is the draft length (the one whose values are all whole numbers)."""
    return next((k for k in s.spec if all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                          for v in s.caps.config_space[k])), None)


def _eos_tail(s: Stream) -> None:
    # Half the time the deepest eos of the longest path with the draft length set around it: k =
    # position - 1 puts eos as the bonus token of a fully accepted run (position 0 is the prefill's),
    # the largest k puts it inside the accepted run with the run's last token after it; both, under
    # every speculation value in turn (which drafter drafts eos at all depends on the engine; these
    # prompts are short and end within three tokens, so the sweep is cheap). Otherwise eos anywhere,
    # half the time with speculation on (inside a draft run, or not speculated).
    window = window_knob(s)
    paths = _eos_paths(s) if STEP_KINDS["eos"].applies(s) else []
    if window and paths and s.draw(st.booleans()):
        path = paths[0]
        at = len(path.continuation)
        ks = [v for v in s.caps.config_space[window] if v >= at - 1]
        if ks:
            for k in sorted({min(ks), max(ks)}):  # the bonus placement (k = position - 1), inside the run
                for config in speculation_sweep(s, {window: k}):
                    if config != s.current:
                        s.configure(config)
                    s.add_batch(_eos(s, path, at))
            return
    _switched(s, speculating, STEP_KINDS["eos"])


def _speculated(s: Stream, kind: StepKind) -> None:
    """`kind` under every speculation value in turn (`speculation_sweep`): a stop inside a draft run
    needs a drafter that gets drafts accepted, and which one does depends on the engine and the prompt."""
    for config in speculation_sweep(s, {}) or [s.current]:
        if config != s.current:
            s.configure(config)
        if kind.applies(s):
            _as_tail(kind)(s)


def _as_tail(kind: StepKind) -> Callable[[Stream], None]:
    def tail(s: Stream) -> None:
        items = kind.build(s)
        if items is not None:
            s.add_batch(items)
    return tail


# Closing steps, each drawn in half the scenarios: what a short run (the dev profile's 12 examples, two
# of them the simplest scenario) must exercise or end inconclusive — a speculation pair, a cross-identity
# attempt, an eviction — and the steps above make only by chance. Tails, not step kinds, so those steps
# keep their share of the scenario (a reconfigured engine may start cold: fewer hits), and shrinking
# drops a tail where a witness does not need it.
TAILS = (
    StepKind("respec", _respec_tail, lambda s: bool(s.spec and s.pool)),
    StepKind("cross_identity", _cross_identity_tail, lambda s: len(s.identities) > 1 and s.top > s.bs),
    StepKind("pressure", _pressure_tail, lambda s: s.caps.evicts),
    # Earlier traffic again after a flush: a count (or KV) that outlives the flush shows here
    # (lmdeploy 4917).
    StepKind("flush_resend", _flush_tail, lambda s: bool(s.pool)),
    # eos (where the engine's landmarks say it fires), placed around the verification window under
    # every speculation value half the time: eos inside a draft run or as the bonus token needs both,
    # and neither comes by chance.
    StepKind("eos", lambda s: _eos_tail(s), STEP_KINDS["eos"].applies),
    # A stop id past position 0 under every speculation value in turn: a stop inside a draft run (a
    # plain one comes from the step kind of the same name).
    StepKind("restop", lambda s: _speculated(s, STEP_KINDS["restop"]), STEP_KINDS["restop"].applies),
    # Requests sharing a prefix nobody sent yet, half the time with chunked prefill switched on.
    StepKind("sharers", lambda s: _switched(s, scheduling, STEP_KINDS["sharers"]), STEP_KINDS["sharers"].applies),
)

# Steering tails, each in a half or a quarter of the scenarios (fair booleans: Hypothesis' `sampled_from`
# is far from uniform, so as step kinds they could be starved in a seed): the situations a random stream
# almost never produces (conformance/situations.py). A quarter for collide and reload; a half for
# near_tie and respell, whose bugs need a further condition of their own (a hit on the tie's block; a
# respelling that keeps block token counts). Each adds one or two batches of short prompts.
STEERING = (
    (StepKind("near_tie", _near_ties_tail, STEP_KINDS["near_tie"].applies), 1),
    *((StepKind(k.name, _as_tail(k), k.applies), flips) for k, flips in (
        (STEP_KINDS["respell"], 1), (STEP_KINDS["collide"], 2), (STEP_KINDS["reload"], 2))),
)
