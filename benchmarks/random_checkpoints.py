"""How far the steering reaches on models nobody mined landmarks for: random-init Llama checkpoints saved
by transformers (each with its own tokenizer, no shipped tables), run through the transformers adapter.

    python benchmarks/random_checkpoints.py [--weights 3,4,5,6,7] [--profile ci] [--modes generate,prompt_lookup]

Per checkpoint (`--weights`: the torch seeds of its random weights; the recipe is
tests/test_landmark_discovery.save_checkpoint) the run starts with a landmark search of its own
(adapters/landmark_search.py, cached per checkpoint digest under a fresh .kvparity/), then runs the
profile. Prints one Markdown table: the counts of the situations the steering is for (eos, same text,
near-ties, stops, each inside speculation), the landmarks the run recorded it found, its verdict and wall
time. Issue 28's bar reads these: eos, stop-in-speculation and same-text situations >= 5 per CI run.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.exit_codes import ExitCode  # noqa: E402
from conformance.history_files import load_history  # noqa: E402
from conformance.situations import coverage  # noqa: E402

SHOWN = ("eos_finish", "eos_in_speculation", "same_text_other_ids", "near_tie_met", "stop_finish",
         "stop_in_speculation", "length_in_speculation", "accepted_draft")


def run(folder: Path, profile: str, modes: str, work: Path) -> tuple[Path, float, int]:
    """One `kvparity run` on `folder`, from `work` (so the landmark cache starts empty)."""
    t0 = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "kvparity", "run", "--engine", "transformers",
                            "--engine-arg", f"model={folder}", "--engine-arg", f"modes={modes}",
                            "--profile", profile, "--report-dir", str(work / "runs"), "-q"],
                           cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    return Path(sorted(glob.glob(str(work / "runs" / "*" / "*" / "history.jsonl")))[-1]), time.perf_counter() - t0, code


def landmarks(h) -> str:
    """What the run's landmark search found, as the run recorded it (its capabilities)."""
    m = h.capabilities.landmarks
    took = "" if m.search_s is None else f" in {m.search_s:.0f} s"
    return f"{len(m.eos_paths)} eos paths, {len(m.near_ties)} near-ties, {len(m.same_text)} same-text{took}"


def verdict(code: int) -> str:
    try:
        return ExitCode(code).name
    except ValueError:  # not one of kvparity's exit codes (a crash of the interpreter, say)
        return str(code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default="3,4,5,6,7", help="torch seeds of the checkpoints' random weights")
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--modes", default="generate,prompt_lookup", help="the transformers adapter's modes")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from test_landmark_discovery import save_checkpoint  # the tests' recipe: one checkpoint per seed

    tmp = Path(tempfile.mkdtemp(prefix="kvparity-random-ckpt-"))
    columns = []
    for seed in (int(s) for s in args.weights.split(",")):
        work = tmp / f"w{seed}"
        work.mkdir()
        path, wall, code = run(save_checkpoint(tmp, seed), args.profile, args.modes, work)
        h = load_history(path)
        columns.append((f"weights {seed}", {c.name: c.count for c in coverage(h)}, landmarks(h), wall, code))
    print("| situation | " + " | ".join(c[0] for c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in SHOWN:
        print(f"| `{name}` | " + " | ".join(str(c[1].get(name, "-")) for c in columns) + " |")
    print("| landmarks | " + " | ".join(c[2] for c in columns) + " |")
    print("| verdict, wall (s) | " + " | ".join(f"{verdict(c[4])}, {c[3]:.0f}" for c in columns) + " |")


if __name__ == "__main__":
    main()
