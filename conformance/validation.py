"""The boundary: every value an engine hands the suite is checked here before it is recorded or checked.

A malformed answer (a string where a count belongs, NaN in a timing, a token outside the vocabulary)
would otherwise crash a check — or, worse, be written into the history as something that is not JSON
and re-read as something else. Each rule raises `EngineError` naming the request and the field, so a
malformed answer is an `error` verdict with a one-line cause, never a pass and never a traceback.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from conformance.contract import FINISH_REASONS, TIMELINE, Baseline, Capabilities, EngineError, Request, Result
from conformance.knobs import KNOB_ROLES


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_finite(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def json_safe(value: Any, where: str) -> None:
    """Raise unless `value` is plain JSON data with finite numbers (what the history can hold)."""
    if value is None or isinstance(value, (bool, str)) or is_int(value):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EngineError(f"{where} is {value!r}, not a finite number")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            json_safe(v, f"{where}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise EngineError(f"{where} has a key {k!r} that is not a string")
            json_safe(v, f"{where}.{k}")
        return
    raise EngineError(f"{where} is a {type(value).__name__}, not JSON data")


def _count(value: Any, where: str) -> None:
    if value is not None and (not is_int(value) or value < 0):
        raise EngineError(f"{where} is {value!r}, not a count (an integer >= 0, or None)")


def _tokens(tokens: Sequence[Any], vocab: int, where: str) -> None:
    for i, t in enumerate(tokens):
        if not is_int(t) or not 0 <= t < vocab:
            raise EngineError(f"{where}[{i}] = {t!r} is not a token id of the vocabulary of {vocab}")


def capabilities(caps: Any) -> Capabilities:
    """The engine's claims must be usable: the strategies size everything from them."""
    if not isinstance(caps, Capabilities):
        raise EngineError(f"capabilities() returned {type(caps).__name__}, not Capabilities")
    for name in ("vocab_size", "max_context", "block_size"):
        value = getattr(caps, name)
        if not is_int(value) or value < 1:
            raise EngineError(f"capabilities().{name} is {value!r}, not a positive integer")
    if caps.eos_id is not None and (not is_int(caps.eos_id) or not 0 <= caps.eos_id < caps.vocab_size):
        raise EngineError(f"capabilities().eos_id is {caps.eos_id!r}, not a token id")
    if not _is_finite(caps.tolerance) or caps.tolerance < 0:
        raise EngineError(f"capabilities().tolerance is {caps.tolerance!r}, not a finite number >= 0")
    if not is_int(caps.logprobs_k) or caps.logprobs_k < 0:
        raise EngineError(f"capabilities().logprobs_k is {caps.logprobs_k!r}, not a count (an integer >= 0)")
    if caps.logprob_epsilon is not None and (not _is_finite(caps.logprob_epsilon) or caps.logprob_epsilon < 0):
        raise EngineError(f"capabilities().logprob_epsilon is {caps.logprob_epsilon!r}, not a finite number >= 0")
    if not isinstance(caps.oracle, str):
        raise EngineError(f"capabilities().oracle is {caps.oracle!r}, not a string")
    json_safe(dict(caps.config_space), "capabilities().config_space")
    if not caps.timeline <= set(TIMELINE):
        raise EngineError(f"capabilities().timeline {sorted(map(str, caps.timeline))} names other than {', '.join(TIMELINE)}")
    marks = caps.landmarks
    for i, path in enumerate(marks.eos_paths):
        _tokens(path.prompt + path.continuation, caps.vocab_size, f"capabilities().landmarks.eos_paths[{i}]")
    for i, tie in enumerate(marks.near_ties):
        _tokens(tie.prompt, caps.vocab_size, f"capabilities().landmarks.near_ties[{i}]")
    for i, (a, b) in enumerate(marks.same_text):
        _tokens(a + b, caps.vocab_size, f"capabilities().landmarks.same_text[{i}]")
        if a == b or not a or not b:
            raise EngineError(f"capabilities().landmarks.same_text[{i}] is not two distinct token sequences")
    for knob in caps.config_space:
        if caps.knob_roles.get(knob) not in KNOB_ROLES:
            raise EngineError(f"capabilities(): knob {knob!r} declares no role in knob_roles "
                              f"(one of {', '.join(KNOB_ROLES)})")
    return caps


def results(requests: Sequence[Request], answer: Any, caps: Capabilities) -> list[Result]:
    """`run()`'s answer: one well-formed `Result` per request, in request order."""
    if not isinstance(answer, (list, tuple)) or len(answer) != len(requests):
        size = len(answer) if hasattr(answer, "__len__") else "?"
        raise EngineError(f"run() returned {type(answer).__name__} of length {size} for {len(requests)} requests")
    for q, r in zip(requests, answer):
        result(q, r, caps)
    return list(answer)


def result(q: Request, r: Any, caps: Capabilities) -> None:
    where = f"request {q.id}"
    if not isinstance(r, Result):
        raise EngineError(f"run() returned {type(r).__name__} for {where}, not Result")
    if r.request_id != q.id:
        raise EngineError(f"result for {r.request_id!r} where {q.id!r} was expected (results out of order)")
    _result_fields(r, where)
    _tokens(r.output, caps.vocab_size, f"{where}: output")
    if r.finish_reason == "refused" and r.output:
        raise EngineError(f"{where}: a refused request has no output, got {len(r.output)} tokens")
    if r.top2 is not None:
        if not isinstance(r.top2, (tuple, list)) or len(r.top2) > len(r.output):
            raise EngineError(f"{where}: top2 must hold at most one entry per output token")
        for i, entry in enumerate(r.top2):
            if (not isinstance(entry, (tuple, list)) or len(entry) != 4 or not is_int(entry[0]) or not is_int(entry[2])
                    or not _is_finite(entry[1]) or not _is_finite(entry[3])):
                raise EngineError(f"{where}: top2[{i}] = {entry!r} is not (id, finite logit, id, finite logit)")
    if r.logprobs is not None:
        logprobs(r.logprobs, r.output, caps, where)
    json_safe(dict(r.extra), f"{where}: extra")


_COUNTS = ("cached_tokens", "draft_proposed", "draft_accepted", "evictions", "prefill_chunks", "arrived_at_step",
           "ended_at_step")


def _result_fields(r: Result, where: str) -> None:
    """The types of a result's fields, which the checks rely on: at the run's boundary (`result`) and in a
    history read back (`recorded`) alike."""
    if r.finish_reason not in FINISH_REASONS:
        raise EngineError(f"{where}: unknown finish_reason {r.finish_reason!r:.80}")
    for name in _COUNTS:
        _count(getattr(r, name), f"{where}: {name}")
    if r.preempted is not None and not isinstance(r.preempted, bool):
        raise EngineError(f"{where}: preempted is {r.preempted!r}, not true, false or None")
    if not isinstance(r.timings, Mapping):
        raise EngineError(f"{where}: timings is a {type(r.timings).__name__}, not a mapping")
    for key, value in r.timings.items():
        if not isinstance(key, str) or not _is_finite(value):
            raise EngineError(f"{where}: timings[{key!r}] = {value!r} is not a finite number")
    if not isinstance(r.extra, Mapping):
        raise EngineError(f"{where}: extra is a {type(r.extra).__name__}, not a mapping")


def logprobs(lps: Any, output: Sequence[int], caps: Capabilities, where: str) -> None:
    """A result's per-position top-k: one entry per output token, each at most k pairs (k + 1 where the
    chosen token lies outside the top-k) of (token id, finite logprob <= 0), sorted best first, distinct
    tokens, the chosen token among them. An engine that declares no k reports none."""
    if caps.logprobs_k < 1:
        raise EngineError(f"{where}: logprobs reported, but capabilities().logprobs_k is {caps.logprobs_k}")
    if not isinstance(lps, (tuple, list)) or len(lps) != len(output):
        raise EngineError(f"{where}: logprobs must hold one entry per output token ({len(output)})")
    for i, (step, chosen) in enumerate(zip(lps, output)):
        at = f"{where}: logprobs[{i}]"
        if not isinstance(step, (tuple, list)) or not 1 <= len(step) <= caps.logprobs_k + 1:
            raise EngineError(f"{at} is not 1 to k + 1 = {caps.logprobs_k + 1} (token, logprob) pairs")
        for pair in step:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not is_int(pair[0]) or not _is_finite(pair[1]):
                raise EngineError(f"{at} holds {pair!r}, not (token id, finite logprob)")
            if not 0 <= pair[0] < caps.vocab_size or pair[1] > 0:
                raise EngineError(f"{at} holds {pair!r}: a token outside the vocabulary or a logprob above 0")
        values = [g for _, g in step]
        if any(a < b for a, b in zip(values, values[1:])):
            raise EngineError(f"{at} is not sorted best first: {values}")
        tokens = [t for t, _ in step]
        if len(set(tokens)) != len(tokens) or chosen not in tokens:
            raise EngineError(f"{at}: tokens {tokens} repeat or lack the chosen token {chosen}")


def baseline(q: Request, b: Any, caps: Capabilities) -> Baseline:
    """The oracle's answer is an engine answer too (the adapter's baseline mode or a reference model)."""
    where = f"baseline for request {q.id}"
    if not isinstance(b, Baseline):
        raise EngineError(f"baseline() returned {type(b).__name__}, not Baseline")
    if b.finish_reason not in FINISH_REASONS:
        raise EngineError(f"{where}: unknown finish_reason {b.finish_reason!r}")
    _tokens(b.output, caps.vocab_size, f"{where}: output")
    _tokens(b.runner_up, caps.vocab_size, f"{where}: runner_up")
    for i, m in enumerate(b.margins):
        if not math.isfinite(m) or m < 0:
            raise EngineError(f"{where}: margins[{i}] = {m!r} is not a finite number >= 0")
    if len(b.contenders) > len(b.output):
        raise EngineError(f"{where}: contenders for {len(b.contenders)} steps, output has {len(b.output)}")
    for i, step in enumerate(b.contenders):
        _tokens([t for t, _ in step], caps.vocab_size, f"{where}: contenders[{i}]")
        if any(not math.isfinite(g) or g < 0 for _, g in step):
            raise EngineError(f"{where}: contenders[{i}] has a gap that is not a finite number >= 0")
    if len(b.logprobs) > len(b.output):
        raise EngineError(f"{where}: logprobs for {len(b.logprobs)} steps, output has {len(b.output)}")
    for i, step in enumerate(b.logprobs):
        _tokens([t for t, _ in step], caps.vocab_size, f"{where}: logprobs[{i}]")
        if any(not math.isfinite(g) or g > 0 for _, g in step):
            raise EngineError(f"{where}: logprobs[{i}] has a logprob that is not a finite number <= 0")
    return b


def snapshot(raw: Any) -> dict[str, Any]:
    """The scalar keys of a white-box snapshot (what the checks read); per-block listings can be
    megabytes per batch, so the history keeps the counts and the engine's own debugging keeps the rest."""
    if not isinstance(raw, Mapping):
        raise EngineError(f"snapshot() returned {type(raw).__name__}, not a mapping")
    out = {str(k): v for k, v in raw.items() if v is None or isinstance(v, (bool, int, float, str))}
    for key, value in out.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise EngineError(f"snapshot()[{key!r}] is {value!r}, not a finite number")
    return out


def recorded(history: Any) -> None:
    """A history read back (`kvparity report`, `kvparity merge`) crosses a boundary again: its values were
    checked here when the run wrote them, but a history whose chain was recomputed after an edit (the chain
    has no secret) can hold anything. The types the checks rely on are checked again, so a string where a
    count belongs is one `EngineError` naming it — it was a traceback from inside a check ("'>' not
    supported between 'str' and 'int'"), a list for an id one from inside the oracle. Types only: the rules
    on values grew over time (top2's length, knob roles), and a history an older run wrote stays readable."""
    meta = history.meta
    checks, engine_args = meta.get("checks"), meta.get("engine_args")
    if checks is not None and not (isinstance(checks, list) and all(isinstance(c, str) for c in checks)):
        raise EngineError(f"run_start checks is {checks!r:.80}, not a list of check names")
    if engine_args is not None and not isinstance(engine_args, Mapping):
        raise EngineError(f"run_start engine_args is a {type(engine_args).__name__}, not a mapping")
    for name in ("duration_s", "engine_s"):
        value = (history.ended or {}).get(name)
        if value is not None and not _is_finite(value):
            raise EngineError(f"run_end {name} is {value!r:.80}, not a finite number")
    caps = history.capabilities
    if caps is not None:
        for name in ("vocab_size", "max_context", "block_size"):
            if not is_int(getattr(caps, name)):
                raise EngineError(f"capabilities {name} is {getattr(caps, name)!r:.80}, not an integer")
        if not _is_finite(caps.tolerance):
            raise EngineError(f"capabilities tolerance is {caps.tolerance!r:.80}, not a finite number")
    for ex in history.examples:
        for b in ex.batches:
            for q in b.requests:
                if not isinstance(q.id, str):
                    raise EngineError(f"example {ex.index}: a request id is {q.id!r:.80}, not a string")
            for q, r in zip(b.requests, b.results):
                _recorded_result(q, r)
            if b.snapshot is not None:
                snapshot(b.snapshot)
        for fb in ex.failed_batches:
            snapshot(fb.snapshot)


def _recorded_result(q: Request, r: Result) -> None:
    """`result`'s field types, and the shapes of what it checks further against the engine's claims."""
    where = f"request {q.id}"
    _result_fields(r, where)
    if not all(is_int(t) for t in r.output):
        raise EngineError(f"{where}: output holds what is not a token id")
    for name in ("top2", "logprobs"):
        if getattr(r, name) is not None and not isinstance(getattr(r, name), (tuple, list)):
            raise EngineError(f"{where}: {name} is a {type(getattr(r, name)).__name__}, not a list")
