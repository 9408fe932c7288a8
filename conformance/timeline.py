"""The timeline of one example: its steps in order, and for each request where its prompt came from.

A failure is only understood with what led to it: which earlier request warmed the prefix that was
served, under which identity, how many tokens it shared, what the engine said it reused. The checks
compute "the longest prefix shared with earlier traffic of the same / another identity" as numbers
(`history_facts.reuse_scan`); the timeline says the same with names — the earlier request, its batch,
its identity — so a report can tell an engine developer *whose* KV was reused, and the grouping of
findings can ask whether any cross-identity reuse happened at all.

Sharing is counted the way `reuse_scan` counts it (the same definition the isolation check judges by):
within one cache epoch (reset to reset), against earlier prompts and earlier prompt + output, earlier
requests of the same batch included (arrival order).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from attrs import frozen

from conformance.history_facts import lcp
from conformance.contract import Identity
from conformance.history import BatchRecord, Example
from conformance.history_codec import request_from


@frozen
class Shared:
    """The longest prefix a prompt shares with one earlier request (0 tokens: none)."""

    tokens: int = 0
    request: str | None = None
    batch: int | None = None  # index among the example's answered batches
    identity: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "request": self.request, "batch": self.batch, "identity": self.identity}


@frozen
class Line:
    """One request of a step, with what the engine said about it (None where it never answered)."""

    request: str
    identity: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_ids: tuple[int, ...]
    same: Shared  # longest prefix shared with earlier same-identity traffic
    other: Shared  # ... and with earlier traffic of another identity
    output: tuple[int, ...] | None = None
    finish_reason: str | None = None
    cached_tokens: int | None = None
    draft_proposed: int | None = None
    draft_accepted: int | None = None
    prefill_chunks: int | None = None
    evictions: int | None = None
    preempted: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request, "identity": self.identity, "prompt": list(self.prompt),
                "prompt_len": len(self.prompt), "max_tokens": self.max_tokens, "stop_ids": list(self.stop_ids),
                "same": self.same.to_json(), "other": self.other.to_json(),
                "output": None if self.output is None else list(self.output), "finish_reason": self.finish_reason,
                "cached_tokens": self.cached_tokens, "draft_proposed": self.draft_proposed,
                "draft_accepted": self.draft_accepted, "prefill_chunks": self.prefill_chunks,
                "evictions": self.evictions, "preempted": self.preempted}


@frozen
class TimelineStep:
    """One step of a told timeline (not a scenario's `strategies.Step`, which is what was drawn to send).
    `kind`: "reset", "configure", "batch" (answered) or "failed" (submitted, never answered)."""

    kind: str
    batch: int | None = None
    config: Mapping[str, Any] | None = None
    lines: tuple[Line, ...] = ()
    epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "batch": self.batch, "config": None if self.config is None else dict(self.config),
                "epoch": self.epoch, "requests": [ln.to_json() for ln in self.lines]}


def _best(prompt: tuple[int, ...], seen: Iterable[tuple[Identity, tuple[int, ...], str, int]],
          same: bool, identity: Identity) -> Shared:
    best = Shared()
    for ident, tokens, rid, batch in seen:
        if (ident == identity) != same:
            continue
        n = lcp(prompt, tokens)
        if n > best.tokens:
            best = Shared(n, rid, batch, ident.label())
    return best


def timeline(example: Example) -> list[TimelineStep]:
    """Every step of `example` in order, each request with its prefix provenance and its result."""
    steps: list[TimelineStep] = []
    answered = {b.index: b for b in example.batches}
    seen: list[tuple[Identity, tuple[int, ...], str, int]] = []
    epoch, config, n_batch = 0, {}, 0
    for raw in example.steps():
        kind = raw.get("step")
        if kind == "reset":
            epoch += 1
            seen = []
            steps.append(TimelineStep("reset", epoch=epoch))
        elif kind == "configure":
            config = dict(raw.get("config") or {})
            steps.append(TimelineStep("configure", config=config, epoch=epoch))
        elif kind == "batch":
            record: BatchRecord | None = answered.get(n_batch)
            requests = record.requests if record is not None else [request_from(r) for r in raw.get("requests", ())]
            results = record.results if record is not None else ()
            lines = []
            for k, q in enumerate(requests):
                r = results[k] if k < len(results) else None
                lines.append(Line(
                    q.id, q.identity.label(), q.prompt, q.max_tokens, q.stop_ids,
                    _best(q.prompt, seen, True, q.identity), _best(q.prompt, seen, False, q.identity),
                    None if r is None else r.output, None if r is None else r.finish_reason,
                    None if r is None else r.cached_tokens, None if r is None else r.draft_proposed,
                    None if r is None else r.draft_accepted, None if r is None else r.prefill_chunks,
                    None if r is None else r.evictions, None if r is None else r.preempted))
                seen.append((q.identity, q.prompt, q.id, n_batch))
                if r is not None:
                    seen.append((q.identity, q.prompt + tuple(r.output), q.id, n_batch))
            steps.append(TimelineStep("batch" if record is not None else "failed", batch=n_batch,
                                      config=config, lines=tuple(lines), epoch=epoch))
            if record is not None:
                n_batch += 1
    return steps


def find_line(steps: Iterable[TimelineStep], batch: int | None, request: str | None) -> Line | None:
    """The timeline line of request `request` in answered batch `batch`."""
    for s in steps:
        if s.batch == batch and s.kind == "batch":
            for ln in s.lines:
                if ln.request == request:
                    return ln
    return None
