"""transformers' LlamaForCausalLM loads each shipped folder as is and decodes exactly like our baseline.

Both sides run in float64, so an argmax flip would need a margin below ~1e-12: any difference here is a
conversion bug (weight names, RoPE layout, norm epsilon), not numerics.
"""

from __future__ import annotations

import pytest
import torch

from reference_engine import checkpoints
from reference_engine.baseline import greedy
from reference_engine.training.measure import prompts

transformers = pytest.importorskip("transformers")
N_PROMPTS, NEW_TOKENS = 100, 16


def hf_greedy_batch(folder, batch: list[list[int]]) -> list[tuple[int, ...]]:
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    ids = torch.tensor(batch)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=2, pad_token_id=0)
    results = []
    for row in out[:, ids.shape[1]:].tolist():
        results.append(tuple(row[: row.index(2) + 1] if 2 in row else row))
    return results


@pytest.mark.parametrize("revision", sorted(checkpoints.REVISIONS))
def test_transformers_greedy_equals_reference_baseline(revision):
    batch = prompts(N_PROMPTS)
    model = checkpoints.load_target(revision)
    expected = [greedy(model, p, NEW_TOKENS).output for p in batch]
    got = hf_greedy_batch(checkpoints.revision_dir(revision), batch)
    mismatches = [i for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    assert not mismatches, f"{len(mismatches)}/{N_PROMPTS} prompts differ, first: {mismatches[0]}"


def test_transformers_loads_the_draft_folder_and_agrees():
    batch = prompts(20)
    draft = checkpoints.load_draft()
    expected = [greedy(draft, p, NEW_TOKENS).output for p in batch]
    assert hf_greedy_batch(checkpoints.CHECKPOINTS / checkpoints.DRAFT, batch) == expected
