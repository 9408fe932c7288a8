"""Which weights serve which identity: one merged model per (revision, adapter weights), loaded lazily.

LoRA adapters are merged into a copy of the target (checkpoints.merge_lora) so every identity runs the
same forward code; the engine then runs one forward per weights group in a step. An adapter *name* is
bound to weights through `load_adapter`, and the binding can change (an in-place reload): the prefix
cache keys on the weights digest, so stale KV of the old weights is never served under the new ones.
"""

from __future__ import annotations

import pathlib
from typing import Callable

import torch

from reference_engine import checkpoints
from reference_engine.errors import UnknownAdapterError
from reference_engine.model import Llama
from reference_engine.prefix_cache import CacheIdentity
from reference_engine.sequence import Identity


class ModelRegistry:
    """Resolves identities to models and to the `CacheIdentity` the prefix cache keys on."""

    def __init__(self, dtype: torch.dtype = torch.float64) -> None:
        self.dtype = dtype
        self._identities: dict[Identity, CacheIdentity] = {}  # memo; cleared when an adapter is rebound
        # adapter name -> (weights digest, merge function)
        self.adapters: dict[str, tuple[str, Callable[[Llama], Llama]]] = {}
        for name in checkpoints.ADAPTERS:
            if (checkpoints.adapter_dir(name) / "adapter_model.safetensors").exists():
                self.load_adapter(name, name)
        self._draft_loader: Callable[[], Llama] = lambda: checkpoints.load_draft(dtype)
        self._models: dict[tuple, Llama] = {}
        self._base: dict[str, Llama] = {}
        self._draft: Llama | None = None

    # -- identities ---------------------------------------------------------------------------------
    def revisions(self) -> tuple[str, ...]:
        return tuple(checkpoints.REVISIONS)

    def revision_digest(self, revision: str) -> str:
        return checkpoints.revision_digest(revision)

    def load_adapter(self, name: str, source: str | pathlib.Path) -> str:
        """Bind adapter `name` to the weights of a shipped adapter (by name) or a PEFT folder. Rebinding
        a name is an in-place reload: a new digest, so a new identity. Returns the weights digest."""
        folder = checkpoints.adapter_dir(source) if str(source) in checkpoints.ADAPTERS else pathlib.Path(source)
        weights = folder / "adapter_model.safetensors"
        if not weights.exists():
            raise UnknownAdapterError(f"no adapter weights at {weights}")
        digest = checkpoints.file_digest(weights)
        self.adapters[name] = (digest, lambda base, folder=folder: checkpoints.merge_lora(base, folder))
        self._identities.clear()
        return digest

    def validate(self, identity: Identity) -> None:
        self.revision_digest(identity.revision)
        if identity.adapter is not None and identity.adapter not in self.adapters:
            raise UnknownAdapterError(f"unknown adapter {identity.adapter!r}; known: {sorted(self.adapters)}")

    def cache_identity(self, identity: Identity) -> CacheIdentity:
        memo = self._identities.get(identity)
        if memo is not None and (identity.adapter is None or self.adapters[identity.adapter][0] == memo.adapter_digest):
            return memo
        self.validate(identity)
        digest = self.adapters[identity.adapter][0] if identity.adapter is not None else None
        resolved = CacheIdentity(identity.revision, self.revision_digest(identity.revision), identity.adapter,
                                 digest, identity.salt)
        self._identities[identity] = resolved
        return resolved

    def weights_key(self, identity: Identity) -> tuple:
        """Requests with equal weights keys run in the same forward pass (salt does not matter)."""
        ci = self.cache_identity(identity)
        return (ci.revision, ci.revision_digest, ci.adapter, ci.adapter_digest)

    # -- models -------------------------------------------------------------------------------------
    def base(self, revision: str) -> Llama:
        if revision not in self._base:
            self.revision_digest(revision)  # raises for unknown revisions
            self._base[revision] = checkpoints.load_target(revision, None, self.dtype).eval()
        return self._base[revision]

    def model(self, identity: Identity) -> Llama:
        key = self.weights_key(identity)
        if key not in self._models:
            if identity.adapter is None:
                self._models[key] = self.base(identity.revision)
            else:
                import copy

                merged = self.adapters[identity.adapter][1](copy.deepcopy(self.base(identity.revision)))
                self._models[key] = merged.to(self.dtype).eval()
        return self._models[key]

    def draft(self) -> Llama:
        if self._draft is None:
            self._draft = self._draft_loader().eval()
        return self._draft

    def config(self):
        return self.base(self.revisions()[0]).config
