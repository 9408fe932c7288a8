"""The reference model loads any Llama-family checkpoint: random-init Llama, Mistral and Qwen2 models saved by
transformers (tiny sizes, nothing downloaded) give token for token transformers' greedy output in float64.

Each architecture is saved with the variant that distinguishes it: GQA everywhere, llama3 and linear RoPE
scaling, a large theta, tied and untied embeddings, Llama's attention bias, Qwen2's q/k/v bias, Mistral's
sliding window. Where a variant would leave greedy tokens unchanged by chance, the test also pins the
logits (and shows that dropping the variant moves them), so it can fail.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from reference_engine import checkpoints  # noqa: E402
from reference_engine.baseline import greedy  # noqa: E402
from reference_engine.model import DenseKV, Llama, LlamaConfig, UnsupportedCheckpoint  # noqa: E402

SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ARCHS = {
    "llama-llama3-untied-bias": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=320, attention_bias=True, max_position_embeddings=256, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})),
    "llama-linear-tied": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=320, tie_word_embeddings=True, max_position_embeddings=256,
        rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "mistral-window": ("MistralForCausalLM", "MistralConfig", dict(vocab_size=320, sliding_window=128,
                                                                    max_position_embeddings=4096)),
    "qwen2-tied-bias": ("Qwen2ForCausalLM", "Qwen2Config", dict(vocab_size=320, tie_word_embeddings=True,
                                                                max_position_embeddings=256)),
}
PROMPTS = ([5, 17, 99, 3, 250, 41, 8, 8, 8, 120, 77, 12, 300, 6, 44, 19, 230, 11, 64, 2, 90, 91],
           [33], [7, 7, 7, 7, 300, 21])


def save_random(kind: str, root: pathlib.Path, **overrides) -> pathlib.Path:
    """A random-init checkpoint of `kind` saved by transformers itself (float32 on disk)."""
    model_cls, config_cls, extra = ARCHS[kind]
    torch.manual_seed(len(kind))
    config = getattr(transformers, config_cls)(**{**SIZES, **extra, **overrides})
    model = getattr(transformers, model_cls)(config)
    folder = root / kind
    model.save_pretrained(folder)
    return folder


def hf_greedy(folder: pathlib.Path, prompt, n: int):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), torch.stack([x[0] for x in out.logits]).double()  # generate hands float32 logits


def ref_logits(model: Llama, prompt, output) -> torch.Tensor:
    """The reference's logits at each output position, teacher-forced on `output`."""
    seq = list(prompt) + list(output)
    kv = DenseKV(model.config)
    return model(torch.tensor(seq), torch.arange(len(seq)), kv)[len(prompt) - 1:len(seq) - 1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {kind: save_random(kind, root) for kind in ARCHS}


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_reference_equals_transformers_greedy_in_float64(saved, kind):
    model = checkpoints.load_model_dir(saved[kind], torch.float64)
    for prompt in PROMPTS:
        expected, logits = hf_greedy(saved[kind], prompt, 12)
        got = greedy(model, prompt, 12, eos_id=-1)  # no eos: compare all 12 steps
        assert list(got.output) == expected, f"{kind}: {got.output} != {expected} for prompt {prompt}"
        # transformers computes RoPE angles in float32 even for a float64 model: agreement to ~1e-6, not 1e-13
        assert torch.allclose(ref_logits(model, prompt, expected), logits, atol=1e-5, rtol=0), kind


def test_config_variants_are_read(saved):
    cfg = {k: checkpoints.read_config(v) for k, v in saved.items()}
    assert cfg["llama-llama3-untied-bias"].rope_scaling[0] == ("rope_type", "llama3")
    assert cfg["llama-llama3-untied-bias"].qkv_bias and cfg["llama-llama3-untied-bias"].o_bias
    assert cfg["llama-llama3-untied-bias"].rope_theta == 500000.0
    assert dict(cfg["llama-linear-tied"].rope_scaling) == {"rope_type": "linear", "factor": 4.0}
    assert cfg["llama-linear-tied"].tie_word_embeddings
    assert cfg["qwen2-tied-bias"].qkv_bias and not cfg["qwen2-tied-bias"].o_bias
    assert cfg["mistral-window"].max_position_embeddings == 128  # capped at the sliding window
    assert all(c.num_key_value_heads == 2 and c.num_attention_heads == 4 for c in cfg.values())


@pytest.mark.parametrize("kind", ["llama-llama3-untied-bias", "llama-linear-tied"])
def test_rope_scaling_changes_the_logits(saved, kind):
    """Both ways: the same weights without the scaling give other logits than transformers' (so the
    equality above is not vacuous for the scaled frequencies)."""
    model = checkpoints.load_model_dir(saved[kind], torch.float64)
    plain = Llama(LlamaConfig(**{**_fields(model.config), "rope_scaling": ()}))
    plain.load_state_dict(model.state_dict())
    plain = plain.to(torch.float64).eval()
    prompt = PROMPTS[0]
    expected, logits = hf_greedy(saved[kind], prompt, 4)
    assert torch.allclose(ref_logits(model, prompt, expected), logits, atol=1e-5, rtol=0)
    assert not torch.allclose(ref_logits(plain, prompt, expected), logits, atol=1e-3, rtol=0)


def test_missing_or_extra_weights_are_refused(saved, tmp_path):
    """A bias the config does not declare is not silently dropped: strict loading refuses it."""
    folder = tmp_path / "qwen-as-mistral"
    folder.mkdir()
    config = json.loads((saved["qwen2-tied-bias"] / "config.json").read_text())
    config["model_type"] = "mistral"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((saved["qwen2-tied-bias"] / "model.safetensors").read_bytes())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        checkpoints.load_model_dir(folder)


@pytest.mark.parametrize("change, match", [({"model_type": "gpt2"}, "Llama family"),
                                           ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "yarn"),
                                           ({"hidden_act": "gelu"}, "silu")])
def test_unsupported_configs_are_refused_by_name(saved, change, match):
    config = json.loads((saved["llama-linear-tied"] / "config.json").read_text())
    with pytest.raises(UnsupportedCheckpoint, match=match):
        LlamaConfig.from_hf({**config, **change})


def test_the_shipped_family_loads_through_the_generic_path():
    generic = checkpoints.load_model_dir(checkpoints.revision_dir("a"))
    assert generic.config == checkpoints.load_target("a").config
    assert not generic.config.tie_word_embeddings and generic.config.rope_scaling == ()


def _fields(c: LlamaConfig) -> dict:
    import attrs

    return attrs.asdict(c, recurse=False)


# --------------------------------------------------------------------------- model=PATH on an adapter


@pytest.fixture(scope="module")
def big_vocab(tmp_path_factory) -> pathlib.Path:
    """A random-init Llama with a 32,000-token vocabulary and its own special ids (eos 31999)."""
    return save_random("llama-linear-tied", tmp_path_factory.mktemp("big"), vocab_size=32000, eos_token_id=31999,
                       bos_token_id=31998, pad_token_id=31997)


def test_checkpoint_info_reads_the_users_model(big_vocab):
    from adapters import checkpoint_info

    info = checkpoint_info.read(big_vocab)
    assert (info.vocab_size, info.eos_id, info.bos_id, info.pad_id, info.max_context) == (32000, 31999, 31998, 31997, 256)
    shipped = checkpoint_info.shipped()
    assert (shipped.vocab_size, shipped.eos_id, shipped.max_context, shipped.tokenizer_vocab) == (1024, 2, 1024, 1024)


def test_checkpoint_info_refuses_a_folder_without_config(tmp_path):
    from adapters import checkpoint_info
    from conformance.contract import UsageError

    with pytest.raises(UsageError, match="no config.json"):
        checkpoint_info.read(tmp_path)


@pytest.mark.parametrize("oracle", ["reference", "self"])
def test_transformers_adapter_on_a_users_checkpoint_declares_its_vocabulary(big_vocab, oracle):
    from adapters.transformers import TransformersAdapter
    from conformance.contract import Request

    a = TransformersAdapter(model=str(big_vocab), oracle=oracle)
    caps = a.capabilities()
    assert (caps.vocab_size, caps.eos_id, caps.max_context, caps.revisions) == (32000, 31999, 256, ("a",))
    assert caps.oracle.startswith(oracle) and "assisted" not in caps.config_space["mode"]
    req = Request("r", [31000, 12, 25000, 7, 7], 6)
    for mode in ("generate", "prompt_lookup", "batch"):
        a.configure({"mode": mode})
        assert a.run([req])[0].output == a.baseline(req).output, mode
    a.close()


def test_kvparity_run_on_a_large_vocabulary_checkpoint(big_vocab, tmp_path):
    from kvparity.cli import main

    code = main(["run", "--engine", "transformers", "--engine-arg", f"model={big_vocab}",
                 "--engine-arg", "modes=generate,prompt_lookup", "--max-examples", "3", "--no-shrink",
                 "--report-dir", str(tmp_path)])
    (results,) = tmp_path.glob("transformers/*/results.json")
    data = json.loads(results.read_text())
    caps = data["run"]["capabilities"]
    assert code in (0, 2), data["verdict"]  # 3 examples may leave a claimed capability unexercised
    assert data["checks"]["parity"]["status"] == "pass"
    assert (caps["vocab_size"], caps["eos_id"], caps["oracle"]) == (32000, 31999, "reference (float64)")


def test_the_shipped_family_as_a_users_model_through_the_transformers_adapter():
    """model=PATH on the shipped folder: the same facts and the same answers as the built-in path."""
    from adapters.transformers import TransformersAdapter
    from conformance.contract import Request

    a = TransformersAdapter(model=str(checkpoints.revision_dir("a")), modes="generate")
    caps = a.capabilities()
    assert (caps.vocab_size, caps.eos_id, caps.max_context, caps.identities) == (1024, 2, 1024, frozenset())
    req = Request("r", [5, 80, 81, 300, 12], 8)
    assert a.run([req])[0].output == a.baseline(req).output
    a.close()


def test_http_adapter_reads_a_model_folder(big_vocab):
    """openai_http with model=PATH (a folder) declares that checkpoint's vocabulary and eos and judges it
    by the reference oracle on that folder; attached to a fake server (named as such), stdlib only."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from test_adapter_openai_http import FakeServer

    from adapters.openai_http.adapter import OpenAIHttpAdapter

    srv = FakeServer("ids")
    try:
        a = OpenAIHttpAdapter(base_url=srv.url, model=str(big_vocab))
        caps = a.capabilities()
        assert (caps.vocab_size, caps.eos_id, caps.max_context) == (32000, 31999, 256)
        assert caps.oracle == "reference (float64)" and a.model == "fake-model"
    finally:
        srv.stop()
