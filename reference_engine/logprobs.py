"""Per-position log-probabilities: what the engine and plain greedy decoding report below the argmax.

A wrong KV block often leaves every argmax as it was (a confident model), but it moves the distribution;
the top-k log-softmax at each decoded position shows that (conformance's logprob_parity). Both sides
compute it here, from a position's logits, in the precision they run in.
"""

from __future__ import annotations

import torch

LOGPROBS_K = 5  # top-k per position the engine reports and the baseline records


def top_logprobs(logits: torch.Tensor, k: int = LOGPROBS_K,
                 chosen: int | None = None) -> tuple[tuple[int, float], ...]:
    """The top-k (token, log-softmax) of one position's logits, best first, plus `chosen` (the token
    the engine committed there) at its place in the order when it is not among them."""
    lp = torch.log_softmax(logits, dim=-1)
    values, ids = lp.topk(min(k, lp.shape[-1]))
    pairs = [(int(t), float(v)) for t, v in zip(ids, values)]
    if chosen is not None and all(t != chosen for t, _ in pairs):
        pairs.append((int(chosen), float(lp[chosen])))
        pairs.sort(key=lambda p: -p[1])
    return tuple(pairs)
