"""Which token a lower-precision engine picked where it left the oracle's path, per run folder: the
figures behind reports/calibration/README.md ("near-ties ... of them a non-runner-up contender").

    python benchmarks/near_tie_picks.py RUN_DIR [RUN_DIR ...]

For every result with a baseline (each sent request, not deduplicated), the run's own tie-aware
comparison (conformance/oracle.py, the run's tau): equal, near-tie (split into the runner-up and
another contender within tau), or divergent. Prints one Markdown row per run folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.history_files import load_run_history
from conformance.oracle import DIVERGE, FINISH, NEAR_TIE, compare


def picks(run_dir: Path) -> dict[str, int]:
    history = load_run_history(run_dir)  # committed: history.jsonl.gz
    counts = {"results": 0, "divergent": 0, "near_ties": 0, "runner_up": 0, "other_contender": 0}
    for record in history.batches():
        for q, r in zip(record.requests, record.results):
            base = history.baseline_for(q)
            if base is None or r.finish_reason == "abort":
                continue
            c = compare(base, r.output, r.finish_reason, history.tolerance)
            counts["results"] += 1
            if c.kind in (DIVERGE, FINISH):
                counts["divergent"] += 1
            elif c.kind == NEAR_TIE:
                counts["near_ties"] += 1
                second = base.runner_up[c.position] if c.position < len(base.runner_up) else None
                counts["runner_up" if c.got == second else "other_contender"] += 1
    return counts


def main(argv: list[str]) -> None:
    print("| run | verdict | examples | results | divergent | near-ties | runner-up | other contender |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for arg in argv:
        run_dir = Path(arg)
        res = json.loads((run_dir / "results.json").read_text())
        c = picks(run_dir)
        print(f"| `{run_dir}` | {res['verdict']} | {res['examples']} | {c['results']} | {c['divergent']} | "
              f"{c['near_ties']} | {c['runner_up']} | {c['other_contender']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
