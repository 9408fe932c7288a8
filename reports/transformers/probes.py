"""Direct reproductions of the two transformers findings in README.md, on the shipped checkpoint.

    python reports/transformers/probes.py stop-ids     # F1: a persistent manager keeps its first eos ids
    python reports/transformers/probes.py prefill-only # F2: a request that ends in its prefill step never
                                                       #     publishes its blocks for sharing
Each prints what it saw and exits 1 if the finding reproduces, 0 if not.
"""

from __future__ import annotations

import logging
import sys

import torch
from transformers import GenerationConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cache import PagedAttentionCache

from reference_engine import checkpoints

logging.disable(logging.WARNING)
torch.set_num_threads(1)
PROMPT = [1] + list(range(100, 140))  # 41 tokens: two full blocks of 16


def generate(model, max_new: int, eos: list[int], hits: dict | None = None) -> list[int]:
    gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=64, allow_block_sharing=True)
    original = PagedAttentionCache.search_prefix_match

    def search(self, request_id, prompt_ids):
        n = original(self, request_id, prompt_ids)
        if hits is not None:
            hits["cached"] = hits.get("cached", 0) + n
        return n

    PagedAttentionCache.search_prefix_match = search
    try:
        out = model.generate_batch([PROMPT], generation_config=gen, continuous_batching_config=cb,
                                   progress_bar=False, persistent_manager=True, warmup=False)
    finally:
        PagedAttentionCache.search_prefix_match = original
    return list(out.values())[0].generated_tokens


def stop_ids(model) -> bool:
    first = generate(model, 8, [2])
    stop = first[2]
    second = generate(model, 8, [2, stop])
    print(f"first call (eos [2]):            {first}")
    print(f"second call (eos [2, {stop}]):     {second}   <- should end at {stop}")
    return second != first[:3]


def prefill_only(model) -> bool:
    generate(model, 1, [2])                      # ends in its prefill step
    hits: dict = {}
    generate(model, 4, [2], hits)                # same prompt again, later call, same manager
    print(f"repeat after a max_new_tokens=1 request: {hits.get('cached', 0)} cached tokens (32 were shareable)")
    model.destroy_cached_continuous_batching_manager()
    generate(model, 2, [2])                      # ends after one decode step
    hits = {}
    generate(model, 4, [2], hits)
    print(f"repeat after a max_new_tokens=2 request: {hits.get('cached', 0)} cached tokens")
    return hits.get("cached", 0) > 0


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "stop-ids"
    model = LlamaForCausalLM.from_pretrained(checkpoints.revision_dir("a"), dtype=torch.float64).eval()
    if which == "stop-ids":
        found = stop_ids(model)
    elif which == "prefill-only":
        found = prefill_only(model)
    else:
        print(__doc__)
        return 3
    print("REPRODUCED" if found else "not reproduced")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
