"""What differs between llama-cpp-python releases (0.2.38 -> current), found by probing the installed package.

The llama_cpp adapter asks this module, and only this module, what the installed release can do. Each
answer comes from the package itself (a constructor signature, a ctypes struct field, an attribute), not from
a version-number table, so a release nobody listed is judged by what it has:

* **KV cache type.** `Llama(type_k=, type_v=)` exists from 0.2.4x on. Older constructors swallow unknown
  keywords (`**kwargs`) silently, so passing them would quietly run f16 KV, whose rounding flips argmaxes
  above the adapter's tau. Their context struct (`llama_context_params`) already has the fields, and the
  constructor starts from `llama_context_default_params()`: `constructing()` hands it those defaults with
  the KV type set, for the duration of the constructor call only. A release with neither cannot run f32
  KV: the adapter refuses it (a usage error), it does not run f16 under an f32 tolerance.
* **Micro-batch.** `n_ubatch` exists only where llama.cpp splits batches into micro-batches; elsewhere
  `n_batch` alone sets the chunk size, so it is not passed.
* **GGUF LoRA adapters.** Old llama.cpp applies LoRA only from its own pre-GGUF "ggla" files
  (`llama_model_apply_lora_from_file`); the GGUF adapters `kvparity export-gguf` writes need
  `llama_adapter_lora_init` (or its earlier name `llama_lora_adapter_init`). Without it the adapter
  claims no adapter identities.
* **Speculation.** `llama_cpp.llama_speculative` (`LlamaDraftModel`, `LlamaPromptLookupDecoding`) arrived in
  0.2.38; without it the adapter claims no speculation and offers no drafter.
* **close().** `Llama.close()` frees the context and model explicitly; before it existed, dropping the last
  reference is all there is.

What a release does wrong is not smoothed over here: a bug is for the suite to find (the museum's
exhibits), so this module only decides which arguments reach the engine and what is claimed.
"""

from __future__ import annotations

import contextlib
import inspect
from types import ModuleType
from typing import Any, Iterator

from attrs import frozen

from conformance.contract import UsageError

GGUF_LORA_INIT = ("llama_adapter_lora_init", "llama_lora_adapter_init")


@frozen
class Features:
    """What the installed llama-cpp-python can do, as far as the adapter needs to know."""

    version: str
    kv_type_kwargs: bool  # Llama(type_k=, type_v=)
    kv_type_struct: bool  # llama_context_params has type_k/type_v (settable through the defaults)
    n_ubatch: bool
    gguf_lora: bool
    speculative: bool
    close: bool

    @property
    def kv_type(self) -> bool:
        """The KV cache type can be chosen at all."""
        return self.kv_type_kwargs or self.kv_type_struct


def _parameters(fn: Any) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return frozenset()


def _struct_fields(struct: Any) -> frozenset[str]:
    return frozenset(name for name, *_ in getattr(struct, "_fields_", ()))


def probe(llama_cpp: ModuleType, speculative: ModuleType | None) -> Features:
    """Features of the package `llama_cpp` (and its `llama_speculative` module, None when it is missing)."""
    llama = llama_cpp.Llama
    params = _parameters(llama.__init__)
    low = getattr(llama_cpp, "llama_cpp", llama_cpp)  # the ctypes bindings (re-exported by the package)
    return Features(
        version=str(getattr(llama_cpp, "__version__", "?")),
        kv_type_kwargs={"type_k", "type_v"} <= params,
        kv_type_struct={"type_k", "type_v"} <= _struct_fields(getattr(low, "llama_context_params", None)),
        n_ubatch="n_ubatch" in params,
        gguf_lora=any(hasattr(low, name) for name in GGUF_LORA_INIT),
        speculative=speculative is not None and hasattr(speculative, "LlamaPromptLookupDecoding"),
        close=callable(getattr(llama, "close", None)),
    )


def llama_kwargs(features: Features, *, n_batch: int, kv: int) -> dict[str, Any]:
    """The constructor keywords that differ between releases (the rest are common to all of them)."""
    if not features.kv_type:
        raise UsageError(f"llama-cpp-python {features.version} cannot set the KV cache type (neither "
                         f"Llama(type_k=) nor llama_context_params.type_k): the adapter needs f32 KV")
    kwargs: dict[str, Any] = {}
    if features.kv_type_kwargs:
        kwargs.update(type_k=kv, type_v=kv)
    if features.n_ubatch:
        kwargs["n_ubatch"] = n_batch
    return kwargs


@contextlib.contextmanager
def constructing(features: Features, llama_cpp: ModuleType, *, kv: int) -> Iterator[None]:
    """Wrap a `Llama(...)` call. Where the constructor has no type_k/type_v, its context parameters start
    from `llama_context_default_params()`: for the duration of the call those defaults carry the KV type."""
    if features.kv_type_kwargs:
        yield
        return
    low = getattr(llama_cpp, "llama_cpp", llama_cpp)
    original = low.llama_context_default_params

    def defaults_with_kv_type():
        params = original()
        params.type_k = kv
        params.type_v = kv
        return params

    low.llama_context_default_params = defaults_with_kv_type
    try:
        yield
    finally:
        low.llama_context_default_params = original


def close(features: Features, llm: Any) -> None:
    """Free a `Llama` now where the release can; otherwise the last reference going away frees it."""
    if features.close:
        llm.close()
