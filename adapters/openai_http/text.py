"""The text channel: what token ids mean when a server only speaks text (llama-cpp-python's server).

In prompt_mode=text the server never sees our token ids: it tokenizes `decode(prompt)`, and
`encode(decode(ids)) != ids` whenever ids are not in canonical BPE form. So the oracle must judge the
*effective prompt* the server receives, and output ids must be recovered from what the server returns:
its ids where it gives them, else its per-token logprob pieces (each maps to one id of the shipped
vocabulary, except partial-UTF-8 byte tokens), else the completion text re-encoded (not token-exact).
This module does that mapping, with the shipped tokenizer, and nothing else.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any, Sequence

from conformance.contract import Baseline

TOKEN_ID = re.compile(r"^token_id:(\d+)$")  # vLLM's `return_tokens_as_token_ids` spelling


class TextChannel:
    """Token ids ↔ text for one adapter; `text_mode` False means ids pass through unchanged."""

    def __init__(self, load_tokenizer, text_mode: bool) -> None:
        self._load_tokenizer = load_tokenizer
        self.text_mode = text_mode
        self._tokenizer = None
        self._pieces: dict[str, int] | None = None
        self._effective: dict[tuple[int, ...], tuple[int, ...]] = {}

    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer().decode(list(ids), skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer().encode(text, add_special_tokens=False).ids

    def roundtrip(self, ids: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.encode(self.decode(ids)))

    def effective_prompt(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """The token ids the server actually receives: the prompt itself, or encode(decode(prompt))."""
        key = tuple(int(t) for t in prompt)
        if not self.text_mode:
            return key
        if key not in self._effective:
            self._effective[key] = self.roundtrip(key)
        return self._effective[key]

    def through_text(self, b: Baseline) -> Baseline:
        """The baseline as seen through the text channel (output ids re-encoded from the completion
        text); margins past the first changed position are the smallest greedy margin from there on."""
        out = list(b.output)
        tail = [out.pop()] if out and b.finish_reason in ("eos", "stop") else []  # the terminal token is separate
        rt = list(self.roundtrip(out)) if out else []
        if rt == out:
            return b
        same = next((i for i, (x, y) in enumerate(zip(out, rt)) if x != y), min(len(out), len(rt)))
        floor = min(b.margins[same:], default=float("inf"))
        margins = tuple(b.margins[:same]) + (floor,) * (len(rt) + len(tail) - same)
        return Baseline(tuple(rt + tail), b.finish_reason, margins, tuple(b.runner_up[:same]), b.contenders[:same])

    def _piece_map(self) -> dict[str, int]:
        """Token text -> id for every piece of the vocabulary that decodes to a unique, non-empty string."""
        if self._pieces is None:
            tok, seen = self.tokenizer(), collections.Counter()
            pieces = {}
            for i in range(tok.get_vocab_size()):
                p = tok.decode([i], skip_special_tokens=False)
                seen[p] += 1
                pieces[p] = i
            self._pieces = {p: i for p, i in pieces.items() if seen[p] == 1 and p and "\ufffd" not in p}
        return self._pieces

    def id_of(self, tok: Any) -> int | None:
        """The id a logprobs token names: `token_id:N`, or (text mode) a unique vocabulary piece."""
        if not isinstance(tok, str):
            return None
        m = TOKEN_ID.match(tok)
        if m is not None:
            return int(m.group(1))
        if not self.text_mode:
            return None
        return self._piece_map().get(tok)

    def ids_from_pieces(self, toks: Any) -> list[int] | None:
        if not toks or not isinstance(toks, list):
            return None
        ids = [self.id_of(t) for t in toks]
        return None if any(i is None for i in ids) else ids

    def top2(self, lp: Any) -> tuple | None:
        """Per output token (top1 id, logprob, top2 id, logprob) from `logprobs.top_logprobs`, or None."""
        top = lp.get("top_logprobs") if isinstance(lp, dict) else None
        if not top:
            return None
        rows = []
        for step in top:
            if not isinstance(step, dict) or len(step) < 2:
                return None
            ranked = sorted(step.items(), key=lambda kv: -float(kv[1]))[:2]
            ids = [self.id_of(tok) for tok, _ in ranked]
            if None in ids:
                return None
            rows.append((ids[0], float(ranked[0][1]), ids[1], float(ranked[1][1])))
        return tuple(rows)

    def topk(self, lp: Any, output: list[int]) -> tuple | None:
        """Per output token its top-k (id, logprob), best first, with the chosen token added where the
        server's top list lacks it (from `token_logprobs`), or None where any of it cannot be read: the
        contract's `Result.logprobs`, which logprob_parity compares with plain decoding's."""
        top = lp.get("top_logprobs") if isinstance(lp, dict) else None
        chosen = lp.get("token_logprobs") if isinstance(lp, dict) else None
        if not top or len(top) < len(output):
            return None
        rows = []
        for pos, tok in enumerate(output):
            step = top[pos]
            if not isinstance(step, dict) or not step:
                return None
            pairs = {self.id_of(t): float(v) for t, v in step.items()}
            if None in pairs or not all(math.isfinite(v) for v in pairs.values()):
                return None
            if tok not in pairs:
                if not isinstance(chosen, list) or pos >= len(chosen) or chosen[pos] is None:
                    return None
                pairs[tok] = float(chosen[pos])
            rows.append(tuple(sorted(pairs.items(), key=lambda kv: -kv[1])))
        return tuple(rows)

