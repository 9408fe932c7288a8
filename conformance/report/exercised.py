"""What a run exercised, for the report: the coverage table, each check's own counts, the identities
and configurations drawn, and how close the baselines came to ties.

A PASS is worth what was tested. "parity: pass" after 1,724 comparisons under five drafters, three
block sizes and four identities is a claim; the same word after 12 comparisons of one configuration is
not. So a report says, beside each verdict, how much was checked — in the check's *own* unit (prefix
hits for `prefix_only`, pool snapshots for `rollback_hygiene`, pairs of runs for the independence
checks) — which situations of the coverage model (`conformance.situations`) were reached and which
relevant ones were not, what was drawn, and how many baseline positions were nearly tied.

`results_part(history)` computes it as JSON (results.json keys "situations" and "exercised");
`blocks(results)` renders it, so a report re-rendered later needs only results.json.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from typing import Any, Mapping

from conformance.history_facts import occurrences
from conformance.history import History
from conformance.oracle import NEAR_TIE, compare
from conformance.report.doc import Block, Heading, Para, Table

# A check's counts in words, and which one is its headline (the bar's length): its own unit.
STAT_WORDS = {
    "compared": "compared with plain decoding", "pairs": "pairs of runs compared",
    "mechanism_active": "results with the mechanism alone in play", "hits": "prefix hits",
    "snapshots": "pool snapshots", "reports_checked": "cached-token reports", "poison_attempts": "cross-identity attempts",
    "evicting_batches": "evicting batches", "results": "results", "near_ties": "near-ties",
    "cached_tokens": "cached tokens", "drafts_accepted": "accepted draft tokens", "chunked": "chunked prefills",
    "evictions": "evicting batches", "cross_identity_attempts": "cross-identity attempts",
    "positive_controls": "positive controls (exact repeats that hit)",
    "positive_control_misses": "positive-control misses",
}
HEADLINE = ("hits", "snapshots", "pairs", "compared", "poison_attempts", "reports_checked", "evicting_batches",
            "results")
COLORS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#f9a825", "error": "#6a1b9a", "skip": "#9e9e9e"}
MAX_ROWS = 12  # identities / configurations listed; the rest summed in one row


def headline(stats: Mapping[str, int]) -> tuple[str, int] | None:
    """The check's own count: (stat name, value), or None for a check that counted nothing."""
    for key in HEADLINE:
        if key in stats:
            return key, int(stats[key])
    return None


def counts_text(stats: Mapping[str, int]) -> str:
    """A check's counts in words, headline first: "82 prefix hits", "347 pairs of runs compared, 168 ..."."""
    head = headline(stats)
    keys = ([head[0]] if head else []) + [k for k in stats if not head or k != head[0]]
    parts = [f"{int(stats[k]):,} {STAT_WORDS.get(k, k.replace('_', ' '))}" for k in keys
             if k != "near_ties" or stats[k]]
    return ", ".join(parts) or "nothing counted"


# --------------------------------------------------------------------------- as data


def _situations(history: History) -> tuple[list[dict[str, Any]], str | None]:
    try:
        from conformance.situations import coverage

        return [c.to_json() for c in coverage(history)], None
    except Exception as exc:  # noqa: BLE001 - the report is written anyway, saying why the table is missing
        return [], f"{type(exc).__name__}: {exc}"


def _config_label(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items())) or "defaults"


def _margins(history: History) -> dict[str, Any]:
    """Baseline top-1/top-2 margins by band (how often plain decoding itself was nearly tied), and the
    near-ties the comparisons met, by band of the margin at the divergence."""
    tau = history.tolerance
    edges = [0.0, 0.01, 0.1, 1.0, math.inf]
    if tau > 0:
        edges = sorted({0.0, tau / 100, tau / 10, tau, *[e for e in (0.01, 0.1, 1.0) if e > tau], math.inf})
    bands = [{"low": lo, "high": hi, "positions": 0, "near_ties": 0} for lo, hi in zip(edges, edges[1:])]

    def band(m: float) -> dict[str, Any]:
        return next(b for b in bands if b["low"] <= m < b["high"])

    for base in history.baselines.values():
        for m in base.margins:
            band(float(m))["positions"] += 1
    for b, i, q, r in occurrences(history):
        base = history.baseline_for(q)
        if base is not None:
            c = compare(base, r.output, r.finish_reason, tau)
            if c.kind == NEAR_TIE and c.margin is not None:
                band(float(c.margin))["near_ties"] += 1
    for b in bands:
        b["high"] = None if math.isinf(b["high"]) else b["high"]
    return {"tolerance": tau, "bands": bands}


def exercised(history: History) -> dict[str, Any]:
    """Identities and configurations drawn (requests and examples each), and margins by band."""
    identities: Counter[str] = Counter()
    identity_examples: dict[str, set[int]] = {}
    configs: Counter[str] = Counter()
    config_examples: dict[str, set[int]] = {}
    batches = 0
    for b in history.batches():
        batches += 1
        label = _config_label(b.config)
        configs[label] += len(b.requests)
        config_examples.setdefault(label, set()).add(b.example)
        for q in b.requests:
            identities[q.identity.label()] += 1
            identity_examples.setdefault(q.identity.label(), set()).add(b.example)
    return {
        "batches": batches, "requests": sum(identities.values()),
        "identities": [{"identity": k, "requests": n, "examples": len(identity_examples[k])}
                       for k, n in identities.most_common()],
        "configurations": [{"config": k, "requests": n, "examples": len(config_examples[k])}
                           for k, n in configs.most_common()],
        "margins": _margins(history),
    }


def results_part(history: History) -> dict[str, Any]:
    """The results.json keys this module owns: "situations" (the coverage table) and "exercised"."""
    rows, problem = _situations(history)
    out: dict[str, Any] = {"situations": rows, "exercised": exercised(history)}
    if history.completion is not None:  # coverage completion ran (conformance/completion.py)
        out["completion"] = dict(history.completion)
    if problem:
        out["exercised"]["situations_error"] = problem
    return out


# --------------------------------------------------------------------------- rendering


def bar_chart(checks: Mapping[str, Mapping[str, Any]]) -> str:
    """One bar per check, coloured by status, its length the log of the check's own count (counts of
    different units — hits, snapshots, comparisons — side by side), labelled in full: the SVG is as wide
    as its longest label, so nothing is cut off."""
    rows = []
    for name, c in checks.items():
        head = headline(c.get("stats", {}))
        label = f"{c['status']} — " + (f"{head[1]:,} {STAT_WORDS.get(head[0], head[0])}" if head else "nothing counted")
        ties = int(c.get("stats", {}).get("near_ties", 0))
        if ties:
            label += f", {ties} near-ties"
        rows.append((name, c["status"], head[1] if head else 0, label))
    top = max((math.log10(1 + n) for _, _, n, _ in rows), default=1.0) or 1.0
    name_w = 8 + 7 * max((len(n) for n, *_ in rows), default=10)
    bar_max, bar_h, char_w = 260, 22, 7.2
    width = int(name_w + bar_max + 16 + char_w * max((len(lab) for *_, lab in rows), default=10))
    height = bar_h * len(rows) + 8
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="checks by status and count" '
             f'font-family="sans-serif" font-size="12">']
    for k, (name, status, n, label) in enumerate(rows):
        y = 4 + k * bar_h
        w = max(3, int(bar_max * math.log10(1 + n) / top))
        parts.append(f'<text x="0" y="{y + 14}">{html.escape(name)}</text>'
                     f'<rect x="{name_w}" y="{y}" width="{w}" height="{bar_h - 6}" fill="{COLORS.get(status, "#999")}"/>'
                     f'<text x="{name_w + w + 6}" y="{y + 14}">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _fmt_edge(x: float | None) -> str:
    return "∞" if x is None else f"{x:g}"


def blocks(results: Mapping[str, Any]) -> list[Block]:
    """The "what was exercised" part of a report, from results.json alone."""
    out: list[Block] = [Heading(2, "What was exercised")]
    ex = results.get("exercised") or {}
    situations = results.get("situations") or []
    out.append(Heading(3, "Coverage: situations reached"))
    if situations:
        rows, classes = [], []
        for s in situations:
            missing = s["relevant"] and s["count"] == 0
            rows.append([f"`{s['name']}` {s['title']}", s["claim"], "yes" if s["relevant"] else "no",
                         f"{s['count']:,}" + (" — **not reached**" if missing else "")
                         + (f" — {s['steering']}" if missing and s.get("steering") else "")])
            classes.append("missing" if missing else ("muted" if not s["relevant"] else ""))
        out.append(Table(["situation", "claim", "relevant", "count"], rows, classes))
        n_missing = sum(s["relevant"] and s["count"] == 0 for s in situations)
        out.append(Para(f"{n_missing} relevant situation(s) not reached." if n_missing else
                        "Every situation relevant to the engine's claims was reached at least once."))
        out += completion_blocks(results.get("completion"))
    else:
        why = ex.get("situations_error")
        out.append(Para("No coverage table" + (f" (the coverage model failed: `{why}`)." if why else ".")))
    if ex:
        out.append(Heading(3, "Drawn"))
        out.append(Para(f"{ex.get('requests', 0):,} requests in {ex.get('batches', 0):,} batches over "
                        f"{results.get('examples', 0):,} examples."))
        for key, what in (("identities", "identity"), ("configurations", "config")):
            items = ex.get(key) or []
            rows = [[f"`{it[what]}`", f"{it['requests']:,}", f"{it['examples']:,}"] for it in items[:MAX_ROWS]]
            if len(items) > MAX_ROWS:
                rest = items[MAX_ROWS:]
                rows.append([f"… {len(rest)} more", f"{sum(i['requests'] for i in rest):,}", ""])
            out.append(Table([what if what == "identity" else "configuration", "requests", "examples"], rows))
        m = ex.get("margins") or {}
        if m.get("bands"):
            tau = m.get("tolerance", 0.0)
            out.append(Heading(3, "Near-ties by margin"))
            out.append(Para(f"Baseline top-1/top-2 logit margins at every position of plain decoding, and the near-ties "
                            f"(divergences where the margin was below τ = {tau:g} and the engine chose the runner-up)."
                            + (" With τ = 0 any divergence is a failure, never a near-tie." if not tau else "")))
            out.append(Table(["margin band", "baseline positions", "near-ties"],
                             [[f"[{_fmt_edge(b['low'])}, {_fmt_edge(b['high'])})", f"{b['positions']:,}",
                               f"{b['near_ties']:,}"] for b in m["bands"]]))
    return out



def completion_blocks(done: Mapping[str, Any] | None) -> list[Block]:
    """What coverage completion did: the situations the stream left unreached, the completion examples
    that went after them (checked like every other), and what reached each one, or that none did."""
    if not done:
        return []
    lines = [f"Coverage completion: the stream left {', '.join(f'`{t}`' for t in done.get('targets', []))} "
             f"unreached; {done.get('examples', 0)} completion example(s) went after them (recorded and checked "
             f"like the others)."]
    for name, how in (done.get("reached") or {}).items():
        lines.append(f"`{name}` reached in example {how.get('example')}, batch {how.get('batch')}, by "
                     f"`{how.get('arm')}` under `{_config_label(how.get('config') or {})}`.")
    if done.get("unreached"):
        lines.append(f"Not reached: {', '.join(f'`{n}`' for n in done['unreached'])}.")
    return [Para(" ".join(lines))]
