"""Does the bug need anything but the request? Each failing request sent again, alone, after a reset.

A failure is found wherever the stream happened to be: in a batch of two, after another identity's
traffic, on a warm cache. Which of that was needed is the first thing an engine developer asks, and
what the report's root cause and a finding's signature (conformance.signature) must not guess: one bug
found in a batch on one engine version and after another identity's warm-up on the next signed as two
bugs (F3 of reports/transformers/known.json did: as scheduling on 4.46.3, as isolation on 5.14.0), and
a planted off-by-one was headed "critical isolation" when no identity was involved.

So the oracle is asked, not the heuristics: after the stream, while the engine is still up, each
failing request is sent once more, alone, after a reset (the contract's fresh state), under the
configuration it failed in (its
drafter, k, chunk size stay: they are the request's setting, not traffic). That is an ordinary example,
recorded and checked like any other, whose `example` event carries `alone`: the (example, request)
pairs it re-sends. Where the lone request fails too, the grouping folds every finding about the pairs
it re-sends into the lone request's own (`fold`): one bug, one finding, the smallest witness shown,
listed under what was in play for the lone request (speculation, chunking, or nothing: parity), and
signed as the lone request — the same bug from any context, seed or engine version signs once.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from conformance.contract import EngineError, Request
from conformance.history import BatchRecord, Example, History
from conformance.scenario import Batch, Configure

MAX_PROBES = 8  # lone re-sends per run: one per distinct failing request, the findings' order first


def _request_of(history: History, failure: Any) -> tuple[Example, BatchRecord, Request] | None:
    w = failure.witness
    req = w.get("request")
    ex = next((e for e in history.examples if e.index == failure.example), None)
    batch = w.get("batch")
    if ex is None or ex.alone is not None or not isinstance(req, Mapping) or not isinstance(batch, int):
        return None
    if not 0 <= batch < len(ex.batches):
        return None
    b = ex.batches[batch]
    q = next((q for q in b.requests if q.id == req.get("id")), None)
    return None if q is None else (ex, b, q)


def probes(history: History, findings: Sequence[Any]) -> list[Any]:
    """The lone re-sends for `findings` (grouping's, in the report's order): one scenario per distinct
    failing request (prompt, max_tokens, stop ids, identity, configuration), at most MAX_PROBES, each
    marked with the (example, request) pairs it re-sends. Timing (arrival, abort) is left out: alone
    means plain."""
    from conformance.completion import MarkedScenario

    by_key: dict[tuple, tuple[Request, dict[str, Any], list[list[Any]]]] = {}
    for fd in findings:
        for failure in fd.failures:  # the record shown is one of them
            found = _request_of(history, failure)
            if found is None:
                continue
            ex, b, q = found
            config = dict(b.config)
            key = (q.prompt, q.max_tokens, q.stop_ids, q.identity, repr(sorted(config.items())))
            if key not in by_key and len(by_key) >= MAX_PROBES:
                continue
            _, _, pairs = by_key.setdefault(key, (q, config, []))
            if [ex.index, q.id] not in pairs:
                pairs.append([ex.index, q.id])
    out = []
    for q, config, pairs in by_key.values():
        lone = Request("alone", q.prompt, q.max_tokens, q.stop_ids, q.identity)
        steps = ((Configure(config),) if config else ()) + (Batch((lone,)),)
        out.append(MarkedScenario(steps, {"alone": pairs}))
    return out


def run_probes(runner: Any, history: History, findings: Sequence[Any], examples: int) -> int:
    """Run `probes(history, findings)` as the run's next examples; the example count after them. An
    engine that breaks on one has its `error` recorded (the run's verdict is then error) and no more
    are sent."""
    for scenario in probes(history, findings):
        try:
            runner.run(scenario, examples)
        except EngineError:
            return examples + 1
        examples += 1
    return examples


def fold(history: History, findings: list[Any], merge: Any) -> list[Any]:
    """Each finding about a request that a lone re-send reproduced, folded into the lone request's own
    finding (`merge(lone, other)` builds the merged one). A lone re-send that passed folds nothing: its
    context was needed, and the finding stays as it was found."""
    resent = {ex.index: ex.alone for ex in history.examples if ex.alone}
    lone_of: dict[tuple[int, str], int] = {}  # (example, request id) -> index in `findings` of the lone finding
    for i, fd in enumerate(findings):
        req = fd.failure.witness.get("request")
        if fd.failure.example in resent and isinstance(req, Mapping) and req.get("id") == "alone":
            for pair in resent[fd.failure.example]:
                lone_of.setdefault(pair, i)
    if not lone_of:
        return findings
    merged: dict[int, Any] = {}
    kept = []
    for i, fd in enumerate(findings):
        req = fd.failure.witness.get("request")
        target = lone_of.get((fd.failure.example, req.get("id"))) if isinstance(req, Mapping) else None
        if target is None or target == i:
            kept.append(i)
            continue
        merged[target] = merge(merged.get(target, findings[target]), fd)
    return [merged.get(i, findings[i]) for i in kept]
