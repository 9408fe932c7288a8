"""`kvparity export WITNESS --minimal`: the steps and one assertion, about fifteen lines of text — what
someone pastes into an upstream issue, beside the full reproducer.

Engine-neutral pseudo-Python over the Engine contract's calls (configure, reset, run), with token ids
and the expected outputs of plain greedy decoding from the plan (kvparity/commands/export/plan.py). The
one assertion is the witness's own claim on the request that most plausibly breaks it, worked out
from the plan alone (no engine runs here): for isolation, the last request sharing more leading tokens
with another identity's traffic than with its own; for prefix_only, the last request; for exercised, the
last exact repeat; for an output claim, the last request's expected tokens. The full reproducer
(`--out`) checks every claim on every request.
"""

from __future__ import annotations

import json
from typing import Any

from conformance.history_facts import lcp  # the prefix length the isolation check itself measures

OUTPUT_CHECKS = ("parity", "history_independence", "spec_independence", "schedule_independence",
                 "eviction_safety")


def _request(q: dict[str, Any]) -> str:
    ident = q["identity"]
    extra = "".join(f", {k}={json.dumps(ident[k])}" for k in ("salt", "adapter", "adapter_digest")
                    if ident.get(k) is not None)
    if ident.get("revision") not in (None, "a"):
        extra += f", revision={json.dumps(ident['revision'])}"
    stop = f", stop_ids={q['stop_ids']}" if q["stop_ids"] else ""
    return f"Request({json.dumps(q['id'])}, prompt={q['prompt']}, max_tokens={q['max_tokens']}{stop}{extra})"


def _key(q: dict[str, Any]) -> tuple:
    i = q["identity"]
    return (i.get("revision"), i.get("adapter"), i.get("adapter_digest"), i.get("salt"))


def _assertion(plan: dict[str, Any]) -> str:
    """The one assertion: `b<batch>[<position>]` names a result of the run() call of that batch."""
    check = plan["witness"]["check"]
    seen: list[tuple[tuple, list[int]]] = []
    prompts: set[tuple] = set()
    chosen: dict[str, Any] = {}
    for step in plan["steps"]:
        if step["step"] == "reset":
            seen, prompts = [], set()
        if step["step"] != "batch":
            continue
        for pos, q in enumerate(step["requests"]):
            where = f"b{step['index']}[{pos}]"
            same = max((lcp(q["prompt"], s) for k, s in seen if k == _key(q)), default=0)
            other = max((lcp(q["prompt"], s) for k, s in seen if k != _key(q)), default=0)
            if check == "isolation" and (other > same or not chosen):
                chosen = {"line": f"assert {where}.cached_tokens <= {same}  # {q['id']} shares {same} leading "
                                  f"tokens with its own identity's earlier traffic ({other} with another's)"}
            elif check == "exercised" and (_key(q), tuple(q["prompt"])) in prompts:
                chosen = {"line": f"assert {where}.cached_tokens > 0  # {q['id']} repeats an earlier prompt "
                                  f"exactly: the prefix cache must hit"}
            elif check == "prefix_only":
                chosen = {"line": f"assert {where}.cached_tokens <= {len(q['prompt']) - 1}  # the last prompt "
                                  f"token is always computed"}
            elif check not in ("isolation", "exercised", "prefix_only"):
                expected = q["expected"]
                chosen = {"line": f"assert {where}.output == {expected['output']}  # plain greedy decoding "
                                  f"(finish_reason {expected['finish_reason']!r})"}
            seen += [(_key(q), list(q["prompt"])), (_key(q), list(q["prompt"]) + q["expected"]["output"])]
        prompts |= {(_key(q), tuple(q["prompt"])) for q in step["requests"]}
    return chosen.get("line", "# (no request to assert on)")


def minimal(plan: dict[str, Any]) -> str:
    """The steps and one assertion, a line each."""
    w = plan["witness"]
    title = f" ({w['title']})" if w.get("title") else ""
    lines = [f"# kvparity witness {w['file']}: [{w['check']}]{title}",
             f"# engine {w['engine']} {json.dumps(w['engine_args'])}; greedy (temperature 0), token ids, "
             f"a cold prefix cache",
             "engine.reset()"]
    for step in plan["steps"]:
        if step["step"] == "configure":
            lines.append(f"engine.configure({json.dumps(step['config'])})")
        elif step["step"] == "reset":
            lines.append("engine.reset()  # flush the prefix cache")
        else:
            reqs = ", ".join(_request(q) for q in step["requests"])
            lines.append(f"b{step['index']} = engine.run([{reqs}])")
    lines.append(_assertion(plan))
    return "\n".join(lines) + "\n"
