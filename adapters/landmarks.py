"""Landmarks (conformance.contract.Landmarks) for engines that run the shipped model family: the eos
paths and near-ties mined from the models (reference_engine/training/landmarks.py, committed as
checkpoints/landmarks.json: token ids only, read as data) and the same-text pairs of the tokenizer.

Same-text pairs: a byte-level BPE has, for every merged token, the ids of its pieces — two id sequences
that decode to the same text ("th" and "t","h"). A cache keyed on text serves one for the other, and a
text-mode HTTP engine re-tokenises; the model computes different things for them, so an engine that
confuses them shows a divergence. Pairs whose pieces are in the strategies' small alphabet come
first, so they mix with its prompts.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

from conformance.contract import EosPath, Landmarks, NearTie

LANDMARKS_FILE = "landmarks.json"
MAX_PAIRS = 24


def same_text_pairs(tokenizer, vocab_size: int, limit: int = MAX_PAIRS) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """Pairs ((merged,), (piece, piece)) with equal decoded text, shortest texts first."""
    texts = {i: tokenizer.decode([i]) for i in range(vocab_size)}
    first: dict[str, int] = {}
    for i, text in texts.items():
        if text and "\ufffd" not in text:
            first.setdefault(text, i)
    pairs = []
    for i, text in texts.items():
        if len(text) < 2 or first.get(text) != i:
            continue
        for cut in range(1, len(text)):
            a, b = first.get(text[:cut]), first.get(text[cut:])
            if a is not None and b is not None and tokenizer.decode([a, b]) == text:
                pairs.append(((i,), (a, b)))
                break
    pairs.sort(key=lambda p: (len(texts[p[0][0]]), not text_is_printable(texts[p[0][0]]), p[0][0]))
    return tuple(pairs[:limit])


def text_is_printable(text: str) -> bool:
    return text.isprintable() and not text.isspace()


def load_tokenizer(file: pathlib.Path, tokenizer_cls: Any) -> Any:
    """`tokenizer_cls.from_file(file)`, or, where this `tokenizers` cannot parse it, the same file with its
    BPE merges in the older spelling.

    The shipped tokenizer.json writes each merge as a pair (`["a", "b"]`); a `tokenizers` older than that
    spelling (0.19 and before: what transformers 4.38 to 4.44 pin) rejects the whole file. Those releases
    still read the legacy `"a b"` strings, which say the same for a byte-level BPE (its pieces hold no
    spaces). Found by trying, not by the version number: a release that reads the file is never rewritten."""
    try:
        return tokenizer_cls.from_file(str(file))
    except Exception as first:  # noqa: BLE001 - the Rust parser raises a bare Exception
        data = json.loads(file.read_text())
        merges = (data.get("model") or {}).get("merges")
        legacy = [" ".join(m) if isinstance(m, list) else m for m in merges or ()]
        if legacy == merges or any(" " in piece for m in merges or () if isinstance(m, list) for piece in m):
            raise first  # not the merges' spelling, or one the legacy form cannot say
        data["model"]["merges"] = legacy
        return tokenizer_cls.from_str(json.dumps(data))


@functools.cache
def shipped_landmarks() -> Landmarks:
    """The shipped family's landmarks (the file, the revision-a tokenizer); empty where absent."""
    from tokenizers import Tokenizer

    from reference_engine import checkpoints

    folder = checkpoints.CHECKPOINTS
    path = folder / LANDMARKS_FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    eos = [EosPath(rev, p, c) for rev, paths in sorted((data.get("eos_paths") or {}).items()) for p, c in paths]
    ties = [NearTie(rev, p) for rev, prompts in sorted((data.get("near_ties") or {}).items()) for p in prompts]
    tok_file = pathlib.Path(checkpoints.revision_dir("a")) / "tokenizer.json"
    tokenizer = load_tokenizer(tok_file, Tokenizer)
    pairs = same_text_pairs(tokenizer, tokenizer.get_vocab_size())
    return Landmarks(tuple(eos), tuple(ties), pairs)
