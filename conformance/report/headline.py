"""A finding's headline: the one sentence an engine developer would write as an issue title.

"[spec_independence] output depends on speculation" names a check, not a bug; a developer files
"Output differs from plain decoding after a prefix-cache hit (request r3, position 4)". The headline says
what is wrong (against plain decoding where the finding has a divergence), in which situation (the
mechanism of the check it is listed under, as the failing request met it) and where (request, output
position or batch). Built from a finding's results.json entry alone, so a re-rendered report says the same.
"""

from __future__ import annotations

from typing import Any, Mapping


def _focus_line(story: Mapping[str, Any]) -> Mapping[str, Any]:
    focus = story.get("focus") or {}
    for step in story.get("timeline", ()):
        if step.get("batch") == focus.get("batch"):
            for ln in step.get("requests", ()):
                if ln.get("request") == focus.get("request"):
                    return {**ln, "batch_size": len(step.get("requests", ()))}
    return {}


def _situation(check: str, ln: Mapping[str, Any], story: Mapping[str, Any]) -> str:
    """The mechanism of `check` as the failing request met it, as a phrase ("after a prefix-cache hit")."""
    cached, chunks, size = ln.get("cached_tokens"), ln.get("prefill_chunks"), ln.get("batch_size", 1)
    if check == "isolation":
        other = (story.get("reused") or {}).get("identity")
        return f"after reusing another identity's KV ({other})" if other else "after reusing another identity's KV"
    if check in ("history_independence", "prefix_only"):
        return f"after a prefix-cache hit ({cached} cached tokens)" if cached else "depending on earlier requests"
    writer = (ln.get("same") or {}).get("request")
    if check == "spec_independence":
        if not ln.get("draft_proposed") and cached and writer:
            return f"after a prefix-cache hit on KV that {writer} wrote with speculative decoding"
        return "with speculative decoding"
    if check == "schedule_independence":
        if isinstance(chunks, int) and chunks > 1:
            return f"when the prompt is prefilled in {chunks} chunks"
        if cached and writer:
            return f"after a prefix-cache hit on KV that {writer} wrote with chunked prefill"
        return f"in a batch of {size} requests" if size > 1 else "depending on scheduling"
    if check == "eviction_safety":
        return "after blocks were evicted"
    in_play = [p for p, on in (("a prefix-cache hit", bool(cached)), ("speculative decoding", bool(ln.get("draft_proposed"))),
                               ("chunked prefill", isinstance(chunks, int) and chunks > 1),
                               (f"a batch of {size}", size > 1), ("preemption", bool(ln.get("preempted")))) if on]
    return "with " + " and ".join(in_play) if in_play else ""


def headline(finding: Mapping[str, Any]) -> str:
    """One sentence: what is wrong, in which situation, where."""
    story = finding.get("story") or {}
    focus = story.get("focus") or {}
    d = story.get("divergence")
    ln = _focus_line(story)
    where = [f"request {focus['request']}"] if focus.get("request") else []
    reused = story.get("reused") or {}
    if d is None and finding.get("check") == "isolation" and reused.get("identity"):
        cached = ln.get("cached_tokens")
        return (f"Request {focus.get('request')} ({ln.get('identity')}) was served KV cached for another identity "
                f"({reused['identity']}, request {reused.get('request')})"
                + (f": {cached} prompt tokens reported cached" if isinstance(cached, int) else "")
                + f" (batch {focus.get('batch')})")
    if d is None:
        title = str(finding.get("title", "failure"))
        if focus.get("batch") is not None:
            where.append(f"batch {focus['batch']}")
        return f"{title[:1].upper()}{title[1:]} ({', '.join(where)})" if where else title[:1].upper() + title[1:]
    position = d.get("position")
    where.append(f"position {position}" if isinstance(position, int) else "finish reason")
    what = "Output differs from plain decoding"
    if d.get("pairwise"):
        wrong = d.get("wrong")
        what = {"got": "A repeated request's output differs from plain decoding",
                "expected": "A request's first run differs from plain decoding (its repeat is right)",
                "both": "Both runs of a repeated request differ from plain decoding"}.get(
            str(wrong), "Two runs of the same request give different outputs")
    elif not isinstance(position, int):
        what = "Finish reason differs from plain decoding"
    situation = _situation(str(finding.get("check")), ln, story)
    return " ".join(x for x in (what, situation) if x) + f" ({', '.join(where)})"
