"""The checks: a named registry of pure functions over a recorded history (DESIGN.md "Checks").

Each check is `fn(history) -> CheckResult`, never talks to an engine and is registered with a title,
a severity and a bug class from BUG_CLASSES.md. `run_check` turns a crashing check into `error` — an
analysis that could not run has proved nothing, so it must never read as a pass (Jepsen's "unknown").

Most checks are example-scoped: they see one Hypothesis example (so a failure can shrink and replay on
its own). `exercised` is run-scoped: vacuity is a property of the whole run, not of one example.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable, Mapping

from attrs import frozen

from conformance.contract import Capabilities, Request, Result
from conformance.history import BatchRecord, History, encode, oracle_key_str
from conformance.oracle import DIVERGE, FINISH, NEAR_TIE, Comparison, compare, compare_pair
from conformance.verdicts import ERROR, FAIL, INCONCLUSIVE, PASS, SKIP, CheckResult, Failure


@frozen
class CheckSpec:
    name: str
    title: str
    severity: str
    bug_class: str
    fn: Callable[[History], CheckResult]
    scope: str = "example"  # "example" or "run"
    applies: Callable[[Capabilities], bool] = lambda caps: True
    doc: str = ""


CHECKS: dict[str, CheckSpec] = {}


def check(name: str, *, title: str, severity: str, bug_class: str, scope: str = "example",
          applies: Callable[[Capabilities], bool] = lambda caps: True):
    """Register a check function under `name` (the name users pass to `--checks`)."""

    def deco(fn: Callable[[History], CheckResult]) -> Callable[[History], CheckResult]:
        CHECKS[name] = CheckSpec(name, title, severity, bug_class, fn, scope, applies,
                                 (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return deco


def run_check(spec: CheckSpec, history: History) -> CheckResult:
    """Run one check; a check that does not apply is `skip`, one that crashes is `error`."""
    caps = history.capabilities
    if caps is not None and not spec.applies(caps):
        return CheckResult(spec.name, SKIP, notes=("the engine does not claim what this check is about",))
    try:
        result = spec.fn(history)
    except Exception as exc:  # noqa: BLE001 - a crashing checker is "unknown", reported as error
        return CheckResult(spec.name, ERROR, notes=(f"check crashed: {type(exc).__name__}: {exc}",))
    if not isinstance(result, CheckResult):
        return CheckResult(spec.name, ERROR, notes=(f"check returned {type(result).__name__}",))
    return result


# --------------------------------------------------------------------------- helpers shared by checks


def knob_role(name: str) -> str:
    """Which claim a configuration knob is about, from its name (documented in contract.Capabilities).

    "spec": drafter / k / speculation on-off; "cache": cache size, prefix caching on-off, eviction;
    anything else is "schedule" (chunk size, token budget, max batch, preemption policy).
    """
    n = name.lower()
    if any(s in n for s in ("spec", "draft", "assist", "lookup", "ngram", "gamma")) or n in ("k", "num_k"):
        return "spec"
    if any(s in n for s in ("cache", "block", "pool", "evict", "memory", "kv", "prefix")):
        return "cache"
    return "schedule"


def lcp(a: Iterable[int], b: Iterable[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chunked(result: Result) -> bool:
    """Result.extra["prefill_chunks"] > 1 or a truthy Result.extra["chunked"]."""
    return int(result.extra.get("prefill_chunks", 0) or 0) > 1 or bool(result.extra.get("chunked", False))


def mechanisms(b: BatchRecord, r: Result) -> set[str]:
    """Which reuse mechanisms were active for one result, as far as the engine reported them."""
    active = set()
    if r.cached_tokens:
        active.add("cache")
    if r.draft_proposed:
        active.add("spec")
    if chunked(r) or len(b.requests) > 1 or r.extra.get("preempted"):
        active.add("schedule")
    return active


def request_json(q: Request) -> dict[str, Any]:
    return encode(q)


class Findings:
    """Accumulates failures, counts and notes for one check over one history."""

    def __init__(self, name: str) -> None:
        self.spec = CHECKS[name]
        self.failures: list[Failure] = []
        self.stats: Counter[str] = Counter()
        self.notes: list[str] = []

    def fail(self, example: int, title: str, explanation: str, witness: Mapping[str, Any],
             bug_class: str | None = None) -> None:
        witness = {"example": example, **encode(dict(witness))}
        digest = hashlib.sha1(json.dumps([title, witness], sort_keys=True).encode()).hexdigest()[:10]
        self.failures.append(Failure(self.spec.name, title, self.spec.severity,
                                     bug_class or self.spec.bug_class, f"{self.spec.name}-{digest}",
                                     witness, explanation, example))

    def note(self, text: str) -> None:
        if len(self.notes) < 20 and text not in self.notes:
            self.notes.append(text)

    def result(self, exercised: bool, why_not: str) -> CheckResult:
        if self.failures:
            status = FAIL
        elif exercised:
            status = PASS
        else:
            status = INCONCLUSIVE
            self.note(why_not)
        return CheckResult(self.spec.name, status, self.failures, self.notes, dict(self.stats))


def divergence_witness(b: BatchRecord, i: int, q: Request, r: Result, c: Comparison,
                       baseline_output: Iterable[int] | None = None) -> dict[str, Any]:
    return {"batch": b.index, "position_in_batch": i, "batch_size": len(b.requests), "config": b.config,
            "request": request_json(q), "identity": q.identity.label(), "output": list(r.output),
            "expected_output": None if baseline_output is None else list(baseline_output),
            "finish_reason": r.finish_reason, "cached_tokens": r.cached_tokens,
            "draft_accepted": r.draft_accepted, "comparison": c.to_json(),
            "first_divergent_position": c.position, "expected": c.expected, "got": c.got,
            "baseline_margin": c.margin}


def context_prose(b: BatchRecord, r: Result) -> str:
    bits = [f"batch of {len(b.requests)}", f"config {dict(b.config) or 'default'}"]
    if r.cached_tokens:
        bits.append(f"{r.cached_tokens} prompt tokens reported as served from cache")
    if r.draft_accepted:
        bits.append(f"{r.draft_accepted}/{r.draft_proposed} draft tokens accepted")
    if chunked(r):
        bits.append("prefill was chunked")
    if r.extra.get("evictions"):
        bits.append(f"{r.extra['evictions']} evictions")
    return "; ".join(bits)


def vs_baseline(f: Findings, h: History, b: BatchRecord, i: int, q: Request, r: Result,
                title: str, why: str) -> None:
    """Compare one result against the oracle; record a near-tie or a failure."""
    base = h.baseline_for(q)
    if base is None:
        f.note(f"no baseline recorded for request {q.id}")
        return
    c = compare(base, r.output, r.finish_reason, h.tolerance)
    f.stats["compared"] += 1
    if c.kind == NEAR_TIE:
        f.stats["near_ties"] += 1
        f.note(f"near-tie (counted, not a failure): request {q.id} {c.describe()}")
    elif c.kind in (DIVERGE, FINISH):
        f.fail(b.example, title, f"Request {q.id} ({q.identity.label()}, {len(q.prompt)} prompt tokens): "
               f"{c.describe()}. {why} Context: {context_prose(b, r)}.",
               divergence_witness(b, i, q, r, c, base.output))


def occurrences(h: History) -> Iterable[tuple[BatchRecord, int, Request, Result]]:
    for b in h.batches():
        for i, q, r in b.pairs():
            if r.finish_reason != "abort":
                yield b, i, q, r


# --------------------------------------------------------------------------- output checks


@check("parity", title="output equals plain greedy decoding", severity="high", bug_class="B")
def parity(h: History) -> CheckResult:
    """Every output equals the oracle's (tie-aware)."""
    f = Findings("parity")
    for b, i, q, r in occurrences(h):
        vs_baseline(f, h, b, i, q, r, "output differs from plain greedy decoding",
                    "Plain decoding (one request alone, fresh KV, no draft) says otherwise.")
    return f.result(f.stats["compared"] > 0, "no request completed, nothing compared")


def _pair_role(b1: BatchRecord, i1: int, b2: BatchRecord, i2: int) -> str:
    """Which independence claim a pair of runs of the same oracle key tests."""
    keys = set(b1.config) | set(b2.config)
    roles = {knob_role(k) for k in keys if b1.config.get(k) != b2.config.get(k)}
    if "spec" in roles:
        return "spec_independence"
    if "schedule" in roles:
        return "schedule_independence"
    shape1 = (i1, tuple(oracle_key_str(q) for q in b1.requests))
    shape2 = (i2, tuple(oracle_key_str(q) for q in b2.requests))
    if shape1 != shape2:
        return "schedule_independence"
    return "history_independence"


def _independence(name: str, h: History, single: Callable[[BatchRecord, Result], bool], what: str) -> CheckResult:
    """Shared body: pairs of runs of the same oracle key attributed to `name`, plus single results whose
    mechanism (cache hit / accepted draft / chunking or batching) was active, compared to the oracle."""
    f = Findings(name)
    groups: dict[str, list[tuple[BatchRecord, int, Request, Result]]] = defaultdict(list)
    for occ in occurrences(h):
        groups[oracle_key_str(occ[2])].append(occ)
    for key, occs in groups.items():
        for a in range(len(occs)):
            for z in range(a + 1, len(occs)):
                (b1, i1, q1, r1), (b2, i2, q2, r2) = occs[a], occs[z]
                if _pair_role(b1, i1, b2, i2) != name:
                    continue
                f.stats["pairs"] += 1
                c = compare_pair(r1.output, r1.finish_reason, r2.output, r2.finish_reason,
                                 h.baselines.get(key), h.tolerance)
                if c.kind == NEAR_TIE:
                    f.stats["near_ties"] += 1
                elif not c.ok:
                    w = divergence_witness(b2, i2, q2, r2, c)
                    w.update(earlier_request=request_json(q1), earlier_batch=b1.index, earlier_config=b1.config,
                             earlier_output=list(r1.output), earlier_cached_tokens=r1.cached_tokens)
                    f.fail(b2.example, f"output depends on {what}",
                           f"The same request ({q2.identity.label()}, {len(q2.prompt)} prompt tokens) gave "
                           f"different outputs: {c.describe()} (first run: batch {b1.index}, "
                           f"{context_prose(b1, r1)}; second run: batch {b2.index}, {context_prose(b2, r2)}).",
                           w)
    for b, i, q, r in occurrences(h):
        # Attribute a lone divergence to this mechanism only when it was the only one in play; when
        # several were, parity reports it and the pairwise comparisons above tell them apart.
        if single(b, r) and len(mechanisms(b, r)) == 1:
            f.stats["mechanism_active"] += 1
            vs_baseline(f, h, b, i, q, r, f"output differs from plain decoding when {what} is in play",
                        f"Plain decoding has no {what}; the output must not change because of it.")
    exercised = f.stats["pairs"] + f.stats["mechanism_active"] > 0
    return f.result(exercised, f"no two runs of one request differed only in {what}, and it was never active")


@check("history_independence", title="output does not depend on earlier traffic", severity="high",
       bug_class="B", applies=lambda c: c.prefix_caching)
def history_independence(h: History) -> CheckResult:
    """Output does not depend on earlier traffic (cold vs warm cache)."""
    return _independence("history_independence", h, lambda b, r: bool(r.cached_tokens), "cache state")


def _spec_applies(c: Capabilities) -> bool:
    return c.speculation or any(knob_role(k) == "spec" for k in c.config_space)


@check("spec_independence", title="output does not depend on the drafter, k or speculation on/off",
       severity="high", bug_class="C", applies=_spec_applies)
def spec_independence(h: History) -> CheckResult:
    """Output does not depend on the drafter, k, or whether speculation is on."""
    return _independence("spec_independence", h, lambda b, r: bool(r.draft_proposed), "speculation")


@check("schedule_independence", title="output does not depend on scheduling", severity="high",
       bug_class="D")
def schedule_independence(h: History) -> CheckResult:
    """Output does not depend on chunk size, token budget, batch composition or arrival order."""
    return _independence("schedule_independence", h,
                         lambda b, r: chunked(r) or len(b.requests) > 1 or bool(r.extra.get("preempted")),
                         "scheduling (chunking, batching, arrival order)")


def batch_evicted(b: BatchRecord) -> bool:
    """Did this batch evict? Evidence: Result.extra["evictions"] > 0, or snapshot["evictions"] (a running
    counter) grew since the snapshot before the batch (taken after a reset or the previous batch)."""
    if any(int(r.extra.get("evictions", 0) or 0) > 0 for r in b.results):
        return True
    after = (b.snapshot or {}).get("evictions")
    return after is not None and b.evictions_before is not None and int(after) > b.evictions_before


@check("eviction_safety", title="output unchanged when blocks are evicted and reused", severity="high",
       bug_class="D", applies=lambda c: c.evicts)
def eviction_safety(h: History) -> CheckResult:
    """Output unchanged when the cache is too small and blocks are evicted and reused."""
    f = Findings("eviction_safety")
    for ex in h.examples:
        evicted_epoch = None
        for b in ex.batches:
            if batch_evicted(b):
                evicted_epoch = (b.epoch, b.segment)
                f.stats["evicting_batches"] += 1
            if evicted_epoch != (b.epoch, b.segment):
                continue
            for i, q, r in b.pairs():
                if r.finish_reason != "abort":
                    vs_baseline(f, h, b, i, q, r, "output differs from plain decoding after evictions",
                                "Blocks were evicted in this cache epoch; evicted-then-reused blocks must "
                                "not leak stale KV.")
    return f.result(f.stats["evicting_batches"] > 0, "no eviction observed (Result.extra['evictions'] / "
                    "snapshot['evictions'] never grew)")


# the cache-accounting, isolation and vacuity checks live next door; importing registers them
from conformance import checks_cache  # noqa: E402,F401
