"""A Llama-architecture decoder in plain torch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Read top to bottom like nanoGPT's model.py. The one twist is *where the KV lives*: attention does not
own a cache. `Llama.forward` takes the new tokens, their absolute positions and a `KVStore` that, per
layer, stores the new keys/values and returns attention over everything the sequence has so far. So the
KV of any token range can be computed given the KV of the tokens before it, which is exactly what a
paged engine (reference_engine.engine) needs; `DenseKV` is the simplest store, used by the baseline.

Weights and names follow Hugging Face's `LlamaForCausalLM` (rotate-half RoPE, untied lm_head), so
transformers, vLLM and llama.cpp load the same checkpoint folder.
"""

from __future__ import annotations

import functools
from typing import Protocol

import attrs
import torch
import torch.nn.functional as F
from torch import nn


@attrs.frozen
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 0

    def to_hf(self) -> dict:
        """config.json as transformers' LlamaConfig expects it."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf(cls, d: dict) -> "LlamaConfig":
        names = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class KVStore(Protocol):
    """Where a forward pass keeps and reads K/V. `attend` stores the new k, v (for `positions`) of one
    layer and returns the causal attention output of the new queries over all KV of their sequence."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor: ...


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     q_positions: torch.Tensor | None) -> torch.Tensor:
    """q: [T, H, D] at absolute `q_positions`; k, v: [L, KVH, D] for positions 0..L-1 of one sequence.

    Each query attends to keys at positions <= its own (q_positions None: every key is visible).
    GQA: each KV head serves H/KVH query heads (query head h reads KV head h // (H/KVH), as in HF).
    """
    mask = None
    if q_positions is not None:
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= q_positions[:, None]  # [T, L]
    # SDPA wants [batch, heads, T or L, D]; with a batch dimension it picks its fast CPU kernel.
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1)


class DenseKV:
    """Contiguous KV of one sequence: the simplest KVStore (baseline decoding, the draft model, tests).

    Buffers grow by doubling and are written in place, so a decode step copies one token's K/V rather
    than the whole history; `truncate` (draft rollback) only moves the length back."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype = torch.float64, capacity: int = 64):
        self.config, self.dtype = config, dtype
        self.lengths = [0] * config.num_hidden_layers  # per layer: within a forward, layer 0 runs ahead
        self.k = self._buffer(capacity)
        self.v = self._buffer(capacity)

    def _buffer(self, capacity: int) -> torch.Tensor:
        c = self.config
        return torch.zeros(c.num_hidden_layers, capacity, c.num_key_value_heads, c.head_dim, dtype=self.dtype)

    def attend(self, layer, q, k, v, positions):
        start, t = self.lengths[layer], q.shape[0]
        if positions[0].item() != start:
            raise ValueError("DenseKV expects new tokens to follow the stored ones")
        if start + t > self.k.shape[1]:
            grown_k, grown_v = self._buffer(2 * (start + t)), self._buffer(2 * (start + t))
            grown_k[:, :self.k.shape[1]], grown_v[:, :self.v.shape[1]] = self.k, self.v
            self.k, self.v = grown_k, grown_v
        self.k[layer, start:start + t] = k
        self.v[layer, start:start + t] = v
        self.lengths[layer] = start + t
        keys, values = self.k[layer, :start + t], self.v[layer, :start + t]
        # one query is the last position: it sees every key, no mask needed
        return causal_attention(q, keys, values, positions if t > 1 else None)

    def truncate(self, length: int) -> None:
        """Drop KV past `length` (rollback of rejected draft tokens)."""
        self.lengths = [min(n, length) for n in self.lengths]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # weight * x / sqrt(mean(x^2) + eps), as HF's LlamaRMSNorm, in one fused op
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


@functools.lru_cache(maxsize=None)
def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, D] of rotate-half RoPE (the HF Llama convention) at `positions`. Computed once
    per forward and shared by every layer's q and k."""
    angles = positions.to(torch.float64)[:, None] * _inv_freq(head_dim, theta)[None, :]  # [T, D/2]
    cos, sin = angles.cos(), angles.sin()  # each frequency once; rotate-half uses it twice
    return torch.cat([cos, cos], dim=-1).to(dtype)[:, None, :], torch.cat([sin, sin], dim=-1).to(dtype)[:, None, :]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by the angles `rope_angles` gave."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, x, cos, sin):
        c, t = self.c, x.shape[0]
        q = self.q_proj(x).view(t, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(t, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(t, c.num_key_value_heads, c.head_dim)
        return rope(q, cos, sin), rope(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaBody(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Llama(nn.Module):
    """`forward` for inference over a KVStore; `forward_train` for whole padded batches."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv: KVStore,
                logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """ids, positions: [T] (any mix of sequences; `kv` knows which token belongs where).
        Returns logits [T, vocab] in the model's dtype — or only the rows `logits_rows` of them: an
        engine samples at a sequence's last token (and its drafts), and the vocab projection of every
        other prefill token is wasted work (most of a prefill's cost in a small model)."""
        c = self.config
        cos, sin = rope_angles(positions, c.head_dim, c.rope_theta, self.dtype)
        x = self.model.embed_tokens(ids)
        for i, layer in enumerate(self.model.layers):
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(x), cos, sin)
            o = kv.attend(i, q, k, v, positions)
            x = x + layer.self_attn.o_proj(o.reshape(o.shape[0], -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if logits_rows is not None:
            x = x[logits_rows]
        return self.lm_head(self.model.norm(x))

    def forward_train(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [B, S] -> logits [B, S, vocab], full causal attention (training only)."""
        c = self.config
        b, s = ids.shape
        cos, sin = rope_angles(torch.arange(s).repeat(b), c.head_dim, c.rope_theta, self.dtype)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer.input_layernorm(x).reshape(b * s, -1)
            q, k, v = layer.self_attn.qkv(h, cos, sin)
            q, k, v = (t.view(b, s, -1, c.head_dim).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(b, s, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x))
