"""Checks on what the engine *reports* and on who may share KV: isolation, prefix-only, accounting.

Reported counts are checked against what the history makes possible: a request can have at most as
many cached tokens as the longest prefix it shares with earlier traffic of the *same identity* since
the last reset (prompts and prompt+output of earlier requests count). More than that means KV came from
somewhere it must not (BUG_CLASSES A) or the count lies (E).
"""

from __future__ import annotations

from conformance.checks.common import request_json, vs_baseline
from conformance.checks.registry import CheckRecorder, check
from conformance.contract import Request, Result
from conformance.history import History
from conformance.history_facts import is_cross_identity_attempt, occurrences, reuse_scan
from conformance.verdicts import CheckResult, Severity


@check(title="KV never serves another identity", severity=Severity.CRITICAL, bug_class="A",
       applies=lambda c: c.reports_cached_tokens or bool(c.identities))
def isolation(h: History, f: CheckRecorder) -> CheckResult:
    """Cached tokens <= prefix shared with the same identity; cross-identity poisoning never changes output."""
    for b, i, q, r, same, other in reuse_scan(h):
        if r.cached_tokens is not None:
            f.stats["reports_checked"] += 1
            if r.cached_tokens > same:
                leak = r.cached_tokens <= other
                title = ("cached tokens served across identities" if leak
                         else "cached tokens exceed any prefix seen before")
                f.fail(b.example, title,
                       f"Request {q.id} ({q.identity.label()}) reported {r.cached_tokens} cached prompt tokens, but "
                       f"it shares only {same} leading tokens with earlier traffic of its own identity since the "
                       f"last reset" + (f" (and {other} with another identity's traffic: its KV was reused)."
                                        if leak else "; no earlier traffic explains the hit."),
                       {"batch": b.index, "request": request_json(q), "identity": q.identity.label(),
                        "cached_tokens": r.cached_tokens, "shared_same_identity": same,
                        "shared_other_identity": other, "config": b.config},
                       bug_class="A" if leak else "E")
        if is_cross_identity_attempt(same, other, h.capabilities) and r.finish_reason != "abort":
            f.stats["poison_attempts"] += 1
            vs_baseline(f, h, b, i, q, r, "output changed after another identity warmed the same prefix",
                        f"Another identity had just sent the same {other} leading tokens; its KV must not serve "
                        f"{q.identity.label()}.")
    exercised = f.stats["reports_checked"] > 0 or f.stats["poison_attempts"] > 0
    return f.result(exercised, "no cached-token report and no cross-identity attempt")


@check(title="a hit never covers the whole prompt", severity=Severity.HIGH, bug_class="B",
       applies=lambda c: c.reports_cached_tokens)
def prefix_only(h: History, f: CheckRecorder) -> CheckResult:
    """cached <= Lin - 1: the last prompt token is always computed, so a hit never skips generation."""
    for b, i, q, r in occurrences(h):
        if r.cached_tokens:
            f.stats["hits"] += 1
            if r.cached_tokens > len(q.prompt) - 1:
                f.fail(b.example, "cache hit covers the last prompt token",
                       f"Request {q.id} reported {r.cached_tokens} cached tokens of a {len(q.prompt)}-token prompt; "
                       f"the last prompt token must always be computed to get fresh logits (else the engine "
                       f"samples stale logits).", {"batch": b.index, "request": request_json(q),
                                                    "cached_tokens": r.cached_tokens, "prompt_len": len(q.prompt)})
    return f.result(f.stats["hits"] > 0, "no prefix hit reported")


def _accounting_problems(q: Request, r: Result, eos: int | None) -> list[tuple[str, str]]:
    out = list(r.output)
    bad: list[tuple[str, str]] = []
    if r.cached_tokens is not None and not 0 <= r.cached_tokens <= len(q.prompt):
        bad.append(("cached tokens out of range", f"cached_tokens={r.cached_tokens} for a {len(q.prompt)}-token prompt"))
    if r.draft_proposed is not None and r.draft_proposed < 0 or r.draft_accepted is not None and r.draft_accepted < 0:
        bad.append(("negative draft counts", f"proposed={r.draft_proposed}, accepted={r.draft_accepted}"))
    if r.draft_proposed is not None and r.draft_accepted is not None and r.draft_accepted > r.draft_proposed:
        bad.append(("more drafts accepted than proposed", f"accepted {r.draft_accepted} > proposed {r.draft_proposed}"))
    if len(out) > q.max_tokens:
        bad.append(("more tokens than max_tokens", f"{len(out)} tokens > max_tokens {q.max_tokens}"))
    terminal = set(q.stop_ids) | ({eos} if eos is not None else set())
    early = [j for j, t in enumerate(out[:-1]) if t in terminal]
    if r.finish_reason != "abort" and early:
        bad.append(("generation continued past a stop/eos token",
                    f"token {out[early[0]]} at position {early[0]} should have ended generation"))
    fr = r.finish_reason
    if fr == "length" and len(out) != q.max_tokens:
        bad.append(("finish_reason 'length' without reaching max_tokens", f"{len(out)} of {q.max_tokens} tokens"))
    elif fr == "stop" and (not out or out[-1] not in q.stop_ids):
        bad.append(("finish_reason 'stop' without a stop token", f"last token {out[-1] if out else None}, stop_ids {list(q.stop_ids)}"))
    elif fr == "eos" and (not out or eos is None or out[-1] != eos):
        bad.append(("finish_reason 'eos' without eos", f"last token {out[-1] if out else None}, eos {eos}"))
    elif fr not in ("length", "stop", "eos", "abort"):
        bad.append(("unknown finish_reason", repr(fr)))
    return bad


@check(title="reported counts are consistent with outputs", severity=Severity.MEDIUM, bug_class="E")
def accounting(h: History, f: CheckRecorder) -> CheckResult:
    """Reported cached/accepted counts and finish reasons are consistent with outputs and each other;
    a request within the engine's declared limits is never refused; a request alone in the engine is never
    reported preempted."""
    eos = h.capabilities.eos_id if h.capabilities else None
    for b in h.batches():
        for i, q, r in b.pairs(refused=True):
            f.stats["refusals"] += 1
            limit = h.capabilities.context_limit(b.config) if h.capabilities else None
            if limit is not None and len(q.prompt) + q.max_tokens <= limit:
                f.fail(b.example, "refused a request within the declared limits",
                       f"Request {q.id}: {len(q.prompt)} prompt tokens + max_tokens {q.max_tokens} = "
                       f"{len(q.prompt) + q.max_tokens}, within the {limit} tokens the engine declares for this "
                       f"configuration, was refused ({r.extra.get('refusal', 'no reason given')}).",
                       {"batch": b.index, "request": request_json(q), "finish_reason": r.finish_reason,
                        "limit": limit})
        alone = len(b.requests) == 1
        for i, q, r in b.pairs():
            f.stats["results"] += 1
            if alone and r.preempted:
                # Preemption takes KV from one running request to give it to another; a request alone in
                # the engine has nobody to yield to. Coverage counts reported preemptions, so a false one
                # would also claim a situation the run never reached.
                f.fail(b.example, "a request alone in the engine reported preempted",
                       f"Request {q.id} ran alone ({len(q.prompt)} prompt tokens, max_tokens {q.max_tokens}) and "
                       f"was reported preempted: with no other request running, nothing could take its KV.",
                       {"batch": b.index, "request": request_json(q), "preempted": True})
            for title, detail in _accounting_problems(q, r, eos):
                f.fail(b.example, title, f"Request {q.id}: {detail} (finish_reason {r.finish_reason!r}, "
                       f"{len(r.output)} output tokens, max_tokens {q.max_tokens}).",
                       {"batch": b.index, "request": request_json(q), "output": list(r.output),
                        "finish_reason": r.finish_reason, "cached_tokens": r.cached_tokens,
                        "draft_proposed": r.draft_proposed, "draft_accepted": r.draft_accepted})
    return f.result(f.stats["results"] + f.stats["refusals"] > 0, "no results")
