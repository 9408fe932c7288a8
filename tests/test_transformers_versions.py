"""adapters.transformers_versions claims what a transformers release has, from probes of the module, and
nothing it lacks. Run on fake modules (named as such) shaped like an old (4.38) and a current (5.x) release,
so it needs no transformers; the last test probes the installed one where there is one."""

from __future__ import annotations

import types

import pytest
import torch

from adapters import transformers_versions as tv


class FakeOldConfig:  # 4.38: the dtype is a plain attribute named torch_dtype
    def __init__(self):
        self.torch_dtype = None


class FakeNewConfig:  # 4.56+: renamed to dtype, torch_dtype a compatibility property
    def __init__(self):
        self.dtype = None

    @property
    def torch_dtype(self):
        return self.dtype


class FakeOldGenerationConfig:
    def __init__(self):
        self.num_assistant_tokens = 5
        self.num_assistant_tokens_schedule = "heuristic"


class FakeNewGenerationConfig(FakeOldGenerationConfig):
    def __init__(self):
        super().__init__()
        self.prompt_lookup_num_tokens = None
        self.assistant_confidence_threshold = 0.4


class FakeBatchingMixin:
    def generate_batch(self, inputs, generation_config=None, continuous_batching_config=None,
                       progress_bar=False, persistent_manager=False, warmup=True, **kwargs):
        raise AssertionError("a probe never calls it")


class FakeEarlyBatchingMixin:  # 4.57: generate_batch, but no persistent manager, no block sharing
    def generate_batch(self, inputs, generation_config=None, progress_bar=True, slice_inputs=True, **kwargs):
        raise AssertionError("a probe never calls it")


class FakeContinuousBatchingConfig:
    def __init__(self, page_size=16, num_blocks=64, allow_block_sharing=True):
        pass


class FakePagedAttentionCache:
    def search_prefix_match(self, request_id, prompt_ids):
        return 0


def fake_transformers(config, generation, mixin=None, version="0.0-fake"):
    return types.SimpleNamespace(__version__=version, PretrainedConfig=config, GenerationConfig=generation,
                                 **({"GenerationMixin": mixin} if mixin else {}))


class FakeContinuousBatchingManager:  # 5.9+: add_requests returns the ids generate_batch looks up
    def add_requests(self, inputs, max_new_tokens=None, record_timestamps=False) -> list[str]:
        raise AssertionError("a probe never calls it")


def fake_importer(cache=FakePagedAttentionCache, config=FakeContinuousBatchingConfig,
                  manager=FakeContinuousBatchingManager):
    modules = {
        "transformers.generation.configuration_utils": types.SimpleNamespace(ContinuousBatchingConfig=config),
        "transformers.generation.continuous_batching.cache": types.SimpleNamespace(PagedAttentionCache=cache),
        "transformers.generation.continuous_batching": types.SimpleNamespace(ContinuousBatchingManager=manager),
    }

    def import_module(name):
        if name not in modules:
            raise ImportError(name)
        return modules[name]

    return import_module


def test_an_old_release_gets_torch_dtype_no_threshold_and_no_batch_mode():
    f = tv.probe(fake_transformers(FakeOldConfig, FakeOldGenerationConfig), fake_importer())
    assert f.dtype_kwarg == "torch_dtype" and tv.load_kwargs(f, torch.float64) == {"torch_dtype": torch.float64}
    assert f.assistant_fields == ("num_assistant_tokens", "num_assistant_tokens_schedule")
    assert not f.prompt_lookup and not f.continuous_batching
    assert f.modes == ("generate", "assisted", "adversarial")


def test_a_current_release_gets_dtype_prompt_lookup_and_batch_mode():
    f = tv.probe(fake_transformers(FakeNewConfig, FakeNewGenerationConfig, FakeBatchingMixin), fake_importer())
    assert tv.load_kwargs(f, torch.float32) == {"dtype": torch.float32}
    assert f.prompt_lookup and f.continuous_batching
    assert f.modes == ("generate", "assisted", "adversarial", "prompt_lookup", "batch")


@pytest.mark.parametrize("mixin, importer", [
    (FakeEarlyBatchingMixin, fake_importer()),                            # no persistent manager in the signature
    (FakeBatchingMixin, fake_importer(cache=object)),                     # prefix hits not observable
    (FakeBatchingMixin, fake_importer(config=lambda page_size=16: None)),  # no block sharing
    (FakeBatchingMixin, lambda name: (_ for _ in ()).throw(ImportError(name))),  # no continuous_batching package
])
def test_batch_mode_needs_every_part_the_adapter_uses(mixin, importer):
    f = tv.probe(fake_transformers(FakeNewConfig, FakeNewGenerationConfig, mixin), importer)
    assert not f.continuous_batching and "batch" not in f.modes


def test_the_assistant_gets_k_and_a_constant_schedule_and_only_the_fields_it_has():
    old = tv.probe(fake_transformers(FakeOldConfig, FakeOldGenerationConfig), fake_importer())
    new = tv.probe(fake_transformers(FakeNewConfig, FakeNewGenerationConfig), fake_importer())
    a_old = types.SimpleNamespace(generation_config=FakeOldGenerationConfig())
    a_new = types.SimpleNamespace(generation_config=FakeNewGenerationConfig())
    tv.configure_assistant(old, a_old, 3)
    tv.configure_assistant(new, a_new, 1)
    assert vars(a_old.generation_config) == {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant"}
    assert a_new.generation_config.num_assistant_tokens == 1
    assert a_new.generation_config.assistant_confidence_threshold == 0.0


def test_per_verification_logits_become_per_token_rows():
    vocab = 4
    step1 = torch.arange(3 * vocab, dtype=torch.float64).reshape(1, 3, vocab)  # 2 candidates + bonus; 1 accepted
    step2 = 100 + torch.arange(2 * vocab, dtype=torch.float64).reshape(1, 2, vocab)  # 1 candidate; 0 accepted
    rows = tv.per_token_logits((step1, step2), [1, 0])
    assert len(rows) == 3 and all(r.shape == (1, vocab) for r in rows)
    assert torch.equal(rows[0], step1[:, 0]) and torch.equal(rows[1], step1[:, 1]) and torch.equal(rows[2], step2[:, 0])
    per_token = (torch.zeros(1, vocab), torch.ones(1, vocab))
    assert tv.per_token_logits(per_token, []) == list(per_token)
    with pytest.raises(ValueError):
        tv.per_token_logits((step1, step2), [1])  # a verification the adapter did not observe


def test_the_installed_release_is_probed_without_error():
    transformers = pytest.importorskip("transformers")
    f = tv.probe(transformers)
    assert f.version == transformers.__version__ and f.modes[:3] == ("generate", "assisted", "adversarial")


def test_a_tokenizer_json_tokenizers_cannot_parse_is_read_as_json(tmp_path):
    """Old transformers pin an old tokenizers that cannot parse the shipped tokenizer.json: checkpoint_info
    then reads the JSON for the two facts it needs (size with added tokens, special-token ids)."""
    import json

    from adapters import checkpoint_info
    from reference_engine import checkpoints

    shipped = json.loads((checkpoints.revision_dir("a") / "tokenizer.json").read_text())
    broken = {**shipped, "model": {**shipped["model"], "merges": 5}}  # no tokenizers release parses this
    (tmp_path / "tokenizer.json").write_text(json.dumps(broken))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 1024}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "pad_token": "<pad>"}))
    info = checkpoint_info.read(tmp_path)
    assert (info.tokenizer_vocab, info.eos_id, info.pad_id) == (checkpoint_info.shipped().tokenizer_vocab, 2, 0)
