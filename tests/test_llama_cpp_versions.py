"""adapters/llama_cpp_versions.py judges a llama-cpp-python release by what it has. These tests feed it fake
packages (named as fakes, built from plain classes and ctypes structs: no llama_cpp needed) shaped like an
old (0.2.3x) and a current (0.3.x) release, and check what it claims and what reaches the constructor."""

from __future__ import annotations

import ctypes
import functools
import types

import pytest

from adapters import llama_cpp_versions as versions
from conformance.contract import UsageError


class FakeOldContextParams(ctypes.Structure):
    _fields_ = [("n_ctx", ctypes.c_uint32), ("type_k", ctypes.c_int), ("type_v", ctypes.c_int)]


class FakeAncientContextParams(ctypes.Structure):
    _fields_ = [("n_ctx", ctypes.c_uint32), ("f16_kv", ctypes.c_bool)]


def _fake_package(*, init, params_struct, lora_init: bool, close: bool, version: str):
    """A fake `llama_cpp` package: a Llama class with the given __init__, and the ctypes bindings module."""
    low = types.ModuleType("fake_llama_cpp_bindings")
    low.llama_context_params = params_struct
    low.llama_context_default_params = lambda: params_struct()
    low.llama_model_apply_lora_from_file = lambda *a: 1
    if lora_init:
        low.llama_adapter_lora_init = lambda *a: None

    @functools.wraps(init)  # keeps init's signature, which is what the probe reads
    def constructor(self, **kwargs):
        init(self, **kwargs)
        self.context_params = low.llama_context_default_params()  # what the real constructor starts from

    class FakeLlama:
        __init__ = constructor

    if close:
        FakeLlama.close = lambda self: setattr(self, "closed", True)
    pkg = types.ModuleType("fake_llama_cpp")
    pkg.Llama, pkg.llama_cpp, pkg.__version__ = FakeLlama, low, version
    return pkg


def _old_init(self, model_path=None, n_ctx=512, n_batch=512, logits_all=False, draft_model=None, **kwargs):
    self.swallowed = kwargs  # 0.2.3x: unknown keywords vanish here


def _new_init(self, model_path=None, n_ctx=512, n_batch=512, n_ubatch=512, type_k=None, type_v=None,
              logits_all=False, draft_model=None, **kwargs):
    self.swallowed = kwargs


FAKE_SPECULATIVE = types.SimpleNamespace(LlamaPromptLookupDecoding=object, LlamaDraftModel=object)


def fake_old():
    return _fake_package(init=_old_init, params_struct=FakeOldContextParams, lora_init=False, close=False,
                         version="0.2.39")


def fake_new():
    return _fake_package(init=_new_init, params_struct=FakeOldContextParams, lora_init=True, close=True,
                         version="0.3.36")


def test_an_old_release_claims_no_gguf_lora_no_close_and_no_kv_keywords():
    f = versions.probe(fake_old(), FAKE_SPECULATIVE)
    assert f.version == "0.2.39" and f.speculative
    assert not f.kv_type_kwargs and f.kv_type_struct and f.kv_type
    assert not f.n_ubatch and not f.gguf_lora and not f.close


def test_a_current_release_claims_what_it_has():
    f = versions.probe(fake_new(), FAKE_SPECULATIVE)
    assert f.kv_type_kwargs and f.n_ubatch and f.gguf_lora and f.close and f.speculative


def test_no_speculative_module_means_no_speculation():
    assert not versions.probe(fake_new(), None).speculative
    assert not versions.probe(fake_new(), types.SimpleNamespace()).speculative


def test_keywords_only_where_the_constructor_takes_them():
    new = versions.probe(fake_new(), FAKE_SPECULATIVE)
    old = versions.probe(fake_old(), FAKE_SPECULATIVE)
    assert versions.llama_kwargs(new, n_batch=9, kv=0) == {"type_k": 0, "type_v": 0, "n_ubatch": 9}
    assert versions.llama_kwargs(old, n_batch=9, kv=0) == {}


@pytest.mark.parametrize("kv", [0, 1])
def test_old_release_gets_its_kv_type_through_the_context_defaults(kv):
    pkg = fake_old()
    f = versions.probe(pkg, FAKE_SPECULATIVE)
    original = pkg.llama_cpp.llama_context_default_params
    with versions.constructing(f, pkg, kv=kv):
        llm = pkg.Llama(model_path="m", **versions.llama_kwargs(f, n_batch=8, kv=kv))
    assert (llm.context_params.type_k, llm.context_params.type_v) == (kv, kv)
    assert llm.swallowed == {}  # nothing silently dropped
    assert pkg.llama_cpp.llama_context_default_params is original  # restored after the call
    after = pkg.Llama(model_path="m")
    assert (after.context_params.type_k, after.context_params.type_v) == (0, 0)  # ctypes zero, untouched


def test_the_defaults_are_restored_when_the_constructor_raises():
    pkg = fake_old()
    f = versions.probe(pkg, FAKE_SPECULATIVE)
    original = pkg.llama_cpp.llama_context_default_params
    with pytest.raises(RuntimeError):
        with versions.constructing(f, pkg, kv=1):
            raise RuntimeError("model failed to load")
    assert pkg.llama_cpp.llama_context_default_params is original


def test_current_release_is_constructed_with_keywords_and_untouched_defaults():
    pkg = fake_new()
    f = versions.probe(pkg, FAKE_SPECULATIVE)
    original = pkg.llama_cpp.llama_context_default_params
    with versions.constructing(f, pkg, kv=1):
        assert pkg.llama_cpp.llama_context_default_params is original
        pkg.Llama(model_path="m", **versions.llama_kwargs(f, n_batch=8, kv=1))


def test_a_release_that_cannot_set_the_kv_type_is_refused():
    pkg = _fake_package(init=_old_init, params_struct=FakeAncientContextParams, lora_init=False, close=False,
                        version="0.1.99")
    f = versions.probe(pkg, None)
    assert not f.kv_type
    with pytest.raises(UsageError, match="KV cache type"):
        versions.llama_kwargs(f, n_batch=8, kv=0)


def test_close_only_where_it_exists():
    new_pkg, old_pkg = fake_new(), fake_old()
    llm = new_pkg.Llama()
    versions.close(versions.probe(new_pkg, None), llm)
    assert llm.closed
    old = old_pkg.Llama()
    versions.close(versions.probe(old_pkg, None), old)  # no close(): nothing to call, no AttributeError
    assert not hasattr(old, "closed")
