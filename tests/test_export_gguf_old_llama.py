"""The GGUF `kvparity export-gguf` writes loads in old llama.cpp too (the one vendored by llama-cpp-python 0.2.38 -
0.2.40, early 2024), not only in current releases. That loader requires what these tests pin; they need only
`gguf`, and each requirement is checked against a file that meets it and one that does not.

What the old loader needs (llama.cpp of Feb 2024, `llm_load_hparams` / `llm_load_vocab`):
* the llama hparams `context_length`, `embedding_length`, `feed_forward_length`, `block_count`,
  `attention.head_count` and `attention.layer_norm_rms_epsilon` (no defaults for those);
* `n_rot` (`rope.dimension_count`) equal to embedding_length / head_count, else "invalid n_rot";
* a `gpt2` tokenizer model with `tokenizer.ggml.merges`, and the byte-level newline token "Ċ" (it asserts
  "model vocab missing newline token" when BPE has none);
* only tensor types it knows: every tensor is f32 here.
`tokenizer.ggml.pre` (newer) is an unknown key there and ignored; the end-to-end proof is the GGUF-equality
test in tests/test_adapter_llama_cpp.py run in a 0.2.39 venv (reports/llama_cpp/README.md, "Versions")."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gguf") is None,
                                reason="gguf not installed (pip install 'kvparity[llamacpp]')")

ARCH = "llama"
REQUIRED_HPARAMS = ("context_length", "embedding_length", "feed_forward_length", "block_count",
                    "attention.head_count", "attention.layer_norm_rms_epsilon")


def old_loader_problems(fields: dict) -> list[str]:
    """What the Feb-2024 llama.cpp loader would reject in a GGUF whose metadata is `fields` (name -> value)."""
    problems = [f"missing {ARCH}.{k}" for k in REQUIRED_HPARAMS if f"{ARCH}.{k}" not in fields]
    if fields.get("general.architecture") != ARCH:
        problems.append("general.architecture is not llama")
    n_embd, n_head = fields.get(f"{ARCH}.embedding_length"), fields.get(f"{ARCH}.attention.head_count")
    n_rot = fields.get(f"{ARCH}.rope.dimension_count")
    if n_rot is not None and n_embd and n_head and n_rot != n_embd // n_head:
        problems.append(f"invalid n_rot {n_rot} != {n_embd} / {n_head}")
    if fields.get("tokenizer.ggml.model") != "gpt2":
        problems.append("tokenizer model is not gpt2")
    if not fields.get("tokenizer.ggml.merges"):
        problems.append("no BPE merges")
    if "\u010a" not in (fields.get("tokenizer.ggml.tokens") or ()):
        problems.append("no newline token")
    return problems


def _fields(path) -> tuple[dict, set[str]]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        out[name] = value
    return out, {gguf.GGMLQuantizationType(t.tensor_type).name for t in reader.tensors}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from adapters.gguf_export import export_gguf

    return _fields(export_gguf("tiny-target-a", tmp_path_factory.mktemp("gguf")))


def test_export_meets_what_the_old_loader_requires(exported):
    fields, types = exported
    assert old_loader_problems(fields) == []
    assert types == {"F32"}


@pytest.mark.parametrize("drop,expected", [
    ("llama.attention.layer_norm_rms_epsilon", "missing llama.attention.layer_norm_rms_epsilon"),
    ("tokenizer.ggml.merges", "no BPE merges"),
])
def test_a_file_without_a_required_key_is_rejected(exported, drop, expected):
    fields = {k: v for k, v in exported[0].items() if k != drop}
    assert expected in old_loader_problems(fields)


def test_a_wrong_rope_dimension_or_tokenizer_is_rejected(exported):
    fields = dict(exported[0], **{"llama.rope.dimension_count": 16, "tokenizer.ggml.model": "llama"})
    problems = old_loader_problems(fields)
    assert any(p.startswith("invalid n_rot") for p in problems) and "tokenizer model is not gpt2" in problems
    tokens = [t for t in exported[0]["tokenizer.ggml.tokens"] if t != "\u010a"]
    assert "no newline token" in old_loader_problems(dict(exported[0], **{"tokenizer.ggml.tokens": tokens}))
