"""The landmarks the shipped family declares (adapters/landmarks.py) are true of the model: each near-tie
really is one under plain greedy decoding, and each same-text pair really decodes to one text. A stale
landmarks.json (a retrained model) fails here, not silently in the coverage table."""

from __future__ import annotations

from tokenizers import Tokenizer

from adapters.landmarks import shipped_landmarks
from adapters.reference import shared_weights
from reference_engine import checkpoints
from reference_engine.baseline import greedy


def test_every_shipped_near_tie_is_a_near_tie_of_plain_decoding():
    ties = shipped_landmarks().near_ties
    assert ties
    for tie in ties:
        assert greedy(shared_weights().base(tie.revision), tie.prompt, 1).margins[0] < 1e-4, tie


def test_every_same_text_pair_decodes_to_one_text_in_distinct_ids():
    tok = Tokenizer.from_file(str(checkpoints.revision_dir("a") / "tokenizer.json"))
    pairs = shipped_landmarks().same_text
    assert len(pairs) >= 8
    for one, other in pairs:
        assert one != other and tok.decode(list(one)) == tok.decode(list(other)), (one, other)


def test_the_shipped_family_declares_no_eos_path_it_cannot_back():
    """The tiny models practically never predict eos (reference_engine/training/landmarks.py): a path
    declared here would have to end on eos under plain decoding."""
    for path in shipped_landmarks().eos_paths:
        model = shared_weights().base(path.revision)
        g = greedy(model, path.prompt, len(path.continuation) + 1)
        assert g.output == path.continuation + (model.config.eos_token_id,)
