"""The vacuity guard and the positive control: a run that never exercised what the engine claims
(no hit, no accepted draft, no chunked prefill, no eviction, no cross-identity attempt) proves nothing
about it, so it is *inconclusive*, not a pass; and an exact same-identity repeat must hit when the
engine reports cached tokens at all (else the count, or the cache, is broken)."""

from __future__ import annotations

from conformance import situations
from conformance.checks.common import request_json
from conformance.checks.registry import CheckRecorder, check
from conformance.history import History
from conformance.history_facts import (batch_evicted, caching_disabled, chunked, config_block_size,
                                       is_cross_identity_attempt, reuse_scan)
from conformance.verdicts import FAIL, INCONCLUSIVE, PASS, CheckResult, Severity


def _positive_control_alone(h: History, f: CheckRecorder) -> CheckResult:
    """`exercised` within one example: only the positive control can fail there (coverage is the run's)."""
    caps = h.capabilities
    if caps is not None and caps.prefix_caching and caps.reports_cached_tokens:
        _positive_control(f, h)
    return CheckResult(f.spec.name, FAIL if f.failures else PASS, f.failures, f.notes, dict(f.stats))


@check(title="the run exercised every claimed capability", severity=Severity.MEDIUM, bug_class="E", scope="run",
       per_example=_positive_control_alone)
def exercised(h: History, f: CheckRecorder) -> CheckResult:
    """Vacuity guard and positive control: claimed-but-never-exercised capabilities make the run inconclusive."""
    caps = h.capabilities
    if caps is None:
        return CheckResult(f.spec.name, INCONCLUSIVE, notes=("no capabilities recorded",))
    for b in h.batches():
        f.stats["evictions"] += int(batch_evicted(b))
        for q, r in zip(b.requests, b.results):
            f.stats["results"] += 1
            f.stats["cached_tokens"] += r.cached_tokens or 0
            f.stats["drafts_accepted"] += r.draft_accepted or 0
            f.stats["chunked"] += int(chunked(r))
    for b, i, q, r, same, other in reuse_scan(h):
        f.stats["cross_identity_attempts"] += int(is_cross_identity_attempt(same, other, caps))
    gaps = []
    if caps.prefix_caching and caps.reports_cached_tokens and not f.stats["cached_tokens"]:
        gaps.append("prefix caching claimed but no cached token was ever reported")
    if caps.speculation and caps.reports_drafts and not f.stats["drafts_accepted"]:
        gaps.append("speculation claimed but no draft token was ever accepted")
    if caps.speculation and caps.reports_drafts:
        gaps += _undrafted_settings(h, f)
    if caps.evicts and not f.stats["evictions"]:
        gaps.append("eviction claimed but none observed")
    if caps.chunked_prefill and not f.stats["chunked"]:
        gaps.append("chunked prefill claimed but no prefill was chunked (no result reported prefill_chunks > 1)")
    if caps.identities and not f.stats["cross_identity_attempts"]:
        gaps.append("identities claimed but no identity ever sent another identity's prefix")
    # Every other situation a claim makes relevant (conformance/situations.py) must have occurred too;
    # the five above keep their own words.
    # One the strategies could not steer to (its landmarks were not found) says so; the user may accept
    # that (`kvparity run --accept-unsteered`): noted, no longer inconclusive.
    said = {"prefix_hit", "accepted_draft", "eviction", "chunked_prefill", "cross_identity_attempt"}
    for row in situations.coverage(h):
        f.stats[f"situation:{row.name}"] = row.count
        if row.relevant and not row.count and row.name not in said:
            why = f"situation never reached: {row.name} ({row.title}; relevant to {row.claim})"
            if row.steering and caps.landmarks.unsteered_accepted:
                f.note(f"{why}: {row.steering}, accepted by --accept-unsteered")
            else:
                gaps.append(f"{why}: {row.steering}" if row.steering else why)
    done = h.completion or {}
    if gaps and done.get("unreached"):  # coverage completion went after them too (conformance/completion.py)
        gaps.append(f"situation never reached, not after {done.get('examples', 0)} completion example(s) either: "
                    f"{', '.join(done['unreached'])}")
    if caps.prefix_caching and caps.reports_cached_tokens:
        _positive_control(f, h)
    for gap in gaps:
        f.note(gap)
    status = FAIL if f.failures else (INCONCLUSIVE if gaps or not f.stats["results"] else PASS)
    return CheckResult(f.spec.name, status, f.failures, f.notes, dict(f.stats))


def _undrafted_settings(h: History, f: CheckRecorder) -> list[str]:
    """Each speculation setting the run served (the values of the speculation knobs in a configuration,
    none of them one of the knob's `off` values) must have drafted at least once: the engine declares
    each as a way to speculate, and a PASS under a setting that never proposed a draft says nothing
    about it — nor tells a drafter that is silently off, or a knob the engine ignores, from a working
    one. Only requests that decoded a second token count (the first comes from the prefill, with no
    draft possible) and that report a draft count (None: the engine does not speculate on that path, or
    does not say); a setting with none had no chance to draft, or no way to show it, and is not judged."""
    knobs = [k for k in h.capabilities.knobs if k.role == "speculation"]  # type: ignore[union-attr]
    served: dict[tuple, int] = {}
    drafted: set[tuple] = set()
    for b in h.batches() if knobs else ():
        config = b.config or {}
        if any(k.name not in config or k.switches_off(config[k.name]) for k in knobs):
            continue  # speculation off, or a setting the history does not name
        setting = tuple((k.name, config[k.name]) for k in knobs)
        for r in b.results:
            if len(r.output) > 1 and r.draft_proposed is not None:
                served[setting] = served.get(setting, 0) + 1
                if r.draft_proposed:
                    drafted.add(setting)
    f.stats["speculation_settings"] = len(served)
    return [f"speculation setting {', '.join(f'{k}={v}' for k, v in setting)} never proposed a draft "
            f"({n} request(s) decoded past their first token under it; a value that means no speculation "
            f"belongs in its knob's `off`)"
            for setting, n in served.items() if setting not in drafted]


def _positive_control(f: CheckRecorder, h: History) -> None:
    """A same-identity exact repeat of a long-enough prompt, in a later batch of the same cache epoch and
    configuration, with no eviction in between, must report a hit."""
    caps = h.capabilities
    assert caps is not None
    for ex in h.examples:
        seen: dict[tuple, int] = {}
        state = None
        for b in ex.batches:
            evicted = batch_evicted(b)
            if (b.epoch, b.segment) != state or evicted or caching_disabled(caps, b.config):
                seen, state = {}, (b.epoch, b.segment)
                if evicted or caching_disabled(caps, b.config):
                    continue
            bs = config_block_size(b.config, caps.block_size)
            for i, q, r in b.pairs():
                key = (q.identity, q.prompt)
                long_enough = len(q.prompt) > max(caps.min_hit_prompt, caps.block_size, bs)
                if key in seen and long_enough and r.cached_tokens == 0:
                    f.stats["positive_control_misses"] += 1
                    f.fail(b.example, "exact repeat reported no cache hit",
                           f"Request {q.id} repeats the {len(q.prompt)}-token prompt of batch {seen[key]} under the "
                           f"same identity and configuration with no reset or eviction in between, yet reported 0 "
                           f"cached tokens: either the prefix cache is not working or its count is not reported.",
                           {"batch": b.index, "earlier_batch": seen[key], "request": request_json(q),
                            "config": b.config})
                elif key in seen and long_enough:
                    f.stats["positive_controls"] += 1
            for q, r in zip(b.requests, b.results):
                if r.finish_reason != "abort":  # an aborted request may have written no full block
                    seen.setdefault((q.identity, q.prompt), b.index)
