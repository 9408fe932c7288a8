"""A witness as a lane diagram: one bar per request, where people would rather look than read.

A timeline table says "r1, 40 prompt tokens, 32 shared with r0 (salt=b), 32 cached"; a picture shows the
same at a glance: two bars of the same length, the second's first 32 tokens shaded as shared and
outlined as cached, in another identity's colour. So each request is a lane (x = token positions, the
prompt to scale, its output after it), grouped by batch (a reset draws a dashed rule: the cache was
flushed), coloured by identity (legend), the prefix it shares with earlier traffic shaded, the span the
engine reported cached outlined, aborts, refusals and preemption marked, and the failing request's first
divergence marked with a red tick. Pure string building from a story's JSON (`story.story`), so a report
re-rendered from results.json draws the same picture; no plotting dependency.
"""

from __future__ import annotations

from html import escape
from typing import Any, Mapping, Sequence

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
LABEL_W, PLOT_W, LANE_H, GAP, GROUP_H, LEGEND_H = 64, 900, 16, 5, 18, 44
MAX_LANES_PER_BATCH = 8  # a flood of 64 requests shows its first ones and the failing one
MAX_LANES = 40


def _steps_upto_focus(story: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The steps a reader needs: everything up to and including the failing batch."""
    focus_batch = (story.get("focus") or {}).get("batch")
    out = []
    for step in story.get("timeline", ()):
        out.append(step)
        if step.get("batch") == focus_batch and step.get("kind") in ("batch", "failed"):
            break
    return out


def _lanes(story: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """("batch", label) / ("reset", None) / ("lane", line) rows, capped, the focus request always kept."""
    focus = story.get("focus") or {}
    rows: list[tuple[str, Any]] = []
    n = 0
    for step in _steps_upto_focus(story):
        if step.get("kind") == "reset":
            if rows and rows[-1][0] != "reset":
                rows.append(("reset", None))
            continue
        if step.get("kind") not in ("batch", "failed"):
            continue
        lines = step.get("requests", ())
        is_focus_batch = step.get("batch") == focus.get("batch")
        keep = [ln for k, ln in enumerate(lines) if (k < MAX_LANES_PER_BATCH - 1 and n + k < MAX_LANES) or
                (is_focus_batch and ln.get("request") == focus.get("request"))]
        label = f"batch {step.get('batch')}" + (" (never answered)" if step.get("kind") == "failed" else "")
        if len(lines) > len(keep):
            label += f" — {len(keep)} of {len(lines)} requests shown"
        rows.append(("batch", label))
        rows += [("lane", {**ln, "_focus": is_focus_batch and ln.get("request") == focus.get("request")})
                 for ln in keep]
        n += len(keep)
    return rows


def _identity_colours(rows: Sequence[tuple[str, Any]]) -> dict[str, str]:
    colours: dict[str, str] = {}
    for kind, ln in rows:
        if kind == "lane" and ln.get("identity") not in colours:
            colours[ln["identity"]] = PALETTE[len(colours) % len(PALETTE)]
    return colours


def _rect(x: float, y: float, w: float, h: float, **attrs: Any) -> str:
    extra = " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in attrs.items())
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" {extra}/>'


def _text(x: float, y: float, s: str, **attrs: Any) -> str:
    extra = " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" {extra}>{escape(s)}</text>'


def _lane(ln: Mapping[str, Any], y: float, scale: float, colour: str, divergence: Mapping[str, Any] | None) -> list[str]:
    """One request: label, prompt bar, shared prefix shaded, cached span outlined, output, marks."""
    x0 = LABEL_W
    plen, out = int(ln.get("prompt_len") or 0), ln.get("output") or []
    shared = max(int((ln.get("same") or {}).get("tokens") or 0), int((ln.get("other") or {}).get("tokens") or 0))
    cached = ln.get("cached_tokens")
    label = ("▶ " if ln.get("_focus") else "") + str(ln.get("request"))  # its identity: the colour (legend)
    tip = (f"{ln.get('request')} ({ln.get('identity')}): {plen} prompt tokens, {shared} shared with earlier requests, "
           f"{'no count of' if cached is None else cached} cached tokens reported, {len(out)} output tokens")
    parts = [f"<title>{escape(tip)}</title>",
             _text(4, y + LANE_H - 4, label, font_size=11, font_weight="bold" if ln.get("_focus") else "normal")]
    parts.append(_rect(x0, y, plen * scale, LANE_H, fill=colour, class_="prompt"))
    if shared:
        parts.append(_rect(x0, y, min(shared, plen) * scale, LANE_H, fill="url(#shared)", class_="shared"))
    parts.append(_rect(x0 + plen * scale, y + 3, len(out) * scale, LANE_H - 6, fill=colour, fill_opacity=0.35,
                       stroke=colour, class_="output"))
    if isinstance(cached, int) and cached > 0:
        parts.append(_rect(x0, y - 1, cached * scale, LANE_H + 2, fill="none", stroke="#000", stroke_width=2,
                           class_="cached"))
    end = x0 + (plen + len(out)) * scale + 4
    marks = []
    if ln.get("finish_reason") in ("abort", "refused"):
        marks.append("aborted" if ln["finish_reason"] == "abort" else "refused")
    if isinstance(ln.get("prefill_chunks"), int) and ln["prefill_chunks"] > 1:
        marks.append(f"prefilled in {ln['prefill_chunks']} chunks")
    if ln.get("draft_proposed"):
        marks.append(f"drafts {ln.get('draft_accepted') or 0}/{ln['draft_proposed']} accepted")
    if ln.get("preempted"):
        marks.append("preempted")
    if ln.get("output") is None:
        marks.append("never answered")
    if ln.get("_focus") and divergence and isinstance(divergence.get("position"), int):
        px = x0 + (plen + divergence["position"]) * scale
        parts.append(f'<line x1="{px:.1f}" y1="{y - 3:.1f}" x2="{px:.1f}" y2="{y + LANE_H + 3:.1f}" '
                     f'stroke="#d00" stroke-width="3" class="divergence"/>')
        marks.append(f"first divergence at output position {divergence['position']}")
    if marks:
        parts.append(_text(end, y + LANE_H - 4, "; ".join(marks), font_size=11,
                           fill="#b00" if ln.get("_focus") else "#444", class_="mark"))
    return parts


def _legend(colours: Mapping[str, str], y: float) -> list[str]:
    parts, x = [], 4.0
    for ident, c in colours.items():
        parts += [_rect(x, y, 14, 12, fill=c), _text(x + 18, y + 10, ident, font_size=11)]
        x += 30 + 6.5 * len(ident)
    y2 = y + 20
    parts += [_rect(4, y2, 14, 12, fill="#999"), _rect(4, y2, 14, 12, fill="url(#shared)"),
              _text(22, y2 + 10, "prefix shared with earlier requests", font_size=11),
              _rect(240, y2, 14, 12, fill="none", stroke="#000", stroke_width=2),
              _text(258, y2 + 10, "reported cached", font_size=11),
              _rect(370, y2 + 2, 14, 8, fill="#999", fill_opacity=0.35, stroke="#999"),
              _text(388, y2 + 10, "output (after the prompt)", font_size=11),
              f'<line x1="560" y1="{y2 - 1}" x2="560" y2="{y2 + 13}" stroke="#d00" stroke-width="3"/>',
              _text(568, y2 + 10, "first divergence", font_size=11)]
    return parts


def lane_file(k: int) -> str:
    """The file name of finding `k`'s diagram, next to report.md (which links it)."""
    return f"witness-{k}.svg"


def lane_svg(story: Mapping[str, Any], title: str = "") -> str:
    """The witness of `story` as a standalone SVG document (also valid inline in HTML)."""
    rows = _lanes(story)
    colours = _identity_colours(rows)
    longest = max([int(ln.get("prompt_len") or 0) + len(ln.get("output") or []) for k, ln in rows if k == "lane"] or [1])
    scale = min(8.0, (PLOT_W - 140) / max(longest, 1))
    body: list[str] = []
    y = 4.0
    if title:
        body.append(_text(4, y + 12, title, font_size=13, font_weight="bold"))
        y += GROUP_H
    for kind, value in rows:
        if kind == "reset":
            body.append(f'<line x1="4" y1="{y + 4:.1f}" x2="{LABEL_W + PLOT_W:.0f}" y2="{y + 4:.1f}" stroke="#888" '
                        f'stroke-dasharray="6 4"/>')
            body.append(_text(LABEL_W + PLOT_W - 160, y + 2, "reset: cache flushed", font_size=10, fill="#666"))
            y += 10
        elif kind == "batch":
            body.append(_rect(2, y, LABEL_W + PLOT_W - 4, 1, fill="#ccc"))
            body.append(_text(4, y + 13, value, font_size=11, fill="#555", font_style="italic"))
            y += GROUP_H
        else:
            lane = _lane(value, y, scale, colours.get(value.get("identity"), "#999"), story.get("divergence"))
            body.append(f'<g class="lane">{"".join(lane)}</g>')
            y += LANE_H + GAP
    body.append(_text(LABEL_W, y + 12, f"x: token positions (1 token = {scale:.2g} px)", font_size=10, fill="#666"))
    y += 20
    body += _legend(colours, y)
    height = y + LEGEND_H
    width = LABEL_W + PLOT_W
    defs = ('<defs><pattern id="shared" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="3" height="6" fill="#fff" fill-opacity="0.55"/>'
            '</pattern></defs>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="lanes" width="{width}" height="{height:.0f}" '
            f'viewBox="0 0 {width} {height:.0f}" font-family="system-ui,sans-serif" role="img" '
            f'aria-label="{escape(title or "lane diagram")}">{defs}{"".join(body)}</svg>')
