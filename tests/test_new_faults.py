"""Each fault added for issue 13 really does the wrong thing in the engine, in the situation it needs:
a hand-built short request stream, run through the reference adapter with the fault on, fails the
expected check, and the same stream passes without it.

The streams are crafted with what the shipped target actually says (asserted, so a retrained
checkpoint fails loudly here instead of silently testing nothing):
  P_EOS1  the tail of a stdlib module ("...__main__':\\n    test()"): greedy says "\\n", eos —
          eos at output position 1 (a draft in the first verification window);
  P_EOS2  a stdlib snippet, then "...__main__':\\n    unittest.main": greedy says "()", "\\n", eos —
          eos at output position 2 (the bonus token of a one-draft window that accepts "\\n");
  Q       greedy says 223, 26, 28, 223, ...: a stop id 26 fires at output position 1;
  TIE     an 8-token prompt whose first top-2 margin is 4.7e-4 (found by searching 20k random prompts).
"""

from __future__ import annotations

import functools

import pytest

import adapters.reference as ref
from conformance import validation
from conformance.contract import Identity, Request
from conformance.scenario_runner import replay
from conformance.scenario import Batch, Configure
from reference_engine.faults import FAULTS, _tokenizer

P_EOS1 = (471, 457, 270, 659, 11, 201, 816, 458, 357, 311, 456, 300, 311, 475, 264, 311, 413, 274, 997, 345)
P_EOS2 = (287, 305, 371, 294, 330, 796, 65, 36, 201, 201, 816, 458, 357, 311, 456, 300, 311, 475, 264, 311,
          413, 274, 674, 314, 293, 276, 16, 475, 264)
Q = tuple(range(10, 30))
TIE = (43, 12, 25, 10, 45, 29, 29, 32)
# Two segmentations of the text "()==2": '(' ')' '==' '2' and '()' '=' '=' '2' (ids of the shipped BPE).
TEXT_A = (10, 11, 540, 20, 21, 22, 23, 24, 25)
TEXT_B = (345, 31, 31, 20, 21, 22, 23, 24, 25)
EOS = 2


def req(rid: str, prompt, max_tokens: int = 6, stop=(), **identity) -> Request:
    return Request(rid, tuple(prompt), max_tokens, tuple(stop), Identity(**identity))


@functools.cache
def digests() -> dict[str, str]:
    return ref.ReferenceAdapter().registry.adapters()


def test_the_crafted_prompts_say_what_the_streams_rely_on():
    adapter = ref.ReferenceAdapter()
    out = {name: adapter.baseline(req("x", p, 8)) for name, p in
           (("eos1", P_EOS1), ("eos2", P_EOS2), ("q", Q), ("tie", TIE))}
    assert out["eos1"].output == (201, EOS) and out["eos1"].finish_reason == "eos"
    assert out["eos2"].output == (345, 201, EOS) and out["eos2"].finish_reason == "eos"
    assert out["q"].output[:4] == (223, 26, 28, 223)
    assert out["tie"].margins[0] < 1e-3
    assert _tokenizer().decode(list(TEXT_A[:4])) == _tokenizer().decode(list(TEXT_B[:4])) == "()==2"


def oracle(k: int, **more) -> Configure:
    return Configure({"drafter": "oracle", "k": k, **more})


# fault -> (the steps, the check that must fail with the fault on and pass without it)
CASES = {
    # eos accepted as the first draft of a 3-draft window, tokens after it in the same window.
    "eos_checked_on_last_token": (lambda: [oracle(3), Batch([req("a", P_EOS1, 8)])], "accounting"),
    # eos as the bonus token: one draft ("\n") accepted, the target's own next token is eos.
    "eos_bonus_unchecked": (lambda: [oracle(1), Batch([req("a", P_EOS2, 8)])], "accounting"),
    # eos on a warm cache: the same eos-ending prompt again, a 16-token hit.
    "eos_ignored_on_hit": (lambda: [Batch([req("a", P_EOS1, 4)]), Batch([req("b", P_EOS1, 4)])], "accounting"),
    # a stop id accepted as the first draft of a window.
    "stop_checked_on_last_token": (lambda: [oracle(3), Batch([req("a", Q, 8, stop=(26,))])], "accounting"),
    # max_tokens 3 reached inside a 3-draft window (1 token from prefill, 2 left).
    "max_tokens_window_overrun": (lambda: [oracle(3), Batch([req("a", Q, 3)])], "accounting"),
    # a stop inside a window that also crosses max_tokens.
    "length_checked_before_stop": (lambda: [oracle(3), Batch([req("a", Q, 3, stop=(26,))])], "accounting"),
    # two requests sharing 10 tokens in one batch, chunks of 5 over blocks of 4: the second is admitted
    # in the step that computes the first's block 1 only in part.
    "scheduled_blocks_cached": (lambda: [Configure({"block_size": 4, "chunk_size": 5}),
                                         Batch([req("a", Q[:12]), req("b", Q[:10] + (40, 41))])], "parity"),
    # salt "t:upper" without an adapter, then salt "t" with adapter upper.
    "identity_joined_with_separator": (lambda: [
        Batch([req("a", Q[:17], 4, salt="t:upper")]),
        Batch([req("b", Q[:17], 4, adapter="upper", salt="t")])], "isolation"),
    # adapter upper warmed, then reloaded in place with the rot13 weights.
    "reload_stale_on_lookup": (lambda: [
        Batch([req("a", Q[:17], 4, adapter="upper", adapter_digest=digests()["upper"])]),
        Batch([req("b", Q[:17], 4, adapter="upper", adapter_digest=digests()["rot13"])])], "isolation"),
    # the same text under another segmentation.
    "text_keyed_blocks": (lambda: [Configure({"block_size": 4}), Batch([req("a", TEXT_A, 4)]),
                                   Batch([req("b", TEXT_B, 4)])], "isolation"),
    # a near-tie prompt sent twice: the second is a hit.
    "tf32_hit_logits": (lambda: [Configure({"block_size": 4}), Batch([req("a", TIE, 2)]),
                                 Batch([req("b", TIE, 2)])], "parity"),
}


def run_case(fault: str | None, name: str) -> tuple[str, str]:
    steps, check = CASES[name]
    adapter = ref.ReferenceAdapter(fault=fault) if fault else ref.ReferenceAdapter()
    caps = validation.capabilities(adapter.capabilities())
    result, crashed = replay(adapter, caps, steps(), check)
    assert crashed is None, crashed
    detail = result.failures[0].explanation if result.failures else "; ".join(result.notes)
    return result.status, detail


@pytest.mark.parametrize("name", list(CASES))
def test_new_fault_fails_its_crafted_stream_and_the_engine_without_it_passes(name):
    status, detail = run_case(name, name)
    assert status == "fail", f"{name}: {detail}"
    assert CASES[name][1] in FAULTS[name].expected
    status, detail = run_case(None, name)
    assert status == "pass", f"without {name}: {detail}"
