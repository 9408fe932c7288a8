"""The shipped checkpoints, and how to load them or any other Llama-family Hugging Face folder.

Folders under `checkpoints/` use Hugging Face's layout, so every engine reads the same files:
  tiny-target-a/, tiny-target-b/   revisions "a" and "b" of the target (config.json, model.safetensors,
                                    tokenizer.json, MODEL_CARD.md)
  tiny-draft/                       the draft model (same tokenizer)
  lora-upper/, lora-rot13/          PEFT-format LoRA adapters of tiny-target-a

An adapter is identified by its name *and* the digest of its weights; a revision by its name and the
digest of model.safetensors. Those digests are what the prefix cache keys on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib

import torch
from safetensors.torch import load_file

from reference_engine.errors import UnknownAdapterError, UnknownRevisionError
from reference_engine.model import Llama, LlamaConfig

CHECKPOINTS = pathlib.Path(__file__).parent / "checkpoints"
REVISIONS = {"a": "tiny-target-a", "b": "tiny-target-b"}
ADAPTERS = {"upper": "lora-upper", "rot13": "lora-rot13"}
DRAFT = "tiny-draft"


def revision_dir(revision: str) -> pathlib.Path:
    if revision not in REVISIONS:
        raise UnknownRevisionError(f"unknown revision {revision!r}; shipped: {sorted(REVISIONS)}")
    return CHECKPOINTS / REVISIONS[revision]


def adapter_dir(adapter: str) -> pathlib.Path:
    if adapter not in ADAPTERS:
        raise UnknownAdapterError(f"unknown adapter {adapter!r}; shipped: {sorted(ADAPTERS)}")
    return CHECKPOINTS / ADAPTERS[adapter]


@functools.lru_cache(maxsize=None)
def file_digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def revision_digest(revision: str) -> str:
    return file_digest(revision_dir(revision) / "model.safetensors")


def adapter_digest(adapter: str) -> str:
    return file_digest(adapter_dir(adapter) / "adapter_model.safetensors")


def read_config(folder: pathlib.Path) -> LlamaConfig:
    """The model config of a Hugging Face folder (raises UnsupportedCheckpoint for other architectures)."""
    path = pathlib.Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder")
    return LlamaConfig.from_hf(json.loads(path.read_text()))


def read_state_dict(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's safetensors weights: one model.safetensors or the shards an
    index (model.safetensors.index.json) names."""
    folder = pathlib.Path(folder)
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{folder} has no model.safetensors (nor a sharded index); only safetensors are read")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        state.update(load_file(str(folder / shard)))
    return state


def load_model_dir(folder: pathlib.Path, dtype: torch.dtype = torch.float64) -> Llama:
    """Any Llama-family Hugging Face folder (the shipped ones included) as a reference model in `dtype`.

    A tied checkpoint stores the embedding once (no lm_head.weight): the model shares the matrix. Every
    other tensor must be present and nothing may be left over (a rotary `inv_freq` buffer some exports
    keep is recomputed, not read): a weight this model does not compute is a refusal, never ignored."""
    config = read_config(folder)
    model = Llama(config)
    state = {k: v for k, v in read_state_dict(folder).items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def merge_lora(model: Llama, folder: pathlib.Path) -> Llama:
    """Fold a PEFT LoRA into the weights: W += (alpha / r) * B @ A. Merging keeps one forward path for
    every identity; the merged weights differ from the base, so must their KV."""
    cfg = json.loads((folder / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    state = load_file(str(folder / "adapter_model.safetensors"))
    prefix = "base_model.model."
    for key, a in state.items():
        if not key.endswith("lora_A.weight"):
            continue
        module_path = key[len(prefix):-len(".lora_A.weight")]
        b = state[key.replace("lora_A", "lora_B")]
        linear = model.get_submodule(module_path)
        with torch.no_grad():
            linear.weight += (scale * (b.double() @ a.double())).to(linear.weight.dtype)
    return model


def load_target(revision: str = "a", adapter: str | None = None, dtype: torch.dtype = torch.float64) -> Llama:
    model = load_model_dir(revision_dir(revision), dtype)
    if adapter is not None:
        merge_lora(model, adapter_dir(adapter))
    return model


def load_draft(dtype: torch.dtype = torch.float64) -> Llama:
    return load_model_dir(CHECKPOINTS / DRAFT, dtype)


def load_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(revision_dir("a") / "tokenizer.json"))
