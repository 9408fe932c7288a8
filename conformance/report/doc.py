"""A report as a list of blocks, rendered to Markdown and to HTML from the same blocks.

report.md and report.html must say the same thing: a reader of either sees the same tables, the same
failure stories, the same counts. So the report is built once, as blocks (headings, paragraphs, bullet
lists, tables, code, folds, figures), and two small renderers turn the blocks into each format. Inline
text uses two Markdown marks only, `code` and **bold**; the HTML renderer translates them after
escaping, so no text from a history is ever interpreted as HTML.
"""

from __future__ import annotations

import html
import re
from typing import Sequence, Union

from attrs import field, frozen


@frozen
class Heading:
    level: int
    text: str
    anchor: str | None = None  # an HTML id, so a finding can be linked


@frozen
class Para:
    text: str


@frozen
class Bullets:
    items: tuple[str, ...] = field(converter=tuple)


@frozen
class Cell:
    """A table cell with a style class: `diff` (a differing token), `bad`, `good`, `muted`."""

    text: str
    cls: str = ""


@frozen
class Table:
    headers: tuple[str, ...] = field(converter=tuple)
    rows: tuple[tuple, ...] = field(converter=lambda rows: tuple(tuple(r) for r in rows))
    row_classes: tuple[str, ...] = field(default=(), converter=tuple)  # per row, e.g. "missing"
    cls: str = ""  # e.g. "align": a token alignment (monospace, no wrapping)


@frozen
class Code:
    text: str
    lang: str = ""


@frozen
class Fold:
    """Collapsed content (<details>): the raw JSON behind a story."""

    summary: str
    blocks: tuple = field(converter=tuple)


@frozen
class Figure:
    """An inline SVG for the HTML page. Markdown shows `alt` instead: a figure only restates a table."""

    svg: str
    alt: str


@frozen
class Section:
    """A boxed group of blocks (one finding); `cls` styles the box."""

    blocks: tuple = field(converter=tuple)
    cls: str = ""


Block = Union[Heading, Para, Bullets, Table, Code, Fold, Figure, Section]

# --------------------------------------------------------------------------- Markdown


def _md_cell(cell: object) -> str:
    text = cell.text if isinstance(cell, Cell) else str(cell)
    if isinstance(cell, Cell) and cell.cls == "diff" and text:
        text = f"**{text}**"
    return text.replace("|", "\\|").replace("\n", " ")


def to_md(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            out.append("|" + "---|" * len(b.headers))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Code):
            out += [f"```{b.lang}", b.text.rstrip("\n"), "```", ""]
        elif isinstance(b, Fold):
            out += [f"<details><summary>{html.escape(b.summary)}</summary>", "", to_md(b.blocks).rstrip("\n"),
                    "", "</details>", ""]
        elif isinstance(b, Figure):
            if b.alt:
                out += [b.alt, ""]
        elif isinstance(b, Section):
            out.append(to_md(b.blocks).rstrip("\n"))
            out.append("")
        else:  # pragma: no cover - a programming error, not a runtime condition
            raise TypeError(f"not a report block: {b!r}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- HTML

_CODE = re.compile(r"`([^`]*)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def inline(text: str) -> str:
    """Markdown's `code` and **bold** as HTML, everything else escaped."""
    parts = _CODE.split(str(text))
    out = []
    for k, part in enumerate(parts):
        if k % 2:
            out.append(f"<code>{html.escape(part)}</code>")
        else:
            out.append(_BOLD.sub(r"<b>\1</b>", html.escape(part)))
    return "".join(out)


def _html_cell(cell: object, tag: str) -> str:
    if isinstance(cell, Cell):
        cls = f' class="{html.escape(cell.cls)}"' if cell.cls else ""
        return f"<{tag}{cls}>{inline(cell.text)}</{tag}>"
    return f"<{tag}>{inline(str(cell))}</{tag}>"


def to_html(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            anchor = f' id="{html.escape(b.anchor)}"' if b.anchor else ""
            out.append(f"<h{b.level}{anchor}>{inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            out.append(f"<p>{inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            cls = f' class="{html.escape(b.cls)}"' if b.cls else ""
            rows = []
            for k, row in enumerate(b.rows):
                rc = b.row_classes[k] if k < len(b.row_classes) and b.row_classes[k] else ""
                attr = f' class="{html.escape(rc)}"' if rc else ""
                rows.append(f"<tr{attr}>" + "".join(_html_cell(c, "td") for c in row) + "</tr>")
            head = "<tr>" + "".join(_html_cell(h, "th") for h in b.headers) + "</tr>"
            out.append(f'<div class="scroll"><table{cls}><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>')
        elif isinstance(b, Code):
            out.append(f"<pre>{html.escape(b.text)}</pre>")
        elif isinstance(b, Fold):
            out.append(f"<details><summary>{inline(b.summary)}</summary>{to_html(b.blocks)}</details>")
        elif isinstance(b, Figure):
            out.append(f'<figure>{b.svg}</figure>')
        elif isinstance(b, Section):
            cls = f' class="{html.escape(b.cls)}"' if b.cls else ""
            out.append(f"<section{cls}>{to_html(b.blocks)}</section>")
        else:  # pragma: no cover
            raise TypeError(f"not a report block: {b!r}")
    return "\n".join(out)


STYLE = """
body{font-family:system-ui,sans-serif;max-width:84em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.scroll{overflow-x:auto}
tr.missing td{background:#fff3cd}tr.focus td{background:#fdecea}tr.muted td{color:#777}tr.missing td:last-child{font-weight:bold;color:#8a6d00}
td.diff{background:#ffd6d6;font-weight:bold}td.bad{color:#c62828;font-weight:bold}td.good{color:#2e7d32}td.muted{color:#888}
table.align td,table.align th{font-family:ui-monospace,monospace;white-space:nowrap;text-align:center}
table.align td:first-child,table.align th:first-child{text-align:left}
pre{background:#f5f5f5;padding:8px;overflow:auto;max-height:30em}code{background:#f5f5f5;padding:0 2px}
section.finding{border-left:4px solid #c62828;padding-left:1em;margin:1.5em 0}
section.finding.critical{border-left-color:#6a1b9a}
details{margin:.5em 0}summary{cursor:pointer;color:#555}
figure{margin:1em 0;overflow-x:auto}
"""


def page(title: str, blocks: Sequence[Block]) -> str:
    """A self-contained HTML page (no scripts, no external resources)."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n{to_html(blocks)}\n</body></html>\n")
