"""Write the shipped HF-format checkpoints as GGUF so llama.cpp runs the very same weights.

Written directly with the `gguf` package (no dependency on llama.cpp's `convert_hf_to_gguf.py`, whose
pre-tokenizer hash table does not know our tokenizer):

* architecture ``llama``, every tensor f32 (``general.file_type`` = ALL_F32), names as llama.cpp expects
  (``token_embd``, ``blk.N.attn_q`` ..., ``output_norm``, ``output``; lm_head is untied);
* Q and K rows permuted from HF's rotate-half RoPE layout into llama.cpp's interleaved-pair layout
  (the same permutation as ``convert_hf_to_gguf.LlamaModel.permute``);
* our byte-level BPE tokenizer as a ``gpt2``-style vocabulary (tokens, merges, pre-tokenizer ``gpt-2``,
  which is the GPT-2 split regex HF's ``ByteLevel(use_regex=True)`` uses); <pad>/<bos>/<eos> are
  CONTROL tokens; no BOS/EOS is added automatically (kvparity prompts are token ids, BOS included or not);
* PEFT LoRA adapters as GGUF LoRA adapters (``general.type = adapter``, ``adapter.type = lora``,
  ``adapter.lora.alpha``; tensors ``<weight>.lora_a`` / ``.lora_b``; B of q/k permuted like the base).

Output file names carry the first 12 hex digits of the source weights' sha256, so an export made from
other weights is never picked up by mistake (a stale GGUF is exactly the "revision not in the key" bug).

Python: ``export_gguf(src, out_dir=None) -> Path`` and ``export_all()``; the command is
``kvparity export-gguf`` (kvparity/commands/export_gguf.py). This module is library code the llama.cpp
adapter and its probes import, so it lives in adapters/ proper: adapters import no command.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import secrets
from typing import Any, Callable, Mapping, Sequence

import numpy as np

CHECKPOINTS = pathlib.Path(__file__).resolve().parents[1] / "reference_engine" / "checkpoints"
SHIPPED = ("tiny-target-a", "tiny-target-b", "tiny-draft", "lora-upper", "lora-rot13")

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def default_out_dir() -> pathlib.Path:
    """$KVPARITY_GGUF_DIR, else ~/.cache/kvparity/gguf."""
    env = os.environ.get("KVPARITY_GGUF_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "kvparity" / "gguf"


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gguf_name(hf_name: str) -> str:
    """HF tensor name (without ``.weight``) -> llama.cpp tensor name (without ``.weight``)."""
    if hf_name == "model.embed_tokens":
        return "token_embd"
    if hf_name == "model.norm":
        return "output_norm"
    if hf_name == "lm_head":
        return "output"
    parts = hf_name.split(".")
    if len(parts) >= 4 and parts[0] == "model" and parts[1] == "layers":
        rest = ".".join(parts[3:])
        if rest in _LAYER_NAMES:
            return f"blk.{int(parts[2])}.{_LAYER_NAMES[rest]}"
    raise ValueError(f"no GGUF name for tensor {hf_name!r}")


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half Q/K rows -> llama.cpp's interleaved pairs (convert_hf_to_gguf's `permute`).
    Acts on rows (output features), so it applies to a weight [out, in] and to a LoRA B [out, r]."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def _load_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: np.asarray(v, dtype=np.float32) for k, v in load_file(str(path)).items()}


def _tokenizer_fields(tok_path: pathlib.Path):
    tok = json.loads(tok_path.read_text())
    model = tok["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{tok_path}: only byte-level BPE tokenizers are supported")
    by_id: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    special: set[int] = set()
    for added in tok.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        if added.get("special"):
            special.add(int(added["id"]))
    n = max(by_id) + 1
    missing = [i for i in range(n) if i not in by_id]
    if missing:
        raise ValueError(f"{tok_path}: vocabulary has holes at ids {missing[:10]}")
    tokens = [by_id[i] for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, merges, special


def _add_tokenizer(writer, tok_path: pathlib.Path, config: Mapping) -> None:
    import gguf

    tokens, merges, special = _tokenizer_fields(tok_path)
    if len(tokens) != int(config["vocab_size"]):
        raise ValueError(f"tokenizer has {len(tokens)} tokens, config.vocab_size={config['vocab_size']}")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([int(gguf.TokenType.CONTROL) if i in special else int(gguf.TokenType.NORMAL)
                            for i in range(len(tokens))])
    writer.add_token_merges(merges)
    for key, adder in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id),
                       ("pad_token_id", writer.add_pad_token_id)):
        if config.get(key) is not None:
            adder(int(config[key]))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def _out_path(out_dir: pathlib.Path, name: str, digest: str) -> pathlib.Path:
    return out_dir / f"{name}-{digest[:12]}-f32.gguf"


def _target(src: pathlib.Path, weights: pathlib.Path, out_dir: pathlib.Path | None) -> tuple[str, pathlib.Path]:
    """(weights digest, the GGUF path an export of exactly these weights gets): the cache key of an export."""
    digest = _sha256(weights)
    return digest, _out_path(pathlib.Path(out_dir) if out_dir else default_out_dir(), src.name, digest)


def export_model(src: pathlib.Path, out_dir: pathlib.Path | None = None, *, force: bool = False) -> pathlib.Path:
    """One HF Llama checkpoint folder (config.json, model.safetensors, tokenizer.json) -> f32 GGUF."""
    import gguf

    src = pathlib.Path(src)
    weights = src / "model.safetensors"
    digest, out = _target(src, weights, out_dir)
    if out.exists() and not force:
        return out
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{src}: model_type {config.get('model_type')!r}, only 'llama' is supported")
    n_head, n_kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // n_head)
    state = _load_safetensors(weights)
    if "lm_head.weight" not in state or config.get("tie_word_embeddings"):
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])

    def fill(writer) -> None:
        writer.add_name(src.name)
        writer.add_string("kvparity.source_sha256", digest)
        writer.add_context_length(int(config.get("max_position_embeddings", 1024)))
        writer.add_embedding_length(hidden)
        writer.add_block_count(int(config["num_hidden_layers"]))
        writer.add_feed_forward_length(int(config["intermediate_size"]))
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_kv)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
        writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
        writer.add_vocab_size(int(config["vocab_size"]))
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        _add_tokenizer(writer, src / "tokenizer.json", config)
        for hf_name in sorted(state):
            if not hf_name.endswith(".weight"):
                raise ValueError(f"unexpected tensor {hf_name!r}")
            base = hf_name[: -len(".weight")]
            w = np.ascontiguousarray(state[hf_name], dtype=np.float32)
            if base.endswith("self_attn.q_proj"):
                w = permute_rope(w, n_head)
            elif base.endswith("self_attn.k_proj"):
                w = permute_rope(w, n_kv)
            writer.add_tensor(gguf_name(base) + ".weight", np.ascontiguousarray(w))

    return _write_gguf(out, fill)


def export_lora(src: pathlib.Path, base: pathlib.Path | None = None, out_dir: pathlib.Path | None = None, *,
                force: bool = False) -> pathlib.Path:
    """A PEFT LoRA folder (adapter_config.json, adapter_model.safetensors) -> GGUF LoRA adapter.
    `base` is the base model folder (for head counts); default: the adapter's base_model_name_or_path
    when it names a shipped folder, else tiny-target-a."""
    import gguf

    src = pathlib.Path(src)
    weights = src / "adapter_model.safetensors"
    digest, out = _target(src, weights, out_dir)
    if out.exists() and not force:
        return out
    cfg = json.loads((src / "adapter_config.json").read_text())
    if base is None:
        named = pathlib.Path(str(cfg.get("base_model_name_or_path") or "tiny-target-a")).name
        base = CHECKPOINTS / (named if (CHECKPOINTS / named).is_dir() else "tiny-target-a")
    config = json.loads((pathlib.Path(base) / "config.json").read_text())
    n_head, n_kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    state = _load_safetensors(weights)
    prefix = "base_model.model."

    def fill(writer) -> None:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(cfg["lora_alpha"]))
        writer.add_name(src.name)
        writer.add_string("kvparity.source_sha256", digest)
        written = 0
        for key in sorted(state):
            if not key.endswith("lora_A.weight"):
                continue
            module = key[len(prefix):-len(".lora_A.weight")] if key.startswith(prefix) else key[:-len(".lora_A.weight")]
            a = state[key]
            b = state[key.replace("lora_A", "lora_B")]
            if module.endswith("self_attn.q_proj"):
                b = permute_rope(b, n_head)
            elif module.endswith("self_attn.k_proj"):
                b = permute_rope(b, n_kv)
            name = gguf_name(module) + ".weight"
            writer.add_tensor(name + ".lora_a", np.ascontiguousarray(a, dtype=np.float32))
            writer.add_tensor(name + ".lora_b", np.ascontiguousarray(b, dtype=np.float32))
            written += 1
        if not written:
            raise ValueError(f"{src}: no lora_A/lora_B tensors found")

    return _write_gguf(out, fill)


def _write_gguf(out: pathlib.Path, fill: Callable[[Any], None]) -> pathlib.Path:
    """Write the GGUF `fill` describes to `out`, through a temporary file of this writer's own renamed into
    place. Two processes exporting at once (a campaign's llama.cpp shards on a cold cache, pytest -n 2) had
    shared one `<name>.tmp`: measured, in 8 of 20 simultaneous exports of one checkpoint one process raised
    FileNotFoundError (the other had already renamed the file both were writing). The content is a
    function of the weights (their digest names the file), so whichever rename lands last is right."""
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.stem}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        writer = gguf.GGUFWriter(str(tmp), "llama")
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _resolve(name_or_dir: str | os.PathLike) -> pathlib.Path:
    p = pathlib.Path(name_or_dir)
    if p.is_dir():
        return p
    if (CHECKPOINTS / str(name_or_dir)).is_dir():
        return CHECKPOINTS / str(name_or_dir)
    raise FileNotFoundError(f"no checkpoint folder {name_or_dir!r} (shipped: {', '.join(SHIPPED)})")


def export_gguf(src: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                force: bool = False) -> pathlib.Path:
    """Export one checkpoint (a folder, or a shipped name such as "tiny-target-a" or "lora-upper") and
    return the GGUF path. Models and PEFT LoRAs are told apart by their files. Idempotent: an existing
    export of the same weights (same digest in the file name) is returned unless `force`."""
    folder = _resolve(src)
    out = pathlib.Path(out_dir) if out_dir else None
    if (folder / "adapter_config.json").exists():
        return export_lora(folder, out_dir=out, force=force)
    return export_model(folder, out_dir=out, force=force)


def export_all(out_dir: str | os.PathLike | None = None, *, force: bool = False,
               names: Sequence[str] = SHIPPED) -> dict[str, pathlib.Path]:
    """Export every shipped checkpoint that is present; returns name -> GGUF path."""
    return {n: export_gguf(n, out_dir, force=force) for n in names if (CHECKPOINTS / n).is_dir()}
