"""Find the prompts where the shipped models do what a random prompt almost never makes them do, and
write them to `checkpoints/landmarks.json` (data: token ids only; conformance.contract.Landmarks).

A stream of random prompts over a small alphabet never meets a near-tie (no margin below 1e-4 in
~2,900 CI steps), so an engine's tie handling — or a lower-precision path that only flips near-ties —
goes untested. **Near-ties** here are prompts whose first greedy token wins by a margin below
`NEAR_TIE` (logits, float64), found by coordinate search: start from the end of a corpus file, try
every alphabet token at one position in one batched forward pass, keep the one that shrinks the
margin most, move on; each is verified with `baseline.greedy` (the definition of plain decoding).

**Eos paths**: a prompt P and a continuation C such that plain greedy decoding of P + C[:i] produces
C[i:] and then eos, for every i — so a stream can place eos at output position 0..|C|. The shipped
models predict eos almost nowhere (teacher-forced over ~120,000 corpus tokens it was the argmax at 0
positions; a coordinate search over 16-token prompts left it 3.5 logits short) except after a file's
closing `if __name__ == '__main__':` call, the one place the corpus ends the same way again and again.
So the paths are the last tokens of such files, cut 1..4 tokens before the end; each is verified at
every i before it is kept.

    python -m reference_engine.training.landmarks            # rewrites checkpoints/landmarks.json
"""

from __future__ import annotations

import json
import pathlib
import random

import torch

from reference_engine import checkpoints
from reference_engine.baseline import greedy
from reference_engine.model import Llama
from reference_engine.training import corpus

OUT = pathlib.Path(checkpoints.__file__).parent / "checkpoints" / "landmarks.json"
NEAR_TIE = 1e-4
PROMPT = 24
PER_REVISION = 6
MAX_CONTINUATION = 4
ALPHABET = 160  # tokens tried at each position: the specials' neighbours and the commonest merges


@torch.no_grad()
def _last_logits(model: Llama, batch: torch.Tensor) -> torch.Tensor:
    return model.forward_train(batch)[:, -1, :]


def _tie_score(model: Llama, prompts: torch.Tensor) -> torch.Tensor:
    top = _last_logits(model, prompts).topk(2).values
    return -(top[:, 0] - top[:, 1])


def _climb(model: Llama, start: list[int], score, alphabet: list[int], rng: random.Random, sweeps: int,
           good) -> list[int] | None:
    best = list(start)
    best_score = float(score(model, torch.tensor([best]))[0])
    for _ in range(sweeps):
        for pos in rng.sample(range(len(best)), len(best)):
            cand = torch.tensor([best[:pos] + [t] + best[pos + 1:] for t in alphabet])
            s = score(model, cand)
            i = int(s.argmax())
            if float(s[i]) > best_score:
                best, best_score = cand[i].tolist(), float(s[i])
            if good(best_score):
                return best
    return None


def _starts(tok, revision: str, rng: random.Random) -> list[list[int]]:
    which = "a" if revision == "a" else "b"
    out = []
    for text in corpus.texts(which):
        ids = tok.encode(text).ids
        if len(ids) > PROMPT:
            out.append(ids[-PROMPT:])
    rng.shuffle(out)
    return out


def eos_paths(model: Llama, tok, texts: list[str]) -> list[list[list[int]]]:
    eos, found = model.config.eos_token_id, []
    for text in (t for t in texts if "__main__" in t[-200:]):
        ids = tok.encode(text.rstrip("\n") + "\n").ids
        for cut in range(MAX_CONTINUATION, -1, -1):
            prompt, cont = ids[-PROMPT - cut:len(ids) - cut], ids[len(ids) - cut:]
            if len(prompt) == PROMPT and all(greedy(model, prompt + cont[:i], cut - i + 2).output == tuple(cont[i:]) + (eos,)
                                             for i in range(cut + 1)):
                found.append([prompt, cont])
                break
        if len(found) >= PER_REVISION:
            break
    return found


def near_ties(model: Llama, starts: list[list[int]], alphabet: list[int], rng: random.Random) -> list[list[int]]:
    found = []
    for start in starts:
        p = _climb(model, start, _tie_score, alphabet, rng, sweeps=3, good=lambda s: -s < NEAR_TIE / 10)
        if p is not None and greedy(model, p, 1).margins[0] < NEAR_TIE:
            found.append(p)
        if len(found) >= PER_REVISION:
            break
    return found


def main() -> None:
    from tokenizers import Tokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    rng = random.Random(0)
    out: dict = {"about": __doc__.strip().split("\n")[0], "near_tie": NEAR_TIE, "eos_paths": {}, "near_ties": {}}
    for revision in checkpoints.REVISIONS:
        model = checkpoints.load_target(revision, None, torch.float64).eval()
        tok = Tokenizer.from_file(str(checkpoints.revision_dir(revision) / "tokenizer.json"))
        alphabet = [t for t in range(3, model.config.vocab_size) if t != model.config.eos_token_id][:ALPHABET]
        starts = _starts(tok, revision, rng)
        out["eos_paths"][revision] = eos_paths(model, tok, corpus.texts(revision))
        out["near_ties"][revision] = near_ties(model, starts, alphabet, rng)
        print(revision, len(out["eos_paths"][revision]), "eos paths,", len(out["near_ties"][revision]), "near-ties",
              flush=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
