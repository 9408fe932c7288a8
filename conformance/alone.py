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
pairs it re-sends. Where the lone request fails too, with the same answer, the grouping folds every
finding about the pairs it re-sends into the lone request's own (`fold`): one bug, one finding, the smallest witness shown,
listed under what was in play for the lone request (speculation, chunking, or nothing: parity), and
signed as the lone request — the same bug from any context, seed or engine version signs once.

Where a failing request's batch held another identity's request and the lone re-send does not fold it,
one more question decides whether the bug is about identities (a base request decoded with a LoRA in a
mixed batch) or about batching (any batch of one tenant would do): the batch (after the batch that wrote
the KV it read, for a cache hit) is sent again after a reset, under its configuration, twice — whole
(`rebatch`), and with every request under the failing one's identity (`kin`: the same prompts, sizes and
order, so only the identities differ) —, the failing request named "probe" in both (`context_probes`).
Whole it fails and under one identity it passes: the finding needed another identity in its batch, and
its signature says so (conformance.signature), so a known LoRA batch-mixing finding no longer waives
every scheduling bug of an engine. Their answers are read from the history; they are not judged (a
run's analysis keeps the last failure of each check and title, and theirs would displace the run's own:
conformance.analysis).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from attrs import evolve

from conformance.contract import EngineError, Request
from conformance.history import BatchRecord, Example, History
from conformance.localise import kv_writer
from conformance.oracle import DIVERGE, FINISH, compare
from conformance.scenario import Batch, Configure

MAX_PROBES = 8  # re-sends of each kind per run: one per distinct failing request, the findings' order first


def _request_of(history: History, failure: Any) -> tuple[Example, BatchRecord, Request] | None:
    w = failure.witness
    req = w.get("request")
    ex = next((e for e in history.examples if e.index == failure.example), None)
    batch = w.get("batch")
    if ex is None or _probe(ex) or not isinstance(req, Mapping) or not isinstance(batch, int):
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


PROBE = "probe"  # the failing request's id in a context probe


def _probe(ex: Example) -> bool:
    return ex.alone is not None or ex.kin is not None or ex.rebatch is not None


def context_probes(history: History, findings: Sequence[Any]) -> list[Any]:
    """For each finding shown by a request of the stream whose batch (or, for a cache hit, its KV writer's:
    `_context`) held another identity's request (a lone re-send that failed has folded its finding
    already: those show the lone request): those batches whole, and with every request under the failing
    one's identity (the same prompts, sizes and order: only the identities differ), each after a reset,
    under its configuration, timelines dropped, marked `rebatch` / `kin` with the pair it re-sends; at
    most MAX_PROBES findings."""
    from conformance.completion import MarkedScenario

    out: list[Any] = []
    seen: set[tuple] = set()
    for fd in findings:
        found = _request_of(history, fd.failure)
        if found is None or len(seen) >= MAX_PROBES:
            continue
        ex, b, q = found
        batches = _context(ex, b, q)
        if all(o.identity == q.identity for x in batches for o in x.requests):
            continue
        key = (ex.index, b.index, q.id)
        if key in seen:
            continue
        seen.add(key)
        pairs = [[ex.index, q.id]]
        whole = [tuple(Request(PROBE if x is b and o.id == q.id else o.id, o.prompt, o.max_tokens, o.stop_ids,
                               o.identity) for o in x.requests) for x in batches]
        config = (Configure(dict(b.config)),) if b.config else ()
        out.append(MarkedScenario(config + tuple(Batch(x) for x in whole), {"rebatch": pairs}))
        out.append(MarkedScenario(config + tuple(Batch(tuple(evolve(o, identity=q.identity) for o in x))
                                                 for x in whole), {"kin": pairs}))
    return out


def _context(ex: Example, b: BatchRecord, q: Request) -> list[BatchRecord]:
    """The batches a context probe re-sends: the request's own, after the batch of the earlier request
    whose KV it likeliest read (a cache hit: `localise.kv_writer`), so KV written beside another identity
    and served later is asked about too."""
    r = next((r for o, r in zip(b.requests, b.results) if o.id == q.id), None)
    writer = kv_writer(ex, b, q) if r is not None and r.cached_tokens else None
    first = next((x for x in ex.batches if writer is not None and any(o is writer[0] for o in x.requests)), None)
    return [b] if first is None or first is b else [first, b]


def probe_wrong(history: History, ex: Example) -> bool | None:
    """Did the probe request of a context probe answer other than plain decoding (None: no answer)?"""
    for b in ex.batches:
        for q, r in zip(b.requests, b.results):
            if q.id == PROBE and r.finish_reason not in ("abort", "refused"):
                base = history.baseline_for(q)
                return None if base is None else \
                    compare(base, r.output, r.finish_reason, history.tolerance).kind in (DIVERGE, FINISH)
    return None


def needed_another_identity(history: History, finding: Any) -> bool:
    """Did the context probes of the finding's request say it needs another identity in its batch: re-sent
    whole, its answer was wrong again; under one identity, right? Read from the probes' own answers."""
    req = finding.failure.witness.get("request")
    pair = (finding.failure.example, req.get("id") if isinstance(req, Mapping) else None)
    whole = [probe_wrong(history, e) for e in history.examples if e.rebatch and pair in e.rebatch]
    kin = [probe_wrong(history, e) for e in history.examples if e.kin and pair in e.kin]
    return bool(whole) and bool(kin) and all(x is True for x in whole) and all(x is False for x in kin)


def run_probes(runner: Any, history: History, findings: Sequence[Any], examples: int,
               make: Any = None) -> int:
    """Run `(make or probes)(history, findings)` as the run's next examples; the example count after
    them. An engine that breaks on one has its `error` recorded (the run's verdict is then error) and
    no more are sent."""
    for scenario in (make or probes)(history, findings):
        try:
            runner.run(scenario, examples)
        except EngineError:
            return examples + 1
        examples += 1
    return examples


def _answer(history: History, example: int, rid: str) -> tuple | None:
    """The answer (output, finish reason) request `rid` got in example `example`; None if it has none."""
    ex = next((e for e in history.examples if e.index == example), None)
    for b in ex.batches if ex is not None else ():
        for _, q, r in b.pairs():
            if q.id == rid:
                return tuple(r.output), r.finish_reason
    return None


def fold(history: History, findings: list[Any], lone_failures: Mapping[int, Sequence[Any]],
         merge: Any, reproduced: Any) -> list[Any]:
    """Each finding about a request that a lone re-send reproduced, folded into the finding that shows
    the lone request's failure (`merge(shown, other)`), which says, per re-sent request, that it fails
    alone (`reproduced(shown, (example, request id), check there)`). A lone re-send that passed folds
    nothing: its context was needed, and the finding stays as it was found.

    Reproduced means the lone request failed AND gave the very answer (output, finish reason) the
    request gave where it failed: one bug, shown again. A lone re-send that fails differently shows
    another bug (a request wrong on a cache hit in context and wrong under its speculation setting alone
    is two bugs, two findings), and folds nothing.

    `lone_failures`: each lone example's own failures (example index -> failures), read from its answers,
    not from `findings`: a run keeps one failure per check and title, the last, so a lone re-send often
    displaces the very failure it reproduces (same check, same title), and lone re-sends failing the
    same way keep only the last of them. The finding showing a lone failure is the one holding its
    check and title."""
    holder = {(f.check, f.title): i for i, fd in enumerate(findings) for f in fd.failures}
    lone_of: dict[tuple[int, str], int] = {}  # (example, request id) -> index of the finding showing it alone
    for ex in history.examples:
        shown = [holder[f.check, f.title] for f in lone_failures.get(ex.index, ()) if (f.check, f.title) in holder]
        lone = _answer(history, ex.index, "alone") if shown else None
        for pair in (ex.alone or ()) if lone is not None else ():
            if _answer(history, *pair) == lone:
                lone_of.setdefault(pair, shown[0])
    out = dict(enumerate(findings))
    found = {}
    for i, fd in enumerate(findings):
        req = fd.failure.witness.get("request")
        pair = (fd.failure.example, req.get("id")) if isinstance(req, Mapping) else None
        if pair in lone_of and lone_of[pair] != i:
            found[pair] = fd.check
            target = lone_of[pair]
            out[target] = merge(out[target], fd)
            del out[i]
    for pair, target in lone_of.items():
        if target in out:
            out[target] = reproduced(out[target], pair, found.get(pair, out[target].check))
    return list(out.values())
