"""Which weights serve which identity: adapter names bound to weights, identities resolved to what the
weights actually are, and the merged model for each.

LoRA adapters are merged into a copy of the target (checkpoints.merge_lora) so every identity runs the
same forward code; the engine then runs one forward per weights group in a step. An adapter *name* is
bound to weights through `load_adapter` (weights from a shipped adapter or a PEFT folder) or
`bind_adapter` (weights by digest), and the binding can change (an in-place reload): the prefix cache
keys on the weights digest, so stale KV of the old weights is never served under the new ones.

The registry owns its bindings and everything derived from them (the identity memo); the loaded models
themselves live in a `weights.Weights`, which registries may share because it is keyed by the weights.
"""

from __future__ import annotations

import pathlib

import torch

from reference_engine import checkpoints
from reference_engine.baseline import GreedyRun, GreedyRuns
from reference_engine.errors import UnknownAdapterError
from reference_engine.model import Llama, LlamaConfig
from reference_engine.prefix_cache import CacheIdentity
from reference_engine.sequence import Identity
from reference_engine.weights import AdapterWeights, Weights

MIN_DIGEST_PREFIX = 8  # a digest prefix shorter than this names no weights (too easy to collide)


class ModelRegistry:
    """Resolves identities to models and to the `CacheIdentity` the prefix cache keys on."""

    def __init__(self, dtype: torch.dtype = torch.float64, weights: Weights | None = None) -> None:
        self.weights = weights or Weights(dtype)
        self.dtype = self.weights.dtype
        self._identities: dict[Identity, CacheIdentity] = {}  # memo; cleared when an adapter is rebound
        self._known: dict[str, AdapterWeights] = {}  # every adapter weights ever bound here, by digest
        self._bound: dict[str, AdapterWeights] = {}  # adapter name -> its weights now
        self.runs = GreedyRuns()  # greedy runs by (weights, prompt): derived from weights, never stale
        for name in checkpoints.ADAPTERS:
            if (checkpoints.adapter_dir(name) / "adapter_model.safetensors").exists():
                self.load_adapter(name, name)

    # -- adapter bindings ---------------------------------------------------------------------------
    def adapters(self) -> dict[str, str]:
        """Adapter name -> the digest of the weights it is bound to now."""
        return {name: w.digest for name, w in self._bound.items()}

    def known_weights(self) -> tuple[str, ...]:
        """The digest of every adapter weights ever bound here (a rebinding does not forget the old
        weights: a name can be bound back to them)."""
        return tuple(self._known)

    def load_adapter(self, name: str, source: str | pathlib.Path | AdapterWeights) -> str:
        """Bind adapter `name` to the weights of a shipped adapter (by name), a PEFT folder, or given
        weights. Rebinding a name is an in-place reload: a new digest, so a new identity. Returns the
        weights digest."""
        if not isinstance(source, AdapterWeights):
            folder = checkpoints.adapter_dir(source) if str(source) in checkpoints.ADAPTERS else pathlib.Path(source)
            if not (folder / "adapter_model.safetensors").exists():
                raise UnknownAdapterError(f"no adapter weights at {folder / 'adapter_model.safetensors'}")
            source = AdapterWeights.from_folder(folder)
        self._known.setdefault(source.digest, source)
        self._bound[name] = source
        self._identities.clear()
        return source.digest

    def bind_adapter(self, name: str, digest: str) -> str:
        """(Re)bind adapter `name` to the weights whose digest is, or starts with, `digest` (at least
        MIN_DIGEST_PREFIX characters): weights bound here before, else a shipped adapter's. Nothing
        changes if the name is bound to such weights already. Returns the full digest."""
        current = self._bound.get(name)
        if current is not None and current.digest.startswith(digest):
            return current.digest
        if len(digest) >= MIN_DIGEST_PREFIX:
            for full, weights in self._known.items():
                if full.startswith(digest):
                    return self.load_adapter(name, weights)
            for shipped in checkpoints.ADAPTERS:
                try:
                    if checkpoints.adapter_digest(shipped).startswith(digest):
                        return self.load_adapter(name, shipped)
                except OSError:
                    continue
        raise UnknownAdapterError(f"adapter {name!r} with weights digest {digest!r}: no such weights")

    # -- identities ---------------------------------------------------------------------------------
    def revisions(self) -> tuple[str, ...]:
        return tuple(checkpoints.REVISIONS)

    def revision_digest(self, revision: str) -> str:
        return checkpoints.revision_digest(revision)

    def validate(self, identity: Identity) -> None:
        self.revision_digest(identity.revision)
        if identity.adapter is not None and identity.adapter not in self._bound:
            raise UnknownAdapterError(f"unknown adapter {identity.adapter!r}; known: {sorted(self._bound)}")

    def cache_identity(self, identity: Identity) -> CacheIdentity:
        memo = self._identities.get(identity)
        if memo is not None:
            return memo
        self.validate(identity)
        digest = self._bound[identity.adapter].digest if identity.adapter is not None else None
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
        return self.weights.base(revision)

    def model(self, identity: Identity) -> Llama:
        self.cache_identity(identity)  # validates (memoised)
        if identity.adapter is None:
            return self.base(identity.revision)
        return self.weights.merged(identity.revision, self._bound[identity.adapter])

    def greedy_run(self, identity: Identity, prompt) -> GreedyRun:
        """The greedy run of `prompt` under the weights `identity` resolves to now (keyed by the
        weights' digests, so a salt shares it and an in-place reload does not)."""
        ci = self.cache_identity(identity)
        return self.runs.run((ci.revision_digest, ci.adapter_digest), self.model(identity), prompt)

    def draft(self) -> Llama:
        return self.weights.draft()

    def config(self) -> LlamaConfig:
        return self.base(self.revisions()[0]).config
