"""Checks on what the engine *says*: its outputs equal plain decoding, and do not depend on earlier
traffic, on speculation, on scheduling or on evictions (BUG_CLASSES B, C, D).

The independence checks compare every pair of runs of one oracle key and attribute a difference to the
claim the runs differ in: a knob of role "speculation" → spec_independence, "schedule" or another batch
shape → schedule_independence, else (same configuration, same batch) history_independence. Where plain
decoding sides with one run, the evidence decides instead (`_attribute`): the other run is the witness,
and a mechanism it reports inactive is not blamed when another it reports is what the right run lacked.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

from conformance.checks.common import context_prose, divergence_witness, request_json, vs_baseline
from conformance.checks.registry import CheckRecorder, check
from conformance.contract import Capabilities, Request, Result
from conformance.history import BatchRecord, History
from conformance.history_codec import oracle_key_str
from conformance.history_facts import batch_evicted, chunked, knob_role, mechanisms, occurrences
from conformance.oracle import DIVERGE, FINISH, NEAR_TIE, compare, compare_pair
from conformance.verdicts import CheckResult, Severity


@check(title="output equals plain greedy decoding", severity=Severity.HIGH, bug_class="B")
def parity(h: History, f: CheckRecorder) -> CheckResult:
    """Every output equals the oracle's (tie-aware)."""
    for b, i, q, r in occurrences(h):
        vs_baseline(f, h, b, i, q, r, "output differs from plain greedy decoding",
                    "Plain decoding (one request alone, fresh KV, no draft) says otherwise.")
    return f.result(f.stats["compared"] > 0, "no request completed, nothing compared")


def _pair_role(caps: Capabilities | None, b1: BatchRecord, i1: int, b2: BatchRecord, i2: int) -> str:
    """Which independence claim a pair of runs of the same oracle key tests."""
    keys = set(b1.config) | set(b2.config)
    roles = {knob_role(caps, k) for k in keys if b1.config.get(k) != b2.config.get(k)}
    if "speculation" in roles:
        return "spec_independence"
    if "schedule" in roles:
        return "schedule_independence"
    shape1 = (i1, tuple(oracle_key_str(q) for q in b1.requests))
    shape2 = (i2, tuple(oracle_key_str(q) for q in b2.requests))
    if shape1 != shape2:
        return "schedule_independence"
    return "history_independence"


_MECHANISM = {"spec_independence": "spec", "history_independence": "cache", "schedule_independence": "schedule"}
_CLAIM = {m: claim for claim, m in _MECHANISM.items()}
Run = tuple[BatchRecord, int, Request, Result]


def _reports(caps: Capabilities | None, mechanism: str) -> bool:
    """Whether the engine reports a mechanism's activity, so that a result showing none is evidence of
    its absence (scheduling has knobs nothing reports, so it never is)."""
    return caps is not None and {"cache": caps.reports_cached_tokens, "spec": caps.reports_drafts}.get(mechanism, False)


def _attribute(h: History, first: Run, second: Run) -> tuple[str, Run, Run]:
    """(claim, right run, witness run) for a pair of runs that differ. By default the claim the runs'
    configurations and batch shapes differ in, witnessed by the later run. When plain decoding agrees
    with exactly one run, the other is the witness; and when the witness reports the default claim's
    mechanism inactive (no drafts proposed, no cached tokens) while reporting one the right run lacks,
    that one is blamed: a wrong repeat served a poisoned cache entry is a cache finding, whatever knob
    the right run happened to differ in."""
    claim = _pair_role(h.capabilities, first[0], first[1], second[0], second[1])
    base = h.baseline_for(first[2])
    wrong = [base is not None and compare(base, r.output, r.finish_reason, h.tolerance).kind in (DIVERGE, FINISH)
             for _, _, _, r in (first, second)]
    if wrong != [True, False] and wrong != [False, True]:
        return claim, first, second
    right, witness = (second, first) if wrong[0] else (first, second)
    active = mechanisms(witness[0], witness[3])
    if _reports(h.capabilities, _MECHANISM[claim]) and _MECHANISM[claim] not in active:
        lacked = sorted(m for m in active - mechanisms(right[0], right[3]) if m in _CLAIM)
        if lacked:
            claim = _CLAIM[lacked[0]]
    return claim, right, witness


def _independence(f: CheckRecorder, h: History, single: Callable[[BatchRecord, Result], bool], what: str) -> CheckResult:
    """Shared body: pairs of runs of the same oracle key attributed to this check, plus single results
    whose mechanism (cache hit / accepted draft / chunking or batching) was active, compared to the oracle."""
    name = f.spec.name
    groups: dict[str, list[tuple[BatchRecord, int, Request, Result]]] = defaultdict(list)
    for occ in occurrences(h):
        groups[oracle_key_str(occ[2])].append(occ)
    for key, occs in groups.items():
        for a in range(len(occs)):
            for z in range(a + 1, len(occs)):
                first, second = occs[a], occs[z]
                c = compare_pair(first[3].output, first[3].finish_reason, second[3].output, second[3].finish_reason,
                                 h.baselines.get(key), h.tolerance)
                if c.ok:
                    if _pair_role(h.capabilities, first[0], first[1], second[0], second[1]) == name:
                        f.stats["pairs"] += 1
                        f.stats["near_ties"] += c.kind == NEAR_TIE
                    continue
                claim, (b1, i1, q1, r1), (b2, i2, q2, r2) = _attribute(h, first, second)
                if claim != name:
                    continue
                f.stats["pairs"] += 1
                if (b1, i1) != (first[0], first[1]):  # the witness is the earlier run: it plays "got"
                    c = compare_pair(r1.output, r1.finish_reason, r2.output, r2.finish_reason,
                                     h.baselines.get(key), h.tolerance)
                w = divergence_witness(b2, i2, q2, r2, c)
                w.update(earlier_request=request_json(q1), earlier_batch=b1.index, earlier_config=b1.config,
                         earlier_output=list(r1.output), earlier_cached_tokens=r1.cached_tokens)
                f.fail(b2.example, f"output depends on {what}",
                       f"The same request ({q2.identity.label()}, {len(q2.prompt)} prompt tokens) gave "
                       f"different outputs: {c.describe()} (one run: batch {b1.index}, {context_prose(b1, r1)}; "
                       f"the other: batch {b2.index}, {context_prose(b2, r2)}).", w)
    for b, i, q, r in occurrences(h):
        # Attribute a lone divergence to this mechanism only when it was the only one in play; when
        # several were, parity reports it and the pairwise comparisons above tell them apart.
        if single(b, r) and len(mechanisms(b, r)) == 1:
            f.stats["mechanism_active"] += 1
            vs_baseline(f, h, b, i, q, r, f"output differs from plain decoding when {what} is in play",
                        f"Plain decoding has no {what}; the output must not change because of it.")
    exercised = f.stats["pairs"] + f.stats["mechanism_active"] > 0
    return f.result(exercised, f"no two runs of one request differed only in {what}, and it was never active")


@check(title="output does not depend on earlier traffic", severity=Severity.HIGH, bug_class="B",
       applies=lambda c: c.prefix_caching)
def history_independence(h: History, f: CheckRecorder) -> CheckResult:
    """Output does not depend on earlier traffic (cold vs warm cache)."""
    return _independence(f, h, lambda b, r: bool(r.cached_tokens), "cache state")


def _spec_applies(c: Capabilities) -> bool:
    return c.speculation or "speculation" in c.knob_roles.values()


@check(title="output does not depend on the drafter, k or speculation on/off", severity=Severity.HIGH,
       bug_class="C", applies=_spec_applies)
def spec_independence(h: History, f: CheckRecorder) -> CheckResult:
    """Output does not depend on the drafter, k, or whether speculation is on."""
    return _independence(f, h, lambda b, r: bool(r.draft_proposed), "speculation")


@check(title="output does not depend on scheduling", severity=Severity.HIGH, bug_class="D")
def schedule_independence(h: History, f: CheckRecorder) -> CheckResult:
    """Output does not depend on chunk size, token budget, batch composition or arrival order."""
    return _independence(f, h, lambda b, r: chunked(r) or len(b.requests) > 1 or bool(r.preempted),
                         "scheduling (chunking, batching, arrival order)")


@check(title="output unchanged when blocks are evicted and reused", severity=Severity.HIGH, bug_class="D",
       applies=lambda c: c.evicts)
def eviction_safety(h: History, f: CheckRecorder) -> CheckResult:
    """Output unchanged when the cache is too small and blocks are evicted and reused."""
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
    return f.result(f.stats["evicting_batches"] > 0,
                    "no eviction observed (no result reported evictions; snapshot['evictions'] never grew)")
