"""A finding told as a story: what happened step by step, where the output went wrong, and whose KV
was reused.

An engine developer reading a failure needs, in this order: the requests that led to it (a timeline:
each step, each request's identity, prompt length, the prefix it shared with earlier requests and with
which one, the cached tokens the engine reported, its output), the first divergence as expected vs got
*aligned* token by token and as decoded text, with the baseline's top-1/top-2 margin there (is it a
near-tie or a confident token?), and for a suspected leak the identity and request whose KV was
reused. The raw witness stays one click away, folded.

`story(history, finding)` builds that as JSON (it lands in results.json, so a report rendered later
needs neither the engine nor the history); `blocks(story, texts)` renders it. Decoded text comes from
`texts` — token ids -> text, recorded at run time by the adapter's optional `decode` hook — because
conformance imports no tokenizer: where the adapter has none, the story shows ids only and says so.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

from conformance.history_facts import chunked
from conformance.grouping import RootCause, cross_identity_reuse, epoch_evicted
from conformance.history import Example, History
from conformance.history_codec import request_from
from conformance.report.below_argmax import deviation_blocks
from conformance.report.doc import Block, Cell, Code, Fold, Para, Table
from conformance.timeline import TimelineStep, find_line, timeline

WINDOW_BEFORE, WINDOW_AFTER = 4, 6  # aligned positions shown around the first divergence
MAX_LINES_PER_BATCH = 8  # a flood of 64 requests shows its first ones and the one that failed
PROMPT_TAIL = 48  # prompt tokens decoded for the focus request (its end is what the model continued)


def text_key(ids: Iterable[int]) -> str:
    return " ".join(str(int(t)) for t in ids)


# --------------------------------------------------------------------------- the story as data


def _example(history: History, index: int) -> Example | None:
    return next((ex for ex in history.examples if ex.index == index), None)


def _divergence(history: History, w: Mapping[str, Any]) -> dict[str, Any] | None:
    """Expected vs got at the first divergence, with the baseline margins along the expected output."""
    if "first_divergent_position" not in w or not isinstance(w.get("request"), Mapping):
        return None
    pairwise = w.get("expected_output") is None and w.get("earlier_output") is not None
    expected = w.get("earlier_output") if pairwise else w.get("expected_output")
    if expected is None:
        return None
    base = history.baseline_for(request_from(w["request"]))
    comparison = w.get("comparison") or {}
    got = list(w.get("output", []))
    return {"position": w.get("first_divergent_position"), "expected": list(expected), "got": got,
            "expected_from": (f"the same request's other run, batch {w.get('earlier_batch')}" if pairwise
                              else "plain greedy decoding"),
            "pairwise": pairwise, "earlier_batch": w.get("earlier_batch"), "batch": w.get("batch"),
            "baseline": list(base.output) if base is not None else None,
            "wrong": _wrong_side(base.output if base is not None else None, list(expected), got, pairwise),
            "margin": w.get("baseline_margin"), "margins": list(base.margins) if base is not None else [],
            "kind": comparison.get("kind"), "expected_finish": comparison.get("expected_finish"),
            "got_finish": comparison.get("got_finish"), "tolerance": history.tolerance,
            "deviations": w.get("logprob_deviations"), "epsilon": w.get("logprob_epsilon"),
            "deviation_position": w.get("logprob_position")}


def _wrong_side(baseline: Sequence[int] | None, expected: list[int], got: list[int], pairwise: bool) -> str | None:
    """Which run differs from plain decoding: "got" (the run that failed), "expected" (a pair check's
    earlier run), "both", or None (no baseline recorded, or only the finish reasons differ). A pair
    check compares two runs of the engine; plain decoding beside them says which one is wrong."""
    if baseline is None:
        return None
    base = list(baseline)
    got_off, exp_off = got != base, pairwise and expected != base
    return "both" if got_off and exp_off else "got" if got_off else "expected" if exp_off else None


def _plain(history: History, line: Any, req: Mapping[str, Any]) -> dict[str, Any] | None:
    """For a finding with no divergence (a leak of KV, a wrong count): the request's output beside plain
    decoding, so the reader sees whether the tokens were right."""
    if line is None or line.output is None or not req:
        return None
    base = history.baseline_for(request_from(req))
    if base is None:
        return None
    return {"baseline": list(base.output), "output": list(line.output), "equal": list(base.output) == list(line.output)}


def _mechanisms(history: History, ex: Example, batch: Any, request: Any) -> list[str]:
    b = ex.batches[batch] if isinstance(batch, int) and 0 <= batch < len(ex.batches) else None
    if b is None:
        return []
    r = next((r for q, r in zip(b.requests, b.results) if q.id == request), None)
    if r is None:
        return []
    out = []
    if r.cached_tokens:
        out.append(f"prefix cache ({r.cached_tokens} prompt tokens reported cached)")
    if r.draft_proposed:
        out.append(f"speculation ({r.draft_proposed} draft tokens proposed, {r.draft_accepted or 0} accepted)")
    if chunked(r):
        out.append(f"chunked prefill ({r.prefill_chunks} chunks)")
    if len(b.requests) > 1:
        out.append(f"batching ({len(b.requests)} requests in the batch)")
    if r.preempted:
        out.append("preemption")
    if epoch_evicted(ex, b):
        out.append("eviction (blocks evicted in this cache epoch)")
    return out


def story(history: History, finding: RootCause) -> dict[str, Any]:
    """The finding's timeline, focus request, divergence, KV reuse and mechanisms in play, as JSON."""
    f = finding.failure
    w = f.witness
    req = w.get("request") if isinstance(w.get("request"), Mapping) else {}
    ex = _example(history, f.example)
    steps: list[TimelineStep] = timeline(ex) if ex is not None else []
    line = find_line(steps, w.get("batch"), req.get("id"))
    reused = None
    if line is not None and line.other.tokens > 0:
        reused = {**line.other.to_json(), "same_tokens": line.same.tokens, "same_request": line.same.request,
                  "cached_tokens": line.cached_tokens, "cross_identity_reuse": cross_identity_reuse(line)}
    # the divergence of the finding: the shown record's, else another record's of the same request (a
    # leak's count failure has none, the parity failure of the same request has)
    divergence = next((d for d in (_divergence(history, x.witness) for x in (f, *finding.failures)) if d), None)
    return {"example": f.example, "focus": {"batch": w.get("batch"), "request": req.get("id")},
            "timeline": [s.to_json() for s in steps], "divergence": divergence,
            "plain": None if divergence is not None else _plain(history, line, req),
            "reused": reused, "mechanisms": _mechanisms(history, ex, w.get("batch"), req.get("id")) if ex else []}


def sequences(s: Mapping[str, Any]) -> list[list[int]]:
    """Every token sequence the rendered story shows as text (what the `decode` hook is asked for)."""
    out: list[list[int]] = []
    focus = s.get("focus") or {}
    for step in s.get("timeline", ()):
        for ln in step.get("requests", ()):
            if ln.get("output"):
                out.append(ln["output"][:16])
            if step.get("batch") == focus.get("batch") and ln.get("request") == focus.get("request"):
                out.append(ln["prompt"][-PROMPT_TAIL:])
    d = s.get("divergence")
    if d:
        p = d["position"] if isinstance(d.get("position"), int) else len(d["expected"])
        out += [d["expected"][:p], d["expected"][p:], d["got"][p:], d["expected"], d["got"]]
        lo, hi = max(0, p - WINDOW_BEFORE), p + WINDOW_AFTER
        out += [[t] for t in d["expected"][lo:hi] + d["got"][lo:hi]]
    return [seq for seq in out if seq]


def decode_texts(stories: Iterable[Mapping[str, Any]], decode: Any) -> dict[str, str]:
    """Decode every sequence the stories show. A decoder that fails decodes nothing (the report must
    still be written; the story then shows token ids only)."""
    texts: dict[str, str] = {}
    if decode is None:
        return texts
    for s in stories:
        for seq in sequences(s):
            key = text_key(seq)
            if key not in texts:
                try:
                    text = decode(list(seq))
                except Exception:  # noqa: BLE001 - text is a courtesy; its absence is stated in the report
                    return texts
                if isinstance(text, str):
                    texts[key] = text
    return texts


# --------------------------------------------------------------------------- rendering


def show(text: str) -> str:
    """Decoded text as a code span: quoted, escapes visible (a leading space matters), no backticks."""
    return "`" + json.dumps(text, ensure_ascii=False).replace("`", "\\u0060") + "`"


def _text(texts: Mapping[str, str], ids: Sequence[int]) -> str | None:
    if not ids:
        return ""
    return texts.get(text_key(ids))


def _tokens(ids: Sequence[int] | None, limit: int = 12) -> str:
    if ids is None:
        return "—"
    shown = ", ".join(map(str, ids[:limit])) + (", …" if len(ids) > limit else "")
    return f"`[{shown}]`"


def _shared(ln: Mapping[str, Any]) -> str:
    bits = []
    same, other = ln["same"], ln["other"]
    if same["tokens"]:
        bits.append(f"{same['tokens']} with {same['request']} (same identity, batch {same['batch']})")
    if other["tokens"]:
        bits.append(f"{other['tokens']} with {other['request']} (**{other['identity']}**, batch {other['batch']})")
    return "; ".join(bits) or "none"


def timeline_table(s: Mapping[str, Any], texts: Mapping[str, str]) -> Table:
    focus = s.get("focus") or {}
    rows, classes = [], []
    for step in s.get("timeline", ()):
        kind = step["kind"]
        if kind == "reset":
            rows.append(["reset", "", "", "", "cache flushed", "", "", ""])
            classes.append("muted")
            continue
        if kind == "configure":
            cfg = ", ".join(f"{k}={v}" for k, v in sorted((step.get("config") or {}).items())) or "defaults"
            rows.append(["configure", "", "", "", f"`{cfg}`", "", "", ""])
            classes.append("muted")
            continue
        lines = step.get("requests", [])
        keep = [k for k, ln in enumerate(lines) if k < MAX_LINES_PER_BATCH - 1 or
                (step.get("batch") == focus.get("batch") and ln["request"] == focus.get("request"))]
        for n, k in enumerate(keep):
            ln = lines[k]
            is_focus = step.get("batch") == focus.get("batch") and ln["request"] == focus.get("request")
            out = ln.get("output")
            text = _text(texts, (out or [])[:16]) if out else None
            output = _tokens(out) + (f" {show(text)}" if text else "")
            label = ("failed batch " if kind == "failed" else "batch ") + str(step.get("batch"))
            rows.append([label if n == 0 else "", ("▶ " if is_focus else "") + ln["request"], ln["identity"],
                         str(ln["prompt_len"]), _shared(ln),
                         "—" if ln.get("cached_tokens") is None else str(ln["cached_tokens"]),
                         output if kind != "failed" else "never answered", ln.get("finish_reason") or "—"])
            classes.append("focus" if is_focus else "")
        if len(lines) > len(keep):
            rows.append(["", f"… {len(lines) - len(keep)} more requests", "", "", "", "", "", ""])
            classes.append("muted")
    return Table(["step", "request", "identity", "prompt tokens", "prefix shared with earlier requests (tokens)",
                  "cached (reported)", "output", "finish"], rows, classes)


def divergence_blocks(d: Mapping[str, Any], texts: Mapping[str, str], request: str | None) -> list[Block]:
    """The first token difference (or the finish reasons), then what lies below the argmax."""
    return _token_blocks(d, texts, request) + (deviation_blocks(d) if d.get("deviations") else [])


def _token_blocks(d: Mapping[str, Any], texts: Mapping[str, str], request: str | None) -> list[Block]:
    exp, got = d["expected"], d["got"]
    p = d.get("position")
    if not isinstance(p, int):  # same tokens: another finish reason, or a difference below the argmax
        if d.get("got_finish") == d.get("expected_finish"):
            return []
        return [Para(f"Same tokens as {d['expected_from']}, but finish reason `{d.get('got_finish')}` instead of "
                     f"`{d.get('expected_finish')}`.")]
    margins = d.get("margins") or []
    at = d.get("margin")
    e_tok = exp[p] if p < len(exp) else None
    g_tok = got[p] if p < len(got) else None

    def tok(t: int | None) -> str:
        if t is None:
            return "<end>"
        txt = texts.get(text_key([t]))
        return f"{t} {show(txt)}" if txt is not None else str(t)

    margin = "n/a" if at is None else f"{at:.4g}"
    tau = d.get("tolerance") or 0.0
    verdict = ("below τ: a near-tie" if at is not None and at < tau else
               f"a confident token (τ = {tau:g}), not a near-tie" if at is not None else "no margin recorded")
    out: list[Block] = [Para(
        f"**First divergence** of request {request} at output position **{p}**: expected ({d['expected_from']}) "
        f"{tok(e_tok)}, got {tok(g_tok)}. Baseline top-1/top-2 margin there: **{margin}** — {verdict}.")]
    lo, hi = max(0, p - WINDOW_BEFORE), min(max(len(exp), len(got)), p + WINDOW_AFTER)
    cols = list(range(lo, hi))

    def row(seq: Sequence[int], as_text: bool) -> list:
        cells: list = []
        for i in cols:
            t = seq[i] if i < len(seq) else None
            other = (got if seq is exp else exp)
            o = other[i] if i < len(other) else None
            value = "" if t is None else (show(texts[text_key([t])]) if as_text and text_key([t]) in texts
                                          else ("?" if as_text else str(t)))
            if t is None and not as_text:
                value = "<end>"
            cells.append(Cell(value, "diff" if i >= p and t != o else ""))
        return cells

    have_text = any(text_key([t]) in texts for t in exp[lo:hi] + got[lo:hi])
    pair, base = bool(d.get("pairwise")), d.get("baseline")
    first = f"other run (batch {d.get('earlier_batch')})" if pair else "expected"
    rows = []
    if pair and base is not None:
        rows.append(["plain decoding", *[Cell(str(base[i]) if i < len(base) else "<end>") for i in cols]])
    rows.append([first, *row(exp, False)])
    if have_text:
        rows.append([first + " text", *row(exp, True)])
    rows.append([f"got (batch {d.get('batch')})" if pair else "got", *row(got, False)])
    if have_text:
        rows.append(["got text", *row(got, True)])
    rows.append(["baseline margin", *[f"{margins[i]:.3g}" if i < len(margins) else "" for i in cols]])
    out.append(Table(["position", *[str(i) for i in cols]], rows, cls="align"))
    if pair:
        out.append(Para(_which_side(d)))
    common, e_rest, g_rest = _text(texts, exp[:p]), _text(texts, exp[p:]), _text(texts, got[p:])
    if e_rest is not None and g_rest is not None:
        out.append(Para(f"Decoded: common output {show(common or '')}, then expected {show(e_rest)} "
                        f"but got {show(g_rest)}."))
    else:
        out.append(Para("Decoded text not recorded: the adapter has no `decode` hook (docs/adapters.md), "
                        "so only token ids are shown."))
    return out


def _which_side(d: Mapping[str, Any]) -> str:
    """A pair check's two runs beside plain decoding, in one sentence: which of them is wrong."""
    earlier, later = f"the run in batch {d.get('earlier_batch')}", f"the run in batch {d.get('batch')}"
    wrong = d.get("wrong")
    if d.get("baseline") is None:
        return "Plain decoding of this request was not recorded, so which run is wrong cannot be said."
    return ("**Which run is wrong**: " + {
        "got": f"{earlier} matches plain decoding; {later} differs from it.",
        "expected": f"{later} matches plain decoding; {earlier} differs from it.",
        "both": f"both runs differ from plain decoding ({earlier} and {later}).",
    }.get(str(wrong), "both runs give plain decoding's tokens; they differ in finish reason only."))


def reuse_blocks(r: Mapping[str, Any], request: str | None, listed_under: str) -> list[Block]:
    served = r.get("cross_identity_reuse")
    cached = "no cached-token count" if r.get("cached_tokens") is None else f"{r['cached_tokens']} cached tokens"
    own = (f"{r['same_tokens']} with its own identity's traffic ({r['same_request']})" if r.get("same_tokens")
           else "none with its own identity's traffic")
    text = (f"**KV reuse across identities**: request {request} shares {r['tokens']} leading tokens with request "
            f"**{r['request']}** of identity **{r['identity']}** (batch {r['batch']}), and {own}; the engine "
            f"reported {cached}.")
    if served:
        text += f" So up to {r['cached_tokens'] - r['same_tokens']} of them came from {r['request']}'s KV."
    elif r.get("cached_tokens") is not None and r["cached_tokens"] > max(r["tokens"], r.get("same_tokens") or 0):
        text += (" That is more than any earlier traffic shares with it: a wrong count or a wrong hit, not another "
                 "identity's KV.")
    elif served is False and listed_under != "isolation":
        text += " That is no more than its own traffic explains: another identity's KV did not serve it."
    return [Para(text)]


def compact_json(obj: Any, indent: int = 0) -> str:
    """JSON with lists of scalars on one line (a 40-token prompt is one line, not forty)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, Mapping):
        if all(not isinstance(v, (Mapping, list, tuple)) for v in obj.values()):
            flat = json.dumps(dict(obj))
            if len(flat) <= 100:
                return flat
        items = [f"{inner}{json.dumps(str(k))}: {compact_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(v, (Mapping, list, tuple)) for v in obj):
            return json.dumps(list(obj))
        return "[\n" + ",\n".join(inner + compact_json(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def blocks(s: Mapping[str, Any], texts: Mapping[str, str], listed_under: str,
           witness: Mapping[str, Any]) -> list[Block]:
    """The story of one finding as report blocks: timeline, divergence, reuse, mechanisms, raw JSON."""
    focus = (s.get("focus") or {}).get("request")
    out: list[Block] = [Para(f"**Timeline** of example {s.get('example')} (▶ marks the request that failed):"),
                        timeline_table(s, texts)]
    if s.get("mechanisms"):
        out.append(Para("In play for this request: " + "; ".join(s["mechanisms"]) + "."))
    if s.get("divergence"):
        out += divergence_blocks(s["divergence"], texts, focus)
    if s.get("plain"):
        p = s["plain"]
        out.append(Table(["", "output"], [["plain decoding", _tokens(p["baseline"], 24)], ["got", _tokens(p["output"], 24)]]))
        out.append(Para(f"Request {focus}'s output " + ("equals plain decoding: the tokens are right; what is wrong is "
                                                         "shown above, not in the output." if p["equal"] else
                                                         "differs from plain decoding.")))
    if s.get("reused"):
        out += reuse_blocks(s["reused"], focus, listed_under)
    focus_line = next((ln for st in s.get("timeline", ()) for ln in st.get("requests", ())
                       if st.get("batch") == (s.get("focus") or {}).get("batch") and ln["request"] == focus), None)
    if focus_line is not None:
        tail = focus_line["prompt"][-PROMPT_TAIL:]
        txt = texts.get(text_key(tail)) if tail else None
        if txt is not None:
            cut = "…" if len(focus_line["prompt"]) > PROMPT_TAIL else ""
            out.append(Para(f"Prompt of {focus} ({focus_line['prompt_len']} tokens) as text: {cut}{show(txt)}"))
    out.append(Fold("raw witness (JSON)", [Code(compact_json(witness), "json")]))
    return out
