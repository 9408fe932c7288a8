"""The reference engine's decoding under `torch.inference_mode` (as shipped) and under `torch.no_grad`.

    python benchmarks/reference_engine_speed.py [--repeats 8] [--prompts 40]

The reference engine runs a tiny float64 model, so a decoding step is many small tensor operations and
the per-operation bookkeeping counts: `no_grad` still keeps version counters and view tracking on every
tensor, `inference_mode` does not; the arithmetic, and so every output, is the same. Nearly every test
and every `kvparity run --engine reference` (the quick start, the fault zoo, `kvparity mutate`) waits on
this. Decodes `--prompts` seeded prompts (1-119 tokens) for 16 steps each (`GreedyRun`, the baseline's
decoder, over the model's `forward`), the two modes taking turns in one process, and prints the CPU
seconds of each turn and the ratio of the medians. One process on a shared machine: read the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time

import torch

from reference_engine.baseline import GreedyRun
from reference_engine.checkpoints import load_target
from reference_engine.model import Llama


@contextlib.contextmanager
def grad_mode(mode: str):
    """`mode` around the block, with the decorators' own mode taken off (each method as written)."""
    patched = [(Llama, "forward"), (GreedyRun, "step")]
    saved = [getattr(cls, name) for cls, name in patched]
    for cls, name in patched:
        setattr(cls, name, getattr(cls, name).__wrapped__)
    try:
        with (torch.inference_mode() if mode == "inference_mode" else torch.no_grad()):
            yield
    finally:
        for (cls, name), fn in zip(patched, saved):
            setattr(cls, name, fn)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--repeats", type=int, default=8, help="turns per mode")
    ap.add_argument("--prompts", type=int, default=40, help="prompts decoded per turn")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load_target()
    rng = random.Random(0)
    prompts = [tuple(rng.randrange(4, 52) for _ in range(rng.randrange(1, 120))) for _ in range(args.prompts)]

    def decode() -> None:
        for prompt in prompts:
            run = GreedyRun(model, prompt)
            for i in range(16):
                run.step(i)

    spent: dict[str, list[float]] = {"no_grad": [], "inference_mode": []}
    for _ in range(args.repeats):
        for mode in spent:
            with grad_mode(mode):
                cpu = time.process_time()
                decode()
                spent[mode].append(time.process_time() - cpu)
    for mode, seconds in spent.items():
        print(f"{mode:15s} CPU s per turn ({args.prompts} prompts x 16 steps): "
              + ", ".join(f"{s:.3f}" for s in sorted(seconds)))
    ratio = statistics.median(spent["inference_mode"]) / statistics.median(spent["no_grad"])
    print(f"inference_mode / no_grad, medians: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
