"""Strategies keep every request within the context its configuration holds (`context_limits`), and the
steering tails send what they promise (each shown on the simplest draw, and able to fail)."""

from __future__ import annotations

from attrs import evolve
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from conformance.contract import Capabilities, Landmarks, NearTie
from conformance.history_codec import capabilities_from, encode
from conformance.scenario import Batch, Configure, Continuation
from conformance.strategies import scenarios

CAPS = Capabilities(name="fake-limits", vocab_size=512, max_context=1024, block_size=16,
                    config_space={"pool_tokens": (4096, 64)}, knob_roles={"pool_tokens": "cache"},
                    context_limits={"pool_tokens": {"64": 64}})


def longest_under_small_pool(steps) -> int:
    """The most tokens (prompt, or a continuation's prompt cap, + max_tokens) any request sent under
    pool_tokens=64 may take."""
    small, worst = False, 0
    for s in steps:
        if isinstance(s, Configure):
            small = str(s.config.get("pool_tokens")) == "64"
        elif isinstance(s, Batch) and small:
            for q in s.items:
                prompt = q.max_prompt if isinstance(q, Continuation) else len(q.prompt)
                worst = max(worst, prompt + q.max_tokens)
    return worst


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(CAPS))
def test_requests_fit_the_context_of_their_configuration(steps):
    assert longest_under_small_pool(steps) <= 64


# Every identity input, adapters with two weights each, and landmarks: the steering steps (reload,
# collide, respell, near_tie, sharers) apply too, and must keep within the limit as well.
FULL = evolve(CAPS, identities={"salt", "adapter", "revision"}, revisions=("a", "b"),
              adapters=("x@d1", "x@d2", "y@d1", "y@d2"), prefix_caching=True, reports_cached_tokens=True,
              config_space={"pool_tokens": (4096, 64), "block_size": (16, 32)},
              knob_roles={"pool_tokens": "cache", "block_size": "cache"},
              landmarks=Landmarks(near_ties=(NearTie("a", tuple(range(5, 29))),),
                                  same_text=(((300,), (301, 302)), ((303,), (304, 305)))))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenarios(FULL))
def test_steered_requests_fit_the_context_of_their_configuration(steps):
    assert longest_under_small_pool(steps) <= 64


def test_without_the_declared_limit_requests_overflow_the_small_pool():
    """The other way round: the same space with no `context_limits` does send longer requests there."""
    find(scenarios(evolve(CAPS, context_limits={})), lambda steps: longest_under_small_pool(steps) > 64,
         settings=settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck),
                           derandomize=True, database=None))  # one search, the same every run: CI time stays put


def test_context_limits_survive_the_history_round_trip():
    assert capabilities_from(encode(CAPS)).context_limits == {"pool_tokens": {"64": 64}}


def test_restop_stops_at_the_drawn_position_where_its_token_is_new_to_the_turn():
    from conformance.scenario_runner import restop_turn

    assert restop_turn([5, 6, 7, 8], 2) == (0, 7)  # a new token: the parent's prompt again, stop at 2
    assert restop_turn([5, 6, 7, 8], 6) == (0, 8)  # past the output: its last token
    assert restop_turn([5, 6, 7, 8], 6, max_tokens=3) == (1, 8)  # resumed so that 3 tokens reach it
    assert restop_turn([5, 6, 7, 2], 9, eos_id=2) == (0, 7)  # never eos, which ends the output by itself
    # A token that came earlier: resumed just past that occurrence, where it is new again.
    assert restop_turn([5, 6, 5, 9], 2) == (1, 5)
    assert restop_turn([7, 5, 5, 6, 5], 4) == (3, 5)  # a loop, then out: the turn resumes past its last 5
    assert restop_turn([5, 5, 5, 6], 1) == (0, 6)  # a repeat of the token before it never fires there
    assert restop_turn([5, 5], 1) == (0, 5)  # no position past 0 can fire: it may fire early
    assert restop_turn([4], 3) == (0, 4)


def test_a_restop_turn_whose_parent_cannot_stop_past_0_takes_the_latest_output_that_can():
    """Which outputs run on is known only once they ran: a parent that ended at once (eos, a one-token
    output, one token repeated) gives way to the latest request of the turn's identity that ran on, and
    a parent that ran on is kept."""
    from conformance.contract import Identity, Request, Result
    from conformance.scenario_runner import ScenarioRunner

    runner = ScenarioRunner.__new__(ScenarioRunner)  # resolve reads only the capabilities
    runner.caps = evolve(CAPS, eos_id=2)
    other = Identity(salt="b")
    resolved = {"ran": (Request("ran", (10, 11), 8), Result("ran", (5, 6, 7, 2), "eos")),
                "other": (Request("other", (12,), 8, identity=other), Result("other", (8, 9), "length")),
                "eos": (Request("eos", (13, 14), 8), Result("eos", (2,), "eos")),
                "loop": (Request("loop", (15,), 8), Result("loop", (4, 4, 4), "length"))}

    def turn(parent: str):
        return runner.resolve(Continuation("t", parent, (1,), 8, (), Identity(), 64, restop=12), resolved)
    for parent in ("eos", "loop"):
        assert turn(parent).prompt == (10, 11) and turn(parent).stop_ids == (7,), parent  # not "other"'s
    assert turn("ran").prompt == (10, 11) and turn("ran").stop_ids == (7,)
    resolved["loop"] = (Request("loop", (15,), 8), Result("loop", (4, 3, 4), "length"))
    assert turn("loop").prompt == (15, 4) and turn("loop").stop_ids == (4,)  # its own: 4 again, past the first 4
    # A parent whose text never repeats gives way to the latest of its identity where a draft run can
    # precede a stop (20 21 is said again, then 9 and 3 are new), never to another identity's.
    resolved["drafted"] = (Request("drafted", (20, 21), 8), Result("drafted", (20, 21, 9, 3), "length"))
    resolved["other2"] = (Request("other2", (1, 3), 8, identity=other), Result("other2", (1, 3, 6), "length"))
    assert turn("ran").prompt == (20, 21) and turn("ran").stop_ids == (3,)
    assert turn("drafted").prompt == (20, 21) and turn("drafted").stop_ids == (3,)


def test_restop_puts_the_stop_after_a_repeat_where_the_text_has_one():
    """A draft is accepted where the text is predictable from its context, first of all where it repeats
    itself: positions whose turn holds a repeat of the parent's text (prompt and output) come first, at
    the drawn position or the earliest after it; without one, the drawn position rules."""
    from conformance.scenario_runner import drafted_stops, repeats, restop_turn

    assert repeats((1, 2, 5, 6, 1, 2)) == {5} and repeats((1, 2, 5, 6, 1, 3)) == set() == repeats((1, 1))
    assert repeats((4, 4, 4, 4)) == {2, 3}  # a loop repeats itself from its third token

    assert drafted_stops((1, 2), (5, 6, 1, 2, 7)) == [3, 4]  # 1 2 again at output 2-3: stops at 3 and 4
    assert restop_turn((5, 6, 1, 2, 7), 1, prompt=(1, 2)) == (0, 2)  # the earliest after the drawn one
    assert restop_turn((5, 6, 1, 2, 7), 9, prompt=(1, 2)) == (0, 7)
    assert restop_turn((5, 6, 1, 2, 7), 1) == (0, 6)  # no repeat without the prompt: the drawn position
    # A turn resumes past the stop token's previous occurrence, so a repeat before it does not count.
    assert drafted_stops((), (4, 4, 4, 5, 4, 6)) == [3, 5]  # not 4: its turn starts past the loop
    assert drafted_stops((), (4, 4, 4, 5, 4, 6), max_tokens=1) == []  # one token: nothing but the prefill's


@given(st.lists(st.integers(0, 3), max_size=12))
def test_repeats_is_its_definition(context):
    from conformance.scenario_runner import repeats

    assert repeats(context) == {k for k in range(1, len(context)) for j in range(k - 1)
                                if (context[j], context[j + 1]) == (context[k - 1], context[k])}


def test_speculation_sweep_puts_every_knob_at_each_value_past_its_first():
    from types import SimpleNamespace

    from conformance.steering import speculation_sweep

    space = {"drafter": ("none", "oracle", "draft", "ngram"), "k": (3, 1, 5), "block_size": (16, 4)}
    s = SimpleNamespace(caps=SimpleNamespace(config_space=space), spec=["drafter", "k"], current={"block_size": 4})
    sweep = speculation_sweep(s, {"k": 5})
    assert [c["drafter"] for c in sweep] == ["oracle", "draft", "ngram"]  # every drafter, none left out
    assert all(c["k"] == 5 and c["block_size"] == 4 for c in sweep)  # `fixed` on top, the rest kept
    assert {c["k"] for c in speculation_sweep(s, {})} == {1, 5}
    assert speculation_sweep(SimpleNamespace(caps=s.caps, spec=[], current={}), {}) == []


def _drawn(build):
    """The steps `build(stream)` appends on the simplest draw (Hypothesis' first example)."""
    from hypothesis import strategies as st

    from conformance.stream import Stream

    @st.composite
    def steps(draw):
        s = Stream(draw, FULL)
        build(s)
        return s.steps
    return find(steps(), lambda _: True, settings=settings(database=None))


def test_the_cross_identity_tail_sends_one_prompt_under_every_identity_one_input_away():
    from conformance.contract import Identity, Request
    from conformance.domains import identity_distance
    from conformance.steering import _cross_identity_tail

    victim = Identity("a", "x", "d1", "tenant-a")

    def build(s):
        s.add_batch((Request("v", tuple(range(5, 45)), 2, (), victim),))
        _cross_identity_tail(s)

    batches = [b.items for b in _drawn(build) if isinstance(b, Batch)][1:]
    assert [q.prompt for b in batches for q in b] == [tuple(range(5, 22))] * len([q for b in batches for q in b])
    assert [q.identity for q in batches[0]] == [victim]  # again as it was: a hit, a count
    changed = [next(k for k in ("revision", "adapter", "salt") if getattr(q.identity, k) != getattr(victim, k))
               for q in batches[1]]
    assert sorted(changed) == ["adapter", "revision", "salt"]
    assert all(identity_distance(q.identity, victim) == 1 for q in batches[1])
    (reload,), = batches[2:]  # alone in its batch: same name, other weights
    assert reload.identity.adapter == "x" and reload.identity.adapter_digest == "d2"


def test_the_near_tie_tail_sends_every_tie_cold_then_warm_under_a_block_size_that_can_hit():
    from conformance.step_kinds import _near_ties_tail

    ties = (NearTie("a", tuple(range(5, 29))), NearTie("a", tuple(range(30, 54))))

    def build(s):
        s.caps = evolve(s.caps, landmarks=Landmarks(near_ties=ties))
        s.assume({"pool_tokens": 4096, "block_size": 32})  # a 24-token prompt is never a hit in 32-token blocks
        _near_ties_tail(s)

    steps = _drawn(build)
    assert isinstance(steps[0], Configure) and steps[0].config["block_size"] == 16
    cold, warm = (b.items for b in steps[1:])
    assert [q.prompt for q in cold] == [q.prompt for q in warm] == [t.prompt for t in ties]
    assert [q.identity for q in cold] == [q.identity for q in warm]


def test_a_flood_is_drawn_only_where_it_can_exhaust_the_pool():
    """In a pool of 64 tokens four long prompts must evict; in one that holds a 1024-token context they
    cannot, and the flood (the dearest step) would be four long prompts for nothing."""
    from types import SimpleNamespace

    from conformance.domains import max_prompt_len

    from conformance.scenario import MAX_NEW

    from conformance.step_kinds import can_flood

    def stream(config):
        return SimpleNamespace(caps=CAPS, current=config, max_batch=4, top=max_prompt_len(CAPS, config))

    assert can_flood(stream({"pool_tokens": 64}))
    assert not can_flood(stream({"pool_tokens": 4096}))
    assert 4 * (max_prompt_len(CAPS, {"pool_tokens": 4096}) + MAX_NEW) <= CAPS.max_context


def test_the_flush_tail_resets_then_resends_two_blocks_and_a_token_at_most():
    from conformance.contract import Identity, Request
    from conformance.scenario import Reset
    from conformance.steering import _flush_tail

    def build(s):
        s.add_batch((Request("v", tuple(range(5, 105)), 12, (), Identity("a")),))
        _flush_tail(s)

    steps = _drawn(build)
    assert isinstance(steps[1], Reset)
    (again,), = [b.items for b in steps[2:]]
    assert again.prompt == tuple(range(5, 5 + 33)) and again.max_tokens == 2  # a prefix of the earlier prompt


def test_one_character_draws_what_a_one_character_text_draws():
    """`ONE_CHARACTER` stands in for `st.text(max_size=1)` to spare the codec map (conformance/domains.py):
    the same choices give the same characters, so every stream is what it was."""
    from hypothesis import seed

    from conformance.domains import ONE_CHARACTER

    def drawn(strategy) -> list:
        out: list = []

        @seed(7)
        @settings(max_examples=200, database=None)
        @given(st.lists(strategy, max_size=5))
        def collect(chars):
            out.append(chars)

        collect()
        return out

    text = drawn(st.text(max_size=1))
    assert drawn(ONE_CHARACTER) == text and any(c and ord(c) > 0xFFFF for cs in text for c in cs)


def test_the_repeating_seed_repeats_every_period_and_no_other_seed_does():
    from conformance.domains import REPEAT_PERIOD, REPEATING_SEED, seeded_tokens

    def repeats(tokens):
        return tokens[:REPEAT_PERIOD] == tokens[REPEAT_PERIOD:2 * REPEAT_PERIOD]

    assert repeats(seeded_tokens(CAPS, 3 * REPEAT_PERIOD + 1, REPEATING_SEED))
    assert not any(repeats(seeded_tokens(CAPS, 2 * REPEAT_PERIOD, seed)) for seed in range(REPEATING_SEED))
    assert seeded_tokens(CAPS, 5, REPEATING_SEED) == seeded_tokens(CAPS, 40, REPEATING_SEED)[:5]  # still prefixes


def test_a_repeating_prompt_sent_again_catches_block_keys_blind_to_their_parent():
    """Its second block has the first block's tokens: sent again, a key without the parent serves the
    first block's KV at the second's positions (the fault zoo's `unchained_block_keys`); chained keys do
    not match there and the same stream passes."""
    from adapters.reference import ReferenceAdapter
    from conformance.contract import Request
    from conformance.minimise import still_fails
    from conformance.domains import REPEATING_SEED, seeded_tokens

    for fault, fails in (("unchained_block_keys", True), (None, False)):
        def engine():
            return ReferenceAdapter(**({"fault": fault} if fault else {}))
        caps = engine().capabilities()
        prompt = seeded_tokens(caps, 34, REPEATING_SEED)
        steps = [Batch((Request("first", prompt, 2),)), Batch((Request("again", prompt, 2),))]
        assert still_fails(engine, caps, "parity", steps) is fails, fault
