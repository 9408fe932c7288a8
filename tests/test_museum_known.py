"""Issue 33 items 4-5: what the museum's transformers runs rely on, testable without installing a release.

`ContinuousBatchingConfig` names its page size `block_size` in 5.5-5.18 and `page_size` later; the adapter
passed `page_size` everywhere, so `batch` mode was a TypeError on the releases that first have block
sharing. The probe reads the field's name from the class's signature (fake config classes, named as such,
shaped like each release line: no install)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from adapters import transformers_versions as tv


@dataclasses.dataclass
class FakeBlockSizeBatchingConfig:  # 5.5-5.18: the page field is block_size
    block_size: int = 256
    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    allow_block_sharing: bool = True


@dataclasses.dataclass
class FakePageSizeBatchingConfig:  # 5.19+: renamed to page_size
    page_size: int = 256
    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    allow_block_sharing: bool = True


@dataclasses.dataclass
class FakeUnnamedPageBatchingConfig:  # neither name: the adapter cannot size pages, so no batch mode
    num_blocks: int | None = None
    allow_block_sharing: bool = True


class FakeBatchingMixin:
    def generate_batch(self, inputs, generation_config=None, continuous_batching_config=None,
                       progress_bar=False, persistent_manager=False, warmup=True, **kwargs):
        raise AssertionError("a probe never calls it")


class FakePagedAttentionCache:
    def search_prefix_match(self, request_id, prompt_ids):
        return 0


class FakeGenerationConfig:
    def __init__(self):
        self.num_assistant_tokens = 5
        self.num_assistant_tokens_schedule = "constant"
        self.prompt_lookup_num_tokens = None


class FakeConfig:
    def __init__(self):
        self.dtype = None

    @property
    def torch_dtype(self):
        return self.dtype


def probe_with(config_cls):
    tf = types.SimpleNamespace(__version__="0.0-fake", PretrainedConfig=FakeConfig,
                               GenerationConfig=FakeGenerationConfig, GenerationMixin=FakeBatchingMixin)
    modules = {"transformers.generation.configuration_utils": types.SimpleNamespace(ContinuousBatchingConfig=config_cls),
               "transformers.generation.continuous_batching.cache":
                   types.SimpleNamespace(PagedAttentionCache=FakePagedAttentionCache)}
    return tv.probe(tf, modules.__getitem__)


@pytest.mark.parametrize("config_cls, field", [(FakeBlockSizeBatchingConfig, "block_size"),
                                               (FakePageSizeBatchingConfig, "page_size")])
def test_the_page_field_is_the_one_the_config_class_names(config_cls, field):
    """Both release lines get batch mode, and the config the adapter builds is accepted by the class with
    the requested page size (the adapter's call, minus the model)."""
    f = probe_with(config_cls)
    assert f.continuous_batching and "batch" in f.modes and f.page_field == field
    cb = config_cls(**tv.batching_config_kwargs(f, 16), num_blocks=64, max_batch_tokens=64, allow_block_sharing=True)
    assert getattr(cb, field) == 16


def test_the_other_name_is_the_type_error_the_probe_avoids():
    """Why the probe matters: each release line rejects the other line's name."""
    with pytest.raises(TypeError):
        FakeBlockSizeBatchingConfig(page_size=16)
    with pytest.raises(TypeError):
        FakePageSizeBatchingConfig(block_size=16)


def test_a_config_without_a_page_field_gets_no_batch_mode():
    f = probe_with(FakeUnnamedPageBatchingConfig)
    assert not f.continuous_batching and "batch" not in f.modes and f.page_field == ""
