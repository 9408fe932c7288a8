"""Find the prompts where the shipped models do what a random prompt almost never makes them do, and
write them to `checkpoints/landmarks.json` (data: token ids only).

A stream of random prompts over a small alphabet never finishes on eos (0 of 8,886 requests in a
1,000-example run) and never meets a near-tie (no margin below 1e-4 in ~2,900 steps), so every eos path
and every tie rule of an engine goes untested. Two searches over the models themselves fix that:

- **eos paths**: a prompt P and a continuation C (|C| = SPAN) such that plain greedy decoding of
  P + C[:i] produces C[i:] and then eos, for every i. A stream that sends P + C[:i] places eos at any
  output position 0..SPAN — inside an accepted draft run, as the bonus token, at max_tokens.
- **near-ties**: prompts whose first greedy token wins by a margin below `NEAR_TIE` (logits, float64).

Both are coordinate searches: start from the end of a corpus file (where eos is already the runner-up),
try every alphabet token at one position in one batched forward pass, keep the best, move on. Every
landmark is then verified with `baseline.greedy` (the definition of plain decoding) before it is kept.

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
SPAN = 4  # eos reachable at output positions 0..SPAN: a whole verification window of k = 3 drafts
NEAR_TIE = 1e-4
PROMPT = 24
PER_REVISION = 6
ALPHABET = 160  # tokens tried at each position: the specials' neighbours and the commonest merges


@torch.no_grad()
def _last_logits(model: Llama, batch: torch.Tensor) -> torch.Tensor:
    return model.forward_train(batch)[:, -1, :]


@torch.no_grad()
def _continue(model: Llama, batch: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy continuation of every row of `batch` (eos excluded), teacher-forced, no KV: [B, steps]."""
    out = []
    for _ in range(steps):
        logits = _last_logits(model, batch)
        logits[:, model.config.eos_token_id] = -float("inf")
        nxt = logits.argmax(-1, keepdim=True)
        out.append(nxt)
        batch = torch.cat([batch, nxt], 1)
    return torch.cat(out, 1) if out else batch[:, :0]


def _eos_gap(model: Llama, full: torch.Tensor) -> torch.Tensor:
    """eos logit minus the best other logit after each row of `full`."""
    logits = _last_logits(model, full)
    eos = model.config.eos_token_id
    others = logits.clone()
    others[:, eos] = -float("inf")
    return logits[:, eos] - others.max(-1).values


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
        if len(ids) > PROMPT + SPAN:
            out.append(ids[-PROMPT - SPAN:-SPAN])
    rng.shuffle(out)
    return out


@torch.no_grad()
def _path_score(model: Llama, seqs: torch.Tensor) -> torch.Tensor:
    """How surely each row is an eos path: the least margin by which greedy decoding, teacher-forced
    along the row, picks each of the last SPAN tokens and then eos (> 0: every one is the argmax)."""
    logits = model.forward_train(seqs)
    eos, n = model.config.eos_token_id, seqs.shape[1]
    margins = []
    for pos in range(n - SPAN - 1, n):
        target = seqs[:, pos + 1] if pos + 1 < n else torch.full((seqs.shape[0],), eos)
        row = logits[:, pos, :]
        chosen = row.gather(1, target[:, None])[:, 0]
        others = row.scatter(1, target[:, None], -float("inf")).max(-1).values
        margins.append(chosen - others)
    return torch.stack(margins, 1).min(1).values


def _eos_climb(model: Llama, start: list[int], alphabet: list[int], rng: random.Random, sweeps: int = 4):
    """Coordinate ascent on `_path_score` over every position of prompt + continuation."""
    seq = list(start) + _continue(model, torch.tensor([start]), SPAN)[0].tolist()
    best = float(_path_score(model, torch.tensor([seq]))[0])
    for _ in range(sweeps):
        for pos in rng.sample(range(len(seq)), len(seq)):
            cand = torch.tensor([seq[:pos] + [t] + seq[pos + 1:] for t in alphabet])
            scores = _path_score(model, cand)
            i = int(scores.argmax())
            if float(scores[i]) > best:
                seq, best = cand[i].tolist(), float(scores[i])
            if best > 0.05:
                return seq[:-SPAN], seq[-SPAN:]
    return None


def eos_paths(model: Llama, starts: list[list[int]], alphabet: list[int], rng: random.Random) -> list[list[list[int]]]:
    found = []
    for start in starts:
        hit = _eos_climb(model, start, alphabet, rng)
        if hit is None:
            continue
        p, cont = hit
        if all(greedy(model, p + cont[:i], SPAN + 2).output == tuple(cont[i:]) + (model.config.eos_token_id,)
               for i in range(SPAN + 1)):
            found.append([p, cont])
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
    out: dict = {"about": __doc__.strip().split("\n")[0], "span": SPAN, "near_tie": NEAR_TIE,
                 "eos_paths": {}, "near_ties": {}}
    for revision in checkpoints.REVISIONS:
        model = checkpoints.load_target(revision, None, torch.float64).eval()
        tok = Tokenizer.from_file(str(checkpoints.revision_dir(revision) / "tokenizer.json"))
        alphabet = [t for t in range(3, model.config.vocab_size) if t != model.config.eos_token_id][:ALPHABET]
        starts = _starts(tok, revision, rng)
        out["eos_paths"][revision] = eos_paths(model, starts, alphabet, rng)
        out["near_ties"][revision] = near_ties(model, starts[::-1], alphabet, rng)
        print(revision, len(out["eos_paths"][revision]), "eos paths,", len(out["near_ties"][revision]), "near-ties")
    OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
