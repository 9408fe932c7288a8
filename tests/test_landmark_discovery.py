"""Landmarks for any checkpoint (issue 28.3): the bounded search on a random-init checkpoint saved by
transformers finds eos paths, near-ties and same-text pairs that plain greedy decoding confirms, caches
them per checkpoint digest (read back as untrusted input), and a situation whose landmarks were not
found reads "not steered" and keeps `exercised` inconclusive unless the user accepts it."""

from __future__ import annotations

import json
import pathlib
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")

from adapters import landmark_search as ls  # noqa: E402
from conformance.analysis import analyse  # noqa: E402
from conformance.contract import Capabilities, Landmarks, evolve  # noqa: E402
from conformance.situations import SITUATIONS, coverage  # noqa: E402
from reference_engine import checkpoints  # noqa: E402
from reference_engine.baseline import greedy  # noqa: E402
from tests.test_conformance_checks import CAPS, Crafted, req, res  # noqa: E402

EOS = 2


def save_checkpoint(root: pathlib.Path, seed: int = 3) -> pathlib.Path:
    """A random-init Llama saved by transformers, with a byte-level BPE trained here (no shipped file).
    Its eos row of lm_head is scaled up so that a short search meets eos (a random model rarely
    predicts any one token; the search itself is what is tested here). `seed` picks the weights
    (benchmarks/random_checkpoints.py runs the suite on several)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [pathlib.Path(ls.__file__).read_text()] * 3
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      initializer_range=0.2, bos_token_id=1, eos_token_id=EOS, pad_token_id=0,
                                      max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 2.0
    folder = root / f"random-llama-{seed}"
    model.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> pathlib.Path:
    return save_checkpoint(tmp_path_factory.mktemp("ckpt"))


def test_search_finds_verified_landmarks_and_caches_them(folder, tmp_path):
    model = checkpoints.load_model_dir(folder, torch.float64)
    built = []

    def oracle():
        built.append(1)
        return ls.reference_logits(model)

    marks = ls.discover(folder, 320, EOS, oracle, budget_s=12, cache_dir=tmp_path)
    assert marks.eos_paths and marks.near_ties and marks.same_text and marks.search_s is not None
    for path in marks.eos_paths:  # the definition: plain greedy decoding (the reference's, KV path)
        for i in range(len(path.continuation) + 1):
            g = greedy(model, path.prompt + path.continuation[:i], 8, eos_id=EOS)
            assert g.output == path.continuation[i:] + (EOS,)
    for tie in marks.near_ties:
        assert greedy(model, tie.prompt, 1, eos_id=EOS).margins[0] < ls.NEAR_TIE
    tok = ls.load_tokenizer(folder)
    for a, b in marks.same_text:
        assert a != b and tok.decode(list(a)) == tok.decode(list(b))
    cached = list(tmp_path.glob("*.json"))
    assert [p.stem for p in cached] == [ls.checkpoint_digest(folder, EOS)]
    again = ls.discover(folder, 320, EOS, oracle, budget_s=12, cache_dir=tmp_path)
    assert again == marks and len(built) == 1  # read back, no second search


def test_a_cache_with_ids_outside_the_vocabulary_is_not_believed(folder, tmp_path, capsys):
    path = tmp_path / f"{ls.checkpoint_digest(folder, EOS)}.json"
    path.write_text(json.dumps({"format": ls.FORMAT, "revision": "a", "budget_s": 99, "search_s": 1,
                                "eos_paths": [[[5, 320], []]], "near_ties": [], "same_text": []}))
    marks = ls.discover(folder, 320, EOS, lambda: None, budget_s=0, cache_dir=tmp_path)
    assert not marks.eos_paths and marks.same_text  # searched again (the tokenizer part)
    assert "ignoring the landmark cache" in capsys.readouterr().err


@pytest.mark.slow  # a 20 s search budget; CI proves the search on a small checkpoint (above)
def test_the_search_on_the_shipped_checkpoint_finds_near_ties_and_same_text_pairs(tmp_path):
    """Its shipped tables hold eos paths, near-ties and same-text pairs; the bounded search finds the
    latter two kinds. Eos paths it does not find in a short budget: the shipped models predict eos only
    after a corpus file's closing `__main__` call (reference_engine/training/landmarks.py), which the
    committed tables keep."""
    model = checkpoints.load_target("a", None, torch.float64)
    folder = checkpoints.revision_dir("a")
    marks = ls.search(ls.reference_logits(model), ls.load_tokenizer(folder), model.config.vocab_size, None, 20)
    assert marks.near_ties and marks.same_text


# ------------------------------------------------------------------ coverage never overclaims

def _eos_missing(caps: Capabilities):
    """A history that reaches nothing about eos (the CAPS engine claims an eos id)."""
    h = Crafted(caps).batch((req("a", tuple(range(10, 22)), salt="x"), res("a", [1, 2])))
    return h.history()


def test_eos_situations_stay_relevant_without_landmarks_and_say_not_steered():
    caps = evolve(CAPS, landmarks=Landmarks(search_s=7.5))
    rows = {r.name: r for r in coverage(_eos_missing(caps))}
    for name in ("eos_finish", "eos_in_speculation", "eos_on_warm_cache", "same_text_other_ids"):
        assert rows[name].relevant and rows[name].count == 0
        assert rows[name].steering == "not steered (no landmarks found in 7.5 s)"
    result = analyse(_eos_missing(caps), ["exercised"]).checks["exercised"]
    assert result.status == "inconclusive"
    assert any("eos_finish" in n and "not steered (no landmarks found in 7.5 s)" in n for n in result.notes)


def test_accept_unsteered_turns_only_the_unsteered_gaps_into_notes():
    from conformance.engine_lifecycle import accept_unsteered

    class Engine:
        def capabilities(self):
            return evolve(CAPS, landmarks=Landmarks(search_s=3))

    engine = Engine()
    accept_unsteered(engine)
    caps = engine.capabilities()
    assert caps.landmarks.unsteered_accepted
    result = analyse(_eos_missing(caps), ["exercised"]).checks["exercised"]
    notes = " ".join(result.notes)
    assert "eos_finish" in notes and "accepted by --accept-unsteered" in notes
    assert result.status == "inconclusive"  # still: drafts, hits ... were not exercised, and say so
    assert not any("eos_finish" in n and "accepted" not in n for n in result.notes)


def test_every_landmark_steered_situation_names_a_landmarks_field():
    for s in SITUATIONS.values():
        assert s.landmark is None or hasattr(Landmarks(), s.landmark)


def test_eos_paths_are_lengthened_where_none_is_long_enough_to_hit_the_cache():
    # vLLM's blocks are 32 tokens; the shipped eos paths have 24-29 prompt tokens, so an eos path sent twice
    # never met a warm cache there (0 `eos_on_warm_cache` in every committed vLLM run).
    from adapters import checkpoint_info
    from adapters.landmarks import shipped_landmarks
    from adapters.reference_oracle import ReferenceOracle

    info = checkpoint_info.shipped()
    oracle = ReferenceOracle(info.eos_id, None)
    shipped = shipped_landmarks()
    assert ls.checkpoint_landmarks("", info, oracle, min_hit_prompt=17) == shipped  # block 16: they hit
    marks = ls.checkpoint_landmarks("", info, oracle, min_hit_prompt=33)
    longer = marks.eos_paths[:len(marks.eos_paths) - len(shipped.eos_paths)]
    assert longer and marks.eos_paths[len(longer):] == shipped.eos_paths
    logits = ls.reference_logits(oracle._model("a", None))
    with torch.no_grad():  # each one checked again by plain greedy decoding, ending as its short original
        assert all(len(p.prompt) == 33 and ls.is_eos_path(logits, p.prompt, p.continuation, info.eos_id)
                   and any(p.prompt[-len(q.prompt):] == q.prompt for q in shipped.eos_paths) for p in longer)

    def never_eos(batch):  # a FAKE model that always predicts token 5: no lengthened copy survives
        out = torch.zeros(*batch.shape, info.vocab_size)
        out[..., 5] = 1.0
        return out

    assert ls.lengthened(never_eos, shipped.eos_paths, 33, list(range(3, 60)), info.eos_id, random.Random(0)) == []


def test_two_shards_caching_one_checkpoint_s_landmarks_at_once_both_write_it(tmp_path):
    """A campaign's shards searching one checkpoint finish together and cache what they found. With one
    shared `<name>.tmp` one of them lost its file to the other's rename and said "cannot cache landmarks"."""
    from at_once import twice_at_once

    codes, errors = twice_at_once("""
from adapters.landmark_search import write_cache
from conformance.contract import EosPath, Landmarks
write_cache(out / f"{r}.json", Landmarks((EosPath("a", (5, 6), (7,)),), (), ()), 1.0, "a")
""", tmp_path, rounds=20, spacing_s=0.1)
    assert codes == [0, 0] and not any("cannot cache" in e for e in errors), errors
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(f"{r}.json" for r in range(20))
    assert not list(tmp_path.glob("*.tmp"))
