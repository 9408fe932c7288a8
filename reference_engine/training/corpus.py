"""The training corpus: CPython 3.11's top-level standard-library modules (PSF License 2.0, which permits
redistribution with the licence notice; see CORPUS_LICENSE.txt beside this file).

It is committed as `corpus.txt.gz` so training needs no network and no particular Python install;
`python -m reference_engine.training.corpus --from-stdlib DIR` rebuilds it from a stdlib folder.
Files are split deterministically into slices: `a` trains revision a, `b` trains revision b, `heldout`
is never trained on (bars in MODEL_CARD.md are measured on it).
"""

from __future__ import annotations

import argparse
import gzip
import pathlib

HERE = pathlib.Path(__file__).parent
CORPUS = HERE / "corpus.txt.gz"
SEPARATOR = "\n\x00FILE "  # never occurs in source text


def build(stdlib: pathlib.Path) -> None:
    parts = []
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(f"{SEPARATOR}{path.name}\n{text}")
    with gzip.open(CORPUS, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write("".join(parts))


def documents() -> list[tuple[str, str]]:
    """(file name, text) pairs in a fixed order."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        raw = f.read()
    docs = []
    for chunk in raw.split(SEPARATOR)[1:]:
        name, _, text = chunk.partition("\n")
        docs.append((name, text))
    return docs


def slice_of(index: int) -> str:
    if index % 10 == 3:
        return "heldout"
    if index % 10 in (6, 8):
        return "b"
    return "a"


def texts(which: str) -> list[str]:
    return [text for i, (_, text) in enumerate(documents()) if slice_of(i) == which]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from-stdlib", type=pathlib.Path, required=True)
    build(parser.parse_args().from_stdlib)
