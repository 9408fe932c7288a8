"""Plain greedy decoding: the definition every optimization must reproduce token for token.

One request, fresh KV, the whole prompt in one forward pass, one token per step, no draft. Besides the
tokens it records, per step, the top-1/top-2 logit margin and the runner-up token: a divergence at a
step whose margin is below an engine's tolerance is a near-tie, not a bug (DESIGN.md). Where the step is
close (runner-up within CONTENDER_WINDOW), it also records the next few tokens and their gaps to the
top-1, so a lower-precision engine picking the third of three near-equal tokens is judged by its gap.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs
import torch

from reference_engine.errors import validate_prompt
from reference_engine.logprobs import top_logprobs
from reference_engine.model import DenseKV, Llama


@attrs.frozen
class Greedy:
    output: tuple[int, ...]
    finish_reason: str  # "eos" | "stop" | "length"
    margins: tuple[float, ...]
    runner_up: tuple[int, ...]
    contenders: tuple[tuple[tuple[int, float], ...], ...] = ()
    logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per step, top-k (token, log-softmax)


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


class GreedyRun:
    """One prompt's greedy run under one model, decoded only as far as someone has asked, and extended
    on demand from its own KV. Decoding step i is the same computation whatever is asked later (the
    prompt in one forward pass, then one token per step), so a run serves every `greedy` call on its
    prompt — any max_tokens, stop ids or eos — with each step decoded once."""

    def __init__(self, model: Llama, prompt) -> None:
        self.model, self.prompt = model, tuple(int(t) for t in prompt)
        self.kv = DenseKV(model.config, dtype=model.dtype)
        # (token, margin, runner-up, contenders, top-k logprobs)
        self.steps: list[tuple[int, float, int, tuple, tuple]] = []

    @torch.inference_mode()
    def step(self, i: int) -> tuple[int, float, int, tuple, tuple]:
        """Step i (0-based) of the run; the caller has checked it fits the context."""
        while len(self.steps) <= i:
            if not self.steps:  # only the prompt's last row is sampled
                ids = torch.tensor(self.prompt, dtype=torch.long)
                logits = self.model(ids, torch.arange(len(ids)), self.kv, torch.tensor([len(ids) - 1]))[0]
            else:
                pos = len(self.prompt) + len(self.steps) - 1
                logits = self.model(torch.tensor([self.steps[-1][0]]), torch.tensor([pos]), self.kv)[-1]
            t1, v1, t2, v2, near = ranked(logits)
            self.steps.append((t1, v1 - v2, t2, near, top_logprobs(logits.double())))
        return self.steps[i]


class GreedyRuns:
    """The greedy runs of one process's models, by (weights, prompt), least recently used dropped past
    `capacity` (each holds its KV: about 2 KiB per token for the shipped target). The baseline and the
    oracle drafters decode the same target greedily on the same prompts; sharing the runs decodes each
    step once for both."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.runs: OrderedDict[tuple, GreedyRun] = OrderedDict()

    def run(self, weights_key: tuple, model: Llama, prompt) -> GreedyRun:
        key = (weights_key, tuple(int(t) for t in prompt))
        run = self.runs.pop(key, None) or GreedyRun(model, key[1])
        self.runs[key] = run
        while len(self.runs) > self.capacity:
            self.runs.popitem(last=False)
        return run


def greedy(model: Llama, prompt, max_tokens: int, stop_ids=(), eos_id: int | None = None,
           run: GreedyRun | None = None) -> Greedy:
    """Plain greedy decoding of `prompt` (on `run`, a `GreedyRun` of this model and prompt, when given)."""
    c = model.config
    validate_prompt(prompt, max_tokens, c.vocab_size, c.max_position_embeddings)
    eos = c.eos_token_id if eos_id is None else eos_id
    run = run or GreedyRun(model, prompt)
    output, margins, runner_up, close, logprobs = [], [], [], [], []
    stop = frozenset(int(s) for s in stop_ids)
    while True:
        t1, margin, t2, near, lps = run.step(len(output))
        output.append(t1)
        margins.append(margin)
        runner_up.append(t2)
        close.append(near)
        logprobs.append(lps)
        reason = finish_reason(t1, len(output), max_tokens, stop, eos)
        if reason:
            return Greedy(tuple(output), reason, tuple(margins), tuple(runner_up), tuple(close), tuple(logprobs))
