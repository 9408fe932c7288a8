"""Plain greedy decoding: the definition every optimization must reproduce token for token.

One request, fresh KV, the whole prompt in one forward pass, one token per step, no draft. Besides the
tokens it records, per step, the top-1/top-2 logit margin and the runner-up token: a divergence at a
step whose margin is below an engine's tolerance is a near-tie, not a bug (DESIGN.md). Where the step is
close (runner-up within CONTENDER_WINDOW), it also records the next few tokens and their gaps to the
top-1, so a lower-precision engine picking the third of three near-equal tokens is judged by its gap.
"""

from __future__ import annotations

import attrs
import torch

from reference_engine.errors import validate_prompt
from reference_engine.model import DenseKV, Llama


@attrs.frozen
class Greedy:
    output: tuple[int, ...]
    finish_reason: str  # "eos" | "stop" | "length"
    margins: tuple[float, ...]
    runner_up: tuple[int, ...]
    contenders: tuple[tuple[tuple[int, float], ...], ...] = ()


CONTENDER_WINDOW = 1.0  # logits: far above any tau worth declaring
CONTENDERS = 4


def ranked(logits: torch.Tensor) -> tuple[int, float, int, float, tuple[tuple[int, float], ...]]:
    """One `topk` per step: the top-1 and runner-up (token, logit) and the contenders, i.e. (token, gap
    to the top-1) for the tokens after the top-1 within CONTENDER_WINDOW, best first."""
    values, ids = logits.double().topk(CONTENDERS + 1)
    gaps = values[0] - values[1:]
    close = tuple((int(t), float(g)) for t, g in zip(ids[1:], gaps) if g < CONTENDER_WINDOW)
    return int(ids[0]), float(values[0]), int(ids[1]), float(values[1]), close


def finish_reason(token: int, produced: int, max_tokens: int, stop_ids, eos_id: int | None) -> str | None:
    """Why generation ends after `token` (the `produced`-th output token), or None to go on.
    The stopping token itself is part of the output."""
    if eos_id is not None and token == eos_id:
        return "eos"
    if token in stop_ids:
        return "stop"
    if produced >= max_tokens:
        return "length"
    return None


@torch.no_grad()
def greedy(model: Llama, prompt, max_tokens: int, stop_ids=(), eos_id: int | None = None) -> Greedy:
    c = model.config
    validate_prompt(prompt, max_tokens, c.vocab_size, c.max_position_embeddings)
    eos = c.eos_token_id if eos_id is None else eos_id
    kv = DenseKV(c, dtype=model.dtype)
    ids = torch.tensor(list(prompt), dtype=torch.long)
    logits = model(ids, torch.arange(len(ids)), kv, torch.tensor([len(ids) - 1]))[0]  # only the last row is sampled
    output, margins, runner_up, close = [], [], [], []
    stop = frozenset(int(s) for s in stop_ids)
    while True:
        t1, v1, t2, v2, near = ranked(logits)
        output.append(t1)
        margins.append(v1 - v2)
        runner_up.append(t2)
        close.append(near)
        reason = finish_reason(t1, len(output), max_tokens, stop, eos)
        if reason:
            return Greedy(tuple(output), reason, tuple(margins), tuple(runner_up), tuple(close))
        pos = len(prompt) + len(output) - 1
        logits = model(torch.tensor([t1]), torch.tensor([pos]), kv)[-1]
