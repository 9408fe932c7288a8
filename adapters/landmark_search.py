"""Landmarks for any checkpoint, found at run start and cached per checkpoint digest.

The shipped family's landmarks were mined once, offline (reference_engine/training/landmarks.py). A
user's model has none, so a run through its adapter could not steer to eos, near-ties or same-text
prompts, and the coverage table called those situations "not relevant". This module finds them for
the checkpoint the adapter names, from the model itself (a bounded oracle search) and its tokenizer:

- **same-text pairs** from the tokenizer's own vocabulary and merges (adapters.landmarks.same_text_pairs);
- **eos paths**: greedy decoding from short prompts drawn from the vocabulary, batched; where eos
  comes out, the prompt plus the output before it is cut 0..MAX_CONTINUATION tokens before eos, and a
  path is kept only if plain greedy decoding of prompt + continuation[:i] gives continuation[i:] and
  eos for every i (the definition contract.EosPath states);
- **near-ties**: coordinate search on prompts (the miner's method) for a first token that wins by a
  margin below NEAR_TIE, kept only where plain greedy decoding confirms it.

The search is bounded by a time budget and by counts; what it finds (possibly nothing) is written to
`.kvparity/landmarks/<checkpoint digest>.json` and read back next time (as untrusted input: capped,
validated as token ids within the vocabulary). `Landmarks.search_s` records how long it looked, so a
situation left without landmarks reads "not steered (no landmarks found in N s)".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import attrs
import torch

from conformance.contract import EosPath, Landmarks, NearTie, UsageError

CACHE_DIR = Path(".kvparity") / "landmarks"
FORMAT = 1
NEAR_TIE = 1e-4
MAX_EOS_PATHS = 6
MAX_NEAR_TIES = 4
MAX_CONTINUATION = 4
PROMPT = 24  # tokens per searched prompt: more than a block, so a resent one can hit the cache
DECODE = 8  # greedy steps per prompt in the eos search
BATCH = 64
ALPHABET = 128  # tokens tried per position by the near-tie climb
DEFAULT_BUDGET_S = 30.0
_SAMPLE = 1 << 20  # bytes hashed at each end of a weights file

# (B, T) token ids -> (B, T, vocab) logits at every position (causal)
Logits = Callable[[torch.Tensor], torch.Tensor]


def checkpoint_digest(folder: str | Path, eos_id: int | None) -> str:
    """What identifies the model for the cache: every JSON file of the folder whole, each weights file
    by name, size and its first and last MiB (a 100 GB model is not read whole at every start), and
    the eos id the suite uses. Retrained weights change the sampled bytes (safetensors headers and
    the tensors themselves)."""
    h = hashlib.sha256(f"eos={eos_id};format={FORMAT}".encode())
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file():
            continue
        h.update(path.name.encode() + b"\0")
        if path.suffix == ".json":
            h.update(path.read_bytes())
        elif path.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf"):
            size = path.stat().st_size
            h.update(str(size).encode())
            with open(path, "rb") as fh:
                h.update(fh.read(_SAMPLE))
                fh.seek(max(0, size - _SAMPLE))
                h.update(fh.read(_SAMPLE))
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------- the search


MAX_LOGITS_BYTES = 64 << 20  # a forward pass holds (rows, positions, vocabulary) logits: bounded


def _tail(logits: Logits, batch: torch.Tensor, keep: int) -> torch.Tensor:
    """The logits of the last `keep` positions, the batch run in as many row chunks as keep the full
    logits within MAX_LOGITS_BYTES (a 150k vocabulary: a few rows at a time)."""
    probe = logits(batch[:1])
    per_row = probe.numel() * 8
    rows = max(1, MAX_LOGITS_BYTES // per_row)
    parts = [probe[:, -keep:, :]] + [logits(batch[i:i + rows])[:, -keep:, :] for i in range(1, len(batch), rows)]
    return torch.cat(parts)


def _last(logits: Logits, batch: torch.Tensor) -> torch.Tensor:
    return _tail(logits, batch, 1)[:, -1, :]


def _greedy(logits: Logits, prompt: Sequence[int], n: int, eos: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding by full recomputation (a landmark is verified by the definition)."""
    seq, out, margins = list(prompt), [], []
    for _ in range(n):
        top = _last(logits, torch.tensor([seq]))[0].double().topk(2)
        t = int(top.indices[0])
        out.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        if t == eos:
            break
        seq.append(t)
    return out, margins


def is_eos_path(logits: Logits, prompt: Sequence[int], cont: Sequence[int], eos: int) -> bool:
    return all(_greedy(logits, list(prompt) + list(cont[:i]), len(cont) - i + 1, eos)[0]
               == list(cont[i:]) + [eos] for i in range(len(cont) + 1))


def eos_paths(logits: Logits, pool: list[int], eos: int, rng: random.Random, deadline: float,
              limit: int = MAX_EOS_PATHS) -> list[tuple[list[int], list[int]]]:
    """Batches of random prompts decoded greedily DECODE steps; every row that emits eos is a
    candidate, cut as deep as it allows (eos deep in the output is what speculation needs)."""
    found: list[tuple[list[int], list[int]]] = []
    while len(found) < limit and time.monotonic() < deadline:
        seqs = torch.tensor([[rng.choice(pool) for _ in range(PROMPT)] for _ in range(BATCH)])
        done = torch.zeros(BATCH, dtype=torch.bool)
        for step in range(DECODE):
            nxt = _last(logits, seqs).argmax(-1)
            for row in (nxt == eos).logical_and(~done).nonzero().flatten().tolist():
                done[row] = True
                ids = seqs[row].tolist()
                cut = min(step, MAX_CONTINUATION)
                prompt, cont = ids[:len(ids) - cut], ids[len(ids) - cut:]
                if (prompt, cont) not in found and is_eos_path(logits, prompt, cont, eos):
                    found.append((prompt, cont))
            if bool(done.all()) or time.monotonic() >= deadline:
                break
            seqs = torch.cat([seqs, nxt[:, None]], dim=1)
    found.sort(key=lambda p: -len(p[1]))
    return found[:limit]


def climbed_eos_paths(logits: Logits, pool: list[int], eos: int, rng: random.Random, deadline: float,
                      limit: int = MAX_EOS_PATHS) -> list[tuple[list[int], list[int]]]:
    """Coordinate search for a prompt whose last `c` tokens are what greedy decoding of the rest gives,
    followed by eos: one teacher-forced forward pass scores a candidate (the smallest margin by which
    each target token, and eos, wins at its position); a score above 0 is a path, then verified.

    The prompt's last token and the continuation are also copied earlier in the prompt (`_twin`), so
    an n-gram drafter (prompt lookup) drafts the continuation: eos then comes right after an accepted
    draft run, and a stop on a continuation token fires inside one. Random prompts almost never do."""
    found: list[tuple[list[int], list[int]]] = []
    while len(found) < limit and time.monotonic() < deadline:
        c = rng.choice((1, 1, 2, 2, 3, MAX_CONTINUATION))  # shallow paths are found fastest
        best = [rng.choice(pool) for _ in range(PROMPT + c)]
        for pos in range(PROMPT - 1, PROMPT + c):
            best[_twin(pos, c)] = best[pos]
        best_score = _path_score(logits, torch.tensor([best]), c, eos)[0]
        for _ in range(4 * len(best)):
            if best_score > 0.05 or time.monotonic() >= deadline:
                break
            pos = rng.randrange(len(best))
            alphabet = rng.sample(pool, min(ALPHABET, len(pool)))
            cands = [_set(best, pos, t, c) for t in alphabet]
            scores = _path_score(logits, torch.tensor(cands), c, eos)
            i = max(range(len(alphabet)), key=scores.__getitem__)
            if scores[i] > best_score:
                best, best_score = cands[i], scores[i]
        prompt, cont = best[:-c], best[-c:]
        if best_score > 0 and (prompt, cont) not in found and is_eos_path(logits, prompt, cont, eos):
            found.append((prompt, cont))
    return found


def _twin(pos: int, c: int) -> int:
    """The earlier copy of position `pos` (the prompt's last token or a continuation token): the copy
    sits at the middle of the prompt."""
    return pos - (PROMPT - 1 - PROMPT // 3)


def _set(seq: list[int], pos: int, token: int, c: int) -> list[int]:
    out = list(seq)
    out[pos] = token
    copied = PROMPT // 3
    if pos >= PROMPT - 1:
        out[_twin(pos, c)] = token
    elif copied <= pos <= copied + c:
        out[pos + (PROMPT - 1 - copied)] = token
    return out


def _path_score(logits: Logits, batch: torch.Tensor, c: int, eos: int) -> list[float]:
    """Per row: min over the last c + 1 predictions of (target logit - best other logit), where the
    targets are the row's last c tokens and then eos."""
    out = _tail(logits, batch, c + 1).double()
    targets = torch.cat([batch[:, -c:], torch.full((batch.shape[0], 1), eos)], dim=1)
    chosen = out.gather(2, targets[:, :, None])[:, :, 0]
    others = out.scatter(2, targets[:, :, None], float("-inf")).max(-1).values
    return (chosen - others).min(-1).values.tolist()


def near_ties(logits: Logits, pool: list[int], eos: int, rng: random.Random, deadline: float,
              limit: int = MAX_NEAR_TIES) -> list[list[int]]:
    """Coordinate search from random prompts: at a random position try ALPHABET tokens in one batched
    forward pass, keep the one that shrinks the first token's top-1/top-2 margin most."""
    found: list[list[int]] = []
    while len(found) < limit and time.monotonic() < deadline:
        best = [rng.choice(pool) for _ in range(PROMPT)]
        best_margin = _margin(logits, torch.tensor([best]))[0]
        for _ in range(3 * PROMPT):
            if best_margin < NEAR_TIE / 10 or time.monotonic() >= deadline:
                break
            pos = rng.randrange(PROMPT)
            alphabet = rng.sample(pool, min(ALPHABET, len(pool)))
            margins = _margin(logits, torch.tensor([best[:pos] + [t] + best[pos + 1:] for t in alphabet]))
            i = min(range(len(alphabet)), key=margins.__getitem__)
            if margins[i] < best_margin:
                best, best_margin = best[:pos] + [alphabet[i]] + best[pos + 1:], margins[i]
        out, margins = _greedy(logits, best, 1, eos)
        if margins and margins[0] < NEAR_TIE and best not in found:
            found.append(best)
    return found


def _margin(logits: Logits, batch: torch.Tensor) -> list[float]:
    top = _last(logits, batch).double().topk(2).values
    return (top[:, 0] - top[:, 1]).tolist()


@contextlib.contextmanager
def _restore_threads(n: int):
    try:
        yield
    finally:
        torch.set_num_threads(n)


def search_pool(vocab_size: int, eos_id: int | None, exclude: Sequence[int] = ()) -> list[int]:
    """The tokens a searched prompt is drawn from: the vocabulary but eos and the `exclude`d ids."""
    skip = set(exclude) | ({eos_id} if eos_id is not None else set())
    return [t for t in range(vocab_size) if t not in skip]


def search(logits: Logits | None, tokenizer, vocab_size: int, eos_id: int | None, budget_s: float,
           revision: str = "a", seed: int = 0, exclude: Sequence[int] = ()) -> Landmarks:
    """Everything findable within `budget_s` seconds (same-text pairs are not timed: a pass over the
    vocabulary). `logits` None (no model the search can run): only the tokenizer's pairs."""
    from adapters.landmarks import same_text_pairs

    start = time.monotonic()
    pairs = same_text_pairs(tokenizer, vocab_size) if tokenizer is not None else ()
    eos, ties = [], []
    if logits is not None and budget_s > 0:
        rng = random.Random(seed)
        pool = search_pool(vocab_size, eos_id, exclude)
        threads = torch.get_num_threads()
        # One thread: the searched batches are small matrices, where an intra-op pool's wake-ups cost
        # more than they save (20x slower on a busy 2-core machine for the tiny test models).
        torch.set_num_threads(1)
        with torch.no_grad(), _restore_threads(threads):
            if eos_id is not None:
                eos = eos_paths(logits, pool, eos_id, rng, start + budget_s * 0.1)
                eos += climbed_eos_paths(logits, pool, eos_id, rng, start + budget_s * 0.7,
                                         MAX_EOS_PATHS - len(eos))
                eos.sort(key=lambda p: -len(p[1]))
            ties = near_ties(logits, pool, -1 if eos_id is None else eos_id, rng, start + budget_s)
    return Landmarks(tuple(EosPath(revision, p, c) for p, c in eos), tuple(NearTie(revision, p) for p in ties),
                     pairs, search_s=round(time.monotonic() - start, 1))


# --------------------------------------------------------------------------- the cache


def _valid_ids(ids: object, vocab_size: int) -> bool:
    return isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
                                         for t in ids)


def read_cache(path: Path, vocab_size: int) -> tuple[Landmarks, float] | None:
    """A cached search result and the budget it had; None where absent or not a valid one (the file
    is read as untrusted input: capped, every id checked against the vocabulary)."""
    from conformance.untrusted import read_json

    if not path.is_file():
        return None
    try:
        d = read_json(path, "landmark cache", cap=4 << 20)
        eos = [(p, c) for p, c in d["eos_paths"]]
        ties, pairs = list(d["near_ties"]), [(a, b) for a, b in d["same_text"]]
        ok = all(_valid_ids(p, vocab_size) and _valid_ids(c, vocab_size) for p, c in eos + pairs)
        ok = ok and all(_valid_ids(t, vocab_size) for t in ties) and d.get("format") == FORMAT
        if not ok:
            raise ValueError("a token id outside the vocabulary, or another format")
        rev = str(d["revision"])
        marks = Landmarks(tuple(EosPath(rev, p, c) for p, c in eos), tuple(NearTie(rev, t) for t in ties),
                          pairs, search_s=float(d["search_s"]))
        return marks, float(d["budget_s"])
    except (UsageError, ValueError, TypeError, KeyError, OSError) as exc:
        print(f"kvparity: ignoring the landmark cache {path} ({str(exc).splitlines()[0][:200]}); searching again",
              file=sys.stderr)
        return None


def write_cache(path: Path, marks: Landmarks, budget_s: float, revision: str) -> None:
    data = {"format": FORMAT, "revision": revision, "budget_s": budget_s, "search_s": marks.search_s,
            "eos_paths": [[list(p.prompt), list(p.continuation)] for p in marks.eos_paths],
            "near_ties": [list(t.prompt) for t in marks.near_ties],
            "same_text": [[list(a), list(b)] for a, b in marks.same_text]}
    # A temporary file of this writer's own: a campaign's shards searching one checkpoint finish together,
    # and with one shared `.tmp` one of them lost its file to the other's rename (adapters/gguf_export.py).
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data) + "\n")
        tmp.replace(path)
    except OSError as exc:  # a read-only working directory: the run goes on, searching next time again
        print(f"kvparity: cannot cache landmarks in {path}: {exc}", file=sys.stderr)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def discover(folder: str | Path, vocab_size: int, eos_id: int | None, model: Callable[[], Logits | None],
             budget_s: float = DEFAULT_BUDGET_S, cache_dir: str | Path | None = None, revision: str = "a",
             exclude: Sequence[int] = ()) -> Landmarks:
    """The landmarks of the checkpoint in `folder`: cached ones if a search with at least this budget
    ran before (or found everything), else a fresh search (`model()` builds what it runs on, only then)."""
    path = Path(cache_dir or CACHE_DIR) / f"{checkpoint_digest(folder, eos_id)}.json"
    cached = read_cache(path, vocab_size)
    if cached is not None:
        marks, had = cached
        if had >= budget_s or (marks.eos_paths or eos_id is None) and marks.near_ties:
            return marks
    marks = search(model() if budget_s > 0 else None, load_tokenizer(folder), vocab_size, eos_id, budget_s,
                   revision, exclude=exclude)
    write_cache(path, marks, budget_s, revision)
    return marks


def load_tokenizer(folder: str | Path):
    """The folder's tokenizer.json (tokenizers), or None where it has none or it cannot be read."""
    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 - an unreadable tokenizer: no same-text pairs, said by the table
        return None


def reference_logits(model) -> Logits:
    """A reference-engine model (reference_engine.model.Llama) as the search's oracle."""
    return model.forward_train


def hf_logits(model) -> Logits:
    """A transformers causal LM as the search's oracle (oracle=self: the model the engine serves)."""
    return lambda batch: model(batch).logits


def lengthened(logits: Logits, paths: Sequence[EosPath], length: int, pool: list[int], eos: int,
               rng: random.Random, tries: int = 8) -> list[EosPath]:
    """Eos paths at least `length` tokens long, made from shorter ones by putting random tokens before
    their prompts, each kept only if plain greedy decoding still ends it the same way (about two in three
    do on the shipped models: the ending is decided by the last tokens)."""
    out = []
    for path in paths:
        for _ in range(tries if len(path.prompt) < length else 0):
            prompt = [rng.choice(pool) for _ in range(length - len(path.prompt))] + list(path.prompt)
            if is_eos_path(logits, prompt, path.continuation, eos):
                out.append(EosPath(path.revision, tuple(prompt), path.continuation))
                break
    return out


def checkpoint_landmarks(model_dir: str, info, oracle, budget_s: float | None = None,
                         min_hit_prompt: int = 0) -> Landmarks:
    """What an adapter serving `model_dir` (empty: the shipped family) declares: the shipped tables,
    or the search's landmarks run on `oracle` (adapters.reference_oracle.ReferenceOracle) for a
    user's model; where the reference cannot load the model, only its tokenizer's pairs.

    An eos path is sent twice so that the second meets it on a warm cache, which a prompt shorter than
    the engine's `min_hit_prompt` never does: the tables are mined at 24 tokens (block size 16), and
    vLLM's blocks are 32. Where no eos path is long enough, lengthened copies of revision a's come first."""
    from adapters.landmarks import shipped_landmarks

    def model() -> Logits | None:
        try:
            return reference_logits(oracle._model("a", None))
        except Exception:  # noqa: BLE001 - another architecture: no model search, said as "not steered"
            return None

    skip = [i for i in (info.bos_id, info.pad_id) if i is not None]
    budget = DEFAULT_BUDGET_S if budget_s is None else budget_s
    marks = discover(model_dir, info.vocab_size, info.eos_id, model, budget, exclude=skip) if model_dir \
        else shipped_landmarks()
    own = [p for p in marks.eos_paths if p.revision == "a"]  # those of the model `model()` loads
    if not own or any(len(p.prompt) >= min_hit_prompt for p in marks.eos_paths) or (logits := model()) is None:
        return marks
    pool = search_pool(info.vocab_size, info.eos_id, skip)
    with torch.no_grad():
        longer = lengthened(logits, own, min_hit_prompt, pool, info.eos_id, random.Random(0))
    return attrs.evolve(marks, eos_paths=tuple(longer) + marks.eos_paths)
