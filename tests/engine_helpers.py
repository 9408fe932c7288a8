"""Shared, process-wide models and oracles for the reference-engine tests (loaded once per process).

The targets are the shipped checkpoints. Where a LoRA adapter or the draft model has not been trained
into reference_engine/checkpoints/ (a fresh clone mid-training), a deterministic synthetic stand-in is
used instead: exactness does not depend on what the weights are, only on the engine using them right.
"""

from __future__ import annotations

import functools

import torch

from reference_engine.baseline import Greedy, greedy
from reference_engine.checkpoints import CHECKPOINTS, DRAFT
from reference_engine.model import Llama, LlamaConfig
from reference_engine.model_registry import ModelRegistry
from reference_engine.sequence import Identity
from reference_engine.weights import AdapterWeights, Weights


def _perturbed(seed: int):
    def merge(base: Llama) -> Llama:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in base.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.v_proj):
                    proj.weight += 0.05 * torch.randn(proj.weight.shape, generator=gen, dtype=torch.float64).to(proj.weight.dtype)
        return base
    return merge


def _random_draft(config: LlamaConfig) -> Llama:
    torch.manual_seed(7)
    c = LlamaConfig(vocab_size=config.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    max_position_embeddings=config.max_position_embeddings)
    return Llama(c).double().eval()


@functools.lru_cache(maxsize=None)
def registry() -> ModelRegistry:
    weights = None
    if not (CHECKPOINTS / DRAFT / "model.safetensors").exists():
        cfg = ModelRegistry().config()
        weights = Weights(draft_loader=lambda: _random_draft(cfg))
    reg = ModelRegistry(weights=weights)
    for seed, name in enumerate(("upper", "rot13")):
        if name not in reg.adapters():
            reg.load_adapter(name, AdapterWeights(f"synthetic-{name}", _perturbed(100 + seed)))
    return reg


IDENTITIES = (Identity(), Identity("b"), Identity("a", "upper"), Identity("a", None, "t1"),
              Identity("a", "rot13", "t1"), Identity("b", "upper", "t2"))


@functools.lru_cache(maxsize=None)
def baseline(identity: Identity, prompt: tuple[int, ...], max_tokens: int, stop_ids: tuple[int, ...]) -> Greedy:
    return greedy(registry().model(identity), prompt, max_tokens, stop_ids)


MARGINS: list[float] = []


def expected(identity, prompt, max_tokens, stop_ids) -> Greedy:
    g = baseline(identity, tuple(prompt), int(max_tokens), tuple(stop_ids))
    MARGINS.append(min(g.margins))
    return g
