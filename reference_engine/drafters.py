"""Drafters propose; the target decides. Speculation is lossless only because of that split.

A drafter looks at a sequence's committed tokens and proposes up to k next tokens. The engine feeds
them to the target in one forward pass, accepts the longest prefix the target agrees with, appends the
target's own next token, and rolls back the rest (engine.py `verify`). Nothing a drafter says can
change the output — only how many target passes it takes — which is exactly what the conformance
suite's "spec independence" check tests, hence the two deliberately extreme test drafters:

  oracle       proposes the target's own greedy continuation: acceptance 1.0, k+1 tokens per pass
  adversarial  proposes a token the target will never pick: acceptance 0.0, still the same output

Drafters with state (the draft model's KV) must follow the sequence when drafts are rejected: they
re-synchronise on the committed tokens at every call (`DraftModelDrafter._sync`).
"""

from __future__ import annotations

import abc

import torch

from reference_engine.config import DRAFTER_NAMES
from reference_engine.model import DenseKV
from reference_engine.model_registry import ModelRegistry
from reference_engine.sequence import Sequence


class Drafter(abc.ABC):
    name = "drafter"

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.forwards = 0  # draft-model token-forwards (the draft's cost units)

    @abc.abstractmethod
    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to k proposed next tokens after `seq.tokens`."""

    def forget(self, request_id: str) -> None:
        """The request finished, was aborted or preempted: drop its state."""

    def reset(self) -> None:
        """Drop all state (engine flush)."""


class DraftModelDrafter(Drafter):
    """The tiny draft model, run autoregressively with its own KV per sequence."""

    name = "draft"

    def __init__(self, registry: ModelRegistry) -> None:
        super().__init__(registry)
        self.model = registry.draft()
        self.state: dict[str, tuple[DenseKV, list[int]]] = {}

    def _sync(self, seq: Sequence) -> tuple[DenseKV, list[int]]:
        """Roll the draft KV back to the longest prefix it shares with the committed tokens: the draft
        KV of its own rejected proposals must not condition later proposals."""
        kv, fed = self.state.get(seq.request_id) or (DenseKV(self.model.config, self.model.dtype), [])
        common = 0
        limit = min(len(fed), len(seq.tokens) - 1)  # always re-feed the last token for fresh logits
        while common < limit and fed[common] == seq.tokens[common]:
            common += 1
        kv.truncate(common)
        del fed[common:]
        self.state[seq.request_id] = (kv, fed)
        return kv, fed

    @torch.inference_mode()
    def propose(self, seq: Sequence, k: int) -> list[int]:
        if k <= 0:
            return []
        kv, fed = self._sync(seq)
        new = seq.tokens[len(fed):]
        proposals: list[int] = []
        while True:
            last = torch.tensor([len(new) - 1])  # only the last fed token's logits are needed
            logits = self.model(torch.tensor(new), torch.arange(len(fed), len(fed) + len(new)), kv, last)[0]
            self.forwards += len(new)
            fed.extend(new)
            proposals.append(int(logits.argmax()))
            if len(proposals) == k:
                return proposals
            new = [proposals[-1]]

    def forget(self, request_id: str) -> None:
        self.state.pop(request_id, None)

    def reset(self) -> None:
        self.state.clear()


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the last n tokens, propose what followed.

    The copy may overlap its own output (as in LZ77): when the match sits just before the tail — a
    sequence repeating itself with a period shorter than k — the proposal continues the repetition
    instead of stopping at the end of the text, so a found match always yields k proposals."""

    name = "ngram"

    def __init__(self, registry: ModelRegistry, max_n: int = 3, min_n: int = 1) -> None:
        super().__init__(registry)
        self.max_n, self.min_n = max_n, min_n

    def propose(self, seq: Sequence, k: int) -> list[int]:
        toks = seq.tokens
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(toks) <= n:
                continue
            tail = toks[-n:]
            for i in range(len(toks) - n - 1, -1, -1):
                if toks[i:i + n] == tail:
                    source = i + n  # < len(toks): the copy always has a first token to read
                    text = list(toks[source:])
                    while len(text) < k:  # overlapping copy: read what was just proposed
                        text.append(text[len(text) - (len(toks) - source)])
                    return text[:k]
        return []


class OracleDrafter(Drafter):
    """Test drafter: the target's own greedy continuation, read off the registry's shared greedy run of
    the prompt under its weights (`ModelRegistry.greedy_run`: the baseline decodes the same run, and a
    suite sends one prompt many times — resends, restops, sharers — so each step is decoded once).

    It keeps proposing past eos, stop ids and max_tokens (the run goes on without them), so the
    engine's truncation of an accepted run is exercised, not bypassed.
    """

    name = "oracle"

    def __init__(self, registry: ModelRegistry, k: int = 4) -> None:
        super().__init__(registry)
        self.k = k

    def propose(self, seq: Sequence, k: int) -> list[int]:
        run = self.registry.greedy_run(seq.identity, seq.prompt)
        room = run.model.config.max_position_embeddings - len(seq.prompt)
        produced = len(seq.output)
        return [run.step(i)[0] for i in range(produced, min(produced + k, room))]


class AdversarialDrafter(OracleDrafter):
    """Test drafter: always wrong — the target's token plus one (mod vocab) at every position."""

    name = "adversarial"

    def propose(self, seq: Sequence, k: int) -> list[int]:
        vocab = self.registry.model(seq.identity).config.vocab_size
        return [(t + 1) % vocab for t in super().propose(seq, k)]


DRAFTERS = {"draft": DraftModelDrafter, "ngram": NgramDrafter, "oracle": OracleDrafter,
            "adversarial": AdversarialDrafter}
assert tuple(DRAFTERS) == DRAFTER_NAMES, "config.DRAFTER_NAMES (what EngineConfig accepts) must list every drafter"


def make_drafter(name: str, registry: ModelRegistry, k: int) -> Drafter | None:
    """The drafter `name` names (EngineConfig has checked it), or None for "none"."""
    if name == "none":
        return None
    cls = DRAFTERS[name]
    return cls(registry, k) if issubclass(cls, OracleDrafter) else cls(registry)
