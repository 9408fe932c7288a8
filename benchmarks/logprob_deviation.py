"""How close a run's logprobs came to logprob_parity's epsilon, per run folder: the figures behind the
transformers runs' table in reports/calibration/README.md ("largest deviation vs epsilon").

    python benchmarks/logprob_deviation.py RUN_DIR [RUN_DIR ...]

logprob_parity reports a failure's deviation but not, on a pass, how much room was left; this reads the
run's history and recomputes, for every result with logprobs and a baseline that has them, the check's own
deviation (conformance.checks.logprobs.deviation), then prints one Markdown row per run folder: the
verdict, logprob_parity's status, results and (position, token) pairs compared, the largest deviation,
the run's epsilon and their ratio.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.checks.logprobs import deviation
from conformance.history_files import load_run_history


def largest(run_dir: Path) -> tuple[int, int, float]:
    """(results compared, pairs compared, largest deviation) over every sent request with a baseline."""
    history = load_run_history(run_dir)
    results = pairs = 0
    worst = 0.0
    for record in history.batches():
        for q, r in zip(record.requests, record.results):
            base = history.baseline_for(q)
            if r.logprobs is None or base is None or not base.logprobs:
                continue
            dev = deviation(base, r)
            if dev is None:
                continue
            results += 1
            pairs += dev.compared
            worst = max(worst, dev.value)
    return results, pairs, worst


def main(argv: list[str]) -> None:
    print("| dtype | seed | verdict | examples | logprob_parity | results | pairs | largest deviation | epsilon "
          "| ratio | wall |")
    print("|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for arg in argv:
        run_dir = Path(arg)
        res = json.loads((run_dir / "results.json").read_text())
        eps = load_run_history(run_dir).capabilities.logprob_epsilon
        status = res.get("checks", {}).get("logprob_parity", {}).get("status", "?")
        n, pairs, worst = largest(run_dir)
        ratio = f"{worst / eps:.2f}" if eps else "-"
        dtype = res["run"].get("engine_args", {}).get("dtype", "?")
        print(f"| {dtype} | {res['run'].get('seed')} | {res['verdict']} | {res['examples']} | {status} | {n} | "
              f"{pairs:,} | {worst:.3g} | {eps if eps is None else f'{eps:.3g}'} | {ratio} | "
              f"{res.get('duration_s', 0):.0f} s |")


if __name__ == "__main__":
    main(sys.argv[1:])
