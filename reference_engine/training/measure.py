"""Measure the shipped checkpoints against the bars of MODEL_CARD.md and rewrite the cards.

`python -m reference_engine.training.measure` (about a minute). tests/test_model_bars.py calls
`measure()` on a smaller sample and asserts the same bars, so a regression in training fails CI.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from reference_engine import checkpoints
from reference_engine.baseline import greedy
from reference_engine.training import corpus

CONTINUATION = 16
PROMPT_LEN = 32


def heldout_stream(n_tokens: int) -> list[int]:
    tok = checkpoints.load_tokenizer()
    ids: list[int] = []
    for text in corpus.texts("heldout"):
        ids += [1] + tok.encode(text).ids + [2]
        if len(ids) >= n_tokens:
            break
    return ids[:n_tokens]


def model_loss(model, ids: list[int], window: int = 256) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor(ids[s:s + window + 1])
            if len(chunk) < 2:
                break
            logits = model.forward_train(chunk[None, :-1])[0]
            total += F.cross_entropy(logits.double(), chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    return total / count


def bigram_loss(vocab: int, ids: list[int]) -> float:
    """Add-one-smoothed bigram model fitted on training slice a, scored on `ids`."""
    tok = checkpoints.load_tokenizer()
    counts = torch.ones(vocab, vocab, dtype=torch.float64)
    for text in corpus.texts("a"):
        train = torch.tensor([1] + tok.encode(text).ids + [2])
        counts.index_put_((train[:-1], train[1:]), torch.ones(len(train) - 1, dtype=torch.float64), accumulate=True)
    logp = (counts / counts.sum(1, keepdim=True)).log()
    x = torch.tensor(ids)
    return -logp[x[:-1], x[1:]].mean().item()


def agreement(target, draft, ids: list[int], window: int = 256) -> float:
    agree = count = 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, window):
            chunk = torch.tensor(ids[s:s + window])[None]
            agree += (target.forward_train(chunk).argmax(-1) == draft.forward_train(chunk).argmax(-1)).sum().item()
            count += chunk.shape[1]
    return agree / count


def prompts(n: int) -> list[list[int]]:
    ids = heldout_stream(n * 97 + PROMPT_LEN + 1)
    return [ids[i * 97: i * 97 + PROMPT_LEN] for i in range(n)]


def measure(n_prompts: int = 100, n_tokens: int = 40_000) -> dict:
    base = checkpoints.load_target("a")
    variants = {"revision b": checkpoints.load_target("b")}
    variants.update({f"adapter {a}": checkpoints.load_target("a", a) for a in checkpoints.ADAPTERS})
    draft = checkpoints.load_draft()
    ids = heldout_stream(n_tokens)
    figures: dict = {
        "heldout_tokens": len(ids),
        "target_loss": model_loss(base, ids),
        "revision_b_loss": model_loss(variants["revision b"], ids),
        "draft_loss": model_loss(draft, ids),
        "bigram_loss": bigram_loss(base.config.vocab_size, ids),
        "draft_agreement": agreement(base, draft, ids),
    }
    margins: list[float] = []
    base_out = []
    for p in prompts(n_prompts):
        g = greedy(base, p, CONTINUATION, eos_id=-1)
        base_out.append(g.output)
        margins += g.margins
    for name, model in variants.items():
        differ = sum(greedy(model, p, CONTINUATION, eos_id=-1).output != b for p, b in zip(prompts(n_prompts), base_out))
        figures[f"differ_{name.replace(' ', '_')}"] = differ / n_prompts
    figures["median_margin"] = statistics.median(margins)
    figures["min_margin"] = min(margins)
    figures["frac_margin_below_1e-3"] = sum(m < 1e-3 for m in margins) / len(margins)
    figures["margin_steps"] = len(margins)
    figures["n_prompts"] = n_prompts
    target_cost = sum(p.numel() for n, p in base.named_parameters() if "embed_tokens" not in n)
    draft_cost = sum(p.numel() for n, p in draft.named_parameters() if "embed_tokens" not in n)
    figures["draft_cost_ratio"] = draft_cost / target_cost
    return figures


CARD = """# {name}

Part of kvparity's tiny model family (see reference_engine/training/train.py). Architecture:
Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU), {arch}. Tokenizer: byte-level BPE, vocabulary
1024, `<pad>`=0, `<bos>`=1, `<eos>`=2. Corpus: CPython 3.11 top-level standard-library modules (PSF
License 2.0), split by file into slices a / b / held-out (reference_engine/training/corpus.py).
{role}

## Measured (python -m reference_engine.training.measure; held-out slice, {heldout_tokens} tokens, {n_prompts} prompts)

| figure | value | bar |
|---|---|---|
| target (revision a) held-out loss, nats/token | {target_loss:.3f} | clearly below bigram |
| add-one bigram held-out loss (fitted on slice a) | {bigram_loss:.3f} | |
| revision b held-out loss | {revision_b_loss:.3f} | |
| draft held-out loss | {draft_loss:.3f} | |
| draft/target greedy next-token agreement | {draft_agreement:.3f} | >= 0.6 |
| draft/target cost ratio (non-embedding parameters per token) | {draft_cost_ratio:.3f} | <= 0.25 |
| 16-token continuations differing, revision a vs b | {differ_revision_b:.2f} | >= 0.5 |
| ... base vs adapter `upper` | {differ_adapter_upper:.2f} | >= 0.5 |
| ... base vs adapter `rot13` | {differ_adapter_rot13:.2f} | >= 0.5 |
| median top-1/top-2 logit margin (greedy steps, revision a) | {median_margin:.4f} | reported |
| smallest margin seen | {min_margin:.2e} | reported |
| fraction of steps with margin < 1e-3 | {frac_margin_below_1e-3:.4f} (of {margin_steps}) | reported |

Intended use: testing inference engines. It writes plausible-looking Python fragments, nothing more.
"""

ROLES = {
    "tiny-target-a": ("the target, revision a", "hidden 128, 2 layers, 4 query / 2 KV heads, head_dim 32, context 1024"),
    "tiny-target-b": ("the target, revision b: revision a trained further on slice b", "as revision a"),
    "tiny-draft": ("the draft model, distilled from revision a", "hidden 64, 1 layer, 2 query / 1 KV heads, head_dim 32"),
    "lora-upper": ("a rank-8 LoRA of revision a (q/k/v/o), trained on UPPER-CASED text", "adapter"),
    "lora-rot13": ("a rank-8 LoRA of revision a (q/k/v/o), trained on rot13 text", "adapter"),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=100)
    args = parser.parse_args(argv)
    figures = measure(args.prompts)
    print(json.dumps(figures, indent=2))
    for folder, (role, arch) in ROLES.items():
        text = CARD.format(name=folder, role=f"This checkpoint: {role}.", arch=arch, **figures)
        (checkpoints.CHECKPOINTS / folder / "MODEL_CARD.md").write_text(text)
    (checkpoints.CHECKPOINTS / "measurements.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
