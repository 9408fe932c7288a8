"""Request state: what the engine knows about one request while it runs, and the report it leaves.

`tokens` is prompt + committed output. `num_computed` counts the leading tokens whose KV is in the
sequence's blocks; the scheduler feeds `tokens[num_computed:]` (a prefill chunk, a recompute after
preemption, or the one new token of a decode, plus draft proposals). Provisional (draft) KV lives past
`num_computed` only inside one step: verification settles it before the step ends.
"""

from __future__ import annotations

import enum

import attrs


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@attrs.frozen
class Identity:
    """Which weights and which tenant a request runs under (the engine's own identity type).

    revision: a shipped target revision ("a", "b"); adapter: a LoRA adapter name known to the engine
    (its weights digest is looked up by the engine, so a reload under the same name is a new identity);
    salt: a tenant's cache salt — equal salts may share KV, different ones never.
    """

    revision: str = "a"
    adapter: str | None = None
    salt: str | None = None


@attrs.frozen
class Report:
    """Everything the engine says about one finished (or aborted) request."""

    request_id: str
    output: tuple[int, ...]
    finish_reason: str  # eos | stop | length | abort
    prompt_tokens: int
    cached_tokens: int
    draft_proposed: int
    draft_accepted: int
    proposed_per_position: tuple[int, ...]
    accepted_per_position: tuple[int, ...]
    verification_steps: int
    provisional_allocated: int
    provisional_freed: int
    evictions: int  # evictions anywhere in the pool while this request was live
    preemptions: int
    prefill_chunks: int  # forward passes its first prefill took
    chunked: bool
    ttft_s: float | None
    tpot_s: float | None
    ttft_cost: int | None  # target token-forwards (whole engine) from arrival to first token
    tpot_cost: float | None
    target_forwards: int  # this request's own target token-forwards
    draft_forwards: int  # this request's own draft-model token-forwards
    # per output token, top-k (token, logprob) plus the chosen one; None where some position had no logits
    logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None


@attrs.define(eq=False)
class Sequence:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: frozenset[int]
    identity: Identity
    eos_id: int | None
    tokens: list[int] = attrs.Factory(lambda self: list(self.prompt), takes_self=True)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_computed: int = 0
    block_table: list[int] = attrs.Factory(list)
    block_keys: list[str] = attrs.Factory(list)  # keys of the leading registered blocks (chain)
    admitted_once: bool = False
    prefill_done_once: bool = False
    # statistics
    cached_tokens: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    proposed_per_position: list[int] = attrs.Factory(list)
    accepted_per_position: list[int] = attrs.Factory(list)
    verification_steps: int = 0
    provisional_allocated: int = 0
    provisional_freed: int = 0
    preemptions: int = 0
    prefill_chunks: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    evictions_at_arrival: int = 0
    t_arrival: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    cost_arrival: int = 0
    cost_first: int | None = None
    cost_last: int | None = None
    logprobs: list | None = attrs.Factory(list)  # per committed output token; None once one had no logits

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    def report(self, evictions_now: int) -> Report:
        n = len(self.output)
        tpot_s = tpot_c = None
        if n > 1 and self.t_first is not None:
            tpot_s = (self.t_last - self.t_first) / (n - 1)
            tpot_c = (self.cost_last - self.cost_first) / (n - 1)
        return Report(
            request_id=self.request_id, output=tuple(self.output), finish_reason=self.finish_reason or "abort",
            prompt_tokens=len(self.prompt), cached_tokens=self.cached_tokens,
            draft_proposed=self.draft_proposed, draft_accepted=self.draft_accepted,
            proposed_per_position=tuple(self.proposed_per_position),
            accepted_per_position=tuple(self.accepted_per_position),
            verification_steps=self.verification_steps, provisional_allocated=self.provisional_allocated,
            provisional_freed=self.provisional_freed, evictions=evictions_now - self.evictions_at_arrival,
            preemptions=self.preemptions, prefill_chunks=self.prefill_chunks, chunked=self.prefill_chunks > 1,
            ttft_s=None if self.t_first is None else self.t_first - self.t_arrival, tpot_s=tpot_s,
            ttft_cost=None if self.cost_first is None else self.cost_first - self.cost_arrival, tpot_cost=tpot_c,
            target_forwards=self.target_forwards, draft_forwards=self.draft_forwards,
            logprobs=None if self.logprobs is None else tuple(self.logprobs))
