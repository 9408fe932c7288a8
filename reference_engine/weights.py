"""Loaded models, by what their weights are: a target revision, a revision with one LoRA adapter's
weights merged in, the draft model.

Why apart from the registry: which weights an adapter *name* means can change (an in-place reload,
`ModelRegistry.bind_adapter`), what a given set of weights computes cannot. Keying loaded models by
the weights themselves (revision; adapter weights digest) makes this a pure memo — an entry, once
loaded, never changes — so several registries, each with bindings of its own, can share one `Weights`
and load every model once.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Callable

import attrs
import torch

from reference_engine import checkpoints
from reference_engine.model import Llama


@attrs.frozen
class AdapterWeights:
    """One LoRA adapter's weights: their digest (what the prefix cache keys on) and how to merge them
    into a copy of the base model."""

    digest: str
    merge: Callable[[Llama], Llama] = attrs.field(eq=False)

    @classmethod
    def from_folder(cls, folder: pathlib.Path) -> AdapterWeights:
        """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors)."""
        digest = checkpoints.file_digest(folder / "adapter_model.safetensors")
        return cls(digest, lambda base: checkpoints.merge_lora(base, folder))


class Weights:
    """Every model loaded so far, loaded on first use."""

    def __init__(self, dtype: torch.dtype = torch.float64, draft_loader: Callable[[], Llama] | None = None) -> None:
        self.dtype = dtype
        self._draft_loader = draft_loader or (lambda: checkpoints.load_draft(dtype))
        self._base: dict[str, Llama] = {}
        self._merged: dict[tuple[str, str], Llama] = {}
        self._draft: Llama | None = None

    def base(self, revision: str) -> Llama:
        if revision not in self._base:
            checkpoints.revision_digest(revision)  # raises for unknown revisions
            self._base[revision] = checkpoints.load_target(revision, None, self.dtype).eval()
        return self._base[revision]

    def merged(self, revision: str, adapter: AdapterWeights) -> Llama:
        """Revision `revision` with `adapter` merged into a copy of it (the base stays as it is)."""
        key = (revision, adapter.digest)
        if key not in self._merged:
            self._merged[key] = adapter.merge(copy.deepcopy(self.base(revision))).to(self.dtype).eval()
        return self._merged[key]

    def draft(self) -> Llama:
        if self._draft is None:
            self._draft = self._draft_loader().eval()
        return self._draft
