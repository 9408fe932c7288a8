"""What an adapter must know about the model it serves, read from the checkpoint folder itself.

Every adapter used to hard-code the shipped family's numbers (vocabulary 1024, eos 2, context 1024). A
user's model (`--engine-arg model=PATH`, a local Hugging Face folder) says them in its own files:
config.json (vocabulary = rows of the embedding, context, sliding window, special ids),
generation_config.json (the eos the model is generated with; it overrides config.json, as transformers
and vLLM read it) and the tokenizer (tokenizer.json's vocabulary with added tokens; tokenizer_config.json's
special tokens when the configs name none). The strategies size every prompt and draw every id from the
`Capabilities` built from this, so a 32k or 150k vocabulary is drawn from as it is.

Block size is not a property of a checkpoint: it stays the engine's own knob (page size, block size).

Reads JSON only (and `tokenizers` for the vocabulary where a tokenizer.json is present): no engine, no
torch, nothing downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from attrs import frozen

from conformance.contract import UsageError


@frozen
class CheckpointInfo:
    folder: Path
    model_type: str
    vocab_size: int  # ids the model accepts and emits (config.json vocab_size: embedding rows)
    max_context: int  # positions, capped at the sliding window where one applies (see LlamaConfig.from_hf)
    eos_id: int | None  # the first eos: the suite's model of generation has one
    eos_ids: tuple[int, ...]  # every eos generation_config.json names (Llama 3 has several)
    bos_id: int | None
    pad_id: int | None
    tokenizer_vocab: int | None  # tokenizer.json's size with added tokens (None: no tokenizer.json)
    torch_dtype: str | None  # what the weights were saved in (config.json "torch_dtype" / "dtype")

    @property
    def label(self) -> str:
        return f"{self.folder.name} ({self.model_type}, vocab {self.vocab_size}, context {self.max_context})"


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not readable JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    return tuple(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))


def _token_name(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _tokenizer_vocab(file: Path) -> tuple[int, Callable[[str], int | None]]:
    """tokenizer.json's size with added tokens, and its token -> id lookup.

    `tokenizers` reads it where it can. An older `tokenizers` (the one an old transformers pins, e.g.
    0.15 under transformers 4.38) cannot parse a file a newer one wrote (BPE merges as pairs), so then the
    JSON itself is read: the model's vocabulary and the added tokens are all these two facts need."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 - any parse failure: read the JSON instead
        data = _json(file)
        vocab = (data.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the index
            vocab = {entry[0]: i for i, entry in enumerate(vocab) if isinstance(entry, list) and entry}
        ids = {str(k): int(v) for k, v in vocab.items() if isinstance(v, int)} if isinstance(vocab, dict) else {}
        for added in data.get("added_tokens") or ():
            if isinstance(added, dict) and isinstance(added.get("content"), str) and isinstance(added.get("id"), int):
                ids[added["content"]] = added["id"]
        return len(set(ids.values())), ids.get
    return tok.get_vocab_size(with_added_tokens=True), tok.token_to_id


def read(folder: str | Path) -> CheckpointInfo:
    """The checkpoint facts of a local Hugging Face model folder; a one-line UsageError if it is not one."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise UsageError(f"model={folder}: no config.json there (a local Hugging Face model folder is expected; "
                         f"nothing is downloaded)")
    config, generation = _json(path / "config.json"), _json(path / "generation_config.json")
    config = {**config.get("text_config", {}), **config}  # multimodal wrappers keep the LM's fields inside
    tok_config = _json(path / "tokenizer_config.json")
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 2:
        raise UsageError(f"model={folder}: config.json has no usable vocab_size ({vocab!r})")
    tokenizer_vocab, token_to_id = None, None
    if (path / "tokenizer.json").is_file():
        tokenizer_vocab, token_to_id = _tokenizer_vocab(path / "tokenizer.json")

    def special(name: str) -> tuple[int, ...]:
        ids = _ids(generation.get(f"{name}_token_id")) or _ids(config.get(f"{name}_token_id"))
        if not ids and token_to_id is not None:
            token = _token_name(tok_config.get(f"{name}_token"))
            found = token_to_id(token) if token else None
            ids = () if found is None else (int(found),)
        return tuple(i for i in ids if 0 <= i < vocab)

    context = int(config.get("max_position_embeddings") or config.get("n_positions") or 2048)
    window = config.get("sliding_window")
    if config.get("model_type") == "qwen2" and not (config.get("use_sliding_window")
                                                    or "sliding_attention" in (config.get("layer_types") or ())):
        window = None
    if isinstance(window, int) and window > 0:
        context = min(context, window)
    eos = special("eos")
    return CheckpointInfo(
        folder=path, model_type=str(config.get("model_type", "?")), vocab_size=vocab, max_context=context,
        eos_id=eos[0] if eos else None, eos_ids=eos, bos_id=(special("bos") or (None,))[0],
        pad_id=(special("pad") or (None,))[0], tokenizer_vocab=tokenizer_vocab,
        torch_dtype=config.get("torch_dtype") or config.get("dtype"))


def shipped(revision: str = "a") -> CheckpointInfo:
    """The shipped family's facts, read the same way as a user's model."""
    from reference_engine import checkpoints

    return read(checkpoints.revision_dir(revision))
