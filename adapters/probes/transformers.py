"""Direct reproductions of the transformers findings in reports/transformers/README.md, on the shipped
checkpoint, with whichever transformers release runs them (the museum's venvs: .kvparity/venvs/).

    python -m adapters.probes.transformers stop-ids     # F1: a persistent manager keeps its first eos ids
    python -m adapters.probes.transformers prefill-only # F2: a request that ends in its prefill step never
                                                        #     publishes its blocks for sharing
    python -m adapters.probes.transformers lookup-stop-tail  # F3 (4.46): prompt lookup on a prompt that
                                                        #     ends in a stop id returns no token at all
    python -m adapters.probes.transformers assisted     # transformers#30042 (4.39): assisted generation
                                                        #     differs from plain greedy
Each prints what it saw and exits 1 if the finding reproduces, 0 if not.
"""

from __future__ import annotations

import logging
import sys

import torch
import transformers
from transformers import GenerationConfig, LlamaForCausalLM

from adapters import transformers_versions
from adapters.transformers import count_prefix_hits
from conformance.exit_codes import ExitCode
from reference_engine import checkpoints

logging.disable(logging.WARNING)
torch.set_num_threads(1)
PROMPT = [1] + list(range(100, 140))  # 41 tokens: two full blocks of 16


def generate(model, max_new: int, eos: list[int], hits: dict | None = None) -> list[int]:
    """One `generate_batch` call on PROMPT with a persistent manager; `hits` collects the prompt tokens
    the paged cache served from shared blocks (per request id)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    features = transformers_versions.probe(transformers)  # the page field's name differs by release
    cb = ContinuousBatchingConfig(**transformers_versions.batching_config_kwargs(features, 16), num_blocks=64,
                                  max_batch_tokens=64, allow_block_sharing=True)
    with count_prefix_hits(hits if hits is not None else {}):
        out = model.generate_batch([PROMPT], generation_config=gen, continuous_batching_config=cb,
                                   progress_bar=False, persistent_manager=True, warmup=False)
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
    print(f"repeat after a max_new_tokens=1 request: {sum(hits.values())} cached tokens (32 were shareable)")
    model.destroy_cached_continuous_batching_manager()
    generate(model, 2, [2])                      # ends after one decode step
    hits = {}
    generate(model, 4, [2], hits)
    print(f"repeat after a max_new_tokens=2 request: {sum(hits.values())} cached tokens")
    return sum(hits.values()) > 0


def greedy(model, prompt: list[int], eos: list[int], max_new: int, **kwargs) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=0, **kwargs)
    return out[0, len(prompt):].tolist()


def lookup_stop_tail(model) -> bool:
    prompt = [47, 43, 51]  # the CI stream's witness on 4.46.3: the prompt's last token is the stop id
    plain = greedy(model, prompt, [2, 51], 7)
    lookup = greedy(model, prompt, [2, 51], 7, prompt_lookup_num_tokens=3)
    print(f"plain greedy, stop id 51:  {plain}")
    print(f"prompt lookup, stop id 51: {lookup}   <- should equal plain")
    return lookup != plain


def assisted(model, features) -> bool:
    draft = LlamaForCausalLM.from_pretrained(checkpoints.CHECKPOINTS / checkpoints.DRAFT,
                                             **transformers_versions.load_kwargs(features, torch.float64)).eval()
    transformers_versions.configure_assistant(features, draft, 3)
    prompt = PROMPT[:12]
    plain, drafted = greedy(model, prompt, [2], 16), greedy(model, prompt, [2], 16, assistant_model=draft)
    print(f"plain greedy: {plain}")
    print(f"assisted:     {drafted}   <- should equal plain")
    return drafted != plain


def main(argv: list[str]) -> int:
    which = argv[0] if argv else "stop-ids"
    features = transformers_versions.probe(transformers)
    model = LlamaForCausalLM.from_pretrained(checkpoints.revision_dir("a"),
                                             **transformers_versions.load_kwargs(features, torch.float64)).eval()
    print(f"transformers {features.version}")
    if which in ("stop-ids", "prefill-only") and not features.continuous_batching:
        print(f"{which} needs generate_batch with block sharing; transformers {features.version} has none")
        return ExitCode.ERROR
    if which == "stop-ids":
        found = stop_ids(model)
    elif which == "prefill-only":
        found = prefill_only(model)
    elif which == "lookup-stop-tail":
        found = lookup_stop_tail(model)
    elif which == "assisted":
        found = assisted(model, features)
    else:
        print(__doc__)
        return ExitCode.USAGE
    print("REPRODUCED" if found else "not reproduced")
    return ExitCode.FAIL if found else ExitCode.PASS


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
