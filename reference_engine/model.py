"""A Llama-architecture decoder in plain torch: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Read top to bottom like nanoGPT's model.py. The one twist is *where the KV lives*: attention does not
own a cache. `Llama.forward` takes the new tokens, their absolute positions and a `KVStore` that, per
layer, stores the new keys/values and returns attention over everything the sequence has so far. So the
KV of any token range can be computed given the KV of the tokens before it, which is exactly what a
paged engine (reference_engine.engine) needs; `DenseKV` is the simplest store, used by the baseline.

Weights and names follow Hugging Face's `LlamaForCausalLM` (rotate-half RoPE), so transformers, vLLM and
llama.cpp load the same checkpoint folder — and this model loads theirs: `LlamaConfig.from_hf` reads any
Llama-family config.json (Llama, Mistral, Qwen2: GQA, RoPE theta with linear or llama3 scaling, tied or
untied embeddings, q/k/v bias), so a user's checkpoint has an independent float64 ground truth.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Protocol

import attrs
import torch
import torch.nn.functional as F
from torch import nn


# The Llama family as Hugging Face configures it: which `model_type`s this module computes exactly, and
# what differs between them (Qwen2 puts a bias on q/k/v only; Llama's `attention_bias` puts one on
# q/k/v/o; Mistral has none).
FAMILY = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedCheckpoint(ValueError):
    """A config.json this model cannot compute exactly (another architecture, an activation or a RoPE
    variant it does not implement). Said before any weight is loaded, never approximated."""


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
    # The rest is what other Llama-family checkpoints set; the defaults are the shipped family's.
    model_type: str = "llama"
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2; Llama with attention_bias)
    o_bias: bool = False  # bias on o_proj (Llama with attention_bias)
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    # RoPE scaling as ((key, value), ...) of HF's rope_parameters / rope_scaling minus rope_theta;
    # () = plain RoPE. Hashable, so the inverse frequencies are computed once per config.
    rope_scaling: tuple[tuple[str, Any], ...] = ()

    def to_hf(self) -> dict:
        """config.json as transformers' LlamaConfig expects it (the shipped family's fields)."""
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
    def from_hf(cls, d: Mapping[str, Any]) -> "LlamaConfig":
        """Any Llama-family config.json (transformers 4.x `rope_scaling` + `rope_theta`, or 5.x
        `rope_parameters`). Sliding-window attention (Mistral; Qwen2 with use_sliding_window) equals
        full attention while a sequence fits in the window, so the context is capped at the window
        rather than masking: the paged engine and the baseline then need no second attention rule."""
        model_type = str(d.get("model_type", "llama"))
        if model_type not in FAMILY:
            raise UnsupportedCheckpoint(f"model_type {model_type!r} is not in the Llama family this reference "
                                        f"computes ({', '.join(FAMILY)})")
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedCheckpoint(f"hidden_act {d.get('hidden_act')!r}: only silu (SwiGLU) is implemented")
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", None) or d.get("rope_theta") or 10000.0)
        rope_type = rope.pop("rope_type", rope.pop("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise UnsupportedCheckpoint(f"rope_type {rope_type!r}: implemented are {', '.join(ROPE_TYPES)}")
        if float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
            raise UnsupportedCheckpoint("partial rotary embeddings are not implemented")
        keys = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
        scaling = (("rope_type", rope_type),) + tuple((k, float(rope[k])) for k in keys.get(rope_type, ()))
        heads = int(d["num_attention_heads"])
        context = int(d.get("max_position_embeddings", 1024))
        window = d.get("sliding_window")
        if model_type == "qwen2":
            sliding_layers = "sliding_attention" in (d.get("layer_types") or ())
            window = window if (d.get("use_sliding_window") or sliding_layers) else None
        if window:
            context = min(context, int(window))
        attention_bias = bool(d.get("attention_bias") or False)
        eos = d.get("eos_token_id")
        return cls(
            vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]), num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads, num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or int(d["hidden_size"]) // heads),
            max_position_embeddings=context, rope_theta=theta, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            bos_token_id=_first(d.get("bos_token_id")), eos_token_id=_first(eos), pad_token_id=_first(d.get("pad_token_id")),
            model_type=model_type, qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type == "llama" and attention_bias, mlp_bias=bool(d.get("mlp_bias") or False),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            rope_scaling=() if rope_type == "default" else scaling)


def _first(token_id: Any) -> int | None:
    """A special id as one int: HF allows a list (Llama 3's several eos ids); the first is the model's own."""
    if isinstance(token_id, (list, tuple)):
        return int(token_id[0]) if token_id else None
    return None if token_id is None else int(token_id)


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
def _inv_freq(head_dim: int, theta: float, scaling: tuple[tuple[str, Any], ...] = ()) -> torch.Tensor:
    """RoPE inverse frequencies in float64, with HF's `linear` (every frequency / factor) or `llama3`
    (long wavelengths / factor, short ones kept, a smooth blend between) scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    s = dict(scaling)
    kind = s.get("rope_type", "default")
    if kind == "linear":
        return inv / s["factor"]
    if kind == "llama3":
        factor, low, high, old = (s[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings"))
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv / factor + smooth * inv
        return torch.where(wavelen > old / low, inv / factor, torch.where(wavelen < old / high, inv, blended))
    return inv


_ROPE_TABLE_MIN = 1024  # positions per table at least; a longer context doubles it


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype, scaling: tuple[tuple[str, Any], ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, D] of rotate-half RoPE (the HF Llama convention) at `positions`, read from a
    table of every position: one lookup per forward, shared by every layer's q and k. A table, not a
    computation per forward, also gives a position the same rotation bit for bit in any forward
    (a vectorised cos over 17 positions and over one need not agree in the last bit)."""
    length = _ROPE_TABLE_MIN
    top = int(positions.max()) + 1 if positions.numel() else 0
    while length < top:
        length *= 2
    cos, sin = _rope_table(head_dim, theta, scaling, dtype, length)
    return cos[positions], sin[positions]


@functools.lru_cache(maxsize=None)
def _rope_table(head_dim: int, theta: float, scaling: tuple[tuple[str, Any], ...], dtype: torch.dtype,
                length: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(length, dtype=torch.float64)[:, None] * _inv_freq(head_dim, theta, scaling)[None, :]
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
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.o_bias)

    def qkv(self, x, cos, sin):
        c, t = self.c, x.shape[0]
        q = self.q_proj(x).view(t, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(t, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(t, c.num_key_value_heads, c.head_dim)
        return rope(q, cos, sin), rope(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

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
        if config.tie_word_embeddings:  # one matrix, as HF ties them (the checkpoint stores it once)
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @torch.inference_mode()  # not no_grad: a step's many small tensors skip version counters and view
    # tracking (benchmarks/reference_engine_speed.py: 3-17% less CPU decoding); the arithmetic is the same
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv: KVStore,
                logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """ids, positions: [T] (any mix of sequences; `kv` knows which token belongs where).
        Returns logits [T, vocab] in the model's dtype — or only the rows `logits_rows` of them: an
        engine samples at a sequence's last token (and its drafts), and the vocab projection of every
        other prefill token is wasted work (most of a prefill's cost in a small model)."""
        c = self.config
        cos, sin = rope_angles(positions, c.head_dim, c.rope_theta, self.dtype, c.rope_scaling)
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
        cos, sin = rope_angles(torch.arange(s).repeat(b), c.head_dim, c.rope_theta, self.dtype, c.rope_scaling)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer.input_layernorm(x).reshape(b * s, -1)
            q, k, v = layer.self_attn.qkv(h, cos, sin)
            q, k, v = (t.view(b, s, -1, c.head_dim).transpose(1, 2) for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(b, s, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x))
