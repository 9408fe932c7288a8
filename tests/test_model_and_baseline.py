"""The model, the baseline and the shipped checkpoints: named errors, paging-ready forward, exactness."""

from __future__ import annotations

import pytest
import torch

from reference_engine import checkpoints, errors
from reference_engine.baseline import greedy
from reference_engine.model import DenseKV


@pytest.fixture(scope="module")
def target():
    return checkpoints.load_target("a")


def test_forward_in_pieces_equals_forward_in_one_pass(target):
    """The KV of a token range computed after the KV of the tokens before it gives the same logits."""
    ids = torch.tensor([1, 50, 60, 70, 80, 90, 100, 110, 120, 130])
    whole = target(ids, torch.arange(10), DenseKV(target.config))
    kv = DenseKV(target.config)
    parts = [target(ids[a:b], torch.arange(a, b), kv) for a, b in [(0, 3), (3, 4), (4, 10)]]
    assert torch.allclose(whole, torch.cat(parts), atol=1e-10, rtol=0)


def test_greedy_honours_max_tokens_and_stop_ids(target):
    prompt = [1, 100, 200, 300]
    free = greedy(target, prompt, 12, eos_id=-1)
    assert len(free.output) == 12 and free.finish_reason == "length"
    assert len(free.margins) == len(free.runner_up) == 12
    assert all(m >= 0 for m in free.margins)
    stop = free.output[4]
    stopped = greedy(target, prompt, 12, stop_ids=[stop], eos_id=-1)
    first = free.output.index(stop)
    assert stopped.output == free.output[: first + 1] and stopped.finish_reason == "stop"


def test_greedy_stops_at_eos(target):
    free = greedy(target, [1, 5, 6, 7], 8, eos_id=-1)
    as_eos = greedy(target, [1, 5, 6, 7], 8, eos_id=free.output[2])
    assert as_eos.finish_reason == "eos" and as_eos.output[-1] == free.output[2]
    assert len(as_eos.output) <= 3


@pytest.mark.parametrize(
    "prompt, max_tokens, error",
    [
        ([], 4, errors.EmptyPromptError),
        ([1, 1024], 4, errors.OutOfVocabularyError),
        ([1, -1], 4, errors.OutOfVocabularyError),
        ([1] * 1000, 25, errors.ContextOverflowError),
        ([1, 2], 0, errors.BadRequestError),
    ],
)
def test_bad_input_is_a_named_error(target, prompt, max_tokens, error):
    with pytest.raises(error):
        greedy(target, prompt, max_tokens)


def test_unknown_revision_and_adapter_are_named_errors():
    with pytest.raises(errors.UnknownRevisionError, match="shipped"):
        checkpoints.load_target("zz")
    with pytest.raises(errors.UnknownAdapterError, match="shipped"):
        checkpoints.load_target("a", "nope")


def test_identity_digests_differ_between_weights():
    assert checkpoints.revision_digest("a") != checkpoints.revision_digest("b")
    assert checkpoints.adapter_digest("upper") != checkpoints.adapter_digest("rot13")


def test_checkpoints_fit_the_size_budget():
    total = sum(p.stat().st_size for p in checkpoints.CHECKPOINTS.rglob("*") if p.is_file())
    assert total <= 25 * 2**20
