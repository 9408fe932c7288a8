"""Every relative link in README.md and docs/*.md points at a file that exists.

The README is a short front door and the reference lives in docs/, so most links cross a folder: a link
moved from README.md into docs/ without its `../` still renders, and only breaks when a reader clicks it.
External links (http, https, mailto) and pure #anchors are not checked; a #fragment is stripped before
the path is looked up (anchors are GitHub's slugs, which this check does not re-derive).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files() -> list[Path]:
    """The front door and the reference it sends readers to."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def relative_targets(text: str) -> list[str]:
    """The link targets a reader could click, without code (a link shown as an example is not one)."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return [t for t in LINK.findall(prose) if not EXTERNAL.match(t) and not t.startswith("#")]


def broken_links(text: str, base: Path) -> list[str]:
    """The relative targets in `text` that name no existing file or folder, resolved from `base`."""
    return [t for t in relative_targets(text) if not (base / t.split("#", 1)[0]).exists()]


def test_the_checker_finds_a_broken_link_and_passes_a_good_one(tmp_path: Path):
    """The check can fail: a link to a missing file is reported, one to a present file (fragment and
    all), an external link, an anchor and a link inside code are not."""
    (tmp_path / "here.md").write_text("x")
    text = ("[ok](here.md#part) [gone](missing.md) ![img](gone.png \"title\") [web](https://example.org/x) "
            "[anchor](#top) `[code](nowhere.md)`\n```\n[fenced](nowhere-either.md)\n```\n")
    assert broken_links(text, tmp_path) == ["missing.md", "gone.png"]


def test_a_link_moved_into_docs_without_its_parent_step_is_caught(tmp_path: Path):
    """The mistake this file guards against: `reports/x.md` copied from README.md into docs/ unchanged."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "x.md").write_text("x")
    (tmp_path / "docs").mkdir()
    assert broken_links("[r](reports/x.md)", tmp_path) == []
    assert broken_links("[r](reports/x.md)", tmp_path / "docs") == ["reports/x.md"]
    assert broken_links("[r](../reports/x.md)", tmp_path / "docs") == []


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_an_existing_file(path: Path):
    assert broken_links(path.read_text(), path.parent) == []


def test_the_reference_is_linked_from_the_front_door():
    """Every docs file is one click from the README, so moving a section out never hides it."""
    linked = {Path(t.split("#", 1)[0]).name for t in relative_targets((REPO / "README.md").read_text())}
    missing = [p.name for p in markdown_files()[1:] if p.name not in linked]
    assert missing == []
