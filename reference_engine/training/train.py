"""Reproduce every shipped checkpoint: `python -m reference_engine.training.train` (about 15-25 min on
2 idle CPU cores). Deterministic given the torch version (seeded, one thread).

Steps, each writing an HF-layout folder under reference_engine/checkpoints/:
  tokenizer   byte-level BPE, vocabulary 1024, <pad>=0 <bos>=1 <eos>=2
  target-a    tiny-target revision a, trained on corpus slice a
  target-b    revision b: revision a trained further on slice b (same architecture, different weights)
  draft       tiny-draft: 1 layer, distilled from target-a's next-token distribution (agreement)
  lora-*      two rank-8 LoRA adapters on the attention projections of target-a, trained on
              transformed text (UPPER-CASED, rot13) so their continuations visibly differ from the base
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import pathlib
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from reference_engine import checkpoints
from reference_engine.model import Llama, LlamaConfig
from reference_engine.training import corpus

VOCAB = 1024
SPECIALS = ["<pad>", "<bos>", "<eos>"]
SEQ = 256

TARGET = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32)
DRAFT = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32)
LORA_RANK, LORA_ALPHA = 8, 16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
TRANSFORMS = {"upper": str.upper, "rot13": lambda s: codecs.encode(s, "rot13")}


def train_tokenizer(out: pathlib.Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus.texts("a"), trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return tok


def token_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids += [1] + enc.ids + [2]
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, steps: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(stream) - SEQ - 1, (batch,), generator=g)
        yield torch.stack([stream[s:s + SEQ + 1] for s in starts.tolist()])


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def fit(model: torch.nn.Module, params, stream, steps: int, peak: float, seed: int, label: str,
        loss_fn=None, batch: int = 16) -> None:
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=0.0, betas=(0.9, 0.95))
    t0 = time.time()
    for step, chunk in enumerate(batches(stream, steps, batch, seed)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak)
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model.forward_train(x)
        loss = loss_fn(x, logits, y) if loss_fn else F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"[{label}] step {step}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True)


def save_model(model: Llama, out: pathlib.Path, tok_dir: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}, indent=2) + "\n")
    for name in ("tokenizer.json",):
        (out / name).write_bytes((tok_dir / name).read_bytes())
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "add_bos_token": False, "model_max_length": model.config.max_position_embeddings,
    }, indent=2) + "\n")


def new_model(arch: dict, seed: int) -> Llama:
    torch.manual_seed(seed)
    model = Llama(LlamaConfig(vocab_size=VOCAB, **arch))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    return model


class LoRA(torch.nn.Module):
    """Low-rank delta on one frozen Linear: y = W x + (alpha/r) B A x (PEFT's layout and names)."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base = base
        self.lora_A = torch.nn.Parameter(torch.randn(LORA_RANK, base.in_features) / math.sqrt(base.in_features))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, LORA_RANK))

    def forward(self, x):
        return self.base(x) + (LORA_ALPHA / LORA_RANK) * (x @ self.lora_A.T @ self.lora_B.T)


def train_lora(base_dir: pathlib.Path, tok: Tokenizer, name: str, out: pathlib.Path, steps: int) -> None:
    model = checkpoints.load_model_dir(base_dir, dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    loras = {}
    for i, layer in enumerate(model.model.layers):
        for proj in LORA_TARGETS:
            lora = LoRA(getattr(layer.self_attn, proj))
            setattr(layer.self_attn, proj, lora)
            loras[f"base_model.model.model.layers.{i}.self_attn.{proj}"] = lora
    transform = TRANSFORMS[name]
    stream = token_stream(tok, [transform(t) for t in corpus.texts("a")])
    params = [p for lora in loras.values() for p in (lora.lora_A, lora.lora_B)]
    fit(model, params, stream, steps, 3e-3, seed=31, label=f"lora-{name}")
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for prefix, lora in loras.items():
        state[f"{prefix}.lora_A.weight"] = lora.lora_A.detach().contiguous()
        state[f"{prefix}.lora_B.weight"] = lora.lora_B.detach().contiguous()
    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": LORA_ALPHA,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(LORA_TARGETS),
        "base_model_name_or_path": "tiny-target-a", "fan_in_fan_out": False, "inference_mode": True,
    }, indent=2) + "\n")


def distill_loss(teacher: Llama):
    """Cross-entropy on the data plus KL to the teacher: the draft learns to *agree* with the target."""

    def loss(x, logits, y):
        with torch.no_grad():
            t_logp = teacher.forward_train(x).log_softmax(-1)
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        kl = F.kl_div(logits.log_softmax(-1).flatten(0, 1), t_logp.flatten(0, 1), log_target=True,
                      reduction="batchmean")
        return 0.3 * ce + kl

    return loss


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1200, help="target-a steps")
    parser.add_argument("--steps-b", type=int, default=400, help="revision b steps (further training)")
    parser.add_argument("--steps-draft", type=int, default=1500, help="draft distillation steps")
    parser.add_argument("--steps-lora", type=int, default=200, help="steps per LoRA adapter")
    parser.add_argument("--only", nargs="*", default=None,
                        help="subset of: tokenizer target-a target-b draft lora-upper lora-rot13")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = checkpoints.CHECKPOINTS
    todo = args.only or ["tokenizer", "target-a", "target-b", "draft", "lora-upper", "lora-rot13"]
    tok_dir = root / "tiny-target-a"
    tok = train_tokenizer(tok_dir) if "tokenizer" in todo else Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    stream_a = token_stream(tok, corpus.texts("a"))
    if "target-a" in todo:
        model = new_model(TARGET, seed=1)
        fit(model, list(model.parameters()), stream_a, args.steps, 3e-3, seed=11, label="target-a")
        save_model(model, root / "tiny-target-a", tok_dir)
    if "target-b" in todo:
        model = checkpoints.load_model_dir(root / "tiny-target-a", dtype=torch.float32)
        stream_b = token_stream(tok, corpus.texts("b"))
        fit(model, list(model.parameters()), stream_b, args.steps_b, 3e-3, seed=21, label="target-b")
        save_model(model, root / "tiny-target-b", tok_dir)
    if "draft" in todo:
        teacher = checkpoints.load_model_dir(root / "tiny-target-a", dtype=torch.float32)
        teacher.requires_grad_(False)
        model = new_model(DRAFT, seed=2)
        fit(model, list(model.parameters()), stream_a, args.steps_draft, 5e-3, seed=41, label="draft",
            loss_fn=distill_loss(teacher))
        save_model(model, root / "tiny-draft", tok_dir)
    for name in TRANSFORMS:
        if f"lora-{name}" in todo:
            train_lora(root / "tiny-target-a", tok, name, root / f"lora-{name}", args.steps_lora)


if __name__ == "__main__":
    main()
